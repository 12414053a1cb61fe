"""LayerNorm (gain 1, bias 0): Monte Carlo component and published sweep."""

from __future__ import annotations

import math

import numpy as np

from sigprop.mc.component import Component
from sigprop.mc.components._util import grid_std
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward


class LayerNormMC(Component):
    name = "layernorm"
    rule = "layernorm"

    def dims(self, params):
        return params.get("L", 16), params["d"], params["d"]

    def forward(self, X, W, params, rng):
        dt = X.dtype.type
        eps = params.get("eps", 1e-5)
        d = X.shape[-1]
        Z = X - X.mean(axis=-1, keepdims=True)
        ss = np.einsum("...f,...f->...", Z, Z)
        inv = 1.0 / np.sqrt(ss / d + eps)             # 1 / sigma_t, one per token
        inv = inv.astype(dt, copy=False)[..., None]
        Z *= inv                                       # Z is now the output Y
        return Z, (Z, inv)

    def backward(self, GY, cache):
        # dy/dx = (1/sigma) (P - y y^T / d):  gx = (g - mean_f g - y mean_f(y g)) / sigma
        Y, inv = cache
        d = Y.shape[-1]
        yg = (np.einsum("...f,...f->...", Y, GY) / d).astype(Y.dtype, copy=False)[..., None]
        GX = GY - GY.mean(axis=-1, keepdims=True)
        GX -= Y * yg
        GX *= inv
        return GX

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 15.0 * batch * L * d


COMPONENT = LayerNormMC()


# --- sample sizes -------------------------------------------------------------------------
# Per sequence (L tokens sharing one correlated component), the estimates fluctuate mostly
# through the shared components: |c|^2/d and |h|^2/d have relative std sqrt(2/d).  To first
# order (measured, scratch calibration) the per-sequence standard deviations, in the units
# the error metric uses, are
#   output cov  ~ sqrt(2/d) r (1-r)                   (normalisation cancels most of |c|^2)
#   grad var    ~ sqrt(2/d) sqrt(r^2 + rg^2)          (relative)
#   grad cov    ~ sqrt(2/d) rg sqrt(1 + r^2)          (over the gradient variance)
# plus pair noise ~ sqrt(2/d)/L.  We choose the number of sequences so that the standard
# error of every moment is at most TARGET_SE (fractions), keeping p99 well below the
# published figures without simulating more than needed.
TARGET_SE = {"x_corr": 0.0025, "g_var": 0.008, "g_corr": 0.006}
RUNS = 4


def _sequences(d: int, L: int, r: float, rg: float) -> int:
    base = 2.0 / d
    pair = (1.0 / L) ** 2 + 1.0 / (L * d)
    need = max(
        (base * (r * (1 - r)) ** 2 + base * pair) / TARGET_SE["x_corr"] ** 2,
        (base * (r**2 + rg**2) + base * pair) / TARGET_SE["g_var"] ** 2,
        (base * rg**2 * (1 + r**2) + base * pair) / TARGET_SE["g_corr"] ** 2,
    )
    return max(RUNS * 2, int(math.ceil(need)))


def _case(pt: dict) -> Case:
    d, L = pt["d"], pt["L"]
    rule = {"d": d, "eps": 1e-5}
    nseq = _sequences(d, L, pt["x_corr"], pt["g_corr"])
    batch = int(math.ceil(nseq / RUNS))
    return Case(rule, {**rule, "L": L},
                Forward(pt["x_mean"], grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), RUNS, batch)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (-10.0, -3.33, 3.33), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 1 / 3, 2 / 3), "g_std": (0.316, 1.0, 3.16),
        "d": (100, 316, 1000), "L": (100, 1000),
    },
    make_case=_case,
    published={"x_mean": (0.0, 0.0, 0.0), "x_var": (0.0, 0.0, 0.0), "g_var": (0.4, 1.5, 3.2),
               "x_corr": (0.1, 0.5, 1.0), "g_corr": (0.2, 0.9, 2.2)},
    note="Sample sizes adapt to the predicted noise of each point (see TARGET_SE).",
)
