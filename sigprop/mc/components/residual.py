"""Residual x' = a x + b y with an independent branch: Monte Carlo component and sweep.

The component samples its own branch y (mean/var/corr from the parameters) independent of
x, as the rule assumes; the gradient reported is the skip path's (to x).
"""

from __future__ import annotations

from sigprop.mc.component import SEQ, WIDTH, Component
from sigprop.mc.components._util import batch_for, grid_std
from sigprop.mc.sampling import correlated
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward


class ResidualMC(Component):
    name = "residual"
    rule = "residual"
    array_api = True
    weights = False
    sim_params = (SEQ, WIDTH)

    def dims(self, params):
        return params.get("L", SEQ.default), params.get("d", WIDTH.default), params.get("d", WIDTH.default)

    def forward(self, X, W, params, rng):
        Y = correlated(rng, X.shape, params["y_mean"], params["y_var"], params["y_corr"], X.dtype)
        return params["a"] * X + params["b"] * Y, params["a"]

    def backward(self, GY, a):
        return a * GY

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 4.0 * batch * L * d


COMPONENT = ResidualMC()


def _case(pt: dict) -> Case:
    rule = {"a": pt["a"], "b": pt["b"], "y_mean": pt["y_mean"], "y_var": pt["y_var"], "y_corr": pt["y_corr"]}
    runs = 8
    batch = batch_for(40000, pt["d"], runs)
    return Case(rule, {**rule, "d": pt["d"], "L": pt["L"]},
                Forward(pt["x_mean"], grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), runs, batch)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (0.0, 1.0), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 2 / 3), "g_std": (1.0,), "d": (100, 1000), "L": (100,),
        "a": (0.5, 1.0), "b": (0.1, 1.0), "y_mean": (0.0, -1.0), "y_var": (0.1, 1.0, 10.0),
        "y_corr": (0.0, 0.5, 0.9),
    },
    make_case=_case,
    published={m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")},
    note="No published grid: sigprop's own.",
)
