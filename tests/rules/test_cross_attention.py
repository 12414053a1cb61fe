"""Cross-attention (encoder-decoder): the rule against its Monte Carlo component, the component's
hand-written backward against central differences, the rule's limit of self-attention, its
symbolic form, its domain."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.mc.component import check
from sigprop.mc.components import get as component
from sigprop.rules import REGISTRY
from sigprop.rules import cross_attention as X
from sigprop.state import Backward, Forward


def _params(d=256, H=4, dh=64, L=16, Lk=64, wqk=0.6, p=0.0, qk=0, bias=0.0):
    return dict(d=d, n_heads=H, d_head=dh, L=L, L_enc=Lk, q_std=wqk / math.sqrt(d), k_std=wqk / math.sqrt(d),
                v_std=1 / math.sqrt(d), o_std=1 / math.sqrt(H * dh), p=p, qk_norm=qk,
                q_bias_std=bias, k_bias_std=bias, v_bias_std=bias, o_bias_std=bias)


@pytest.mark.parametrize("qk", [0, 1, 2])
def test_component_backward_matches_central_differences(qk):
    """Both gradients of the hand-written backward (into the queries' input and into the
    encoder output) against central differences of the forward, float64, with biases."""
    comp = component("cross_attention")
    prm = _params(d=12, H=2, dh=4, L=3, Lk=5, wqk=1.5, qk=qk, bias=0.3)
    rng = np.random.default_rng(0)
    W = comp.sample_weights(rng, prm, np.float64)
    Xq, E = rng.standard_normal((2, 3, 12)), rng.standard_normal((2, 5, 12))
    G = rng.standard_normal((2, 3, 12))
    _, cache = comp.forward_pair(Xq, E, W, prm, rng)
    gx, ge = comp.backward_pair(G, cache)

    def loss(a, b):
        return float(np.sum(comp.forward_pair(a, b, W, prm, rng)[0] * G))

    h = 1e-6
    for arr, grad, which in ((Xq, gx, 0), (E, ge, 1)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            up, dn = arr.copy(), arr.copy()
            up[idx] += h
            dn[idx] -= h
            num[idx] = ((loss(up, E) - loss(dn, E)) if which == 0 else (loss(Xq, up) - loss(Xq, dn))) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-8)


def test_rule_reduces_to_self_attention():
    """With the queries' input equal to the encoder output and L = L_enc the output is the
    attention rule's, and the two gradients add up to the attention rule's input gradient
    (its query path, and its value and key paths), variance and covariance."""
    x, g = Forward(0.1, 1.3, 0.3), Backward(1.7, 0.4)
    prm = _params(L=32, Lk=32, p=0.1, bias=0.05)
    att = {k: v for k, v in prm.items() if k != "L_enc"}
    ya, ga = REGISTRY["attention"].evaluate(x, g, **att)
    y, gx, ge = X.evaluate(x, x, g, **prm)
    assert float(y.var) == pytest.approx(float(ya.var), rel=1e-12)
    assert float(y.corr) == pytest.approx(float(ya.corr), rel=1e-12)
    assert float(gx.var + ge.var) == pytest.approx(float(ga.var), rel=1e-12)
    assert float(gx.var * gx.corr + ge.var * ge.corr) == pytest.approx(float(ga.var * ga.corr), rel=1e-12)


#: (query-side input, encoder output, decoder length, encoder length, dropout, QK-norm)
_MC_CASES = [
    (Forward(0.0, 1.0, 0.3), Forward(0.0, 2.0, 0.5), 16, 64, 0.0, 0),
    (Forward(0.0, 1.0, 0.0), Forward(0.2, 1.0, 0.3), 96, 16, 1 / 3, 0),
    (Forward(0.0, 1.0, 0.5), Forward(0.0, 1.0, 0.0), 32, 48, 0.0, 2),
]


@pytest.mark.parametrize("side", ["cross_attention", "cross_attention_kv"])
@pytest.mark.parametrize("case", range(len(_MC_CASES)))
def test_rule_agrees_with_monte_carlo(side, case):
    """check-component's default tolerance (5% or 4 SE on the variances, 0.03 on the
    correlations) at decoder and encoder lengths that differ, with dropout and QK-norm: the
    gradient into the decoder stream (query side) and into the encoder output (key/value side,
    collected over the decoder's rows: L / L_enc times the self-attention form)."""
    xq, xe, L, Lk, p, qk = _MC_CASES[case]
    prm = _params(L=L, Lk=Lk, p=p, qk=qk, wqk=1.0 if qk else 0.6)
    if side == "cross_attention":
        prm.update(enc_mean=xe.mean, enc_var=xe.var, enc_corr=xe.corr)
        x = xq
    else:
        prm.update(dec_mean=xq.mean, dec_var=xq.var, dec_corr=xq.corr)
        x = xe
    res = check(side, prm, x, Backward(1.0, 0.5), trials=8, batch=24, seed=case, dtype=np.float64)
    assert res.passed, (res.predicted, res.measured, res.se)


def test_monte_carlo_check_can_fail():
    """The comparison above sees a wrong length ratio: the key/value gradient evaluated as if
    the encoder had as many tokens as the decoder (L_enc = L) is refused by the same check."""
    xq, xe = Forward(0.0, 1.0, 0.3), Forward(0.0, 2.0, 0.5)
    prm = _params(L=16, Lk=64)
    meas = check("cross_attention_kv", {**prm, "dec_mean": 0.0, "dec_var": 1.0, "dec_corr": 0.3}, xe,
                 Backward(1.0, 0.5), trials=8, batch=24, seed=0, dtype=np.float64)
    _, _, wrong = X.evaluate(xq, xe, Backward(1.0, 0.5), **{**prm, "L_enc": 16})
    assert abs(float(wrong.var) / meas.measured["g_var"] - 1) > 0.5


@functools.lru_cache(maxsize=None)
def _symbolic(name):
    return REGISTRY[name].symbolic()


@pytest.mark.parametrize("name", ["cross_attention", "cross_attention_kv"])
@pytest.mark.parametrize("qk", [0, 2])
def test_symbolic_agrees_with_the_numeric_rule(name, qk):
    """One definition: the symbolic outputs, evaluated with the numeric primitives
    (sigprop.backend.symbolic.evaluate), reproduce the numeric rule to 1e-10."""
    import sigprop.backend.symbolic as sm
    from sigprop import symbols

    rule = REGISTRY[name]
    pf = rule.prefix
    prm = {**_params(d=128, H=4, dh=32, L=24, Lk=40, wqk=0.5, p=0.1, qk=qk, bias=0.05),
           f"{pf}_mean": 0.2, f"{pf}_var": 1.4, f"{pf}_corr": 0.35, "qk_eps": 1e-5}
    x, g = Forward(-0.1, 0.8, 0.25), Backward(1.3, 0.3)
    y, gb = rule.evaluate(x, g, **prm)
    num = {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": gb.var, "g_corr": gb.corr}
    vals = {symbols.symbol("x_std"): math.sqrt(x.var), symbols.symbol("x_corr"): x.corr,
            symbols.symbol("x_mean"): x.mean, symbols.symbol("g_std"): math.sqrt(g.var),
            symbols.symbol("g_corr"): g.corr, symbols.symbol(f"{pf}_std"): math.sqrt(prm[f"{pf}_var"])}
    vals.update({symbols.symbol(k): v for k, v in prm.items() if k != f"{pf}_var"})
    for key, expr in _symbolic(name).items():
        val = float(sm.evaluate(expr, vals))
        assert val == pytest.approx(float(num[key]), rel=1e-10, abs=1e-14), (key, val, num[key])


@pytest.mark.parametrize("bad", [{"enc_corr": 1.5}, {"enc_corr": -0.1}, {"enc_var": -1.0}, {"L_enc": 1}])
def test_domain(bad):
    prm = {**_params(), "enc_mean": 0.0, "enc_var": 1.0, "enc_corr": 0.2, **bad}
    with pytest.raises(DomainError):
        REGISTRY["cross_attention"].evaluate(Forward(0.0, 1.0, 0.2), Backward(1.0, 0.0), **prm)
