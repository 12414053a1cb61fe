"""Small Hugging Face configs (4 layers, d_model 128, 4 heads of 32, vocabulary 256, context 64)
of every family sigprop reads, for the PyTorch interop tests: those of the family accuracy
table (:data:`sigprop.torch.families.SMALL`)."""

from sigprop.torch.families import SMALL as CONFIGS

__all__ = ["CONFIGS"]
