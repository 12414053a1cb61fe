"""RMSNorm (gain 1): Monte Carlo component and sweep grid (sigprop's own; none is published).

Grid: input std {0.316, 1, 3.16} x input mean {-3.33, 0, 1} (RMSNorm keeps the mean, so
mean/std ratios from 0 to 10.5) x r, rg {0, 1/3, 2/3} x grad std {0.316, 1, 3.16} x
d {100, 316, 1000} x L {16, 128}; eps 1e-6.  Sample sizes follow LayerNorm's noise model
(:mod:`sigprop.mc.components.layernorm`), with at least 4e5 / d sequences.
"""

from __future__ import annotations

import math

from sigprop.mc.backend import backend_of
from sigprop.mc.component import SEQ, Component
from sigprop.mc.components.layernorm import _sequences, inverse_rms, norm_backward, norm_case
from sigprop.mc.sweep import Case, SweepSpec


class RMSNormMC(Component):
    """y = x / sqrt(mean_f x^2 + eps) per token (as torch.nn.RMSNorm and LLaMA's RMSNorm),
    gain 1; params: d, eps (default 1e-6), L."""

    name = "rmsnorm"
    rule = "rmsnorm"
    array_api = True
    weights = False

    def dims(self, params):
        return params.get("L", SEQ.default), params["d"], params["d"]

    def forward(self, X, W, params, rng):
        bk = backend_of(X)
        inv = inverse_rms(bk, X, params.get("eps", 1e-6))    # 1 / rho_t, one per token
        Y = X * inv
        return Y, (Y, inv)

    def backward(self, GY, cache):
        # dy/dx = (I - y y^T / d) / rho:  gx = (g - y mean_f(y g)) / rho
        return norm_backward(GY, cache, centred=False)

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 10.0 * batch * L * d


COMPONENT = RMSNormMC()


def _case(pt: dict) -> Case:
    d = pt["d"]
    return norm_case(pt, 1e-6, max(_sequences(d, pt["L"], pt["x_corr"], pt["g_corr"]), int(math.ceil(4e5 / d))))


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (-3.33, 0.0, 1.0), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 1 / 3, 2 / 3), "g_std": (0.316, 1.0, 3.16),
        "d": (100, 316, 1000), "L": (16, 128),
    },
    make_case=_case,
    published={m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")},
    note="Own grid (no published one); sample sizes as for LayerNorm, at least 4e5/d sequences.",
)
