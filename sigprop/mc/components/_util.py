"""Helpers shared by the component modules."""

from __future__ import annotations

import math

import numpy as np

from sigprop.mc.backend import backend_of, np_dtype
from sigprop.mc.component import SEQ, WIDTH, Component
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


def grid_states(pt: dict):
    """Input Forward and incoming Backward of a grid point: x_mean (0 if not in the grid),
    x_std, x_corr, g_std, g_corr, with 0.316 and 3.16 read as sqrt(0.1) and sqrt(10)."""
    from sigprop.state import Backward, Forward

    return (Forward(pt.get("x_mean", 0.0), grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
            Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]))


def activation_sweep(component, n_shared: int, published: dict):
    """The published ReLU/GeLU grid (450 points: the unnamed 2-level factor is taken as width d
    {100, 1000}); L = 2 tokens and ``n_shared`` token-shared draws per configuration, because the
    covariance noise is set by the shared component (relative size r sqrt(2 / N)), not by L."""
    from sigprop.mc.sweep import Case, SweepSpec

    runs, tokens = 8, 2

    def case(pt: dict) -> Case:
        batch = batch_for(n_shared, pt["d"], runs)
        return Case({}, {"d": pt["d"], "L": tokens}, *grid_states(pt), runs, batch)

    return SweepSpec(
        component=component,
        grid={"x_std": (0.316, 1.0, 3.16), "x_corr": (0.0, 0.2, 0.4, 0.6, 0.8),
              "g_corr": (0.0, 0.2, 0.4, 0.6, 0.8), "g_std": (0.316, 1.0, 3.16), "d": (100, 1000)},
        make_case=case,
        note=("published 450-point grid with the unnamed 2-level factor taken as width d {100, 1000}; "
              f"L = 2 tokens, {n_shared:.0e} token-shared draws per configuration"),
        published=published,
    )


class PointwiseActivation(Component):
    """An elementwise activation without weights: dims (L, d, d) from params L and d (the
    simulation sizes), backward GY * f'(x) with f'(x) cached by the forward."""

    weights = False
    sim_params = (SEQ, WIDTH)

    def dims(self, params):
        d = params.get("d", WIDTH.default)
        return params.get("L", SEQ.default), d, d

    def backward(self, GY, deriv):
        return GY * deriv


def pointwise_chunks(X, kernel, chunk: int):
    """(Y, deriv) of a NumPy array X: ``kernel(x, y, dy)`` fills the views y = f(x) and
    dy = f'(x) for each ``chunk``-element slice x of X (cache-sized passes)."""
    X = np.ascontiguousarray(X)
    Y, deriv = np.empty(X.shape, X.dtype), np.empty(X.shape, X.dtype)
    xf, yf, df = X.reshape(-1), Y.reshape(-1), deriv.reshape(-1)
    for s in range(0, xf.size, chunk):
        kernel(xf[s:s + chunk], yf[s:s + chunk], df[s:s + chunk])
    return Y, deriv
