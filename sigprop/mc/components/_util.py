"""Helpers shared by the component modules."""

from __future__ import annotations

import math

import numpy as np

from sigprop.mc.backend import backend_of, np_dtype
from sigprop.mc.sampling import keep_mask


def batch_for(n_shared: float, width: int, runs: int, lo: int = 1, hi: int = 4096) -> int:
    """Batch size such that runs * batch * width >= n_shared.

    The token-shared component of a sample has ``width`` independent entries per sequence, so
    the covariance estimate's relative noise is about sqrt(2 / (runs * batch * width)).
    """
    return int(min(hi, max(lo, math.ceil(n_shared / (runs * width)))))


def dropout_mask(rng, shape, p: float, dtype):
    """Keep-mask already scaled by 1/(1-p), of ``dtype`` (a NumPy dtype or the backend's), on
    the Rng's backend; None when p == 0."""
    if p == 0:
        return None
    keep = keep_mask(rng, shape, p)
    if isinstance(keep, np.ndarray):
        return np.multiply(keep, np_dtype(dtype)(1.0 / (1.0 - p)), dtype=np_dtype(dtype))
    bk = backend_of(keep)
    return bk.xp.astype(keep, bk.dtype(np_dtype(dtype))) * (1.0 / (1.0 - p))


SQRT = {0.316: math.sqrt(0.1), 3.16: math.sqrt(10.0)}


def grid_std(v: float) -> float:
    """The published grids write sqrt(0.1) and sqrt(10) as 0.316 and 3.16."""
    return SQRT.get(v, v)


def activation_sweep(component, n_shared: int, published: dict):
    """The published ReLU/GeLU grid (450 points: the unnamed 2-level factor is taken as width d
    {100, 1000}); L = 2 tokens and ``n_shared`` token-shared draws per configuration, because the
    covariance noise is set by the shared component (relative size r sqrt(2 / N)), not by L."""
    from sigprop.mc.sweep import Case, SweepSpec
    from sigprop.state import Backward, Forward

    runs, tokens = 8, 2

    def case(pt: dict) -> Case:
        batch = batch_for(n_shared, pt["d"], runs)
        return Case({}, {"d": pt["d"], "L": tokens},
                    Forward(0.0, grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                    Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), runs, batch)

    return SweepSpec(
        component=component,
        grid={"x_std": (0.316, 1.0, 3.16), "x_corr": (0.0, 0.2, 0.4, 0.6, 0.8),
              "g_corr": (0.0, 0.2, 0.4, 0.6, 0.8), "g_std": (0.316, 1.0, 3.16), "d": (100, 1000)},
        make_case=case,
        note=("published 450-point grid with the unnamed 2-level factor taken as width d {100, 1000}; "
              f"L = 2 tokens, {n_shared:.0e} token-shared draws per configuration"),
        published=published,
    )
