"""Exact GeLU x Phi(x): Monte Carlo component and published sweep (theory.md section 7).

Forward uses :func:`sigprop.backend.numeric.Phi` (erfc approximation, fractional error
< 1.2e-7; no scipy), backward the exact derivative Phi(x) + x phi(x) cached by the forward.

Grid and sample-size design as for ReLU (see :mod:`sigprop.mc.components.relu`): the
published 450 configurations with the unnamed 2-level factor taken as width d {100, 1000},
L = 2 tokens, and N = 6e5 token-shared draws per configuration (the published runs used
1e5), because the published GeLU errors are about three times smaller than ReLU's.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop.backend.numeric import Phi
from sigprop.mc.component import Component
from sigprop.mc.components._util import activation_sweep

_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_CHUNK = 16384  # elements per Phi call in the forward


class GeLUMC(Component):
    name = "gelu"
    rule = "gelu"

    def dims(self, params):
        return params.get("L", 16), params["d"], params["d"]

    def forward(self, X, W, params, rng):
        # f(x) = x Phi(x) and f'(x) = Phi(x) + x phi(x) (kept for the backward).  Phi works in
        # float64 through ~30 elementwise passes, so it runs over cache-sized chunks (about
        # twice as fast as one pass over a large array).
        X = np.ascontiguousarray(X)
        Y, deriv = np.empty(X.shape, X.dtype), np.empty(X.shape, X.dtype)
        xf, yf, df = X.reshape(-1), Y.reshape(-1), deriv.reshape(-1)  # views
        for s in range(0, xf.size, _CHUNK):
            x = xf[s:s + _CHUNK]
            cdf = Phi(x)  # erfc approximation, fractional error < 1.2e-7
            yf[s:s + _CHUNK] = x * cdf
            df[s:s + _CHUNK] = cdf + x * (np.exp(-0.5 * np.square(x, dtype=cdf.dtype)) * _INV_SQRT_2PI)
        return Y, deriv

    def backward(self, GY, deriv):
        return GY * deriv

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 40.0 * batch * L * d


COMPONENT = GeLUMC()

SWEEP = activation_sweep(COMPONENT, 600_000, {"x_mean": (0.1, 1.0, 2.4), "x_var": (0.2, 0.6, 1.3), "g_var": (0.2, 0.6, 1.1),
     "x_corr": (0.1, 0.5, 1.2), "g_corr": (0.1, 0.4, 0.9)})
