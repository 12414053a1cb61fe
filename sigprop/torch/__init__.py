"""PyTorch interop (needs torch; Hugging Face models also transformers: ``pip install
sigprop[torch]``).  The rest of sigprop never imports this package.

* :func:`apply_init`: set a PyTorch model's weights to a sigprop model's init (a solved one),
  by module names (:mod:`sigprop.interop.torch_names`);
* :func:`sigprop.torch.measure.measure`: the trace of a real PyTorch model, measured with
  hooks, in the form ``sigprop check`` compares with the prediction.
"""

from __future__ import annotations

from sigprop.torch.init import apply_init

__all__ = ["apply_init"]
