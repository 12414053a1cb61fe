"""Dropout: Monte Carlo component and published sweep."""

from __future__ import annotations

from sigprop.mc.component import SEQ, WIDTH, Component
from sigprop.mc.components._util import batch_for, dropout_mask, grid_states
from sigprop.mc.sweep import Case, SweepSpec


class DropoutMC(Component):
    name = "dropout"
    rule = "dropout"
    array_api = True
    weights = False
    sim_params = (SEQ, WIDTH)

    def dims(self, params):
        return params.get("L", SEQ.default), params.get("d", WIDTH.default), params.get("d", WIDTH.default)

    def forward(self, X, W, params, rng):
        mask = dropout_mask(rng, X.shape, params["p"], X.dtype)
        return (X if mask is None else X * mask), mask

    def backward(self, GY, mask):
        return GY if mask is None else GY * mask

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 2.0 * batch * L * d


COMPONENT = DropoutMC()


def _case(pt: dict) -> Case:
    runs = 8
    batch = batch_for(40000, pt["d"], runs)
    return Case({"p": pt["p"]}, {"p": pt["p"], "d": pt["d"], "L": pt["L"]}, *grid_states(pt), runs, batch)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (-10.0, 0.0, 10.0), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 1 / 3, 2 / 3), "g_std": (0.316, 1.0, 3.16),
        "d": (100, 316, 1000), "L": (100, 1000), "p": (0.0, 1 / 3, 2 / 3),
    },
    make_case=_case,
    published={"x_mean": (0.0, 0.1, 0.5), "x_var": (0.1, 0.5, 1.5), "g_var": (0.1, 0.7, 1.5),
               "x_corr": (0.0, 0.4, 1.3), "g_corr": (0.1, 0.5, 1.2)},
)
