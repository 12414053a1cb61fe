"""Attention's modern features: grouped-query heads (kv_heads), QK-norm (qk_norm, qk_eps) and
rotary positions (rope), in the rule and in the Monte Carlo component."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sigprop.backend import numeric as nm
from sigprop.errors import DomainError
from sigprop.mc.component import measure
from sigprop.mc.components.attention import COMPONENT, SWEEP, rope_tables
from sigprop.rules import REGISTRY
from sigprop.rules import attention as att
from sigprop.state import Backward, Forward

RULE = REGISTRY["attention"]


def _params(d=128, H=2, dh=32, L=64, wqk=0.6, wv=1.0, p=0.0, causal=0, **kw):
    out = dict(d=d, n_heads=H, d_head=dh, L=L, q_std=wqk / math.sqrt(d), k_std=wqk / math.sqrt(d),
               v_std=wv / math.sqrt(d), o_std=1 / math.sqrt(H * dh), p=p, causal=causal)
    out.update(kw)
    return out


def _agree(prm, x, g, runs, batch, seed, rel=0.03, z=4.0):
    """Rule against the Monte Carlo: every moment within z standard errors plus rel of its scale."""
    meas = measure(COMPONENT, prm, x, g, runs=runs, batch=batch, seed=seed)
    y, gb = RULE.evaluate(x, g, **prm)
    for name, m_, se, pr, scale in (("x var", meas.x.var, meas.x.var_se, y.var, y.var),
                                    ("x cov", meas.x.cov, meas.x.cov_se, y.corr * y.var, y.var),
                                    ("g var", meas.g.var, meas.g.var_se, gb.var, gb.var),
                                    ("g cov", meas.g.cov, meas.g.cov_se, gb.corr * gb.var, gb.var)):
        assert abs(m_ - pr) <= z * se + rel * abs(scale), (name, m_, pr, se)
    return meas, y, gb


# --- parameters and defaults ---------------------------------------------------------------
def test_defaults_leave_the_rule_unchanged():
    """kv_heads = n_heads (or 0), qk_norm 0 and rope 0 are the plain rule, bit for bit."""
    x, g = Forward(np.array([0.0, 0.3]), np.array([1.0, 2.0]), np.array([0.1, 0.7])), Backward(1.0, 0.3)
    base = RULE.evaluate(x, g, **_params(causal=1, q_bias_std=0.2))
    same = RULE.evaluate(x, g, **_params(causal=1, q_bias_std=0.2, kv_heads=2, qk_norm=0, rope=0.0, qk_eps=0.3))
    for a, b in zip(base, same):
        for u, v in zip(a, b):
            assert np.array_equal(np.asarray(u), np.asarray(v))


@pytest.mark.parametrize("bad, match", [(dict(kv_heads=3, H=4), "must divide"), (dict(rope=0.5), "rotary base"),
                                        (dict(rope=1e4, dh=33), "even d_head"), (dict(qk_norm=3), "qk_norm"),
                                        (dict(qk_eps=-1.0), "qk_eps")])
def test_bad_parameters_are_refused(bad, match):
    H, dh = bad.pop("H", 2), bad.pop("dh", 32)
    with pytest.raises(DomainError, match=match):
        RULE.evaluate(Forward(0.0, 1.0, 0.2), Backward(1.0, 0.0), **_params(H=H, dh=dh, **bad))


# --- grouped-query attention ----------------------------------------------------------------
def test_grouped_query_moments_are_the_per_head_ones():
    """Heads that share K and V give correlated outputs, but every cross-head term of the
    output's and the input gradient's second moments is linear in two independent zero-mean
    W_o blocks (through G W_o^T in the backward): it vanishes in expectation, so the rule's
    moments do not depend on kv_heads; the Monte Carlo (multi-query, 4 query heads on one K/V)
    agrees, forward and backward, bidirectional and causal."""
    x, g = Forward(0.2, 1.5, 0.3), Backward(1.0, 0.4)
    for causal in (0, 1):
        prm = _params(d=128, H=4, dh=32, L=48, wqk=0.9, p=0.1, causal=causal, v_bias_std=0.1)
        ref = RULE.evaluate(x, g, **prm)
        for kv in (1, 2):
            assert RULE.evaluate(x, g, **{**prm, "kv_heads": kv}) == ref
        _agree({**prm, "kv_heads": 1}, x, g, runs=24, batch=8, seed=3)


# --- the component's modern path -------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(kv_heads=1), dict(kv_heads=2, causal=1, p=0.3), dict(qk_norm=1),
                                dict(qk_norm=2, qk_eps=0.3), dict(rope=10.0), dict(rope=1e4, qk_norm=1, kv_heads=2, causal=1)])
def test_component_backward_finite_differences(kw):
    """The hand-written backward of the general path (GQA, QK-norm, rotary) against central
    differences of the forward, float64, dropout mask fixed by the seed."""
    rng = np.random.default_rng(0)
    prm = _params(d=24, H=4, dh=8, L=7, wqk=0.6, q_bias_std=0.2, k_bias_std=0.3, v_bias_std=0.1, o_bias_std=0.1)
    prm.update(kw)
    W = COMPONENT.sample_weights(rng, prm, np.float64)
    X, GY, E = (rng.standard_normal((2, 7, 24)) for _ in range(3))
    seed = 5

    def f(X_):
        return float(np.sum(COMPONENT.forward(X_, W, prm, np.random.default_rng(seed))[0] * GY))

    _, cache = COMPONENT.forward(X, W, prm, np.random.default_rng(seed))
    got = float(np.sum(COMPONENT.backward(GY, cache) * E))
    h = 1e-6
    want = (f(X + h * E) - f(X - h * E)) / (2 * h)
    assert got == pytest.approx(want, rel=1e-6)
    paths = COMPONENT.backward_paths(GY, cache)
    np.testing.assert_allclose(sum(paths.values()), COMPONENT.backward(GY, cache), rtol=1e-10, atol=1e-12)


def test_component_general_path_equals_the_plain_one():
    """The general forward/backward with no modern feature reproduces the fused plain path."""
    rng = np.random.default_rng(1)
    prm = _params(d=24, H=4, dh=8, L=7, causal=1, q_bias_std=0.2, v_bias_std=0.1)
    W = COMPONENT.sample_weights(rng, prm, np.float64)
    X, GY = rng.standard_normal((2, 7, 24)), rng.standard_normal((2, 7, 24))
    Y1, c1 = COMPONENT.forward(X, W, prm, rng)
    Y2, c2 = COMPONENT._forward_modern(X, W, prm, rng)
    np.testing.assert_allclose(Y1, Y2, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(COMPONENT.backward(GY, c1), COMPONENT.backward(GY, c2), rtol=1e-11, atol=1e-13)
    assert COMPONENT.logit_moments(c1) == pytest.approx(COMPONENT.logit_moments(c2), rel=1e-12)


def test_component_rotary_convention():
    """x -> x cos(t theta) + rotate_half(x) sin(t theta), theta_i = base^(-2i/dh) repeated for
    both halves (written here with explicit 2x2 rotations of the pairs (i, i + dh/2)); and the
    logits of identical tokens depend on the position difference only."""
    L, dh, base = 9, 8, 100.0
    cos, sin = rope_tables(L, dh, base)
    x = np.random.default_rng(2).standard_normal(dh)
    for t in range(L):
        rot = np.empty(dh)
        for i in range(dh // 2):
            a = t * base ** (-2 * i / dh)
            rot[i] = x[i] * math.cos(a) - x[i + dh // 2] * math.sin(a)
            rot[i + dh // 2] = x[i + dh // 2] * math.cos(a) + x[i] * math.sin(a)
        np.testing.assert_allclose(x * cos[t] + np.concatenate([-x[dh // 2:], x[:dh // 2]]) * sin[t], rot, atol=1e-12)
    rng = np.random.default_rng(3)
    prm = _params(d=16, H=1, dh=dh, L=L, wqk=1.0, rope=base)
    W = COMPONENT.sample_weights(rng, prm, np.float64)
    X = np.broadcast_to(rng.standard_normal(16), (1, L, 16)).copy()
    _, cache = COMPONENT.forward(X, W, prm, rng)
    S = cache["Qs"][0, 0] @ cache["Ke"][0, 0].T
    for k in range(-L + 1, L):
        diag = np.diagonal(S, offset=k)
        np.testing.assert_allclose(diag, diag[0], rtol=1e-10, atol=1e-12)


def test_component_qk_norm_is_per_head_and_scale_free():
    """QK-norm: the logits do not change when W_q and W_k are scaled (eps -> 0)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((2, 6, 16))
    for kind in (1, 2):
        prm = _params(d=16, H=2, dh=8, L=6, qk_norm=kind, qk_eps=0.0)
        W = COMPONENT.sample_weights(rng, prm, np.float64)
        W2 = {**W, "qkv": W["qkv"].copy()}
        W2["qkv"][:, :32] *= 7.0
        S1 = COMPONENT.forward(X, W, prm, rng)[1]["Qs"]
        S2 = COMPONENT.forward(X, W2, prm, rng)[1]["Qs"]
        np.testing.assert_allclose(S1, S2, rtol=1e-10)


# --- QK-norm in the rule ----------------------------------------------------------------------
def test_qk_norm_logits_do_not_depend_on_scales():
    """With QK-norm the logit variance and the row logit variance are those of unit vectors:
    independent of the Q/K weight stds and of the input scale (up to eps)."""
    x = Forward(0.0, 1.0, 0.3)
    for kind, one in ((2, 1.0), (1, 32 / 31)):
        vals = []
        for w, s2 in ((0.1, 1.0), (2.0, 1.0), (0.6, 10.0)):
            p = _params(wqk=w, qk_norm=kind)
            xs = Forward(0.0, s2, 0.3)
            vals.append((att.logit_var(p, xs), att.mean_row_logit_var(p, xs)))
        assert np.allclose(vals, vals[0], rtol=3e-3)      # (eps is 0.1% of the smallest scale)
        assert vals[0][0] == pytest.approx(one, rel=3e-3)
    # without it both grow like the fourth power of the weight scale
    p1, p2 = _params(wqk=0.3), _params(wqk=0.6)
    assert att.mean_row_logit_var(p2, x) == pytest.approx(16 * att.mean_row_logit_var(p1, x))
    assert att.logit_var(p2, x) == pytest.approx(16 * att.logit_var(p1, x))


def test_qk_norm_key_fluctuation_factor_by_sampling():
    """The two 1/dh effects of normalising every key by its own norm, sampled directly: the
    within-row logit variance is (1 - rk) (1 + rk (1 + rk) / (2 dh)) and its fourth cumulant
    -6 (1 - rk)^2 / (dh + 2) (unit query and key scales)."""
    rng = np.random.default_rng(5)
    dh, n, R = 32, 64, 3000
    for rk in (0.0, 0.6):
        q = rng.standard_normal((R, dh))
        q *= np.sqrt(dh) / np.linalg.norm(q, axis=1, keepdims=True)
        k = rng.standard_normal((R, 1, dh)) * np.sqrt(rk) + rng.standard_normal((R, n, dh)) * np.sqrt(1 - rk)
        k *= np.sqrt(dh) / np.linalg.norm(k, axis=2, keepdims=True)
        z = np.einsum("rd,rnd->rn", q, k) / np.sqrt(dh)
        v = z.var(axis=1, ddof=1).mean()
        assert v == pytest.approx((1 - rk) * (1 + rk * (1 + rk) / (2 * dh)), rel=0.006)


@pytest.mark.parametrize("kind", [1, 2])
@pytest.mark.parametrize("causal", [0, 1])
def test_qk_norm_against_monte_carlo(kind, causal):
    x, g = Forward(0.0, 2.0, 0.0), Backward(1.0, 0.3)
    _agree(_params(d=128, H=2, dh=32, L=64, wqk=1.0, qk_norm=kind, causal=causal), x, g, runs=16, batch=16, seed=7)


# --- rotary positions in the rule --------------------------------------------------------------
def test_kappa_bar_against_a_direct_sum():
    """kbar(n) (Fejer-kernel form) against the mean of (2/dh) sum_i cos((j - l) theta_i) over
    ordered pairs of distinct positions, summed directly; and its variance over the pairs."""
    for n, base, dh in ((2, 1e4, 8), (17, 1e4, 64), (40, 5e5, 32), (64, 3.0, 16)):
        th = base ** (-2 * np.arange(dh // 2) / dh)
        j = np.arange(n)
        t = (j[:, None] - j[None, :])[~np.eye(n, dtype=bool)]
        kap = 2 / dh * np.cos(t[:, None] * th[None, :]).sum(axis=1)
        assert att._kappa_bar(nm, n, base, dh) == pytest.approx(kap.mean(), rel=1e-10, abs=1e-12)
        assert att._kappa_var(nm, n, base, dh) == pytest.approx(kap.var(), rel=1e-8, abs=1e-12)


def test_kappa_bar_symbolic_equals_numeric():
    import sympy as sp

    import sigprop.backend.symbolic as sm
    n, b, dh = sp.symbols("n b dh", positive=True)
    expr = att._kappa_bar(sm, n, b, dh)
    val = float(expr.subs({n: 23, b: 1e4, dh: 16}).doit().evalf())
    assert val == pytest.approx(float(att._kappa_bar(nm, 23, 1e4, 16)), rel=1e-10)


def test_rotary_cosine_moments_symbolic_equal_numeric():
    """The pair-spread moments (M2, D of the query cosine; kf, Ef2, Eqf of the field's) from the
    symbolic namespace evaluate to the numeric ones."""
    import sympy as sp

    import sigprop.backend.symbolic as sm
    n, b, dh = sp.symbols("n b dh", positive=True)
    at = {n: 23, b: 1e4, dh: 16}
    for fn in (att._kappa_moments, att._field_moments):
        sym = fn(sm, n, b, dh)
        num = fn(nm, 23, 1e4, 16)
        for e, v in zip(sym, num):
            assert float(sp.sympify(e).subs(at).doit().evalf()) == pytest.approx(float(v), rel=1e-9)


def test_field_moments_against_a_direct_average():
    """_field_moments (Fejer-kernel closed forms) against direct averages over all ordered pairs
    of distinct positions of cos(t theta_i) cos(t theta_i'), with the weights' second moments
    E nu_i nu_i' = 1 + 3 delta_ii' (field) and (1 + delta_ii') / K (query, times K)."""
    n, base, dh = 40, 1e4, 16
    kf, ef2, eqf = att._field_moments(nm, n, base, dh)
    theta = base ** (-2 * np.arange(dh // 2) / dh)
    t = (np.arange(n)[:, None] - np.arange(n)[None, :])[~np.eye(n, dtype=bool)]
    c = np.cos(t[:, None] * theta[None, :])                       # (pairs, planes)
    F = c.mean(axis=0)
    u = (1 - F) / np.sum(1 - F)
    C = c.T @ c / len(t)
    K = dh // 2
    assert float(kf) == pytest.approx(float(F @ u), rel=1e-9)
    assert float(ef2) == pytest.approx(float(u @ C @ u + 3 * np.sum(u**2 * np.diag(C))), rel=1e-9)
    assert float(eqf) == pytest.approx(float((np.sum(C @ u) + np.sum(u * np.diag(C))) / K), rel=1e-9)


def test_rope_without_a_shared_part_changes_the_softmax_statistics_by_1_over_d():
    """A zero-mean uncorrelated input has no key-shared part: a single logit's law is that
    without rotation, but the rotated query directions meet the key projection's anisotropy
    differently from key to key, so the row statistics differ from the plain rule's by O(1/d)
    (the per-key part of the 2/d fluctuation, a scale mixture: A2 rises) and agree as d grows."""
    from sigprop.rules.attention import _Ctx

    x = Forward(np.float64(0.0), np.float64(1.3), np.float64(0.0))
    excess = {}
    for causal in (0, 1):
        for d in (128, 512):
            prm = _params(d=d, causal=causal, wqk=0.9)
            c0 = _Ctx(nm, x, RULE.param_values(prm))
            c1 = _Ctx(nm, x, RULE.param_values({**prm, "rope": 1e4}), rope=True)
            excess[causal, d] = float(c1.row(c1.stat("A2"))) / float(c0.row(c0.stat("A2"))) - 1
            assert att.logit_var({**prm, "rope": 1e4}, x) == att.logit_var(prm, x)
            assert att.mean_row_logit_var({**prm, "rope": 1e4}, x) == pytest.approx(att.mean_row_logit_var(prm, x))
        assert 0.002 < excess[causal, 128] < 0.05
        assert excess[causal, 512] == pytest.approx(excess[causal, 128] / 4, rel=0.25)


def _sampled_row_stats(d, dh, L, r, wqk, base, nseq, seed, H=4):
    """E sum_j P_ij^2 over the rows of directly sampled rotary attention (float64; the
    component's law: token-shared part of variance r, weights N(0, wqk^2/d)), with its
    standard error over the sequences."""
    rng = np.random.default_rng(seed)
    cos, sin = rope_tables(L, dh, base)

    def rot(v):
        return v * cos + np.concatenate([-v[..., dh // 2:], v[..., :dh // 2]], axis=-1) * sin

    out = []
    for _ in range(nseq):
        X = rng.standard_normal(d) * math.sqrt(r) + rng.standard_normal((L, d)) * math.sqrt(1 - r)
        Wq, Wk = (rng.standard_normal((d, H * dh)) * wqk / math.sqrt(d) for _ in range(2))
        Q, K = ((X @ W).reshape(L, H, dh).transpose(1, 0, 2) for W in (Wq, Wk))
        S = rot(Q) @ rot(K).transpose(0, 2, 1) / math.sqrt(dh)
        P = np.exp(S - S.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        out.append(np.mean(np.sum(P**2, -1)))
    return np.mean(out), np.std(out, ddof=1) / math.sqrt(nseq)


@pytest.mark.parametrize("r, L", [(0.0, 256), (0.5, 256)])
def test_rope_row_concentration_against_sampling(r, L):
    """E sum_j P^2 of rotary attention at logit variance ~4 (d 256, 4 heads of 64, base 1e4):
    the rule within 1% + 3 SE of direct sampling (the earlier mean-field, which put the whole
    2/d fluctuation on the row and matched the field's fourth cumulant by the large-L effective
    variance, was 2.7% low at r 0 and 5% low at r 0.5)."""
    from sigprop.rules.attention import _Ctx

    mc, se = _sampled_row_stats(256, 64, L, r, 1.4, 1e4, nseq=300, seed=3)
    prm = _params(d=256, H=4, dh=64, L=L, wqk=1.4, rope=1e4)
    c = _Ctx(nm, Forward(np.float64(0.0), np.float64(1.0), np.float64(r)), RULE.param_values(prm), rope=True)
    a2 = float(c.row(c.stat("A2")))
    assert abs(a2 - mc) < 0.01 * mc + 3 * se, (a2, mc, se)


def test_edgeworth_row_statistic_against_a_scale_mixture():
    """The first-order fourth-cumulant term of a row statistic (``_row_value(..., k4=True)``):
    iid logits N(0, v (1 + delta)), delta ~ N(0, s2) per key (fourth cumulant 3 s2 v^2), at
    v = 3.84, 64 keys, s2 = 0.025: the Gaussian value plus the term within 1% + 3 SE of
    sampling, while the Gaussian alone is several percent low."""
    v, L, s2 = 3.84, 64, 0.025
    rng = np.random.default_rng(5)
    vj = v * (1 + math.sqrt(s2) * rng.standard_normal((40000, L)))
    z = np.sqrt(np.maximum(vj, 0)) * rng.standard_normal((40000, L))
    P = np.exp(z - z.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    a2 = np.sum(P**2, 1)
    mc, se = a2.mean(), a2.std() / math.sqrt(a2.size)
    g = float(att._row_value(nm, "A2", np.float64(v), np.float64(L)))
    corr = g + 3 * s2 * v**2 / 24 * float(att._row_value(nm, "A2", np.float64(v), np.float64(L), k4=True))
    assert abs(corr - mc) < 0.01 * mc + 3 * se, (corr, mc, se)
    assert mc - g > 0.02 * mc


def test_rope_keeps_correlated_streams_attending():
    """Without rotation a correlated stream's key-shared logit part cancels in the softmax; with
    it the part that varies over key positions stays: the row logit variance rises, more so
    for a smaller base (faster rotations) and a longer row."""
    x = Forward(0.0, 1.0, 0.9)
    p = _params(L=256, dh=64, wqk=1.2)
    v0 = att.mean_row_logit_var(p, x)
    v1 = att.mean_row_logit_var({**p, "rope": 5e5}, x)
    v2 = att.mean_row_logit_var({**p, "rope": 1e4}, x)
    v3 = att.mean_row_logit_var({**p, "rope": 1e4, "L": 16}, x)
    assert v0 < v3 < v2 and v0 < v1 < v2
    assert v2 > 3 * v0


def test_rope_domain_counts_the_positional_part():
    """With rotary positions the domain bound applies to the row logit variance including the
    key-shared part that no longer cancels (what mean_row_logit_var reports)."""
    from sigprop.rules.attention import ROW_LOGIT_VAR_MAX

    x, g = Forward(0.0, 1.0, 0.95), Backward(1.0, 0.0)
    prm = _params(d=64, H=1, dh=64, L=256, wqk=(2.5 * ROW_LOGIT_VAR_MAX) ** 0.25)
    assert att.mean_row_logit_var(prm, x) < ROW_LOGIT_VAR_MAX < att.mean_row_logit_var({**prm, "rope": 1e4}, x)
    with pytest.raises(DomainError, match="row logit variance"):
        RULE.evaluate(x, g, **prm, rope=1e4)


def test_rope_rows_average_to_the_forward():
    """Attention.rows (the causal per-row-length terms) with rotary positions: the row average
    of its output variance is the forward's."""
    x, g = Forward(0.0, 1.0, 0.7), Backward(1.0, 0.0)
    prm = _params(L=32, dh=32, wqk=1.0, causal=1, rope=1e4)
    p = RULE.param_values(prm)
    n = np.arange(1.0, 33.0)
    r = RULE.rows(nm, Forward(np.float64(0.0), np.float64(1.0), np.float64(0.7)), g, p, n)
    y, _ = RULE.evaluate(x, g, **prm)
    assert float(np.mean(r["var"])) == pytest.approx(float(y.var), rel=1e-4)
    rm = att.row_moments(prm, x)
    assert rm.shape == (2, 32) and np.all(np.isfinite(rm))


@pytest.mark.parametrize("causal", [0, 1])
def test_rope_against_monte_carlo(causal):
    """A strongly correlated stream (r = 0.9) at logit scale ~2: the token-varying part of the
    output (var - cov), which rotary positions multiply, and the gradient."""
    x, g = Forward(0.0, 1.0, 0.9), Backward(1.0, 0.3)
    prm = _params(d=256, H=4, dh=64, L=64, wqk=1.2, causal=causal, rope=1e4)
    meas, y, gb = _agree(prm, x, g, runs=12, batch=8, seed=9)
    y0, _ = RULE.evaluate(x, g, **{**prm, "rope": 0.0})
    dec, dec0 = float(y.var * (1 - y.corr)), float(y0.var * (1 - y0.corr))
    dec_mc = meas.x.var - meas.x.cov
    assert abs(dec - dec_mc) < 0.5 * abs(dec - dec0) + 0.1 * dec_mc


def test_sweep_variants():
    for name in ("gqa", "qknorm", "rope"):
        grid = SWEEP.variants[name]["grid"]
        pts = SWEEP.points(grid)
        case = SWEEP.make_case(pts[-1])
        for key in ("kv_heads", "qk_norm", "rope"):
            if key in grid:
                assert case.rule_params[key] == pts[-1][key]
        RULE.param_values(case.rule_params)
    rope = SWEEP.variants["rope"]["grid"]
    assert max(rope["x_corr"]) >= 0.9 and set(rope["rope"]) == {1e4, 5e5} and min(rope["L"]) <= 16


def test_symbolic_plain_option_drops_the_modern_parameters():
    """``symbolic(modern=False)`` is plain attention's form: it does not mention the new
    parameters (the default form does, see test_symbolic_modern_builds)."""
    from sigprop import symbols

    ex = RULE.symbolic(modern=False)
    names = {str(symbols.symbol(n)) for n in ("qk_norm", "rope", "kv_heads", "qk_eps")}
    assert not any(str(s) in names for e in ex.values() for s in getattr(e, "free_symbols", ()))


def test_symbolic_modern_builds():
    """The default symbolic form (QK-norm and rotary positions as Piecewise branches) builds
    (in seconds; timed in docs, not here) and prints: str of its outputs through CSE, LaTeX with every named quantity
    defined once."""
    import sympy as sp

    import sigprop.backend.symbolic as sm
    from sigprop import printing, symbols

    ex = RULE.symbolic()
    free = {str(s) for s in ex["x_var"].free_symbols}
    for name in ("rope", "qk_norm", "qk_eps", "L", "x_corr"):
        assert str(symbols.symbol(name)) in free, name
    where = dict(sm.where(ex.values()))
    texts = {sp.srepr(type(lhs).__name__) for lhs in where}
    for cls in ("Def_kbar", "Def_fejer", "Def_row_A2", "Def_row_A2_k4", "Def_pair_C2", "Def_gamma_pdf"):
        assert repr(cls) in texts, cls
    repl, reduced = sp.cse(list(ex.values()), optimizations=None)
    text = "\n".join(f"{a} = {b}" for a, b in repl) + "\n".join(str(e) for e in reduced)
    assert "kbar(L)" in text and "Piecewise" in text and 1000 < len(text) < 100_000
    tex = printing.rule_latex(RULE)
    assert r"\bar{\kappa}\left(n\right)" in tex and r"b_{\mathrm{rope}}" in tex and r"\nu_{qk}" in tex


def _modern_point(d=128, H=4, dh=32, L=64, wqk=0.5, p=0.1, causal=0, rope=1e4, qk=0, kv=0):
    return dict(d=d, n_heads=H, d_head=dh, L=L, q_std=wqk / math.sqrt(d), k_std=wqk / math.sqrt(d),
                v_std=1 / math.sqrt(d), o_std=1 / math.sqrt(H * dh), p=p, causal=causal, rope=rope,
                qk_norm=qk, kv_heads=kv, q_bias_std=0.1, k_bias_std=0.05, v_bias_std=0.1, o_bias_std=0.02)


def _symbol_values(prm, x, g):
    from sigprop import symbols

    full = {q.name: q.default for q in RULE.params}
    full.update(prm)
    out = {symbols.symbol("x_std"): math.sqrt(x.var), symbols.symbol("x_corr"): x.corr,
           symbols.symbol("x_mean"): x.mean, symbols.symbol("g_std"): math.sqrt(g.var),
           symbols.symbol("g_corr"): g.corr}
    out.update({symbols.symbol(k): v for k, v in full.items()})
    return out


def _rho_clip_acts(prm, x):
    """Whether the numeric rule's clip of the row-pair correlation at +-0.999 (a numeric guard,
    left out of the symbolic form) acts: a Gauss-Hermite node of its law beyond it."""
    c = att._Ctx(nm, x, RULE.param_values(prm), rope=bool(prm["rope"]), check=False)
    _, _, mean, var = c.pair_law()
    nodes = np.polynomial.hermite_e.hermegauss(att._NR)[0]
    return bool(np.any(np.abs(mean + nodes * np.sqrt(var)) > 0.999))


@functools.lru_cache(maxsize=1)
def _modern_symbolic():
    return RULE.symbolic()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rope=st.sampled_from([0.0, 1e4]), qk=st.sampled_from([0, 1, 2]), kv=st.sampled_from([0, 1, 2]),
       causal=st.sampled_from([0, 1]), L=st.sampled_from([2, 5, 17, 64, 200]),
       s2=st.floats(0.2, 4.0), r=st.floats(0.0, 0.9), mu=st.floats(-1.0, 1.0),
       g2=st.floats(0.3, 3.0), rg=st.floats(0.0, 0.9), p=st.sampled_from([0.0, 0.1]),
       wqk=st.sampled_from([0.3, 0.7]))
def test_symbolic_modern_agrees_with_the_numeric_rule(rope, qk, kv, causal, L, s2, r, mu, g2, rg, p, wqk):
    """The symbolic expressions, evaluated at numeric points (sigprop.backend.symbolic.evaluate:
    the same quadrature primitives and each named quantity's numeric twin; everything between
    them from the sympy tree), reproduce the numeric rule to 1e-10 relative: rotary base 0 and
    1e4, QK-norm none/LayerNorm/RMSNorm, grouped heads, causal and not, several lengths,
    variances and correlations.  (Where the numeric rule's clip of the row-pair correlation at
    +-0.999 acts, a guard the symbolic form leaves out, the two differ: such points, at short
    rows and high correlation with rotary positions, are skipped.)"""
    import sigprop.backend.symbolic as sm

    prm = _modern_point(L=L, rope=rope, qk=qk, kv=kv, causal=causal, p=p, wqk=wqk)
    x, g = Forward(mu, s2, r), Backward(g2, rg)
    assume(not _rho_clip_acts(prm, x))
    y, gb = RULE.evaluate(x, g, **prm)
    num = {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": gb.var, "g_corr": gb.corr}
    vals = _symbol_values(prm, x, g)
    for key, expr in _modern_symbolic().items():
        val = float(sm.evaluate(expr, vals))
        assert val == pytest.approx(float(num[key]), rel=1e-10, abs=1e-14), (key, val, num[key])


def test_symbolic_agreement_check_can_fail():
    """The evaluation is sensitive to the symbolic composition: the same expression with the
    rotary cosine factor kbar(L) scaled by 0.9, or with the QK-norm flag's branches swapped,
    no longer agrees with the numeric rule."""
    import sympy as sp

    import sigprop.backend.symbolic as sm
    from sigprop import symbols

    ex = _modern_symbolic()
    prm = _modern_point(L=64, rope=1e4, qk=2)
    x, g = Forward(0.2, 1.3, 0.5), Backward(0.8, 0.3)
    y, _ = RULE.evaluate(x, g, **prm)
    vals = _symbol_values(prm, x, g)
    kbar = next(e for e in sp.preorder_traversal(ex["x_var"]) if type(e).__name__ == "Def_kbar"
                and e.args[0] == symbols.symbol("L"))
    assert float(sm.evaluate(ex["x_var"], vals)) == pytest.approx(float(y.var), rel=1e-12)
    bad = float(sm.evaluate(ex["x_var"].xreplace({kbar: 0.9 * kbar}), vals))
    assert abs(bad / float(y.var) - 1) > 1e-4
    vals_rms_as_ln = {**vals, symbols.symbol("qk_norm"): 1}
    assert abs(float(sm.evaluate(ex["x_var"], vals_rms_as_ln)) / float(y.var) - 1) > 1e-6


def test_named_rotary_definitions_equal_their_numeric_twins():
    """Each rotary named quantity's symbolic definition (finite sums, expanded by doit) equals
    its numeric twin to 1e-10: the Fejer mean, kbar, W, M, D and the field moments."""
    import sympy as sp

    import sigprop.backend.symbolic as sm
    n, b, dh = sp.symbols("n b dh", positive=True)
    at = {n: 23, b: 1e4, dh: 16}
    for fn in (att._kappa_bar, att._kappa_sq, att._kappa_moments, att._field_moments):
        sym, num = fn(sm, n, b, dh), fn(nm, 23, 1e4, 16)
        sym, num = (sym, num) if isinstance(sym, tuple) else ((sym,), (num,))
        for e, v in zip(sym, num):
            assert isinstance(e, sm.Defined)
            assert float(e.subs(at).doit().evalf()) == pytest.approx(float(v), rel=1e-10)
            assert float(sm.evaluate(e, at)) == pytest.approx(float(v), rel=1e-12)
    f = att._fejer_mean(sm, n, sp.Symbol("phi", real=True))
    assert float(f.subs({n: 7, sp.Symbol("phi", real=True): 0.3}).doit()) == pytest.approx(
        float(att._fejer_mean(nm, 7, 0.3)), rel=1e-12)
