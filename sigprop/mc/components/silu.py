"""SiLU x sigmoid(x): Monte Carlo component and sweep grid.

Forward x sigmoid(x) with sigmoid(x) = (1 + tanh(x/2))/2 (no overflow in float32); backward
the exact derivative sigmoid(x) (1 + x (1 - sigmoid(x))), cached by the forward.

Grid and sample sizes as for ReLU and GeLU (:mod:`sigprop.mc.components.relu`): there is no
published SiLU figure, so the same 450-point activation grid is used (input std {0.316, 1,
3.16}, r and rg {0, .2, .4, .6, .8}, grad std {0.316, 1, 3.16}, width d {100, 1000}), L = 2
tokens and 6e5 token-shared draws per configuration.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sigprop.mc.component import Component
from sigprop.mc.components._util import activation_sweep

_CHUNK = 65536


class SiLUMC(Component):
    name = "silu"
    rule = "silu"

    def dims(self, params):
        return params.get("L", 16), params["d"], params["d"]

    def forward(self, X, W, params, rng):
        X = np.ascontiguousarray(X)
        dt = X.dtype.type
        Y, deriv = np.empty_like(X), np.empty_like(X)
        xf, yf, df = X.reshape(-1), Y.reshape(-1), deriv.reshape(-1)
        for s in range(0, xf.size, _CHUNK):      # cache-sized chunks
            x = xf[s:s + _CHUNK]
            sg = np.tanh(x * dt(0.5))
            sg += dt(1.0)
            sg *= dt(0.5)                         # sigmoid(x)
            np.multiply(x, sg, out=yf[s:s + _CHUNK])
            t = dt(1.0) - sg
            t *= x
            t += dt(1.0)
            np.multiply(sg, t, out=df[s:s + _CHUNK])
        return Y, deriv

    def backward(self, GY, deriv):
        return GY * deriv

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 20.0 * batch * L * d


COMPONENT = SiLUMC()

SWEEP = dataclasses.replace(
    activation_sweep(COMPONENT, 600_000, {m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")}),
    note=("ReLU/GeLU's published 450-point grid (no SiLU figures are published), width d {100, 1000}; "
          "L = 2 tokens, 6e+05 token-shared draws per configuration"))
