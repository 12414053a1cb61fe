"""QK-norm attention backward: every query's and key's gradient is divided by its own
squared scale, whose inverse averages to n/(n - 2) times the inverse average (inverse
chi-square, n = d_head degrees of freedom for RMSNorm).  Seeded Monte Carlo of the attention
component at a small head width, where that factor is large (16/14)."""

from __future__ import annotations

import numpy as np

from sigprop.mc.component import check
from sigprop.state import Backward, Forward


def test_qknorm_gradient_variance_small_head():
    params = dict(d=128, n_heads=4, d_head=16, qk_norm=2, L=16, q_std=0.09, k_std=0.09, v_std=0.09,
                  o_std=0.09)
    r = check("attention", params, Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), trials=64, batch=8, seed=1,
              dtype=np.float64)
    pred, meas, se = r.predicted["g_var"], r.measured["g_var"], r.se["g_var"]
    # without the inverse-scale factor the rule was 7% low here (12 standard errors)
    assert abs(pred - meas) < max(0.015 * meas, 3 * se), (pred, meas, se)
