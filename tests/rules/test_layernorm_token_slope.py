"""The norms' per-token gradient slope (LayerNorm ``g_slope``, RMSNorm ``g_slope_rms``) and
the slope's recursion down a pre-norm unit (sigprop.rules.layernorm.token_slope_below),
against seeded Monte Carlo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from sigprop.rules import get
from sigprop.rules.layernorm import token_slope_below, token_slope_factor
from sigprop.state import Backward, Forward
from sigprop.symbols import symbol


def _ln_forward(x, eps, centre=True):
    a = x - x.mean(-1, keepdims=True) if centre else x
    s = (a * a).mean(-1, keepdims=True)
    sig = np.sqrt(s + eps)
    return a / sig, sig, s[..., 0]


def _ln_backward(g, y, sig, centre=True):
    out = g - y * (g * y).mean(-1, keepdims=True)
    if centre:
        out = out - g.mean(-1, keepdims=True)
    return out / sig


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_gradient_scaling_with_the_token_variance(norm):
    """An upstream gradient whose per-token mean square is S/s_t (s_t the token's own
    per-token variance, S its mean: slope -1) comes out larger by 2 kappa/(d-1) (RMSNorm:
    2/d) than an independent one; the rule with slope -1 gets it, slope 0 misses it."""
    d, T, var, eps = 64, 40000, 1e-3, 1e-5
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, math.sqrt(var), (T, d))
    centre = norm == "layernorm"
    y, sig, s = _ln_forward(x, eps, centre)
    g = rng.normal(0.0, 1.0, (T, d)) * np.sqrt(s.mean() / s)[:, None]
    measured = float((_ln_backward(g, y, sig, centre) ** 2).mean())
    name = "g_slope" if centre else "g_slope_rms"
    rule = get(norm)
    gin = Backward(float((g * g).mean()), 0.0)
    x_state = Forward(0.0, var, 0.0)
    new = rule.evaluate(x_state, gin, d=d, eps=eps, **{name: -1.0})[1].var
    old = rule.evaluate(x_state, gin, d=d, eps=eps)[1].var
    se = measured * math.sqrt(2.0 / (T * d)) * 3          # generous: tokens' spread
    assert abs(measured / new - 1) < max(0.008, se / measured)
    assert measured / old - 1 > 0.025                       # ~2/(d-1) = 3.2% missed without it


def test_factor_symbolic_equals_numeric():
    rule = get("layernorm")
    expr = rule.symbolic()["g_var"]
    vals = {"x_var": 2e-3, "x_corr": 0.3, "x_mean": 0.0, "g_var": 1.5, "g_corr": 0.2, "d": 48, "eps": 1e-5,
            "centred": 0.0, "kappa": 1.0, "g_generic": 1.0, "g_slope": -0.8}
    sub = {symbol(k): v for k, v in vals.items() if k not in ("x_var", "g_var")}
    sub[symbol("x_std")] = math.sqrt(vals["x_var"])
    sub[symbol("g_std")] = math.sqrt(vals["g_var"])
    sym = float(sp.N(expr.subs(sub)))
    num = rule.evaluate(Forward(0.0, vals["x_var"], 0.3), Backward(1.5, 0.2),
                        **{k: vals[k] for k in ("d", "eps", "centred", "kappa", "g_generic", "g_slope")})[1].var
    assert sym == pytest.approx(num, rel=1e-12)
    assert token_slope_factor(0.0, 0.1, 1.0, 0.0) == 1.0


def _gelu(h):
    from math import erf
    return h * 0.5 * (1 + np.vectorize(erf)(h / math.sqrt(2)))


def _gelu_prime(h):
    from math import erf
    return 0.5 * (1 + np.vectorize(erf)(h / math.sqrt(2))) + h * np.exp(-h * h / 2) / math.sqrt(2 * math.pi)


def test_slope_below_a_pre_ln_unit_and_a_final_norm():
    """x' = x + W2 gelu(W1 LN(x)), then a final LN, an independent gradient at the top:
    below the final norm the gradient's per-token mean square has slope -1 on the top
    stream's per-token variance; the unit's LN sees slope_out times the skip share, and below
    the unit it is that minus the branch gradient's share (token_slope_below).  Regression
    slopes over tokens, pooled over 24 weight draws (seed 5)."""
    d, dff, T, eps, var0 = 32, 128, 512, 0.0, 1e-3
    s1, s2 = 0.08, 0.01
    rng = np.random.default_rng(5)
    num_norm = num_in = den = 0.0
    pred_norm = pred_in = 0.0
    draws = 24
    for _ in range(draws):
        W1 = rng.normal(0, s1, (dff, d))
        W2 = rng.normal(0, s2, (d, dff))
        x = rng.normal(0, math.sqrt(var0), (T, d))
        y, sig, s_in = _ln_forward(x, eps)
        h = y @ W1.T
        x2 = x + _gelu(h) @ W2.T
        yN, sigN, s_out = _ln_forward(x2, eps)
        g = _ln_backward(rng.normal(0, 1, (T, d)), yN, sigN)        # gradient at the unit's output
        gb = _ln_backward((_gelu_prime(h) * (g @ W2)) @ W1, y, sig)  # its branch part below
        gin = g + gb
        e_in = s_in / s_in.mean() - 1
        eta_out = (g * g).mean(1) / (g * g).mean() - 1
        eta_in = (gin * gin).mean(1) / (gin * gin).mean() - 1
        num_norm += (eta_out * e_in).mean()
        num_in += (eta_in * e_in).mean()
        den += (e_in * e_in).mean()
        skip_share = s_in.mean() / s_out.mean()
        gain = (gb * gb).mean() / (g * g).mean()
        a, b = token_slope_below(-1.0, skip_share, gain / (1 + gain), s_in.mean(), eps)
        pred_norm += a / draws
        pred_in += b / draws
    assert pred_in < pred_norm - 0.05               # the branch's share is not negligible here
    assert num_norm / den == pytest.approx(pred_norm, abs=0.03)
    assert num_in / den == pytest.approx(pred_in, abs=0.03)
