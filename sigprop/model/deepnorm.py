"""DeepNorm constants ([DeepNet] Wang et al. 2022, arXiv:2203.00555, Table 1).

DeepNorm is Post-LN with an up-weighted skip, ``x' = LN(alpha x + G(x))``, and the V, O,
FFN-in and FFN-out weights initialised Xavier-normal with gain ``beta`` (Q and K with gain 1).

| model                                  | alpha                  | beta                    |
|----------------------------------------|------------------------|-------------------------|
| encoder-only or decoder-only, N layers | (2N)^(1/4)             | (8N)^(-1/4)             |
| encoder-decoder, N-layer encoder       | 0.81 (N^4 M)^(1/16)    | 0.87 (N^4 M)^(-1/16)    |
| encoder-decoder, M-layer decoder       | (3M)^(1/4)             | (12M)^(-1/4)            |

The torchscale implementation (microsoft/torchscale, its encoder's ``deepnorm`` init) divides
the encoder's V, O and FFN weights by (N^4 M)^(1/16) / 1.15, an encoder beta of
1.15 (N^4 M)^(-1/16) rather than the paper's 0.87 (N^4 M)^(-1/16) (the same alpha and decoder):
``variant="torchscale"``.

The general pattern behind the single-stack and decoder rows: a stack with K residual
sublayers in total takes alpha = K^(1/4), beta = (4K)^(-1/4) (:func:`deepnorm_general`).
An encoder-only or decoder-only layer has 2 sublayers (attention, FFN), so K = 2N; a
decoder layer of an encoder-decoder model has 3 (self-attention, cross-attention, FFN), so
K = 3M.  The encoder row of the encoder-decoder model is the paper's separate derivation
(the decoder's cross-attention reads the encoder output), not an instance of the pattern.
"""

from __future__ import annotations

from typing import NamedTuple

from sigprop.errors import DomainError


class DeepNormConstants(NamedTuple):
    alpha: float   #: skip scale (multiplies x inside the LayerNorm)
    beta: float    #: Xavier-normal gain of V, O, FFN in and out


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise DomainError(f"{name} must be a positive integer, got {v!r}")
    return v


def deepnorm_general(k_sublayers: int) -> DeepNormConstants:
    """alpha = K^(1/4), beta = (4K)^(-1/4) for a stack of K residual sublayers."""
    k = _positive_int("k_sublayers", k_sublayers)
    return DeepNormConstants(k ** 0.25, (4 * k) ** -0.25)


def deepnorm_constants(n_layers: int, kind: str = "encoder") -> DeepNormConstants:
    """Encoder-only (``kind="encoder"``) or decoder-only (``kind="decoder"``) stack of
    ``n_layers`` layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4).  Both kinds have two
    residual sublayers per layer and so the same constants."""
    n = _positive_int("n_layers", n_layers)
    if kind not in ("encoder", "decoder"):
        raise DomainError(f"kind must be 'encoder' or 'decoder' (an encoder-only or decoder-only "
                          f"stack; use deepnorm_encoder_decoder for both), got {kind!r}")
    return deepnorm_general(2 * n)


#: the encoder beta's factor of each variant of the encoder-decoder constants
VARIANTS = {"paper": 0.87, "torchscale": 1.15}


def deepnorm_encoder_decoder(n_enc: int, m_dec: int, variant: str = "paper") -> dict[str, DeepNormConstants]:
    """Encoder-decoder model with an N-layer encoder and an M-layer decoder:
    encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16) (``variant="torchscale"``:
    1.15 (N^4 M)^(-1/16));
    decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4).
    Returns ``{"encoder": DeepNormConstants, "decoder": DeepNormConstants}``."""
    n = _positive_int("n_enc", n_enc)
    m = _positive_int("m_dec", m_dec)
    if variant not in VARIANTS:
        raise DomainError(f"DeepNorm variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    q = float(n) ** 4 * m
    return {"encoder": DeepNormConstants(0.81 * q ** (1 / 16), VARIANTS[variant] * q ** (-1 / 16)),
            "decoder": deepnorm_general(3 * m)}
