"""Linear y = x W + b: Monte Carlo component and published sweep."""

from __future__ import annotations

import numpy as np

from sigprop.mc.backend import backend_of
from sigprop.mc.component import SEQ, Component
from sigprop.mc.components._util import batch_for, grid_std
from sigprop.mc.sampling import standard_normal
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward


class LinearMC(Component):
    name = "linear"
    rule = "linear"
    array_api = True

    def dims(self, params):
        return params.get("L", SEQ.default), params["d_in"], params["d_out"]

    def sample_weights(self, rng, params, dtype):
        W = standard_normal(rng, (params["d_in"], params["d_out"]), dtype)
        W *= float(params["w_std"])
        b_std = params.get("b_std", 0.0)
        b = standard_normal(rng, params["d_out"], dtype) * float(b_std) if b_std else None
        return {"W": W, "b": b}

    def forward(self, X, W, params, rng):
        # 2-D products: NumPy's stacked (B, L, d) @ (d, e) is several times slower than BLAS
        xp = backend_of(X).xp
        B, L, d = X.shape
        Y = xp.reshape(X, (B * L, d)) @ W["W"]
        if W["b"] is not None:
            Y += W["b"]
        return xp.reshape(Y, (B, L, Y.shape[-1])), W["W"]

    def backward(self, GY, W):
        xp = backend_of(GY).xp
        B, L, e = GY.shape
        return xp.reshape(xp.reshape(GY, (B * L, e)) @ W.T, (B, L, W.shape[0]))


COMPONENT = LinearMC()


def _case(pt: dict) -> Case:
    din, dout = pt["d_in"], pt["d_out"]
    rule = {"d_in": din, "d_out": dout, "w_std": pt["w_std_sqrt_din"] / np.sqrt(din), "b_std": 0.0}
    # A non-zero input mean becomes a per-feature offset mu * sum_a W_ak shared by every token
    # of a weight draw: only d_out independent values per draw.  Its share f of the output
    # variance has relative noise f * sqrt(2 / (runs * d_out)); choose runs to hold that
    # near 1%; the output mean's standard error, in output standard deviations, is about
    # sqrt(f / (runs * d_out)): hold that near 0.8% (at most 160 draws).  The batch gives the
    # token-shared input and gradient components >= 20000 samples (relative noise ~1%).
    x_var = grid_std(pt["x_std"]) ** 2
    f = pt["x_mean"] ** 2 / (x_var + pt["x_mean"] ** 2)
    runs = int(np.clip(np.ceil(max(2 * f**2 / 0.01**2, f / 0.008**2) / dout), 4, 160))
    batch = batch_for(20000, min(din, dout), runs)
    return Case(rule, {**rule, "L": pt["L"]},
                Forward(pt["x_mean"], grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), runs, batch)


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (0.1, 1.0, 10.0), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 1 / 3, 2 / 3), "g_std": (0.316, 1.0, 3.16),
        "d_in": (100, 316, 1000), "d_out": (100, 316, 1000), "L": (100, 1000),
        "w_std_sqrt_din": (0.1, 1.0, 10.0),
    },
    make_case=_case,
    published={"x_mean": (0.0, 0.4, 1.3), "x_var": (0.4, 1.4, 2.8), "g_var": (0.2, 1.0, 2.2),
               "x_corr": (0.4, 1.4, 2.8), "g_corr": (0.2, 1.0, 2.2)},
)
