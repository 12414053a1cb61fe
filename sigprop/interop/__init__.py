"""Other programs' model descriptions, read into sigprop's model object.

:mod:`sigprop.interop.hf` resolves a Hugging Face ``config.json`` (no network, no torch or
transformers import) into a :class:`sigprop.model.spec.Model`.
"""
