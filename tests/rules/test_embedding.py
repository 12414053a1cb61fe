"""Embedding rule (sigprop.rules.embedding), its helpers and its Monte Carlo component."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sigprop.errors import DomainError
from sigprop.mc.component import measure
from sigprop.mc.components import embedding as emb_mc
from sigprop.rules import REGISTRY
from sigprop.rules.embedding import collision_probability, row_gradient_var, zipf_frequencies
from sigprop.state import Backward, Forward
from sigprop.symbols import symbol

RULE = REGISTRY["embedding"]
NAMES = ("word_std", "pos_std", "seg_std", "word_collision", "segment_collision", "L", "g_corr")
S = {k: symbol(k) for k in NAMES}
X0 = Forward(0.0, 1.0, 0.0)     # the rule ignores its input state


@pytest.fixture(scope="module")
def expr():
    return RULE.symbolic()


# --- helpers ------------------------------------------------------------------------------------
def test_zipf_frequencies_small_case():
    f = zipf_frequencies(1.0, 3)
    np.testing.assert_allclose(f, np.array([6 / 11, 3 / 11, 2 / 11]))
    np.testing.assert_allclose(zipf_frequencies(0.0, 4), np.full(4, 0.25))
    f = zipf_frequencies(2.0, 50_000)
    assert f.sum() == pytest.approx(1.0) and np.all(np.diff(f) < 0)
    # sum of squares tends to zeta(4)/zeta(2)^2 for s = 2, V -> infinity
    assert collision_probability(f) == pytest.approx((math.pi**4 / 90) / (math.pi**2 / 6) ** 2, rel=1e-4)


def test_collision_probability():
    assert collision_probability([0.5, 0.5]) == pytest.approx(0.5)
    assert collision_probability([3, 1]) == pytest.approx(0.625)          # counts are normalised
    assert collision_probability([1.0]) == 1.0
    assert collision_probability(np.ones(1000)) == pytest.approx(1e-3)
    for bad in ([], [0, 0], [0.5, -0.1], [np.nan, 1.0], [[0.5, 0.5]], [np.inf, 1]):
        with pytest.raises(DomainError):
            collision_probability(bad)
    with pytest.raises(DomainError):
        zipf_frequencies(-1.0, 10)
    with pytest.raises(DomainError):
        zipf_frequencies(1.0, 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=50).filter(lambda v: sum(v) > 0))
def test_collision_probability_bounds(w):
    c = collision_probability(w)
    k = sum(1 for v in w if v > 0)
    assert 1.0 / k - 1e-12 <= c <= 1.0 + 1e-12


def test_row_gradient_var_sums_to_rule():
    """Averaging the per-row variance over the V rows and rescaling by V/L gives the rule's
    per-occurrence variance."""
    f = zipf_frequencies(1.1, 500)
    L, g2, rg = 64, 2.0, 0.4
    per_row = row_gradient_var(f, L, g2, rg)
    _, g = RULE.evaluate(X0, Backward(g2, rg), word_std=1.0, word_collision=collision_probability(f), L=L)
    assert per_row.sum() / L == pytest.approx(g.var)


# --- (a) symbolic identities ---------------------------------------------------------------------
def test_symbolic_identities(expr):
    wc, sc, rg, L = S["word_collision"], S["segment_collision"], S["g_corr"], S["L"]
    ws, ps, ss = S["word_std"], S["pos_std"], S["seg_std"]
    assert expr["x_mean"] == 0
    assert sp.simplify(expr["x_var"] - (ws**2 + ps**2 + ss**2)) == 0
    # all positions the same token, no position table, single segment type: fully correlated
    assert sp.simplify(expr["x_corr"].subs({wc: 1, sc: 1, ps: 0})) == 1
    # all distinct tokens (c -> 0), no segments: uncorrelated
    assert sp.simplify(expr["x_corr"].subs({wc: 0, ss: 0})) == 0
    # backward: independent gradients pass per occurrence unchanged, rows uncorrelated
    g2 = symbol("g_var")
    assert sp.simplify(expr["g_var"].subs(rg, 0) - g2) == 0
    assert sp.simplify(expr["g_corr"].subs(rg, 0)) == 0
    # one token everywhere: all L gradients land on one row, coherently
    assert sp.simplify(expr["g_var"].subs(wc, 1) - g2 * (1 + rg * (L - 1))) == 0
    assert sp.simplify(expr["g_corr"].subs(wc, 1)) == 0
    # all distinct tokens: each row is one position's gradient
    assert sp.simplify(expr["g_var"].subs(wc, 0) - g2) == 0
    assert sp.simplify(expr["g_corr"].subs(wc, 0) - rg) == 0


# --- (b) properties --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(ws=st.floats(1e-4, 10), ps=st.floats(0, 10), ss=st.floats(0, 10), wc=st.floats(0, 1),
       sc=st.floats(0, 1), L=st.integers(2, 10_000), g2=st.floats(0, 1e3), u=st.floats(0, 1))
def test_properties(ws, ps, ss, wc, sc, L, g2, u):
    rg = -1.0 / (L - 1) + u * (1 + 1.0 / (L - 1))          # the exchangeable range
    rg = min(rg, 1.0)
    y, g = RULE.evaluate(X0, Backward(g2, rg), word_std=ws, pos_std=ps, seg_std=ss,
                         word_collision=wc, segment_collision=sc, L=L)
    assert y.var > 0 and 0 <= y.corr <= 1 + 1e-12
    assert g.var >= 0 and abs(g.corr) <= 1 + 1e-12
    # more collisions, more correlation
    y2, _ = RULE.evaluate(X0, None, word_std=ws, pos_std=ps, seg_std=ss,
                          word_collision=min(1.0, wc + 0.1), segment_collision=sc, L=L)
    assert y2.corr >= y.corr - 1e-15


def test_domain_errors():
    base = dict(word_std=1.0, word_collision=0.1, L=16)
    with pytest.raises(DomainError):
        RULE.evaluate(X0, None, **{**base, "word_collision": 1.5})
    with pytest.raises(DomainError):
        RULE.evaluate(X0, None, **{**base, "word_std": 0.0})
    with pytest.raises(DomainError):
        RULE.evaluate(X0, None, **{**base, "L": 1})
    with pytest.raises(DomainError):
        RULE.evaluate(X0, Backward(1.0, -0.5), **base)              # below -1/(L-1)
    with pytest.raises(DomainError):
        RULE.evaluate(X0, None, **{**base, "V": 100})                # not a parameter


# --- (c) numeric == symbolic ------------------------------------------------------------------------
@pytest.mark.parametrize("pt", [
    dict(word_std=0.5, pos_std=0.3, seg_std=0.2, word_collision=0.07, segment_collision=0.52,
         L=128, g_var=2.0, g_corr=0.3),
    dict(word_std=0.02, pos_std=0.0, seg_std=0.0, word_collision=0.001, segment_collision=1.0,
         L=2, g_var=0.5, g_corr=-0.9),
])
def test_numeric_equals_symbolic(expr, pt):
    rp = {k: pt[k] for k in NAMES if k != "g_corr"}
    y, g = RULE.evaluate(X0, Backward(pt["g_var"], pt["g_corr"]), **rp)
    subs = {S[k]: pt[k] for k in NAMES}
    subs[symbol("g_std")] = math.sqrt(pt["g_var"])
    num = {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": g.var, "g_corr": g.corr}
    for k, v in num.items():
        assert float(sp.sympify(expr[k]).subs(subs).evalf(30)) == pytest.approx(float(v), rel=1e-12, abs=1e-15)


# --- (d) finite differences of the hand-written backward ----------------------------------------------
def test_backward_finite_differences():
    rng = np.random.default_rng(2)
    V, d, B, L = 9, 5, 3, 6
    params = {"zipf_s": 1.0, "V": V, "d": d, "L": L, "word_std": 1.0, "pos_std": 0.5, "seg_std": 0.3}
    W = {"word": rng.standard_normal((V, d)), "pos": rng.standard_normal((L, d)),
         "seg": rng.standard_normal((2, d))}
    X = np.zeros((B, L, 1))
    GY = rng.standard_normal((B, L, d))

    def fwd(Wd):
        return emb_mc.COMPONENT.forward(X, Wd, params, np.random.default_rng(7))

    Y, cache = fwd(W)
    T = emb_mc.COMPONENT.backward(GY, cache)
    assert T.shape == (B, L, d)
    table = emb_mc.COMPONENT.table_gradient(T, cache, V)

    h = 1e-6
    num = np.zeros((V, d))
    for i in range(V):
        for f in range(d):
            Wp = {**W, "word": W["word"].copy()}
            Wm = {**W, "word": W["word"].copy()}
            Wp["word"][i, f] += h
            Wm["word"][i, f] -= h
            num[i, f] = (np.sum(fwd(Wp)[0] * GY) - np.sum(fwd(Wm)[0] * GY)) / (2 * h)
    np.testing.assert_allclose(table, num, rtol=1e-6, atol=1e-8)

    # per sequence, the slots hold one row per distinct token and sum to the total gradient
    np.testing.assert_allclose(T.sum(axis=1), GY.sum(axis=1), atol=1e-12)
    # recover the token ids independently: same draws, position and segment tables zeroed
    Y0, _ = fwd({"word": W["word"], "pos": np.zeros((L, d)), "seg": np.zeros((2, d))})
    tok = np.array([[int(np.argmin(np.abs(W["word"] - y).sum(-1))) for y in Y0[b]] for b in range(B)])
    np.testing.assert_allclose(Y0, W["word"][tok])
    for b in range(B):
        n_distinct = len(np.unique(tok[b]))
        assert np.all(np.any(T[b, :n_distinct] != 0, axis=-1)) and np.all(T[b, n_distinct:] == 0)


def test_forward_uses_tables():
    rng = np.random.default_rng(0)
    V, d, L = 4, 3, 5
    W = {"word": np.arange(V * d, dtype=float).reshape(V, d), "pos": np.zeros((L, d))}
    params = {"zipf_s": 0.5, "V": V, "d": d, "L": L, "word_std": 1.0}
    Y, cache = emb_mc.COMPONENT.forward(np.zeros((2, L, 1)), W, params, rng)
    rows = Y.reshape(-1, d)
    assert all(any(np.array_equal(r, w) for w in W["word"]) for r in rows)


# --- (e) seeded Monte Carlo agreement -------------------------------------------------------------------
@pytest.mark.parametrize("pt", [
    dict(zipf_s=1.2, V=1000, word_std=1.0, pos_std=0.5, seg_std=0.3, d=64, L=128, g_corr=2 / 3),
    dict(zipf_s=1.0, V=30000, word_std=1.0, pos_std=0.0, seg_std=0.0, d=256, L=128, g_corr=1 / 3),
])
def test_mc_agrees(pt):
    case = emb_mc.SWEEP.make_case(pt)
    px, pg = RULE.evaluate(case.x, case.g, **case.rule_params)
    m = measure(emb_mc.COMPONENT, case.sim_params, case.x, case.g, runs=2 * case.runs,
                batch=case.batch, seed=4)
    k = 4.5
    assert abs(m.x.mean) <= k * m.x.mean_se + 1e-9
    assert abs(m.x.var - px.var) <= k * m.x.var_se
    assert abs(m.x.cov - px.corr * px.var) <= k * m.x.cov_se
    assert abs(m.g.var - pg.var) <= k * m.g.var_se
    assert abs(m.g.cov - pg.corr * pg.var) <= k * m.g.cov_se


def test_mc_collision_drives_correlation():
    """Word table only, one token distribution far from uniform: the measured token
    correlation is sum f^2 and the per-occurrence gradient grows by rg (L-1) sum f^2."""
    pt = dict(zipf_s=1.5, V=200, word_std=1.0, pos_std=0.0, seg_std=0.0, d=128, L=64, g_corr=0.5)
    c = float(np.sum(zipf_frequencies(1.5, 200) ** 2))
    sim = {**pt, "segment_freqs": (1.0,)}
    m = measure(emb_mc.COMPONENT, sim, X0, Backward(1.0, 0.5), runs=40, batch=40, seed=9)
    assert abs(m.x.corr - c) < 5 * m.x.corr_se
    assert abs(m.g.var - (1 + 0.5 * 63 * c)) < 5 * m.g.var_se
    assert abs(m.x.corr - c) < 0.2 * c


def test_small_seeded_sweep():
    from sigprop.mc.sweep import run_sweep

    spec = emb_mc.SWEEP
    assert len(spec.points()) == 576
    res = run_sweep(spec, RULE, n=8, seed=3)
    for row in res.rows:
        for mom, err in row["errors"].items():
            assert err < 0.08, (row["point"], mom, err)   # standard errors ~2 % by design
