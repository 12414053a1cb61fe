"""Sampling hidden states with a given mean, variance and token correlation.

Convention (contract.md, "Input"): a Gaussian component shared by all tokens of a sequence
carries the correlation.  For shape (B, L, d),

    x = mean + sqrt(var) * (sqrt(corr) * c + sqrt(1 - corr) * e),

c of shape (B, 1, d) and e of shape (B, L, d) iid standard normal.  This needs corr >= 0;
negative token correlations are not sampled (DomainError).
"""

from __future__ import annotations

import numpy as np

from sigprop.errors import DomainError


def correlated(rng: np.random.Generator, shape, mean=0.0, var=1.0, corr=0.0, dtype=np.float32):
    B, L, d = shape
    if not 0.0 <= corr <= 1.0:
        raise DomainError(f"the sampler needs a token correlation in [0, 1], got {corr:g}")
    if var < 0:
        raise DomainError(f"variance must be non-negative, got {var:g}")
    e = rng.standard_normal((B, L, d), dtype=dtype)
    e *= np.sqrt((1.0 - corr) * var)
    if corr > 0:
        c = rng.standard_normal((B, 1, d), dtype=dtype)
        c *= np.sqrt(corr * var)
        e += c
    if mean:
        e += mean
    return e
