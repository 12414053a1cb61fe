"""Softmax over a row of L logits: Monte Carlo component and sweeps.

X has shape (B, L, 1): each of the B sequences is one row of L logits (the L "tokens"),
normalised over the token axis.  No weights.  Backward (hand-written):
dX = P * (G - sum_k P_k G_k), row by row.

Sample sizes.  The rule is exact, so the sweep error is Monte Carlo noise alone.  The
variance estimate averages the row statistic Q = sum_j P_j^2 over rows; its relative noise
per row, n_x = sd(Q) / (L var P), is known exactly from the softmax moments
(Var Q = L E P^4 + L (L-1) E P_1^2 P_2^2 - (L E P^2)^2), and is sqrt(2/(L-1)) for small
logit variance (then Q - 1/L is a scaled chi-square).  The gradient row statistic was
measured to be 0.95-1.3x as noisy (8 configurations across the extended grid).  Each case takes rows = (1.3 n_x / tau)^2 for a
relative standard error tau = 0.2%, relaxed up to 1.5% where that would need more than 2e7
logits (only at large logit variance and long rows: extended grid), split into runs of at
most 4e6 logits.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop.backend import numeric
from sigprop.mc.backend import backend_of
from sigprop.mc.component import Component
from sigprop.mc.components._util import grid_std
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.rules.softmax_moments import softmax_expect, softmax_expect_sum
from sigprop.state import Backward, Forward


class SoftmaxMC(Component):
    name = "softmax"
    rule = "softmax"
    array_api = True
    weights = False

    def dims(self, params):
        return params["L"], 1, 1

    def forward(self, X, W, params, rng):
        # exp(x - max) / sum: the standard has no softmax
        bk = backend_of(X)
        xp = bk.xp
        P = bk.exp_(X - xp.max(X, axis=1, keepdims=True))
        P /= xp.sum(P, axis=1, keepdims=True)
        return P, P

    def backward(self, GY, P):
        xp = backend_of(GY).xp
        GX = GY - xp.sum(P * GY, axis=1, keepdims=True)
        GX *= P
        return GX

    def flops(self, params, batch):
        return 10.0 * batch * params["L"]


COMPONENT = SoftmaxMC()

#: most logits in one run (memory bound: a few float32 arrays of this size)
_MAX_PER_RUN = 4_000_000
#: gradient row noise / forward row noise, measured (<= 1.3 over the extended grid)
_GRAD_NOISE = 1.3
#: target relative noise of var and grad var, its relaxed maximum, and the logit budget
#: beyond which the target is relaxed
_TAU, _TAU_MAX, _BUDGET = 0.002, 0.015, 2e7


def row_noise(v: float, L: int) -> float:
    """Relative standard deviation, per row, of sum_j P_j^2 - 1/L around L var(P)."""
    if v < 0.3:  # small-variance limit (the exact expression cancels there)
        return math.sqrt(2.0 / (L - 1))
    ep2 = softmax_expect(numeric, v, L, ((2, 0),))
    var = softmax_expect_sum(numeric, v, L, [((L - 1) / L, ((2, 0),)),
                                              (-(L - 1) / L, ((1, 0), (1, 0)))])
    eq2 = softmax_expect_sum(numeric, v, L, [(L, ((4, 0),)), (L * (L - 1), ((2, 0), (2, 0)))])
    return float(math.sqrt(max(eq2 - (L * ep2) ** 2, 0.0)) / (L * var))


def _sizes(v: float, L: int) -> tuple[int, int]:
    """(runs, batch): relative noise 0.2%, relaxed (up to 1.5%) where that would need more
    than 2e7 logits (heavy-tailed rows: large logit variance and long rows)."""
    n = _GRAD_NOISE * row_noise(v, L)
    rows = min((n / _TAU) ** 2, max(_BUDGET / L, (n / _TAU_MAX) ** 2))
    rows = math.ceil(rows)
    runs = max(8, math.ceil(rows * L / _MAX_PER_RUN))
    return runs, max(1, math.ceil(rows / runs))


def _case(pt: dict) -> Case:
    L = int(pt["L"])
    s2 = grid_std(pt["x_std"]) ** 2
    runs, batch = _sizes((1 - pt["x_corr"]) * s2, L)
    return Case({"L": L}, {"L": L}, Forward(0.0, s2, pt["x_corr"]),
                Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), runs, batch)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": tuple(float(s) for s in np.logspace(-2, 0, 5)),
        "L": tuple(int(round(l)) for l in np.geomspace(300, 10000, 5)),
        "x_corr": (0.0, 0.2, 0.4, 0.6, 0.8),
        "g_std": (0.316, 1.0, 3.16),
        "g_corr": (0.0, 1 / 3, 2 / 3),
    },
    make_case=_case,
    published={"x_mean": (0.0, 0.0, 0.0), "x_var": (0.1, 0.5, 2.6), "g_var": (0.1, 0.6, 3.7),
               "x_corr": None, "g_corr": None},
    note=("Published grid: logit std 0.01..1 (5 log-spaced), L 300..10000 (5 log-spaced); "
          "r 0..0.8 (step 0.2), rg {0, 1/3, 2/3}, grad std {0.316, 1, 3.16}.  Rows per case "
          "sized for 0.2% relative noise (published: 1e4 rows): 8.5e5 to 2e7 logits."),
)

SWEEP.variants["extended"] = {
    "grid": {
        "x_std": (0.1, 0.3, 1.0, 1.5, 2.0, 2.5, 3.0),
        "L": (32, 100, 300, 1000, 3000, 10000),
        "x_corr": (0.0, 0.2, 0.4, 0.6, 0.8),
        "g_std": (1.0,),
        "g_corr": (0.0, 1 / 3, 2 / 3),
    },
    "note": ("Extended grid: logit std up to 3 (logit variance 9, where the published forms "
             "are off by 2x and more) and L from 32; target p99 <= 5% for var and grad var. "
             "Rows per case: 0.2% relative noise, relaxed up to 1.5% where that would "
             "need more than 2e7 logits; at most ~2.6e8 logits (std >= 2, L = 10000, small r)."),
}
