"""Helpers shared by the component modules."""

from __future__ import annotations

import math

import numpy as np


def batch_for(n_shared: float, width: int, runs: int, lo: int = 1, hi: int = 4096) -> int:
    """Batch size such that runs * batch * width >= n_shared.

    The token-shared component of a sample has ``width`` independent entries per sequence, so
    the covariance estimate's relative noise is about sqrt(2 / (runs * batch * width)).
    """
    return int(min(hi, max(lo, math.ceil(n_shared / (runs * width)))))


def dropout_mask(rng: np.random.Generator, shape, p: float, dtype) -> np.ndarray | None:
    """Keep-mask already scaled by 1/(1-p); None when p == 0."""
    if p == 0:
        return None
    keep = rng.random(shape, dtype=np.float32) >= p
    return keep.astype(dtype) * dtype(1.0 / (1.0 - p))


SQRT = {0.316: math.sqrt(0.1), 3.16: math.sqrt(10.0)}


def grid_std(v: float) -> float:
    """The published grids write sqrt(0.1) and sqrt(10) as 0.316 and 3.16."""
    return SQRT.get(v, v)
