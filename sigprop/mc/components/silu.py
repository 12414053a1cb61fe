"""SiLU x sigmoid(x): Monte Carlo component and sweep grid.

Forward x sigmoid(x) with sigmoid(x) = (1 + tanh(x/2))/2 (no overflow in float32); backward
the exact derivative sigmoid(x) (1 + x (1 - sigmoid(x))), cached by the forward.  NumPy arrays
go through a chunked in-place kernel, other array-API backends through the same operations
on whole arrays.

Grid and sample sizes as for ReLU and GeLU (:mod:`sigprop.mc.components.relu`): there is no
published SiLU figure, so the same 450-point activation grid is used (input std {0.316, 1,
3.16}, r and rg {0, .2, .4, .6, .8}, grad std {0.316, 1, 3.16}, width d {100, 1000}), L = 2
tokens and 6e5 token-shared draws per configuration.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sigprop.mc.backend import backend_of
from sigprop.mc.components._util import PointwiseActivation, activation_sweep, pointwise_chunks

_CHUNK = 65536


def _silu_kernel(x, y, dy):
    dt = x.dtype.type
    sg = np.tanh(x * dt(0.5))
    sg += dt(1.0)
    sg *= dt(0.5)                         # sigmoid(x)
    np.multiply(x, sg, out=y)
    t = dt(1.0) - sg
    t *= x
    t += dt(1.0)
    np.multiply(sg, t, out=dy)


class SiLUMC(PointwiseActivation):
    name = "silu"
    rule = "silu"
    array_api = True

    def forward(self, X, W, params, rng):
        bk = backend_of(X)
        if bk.is_numpy:
            return pointwise_chunks(X, _silu_kernel, _CHUNK)
        sg = (bk.xp.tanh(X * 0.5) + 1.0) * 0.5        # sigmoid(x)
        return X * sg, sg * ((1.0 - sg) * X + 1.0)

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 20.0 * batch * L * d


COMPONENT = SiLUMC()

SWEEP = dataclasses.replace(
    activation_sweep(COMPONENT, 600_000, {m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")}),
    note=("ReLU/GeLU's published 450-point grid (no SiLU figures are published), width d {100, 1000}; "
          "L = 2 tokens, 6e+05 token-shared draws per configuration"))
