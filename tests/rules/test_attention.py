"""Attention: moment rules ("attention", "attention-published"), their backend primitives,
and the Monte Carlo component (hand-written backward)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sigprop.backend.numeric as nm
from sigprop.errors import DomainError
from sigprop.mc.component import measure
from sigprop.mc.components.attention import COMPONENT, SWEEP
from sigprop.rules import REGISTRY
from sigprop.state import Backward, Forward

RULE = REGISTRY["attention"]
PUB = REGISTRY["attention-published"]


def _params(d=128, H=1, dh=32, L=64, wqk=0.5, wv=1.0, p=0.0, causal=0, **biases):
    out = dict(d=d, n_heads=H, d_head=dh, L=L, q_std=wqk / math.sqrt(d), k_std=wqk / math.sqrt(d),
               v_std=wv / math.sqrt(d), o_std=1 / math.sqrt(H * dh), p=p, causal=causal)
    out.update(biases)
    return out


def _sym():
    import sigprop.backend.symbolic as sm  # noqa: F401  (makes the submodule importable)
    from sigprop import symbols

    return symbols.symbol


# --- (a) limits and identities ------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("causal", [0, 1])
def test_small_logit_limit(p, causal):
    """Vanishing query/key weights: uniform attention.  Closed forms written out by hand:
    O_i = sum_j A_ij v_j with A_ij = m_ij / (n (1-p)), n keys in row i."""
    d, H, dh, L = 200, 2, 16, 40
    s2, r, mu, g2, rg = 1.7, 0.35, 0.4, 0.8, 0.25
    sv, so, sbv, sbo = 0.9 / math.sqrt(d), 1.1 / math.sqrt(H * dh), 0.3, 0.2
    prm = _params(d=d, H=H, dh=dh, L=L, wqk=1e-5, p=p, causal=causal, v_bias_std=sbv, o_bias_std=sbo)
    prm["v_std"], prm["o_std"] = sv, so
    y, gb = RULE.evaluate(Forward(mu, s2, r), Backward(g2, rg), **prm)
    q = p / (1 - p)
    ns = np.arange(1, L + 1) if causal else np.full(L, L)
    A2 = np.mean(1.0 / ns)                                   # mean over rows of sum_j P_ij^2
    c2, tau = r * s2 + mu**2, (1 - r) * s2
    # E|sum_j A_ij x_j|^2 / d = c2 E(sum A)^2 + tau E sum A^2
    EO2 = sv**2 * d * (c2 * (1 + q * A2) + tau * A2 / (1 - p)) + sbv**2 * (1 + q * A2)
    # rows i != k: the shared keys are the shorter row's, weight 1/n_long each
    pairs = [(i, k) for i in range(L) for k in range(L) if i != k]
    C2 = np.mean([1.0 / max(ns[i], ns[k]) for i, k in pairs]) if causal else 1.0 / L
    EOO = sv**2 * d * (c2 + tau * C2) + sbv**2
    gain = H * dh * so**2
    assert y.var == pytest.approx(gain * EO2 + sbo**2, rel=2e-3)
    assert y.corr * y.var == pytest.approx(gain * EOO + sbo**2, rel=2e-3)
    assert float(y.mean) == 0.0
    # value path only: dV_j = sum_i A_ij g_i
    K0 = H * sv**2 * dh * d * so**2 * g2
    gvar = K0 * (A2 / (1 - p) + rg * (L - 1) * C2)
    gcov = K0 * ((1 - A2) / (L - 1) + rg * (1 - C2))
    assert gb.var == pytest.approx(gvar, rel=2e-3)
    assert gb.corr * gb.var == pytest.approx(gcov, rel=2e-3)


def test_published_limits():
    """[TGS] formulas: r = 1 gives corr 1; the gradient at rg = 0 is the 1/L value path."""
    prm = _params(d=100, dh=32, L=300, wqk=0.3, p=0.0)
    y, gb = PUB.evaluate(Forward(0.0, 2.0, 1.0), Backward(1.0, 0.0), **prm)
    assert float(y.corr) == pytest.approx(1.0)
    so2, sv2 = prm["o_std"] ** 2, prm["v_std"] ** 2
    assert gb.var == pytest.approx(100 * so2 * 32 * sv2 / 300)


@pytest.mark.slow   # did not finish within 15 min on 2026-11-22 (loaded 2-core machine), before and after that day's quadrature change
def test_symbolic_identities():
    symbol = _sym()
    import sympy as sp

    ex = RULE.symbolic()
    so, sbo, sg, sbv, p = (symbol(n) for n in ("o_std", "o_bias_std", "g_std", "v_bias_std", "p"))
    assert ex["x_mean"] == 0
    # the output projection scales the bias-free part of the forward variance by so^2
    assert sp.simplify(sp.diff((ex["x_var"] - sbo**2) / so**2, so)) == 0
    # the backward is linear in the upstream gradient variance ...
    assert sp.simplify(sp.diff(ex["g_var"] / sg**2, sg)) == 0
    # ... and, without dropout, blind to the value bias (it is constant over the keys)
    assert sp.diff(ex["g_var"].subs(p, 0), sbv) == 0
    pub = PUB.symbolic()
    L, rg = symbol("L"), symbol("g_corr")
    assert sp.simplify(pub["g_var"].subs({rg: 0, p: 0})
                       - symbol("n_heads") * symbol("d") * so**2 * sg**2 * symbol("d_head")
                       * symbol("v_std") ** 2 / L) == 0


# --- (b) properties -------------------------------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s2=st.floats(0.05, 10.0), r=st.floats(0.0, 0.95), mu=st.floats(-2.0, 2.0),
       rg=st.floats(0.0, 0.95), wqk=st.floats(0.05, 0.7), p=st.floats(0.0, 0.7),
       d=st.sampled_from([64, 256, 1024]), dh=st.sampled_from([16, 64]),
       L=st.integers(2, 400), H=st.integers(1, 4), qb=st.floats(0.0, 1.0))
def test_properties(s2, r, mu, rg, wqk, p, d, dh, L, H, qb):
    prm = _params(d=d, H=H, dh=dh, L=L, wqk=wqk, p=p, q_bias_std=qb, v_bias_std=0.1)
    y, gb = RULE.evaluate(Forward(mu, s2, r), Backward(1.3, rg), **prm)
    for v in (y.var, gb.var):
        assert np.isfinite(v) and v > 0
    for c in (y.corr, gb.corr):   # (1e-6: the quadratures' relative accuracy near corr = 1)
        assert np.isfinite(c) and -1 - 1e-6 <= c <= 1 + 1e-6
    # without dropout, the output is a convex combination of values: corr >= the
    # correlation carried by the shared input part alone
    if p == 0:
        assert y.corr >= -1e-9


def test_properties_causal_and_arrays():
    """Arrays broadcast (one call for several configurations); causal rows included."""
    prm = _params(d=128, dh=32, L=np.array([8.0, 50.0]), wqk=0.8, p=0.2, causal=1)
    y, gb = RULE.evaluate(Forward(0.0, np.array([1.0, 4.0]), 0.3), Backward(1.0, 0.5), **prm)
    assert y.var.shape == (2,) and gb.var.shape == (2,)
    assert np.all(y.var > 0) and np.all(np.abs(y.corr) <= 1) and np.all(np.abs(gb.corr) <= 1)
    y1, g1 = RULE.evaluate(Forward(0.0, 4.0, 0.3), Backward(1.0, 0.5),
                           **{**prm, "L": 50})
    assert y1.var == pytest.approx(y.var[1], rel=1e-10)
    assert g1.var == pytest.approx(gb.var[1], rel=1e-10)


def test_domain():
    with pytest.raises(DomainError):
        RULE.evaluate(Forward(0.0, 1.0, 0.2), None, **_params(L=1))
    with pytest.raises(DomainError):
        RULE.evaluate(Forward(0.0, 1.0, -0.2), None, **_params())
    with pytest.raises(DomainError):
        RULE.evaluate(Forward(0.0, 1.0, 0.2), None, **_params(causal=2))
    with pytest.raises(DomainError):
        RULE.evaluate(Forward(0.0, 1.0, 0.2), None, **_params(p=1.0))


# --- (c) numeric == symbolic --------------------------------------------------------------
def test_published_numeric_equals_symbolic():
    symbol = _sym()
    ex = PUB.symbolic()
    for s2, r, rg, p, L in [(0.5, 0.1, 0.3, 0.2, 300), (3.0, 0.6, 0.0, 0.0, 1000)]:
        prm = _params(d=316, dh=64, L=L, wqk=0.4, p=p)
        y, gb = PUB.evaluate(Forward(0.0, s2, r), Backward(0.7, rg), **prm)
        pv = PUB.param_values(prm)
        sub = {symbol(q.name): getattr(pv, q.name) for q in PUB.params}
        sub.update({symbol("x_corr"): r, symbol("g_corr"): rg, symbol("x_std"): math.sqrt(s2),
                    symbol("g_std"): math.sqrt(0.7)})
        for key, val in (("x_var", y.var), ("x_corr", y.corr), ("g_var", gb.var), ("g_corr", gb.corr)):
            assert float(ex[key].subs(sub).evalf()) == pytest.approx(float(val), rel=1e-9)


def test_pair_length_sum_on_arrays_against_direct_sums():
    """The causal pair weights on arrays whose entries span phi ~ 1 (the geometric sum's M),
    moderate values, and phi far below 1 (terms far below the smallest normal double, which
    the sum takes as 0), against the double sums written out term by term."""
    L = 40
    l2 = np.array([[-1e-14, -0.013, -0.3], [-2.0, -40.0, -690.0]])
    l1 = np.array([[-1e-14, -0.021, -1.5], [-0.5, -690.0, -3.0]])

    def direct(a2, a1, k):
        tot = 0.0
        for n in range(1, L):
            ff = math.prod(n - j for j in range(k))
            if ff <= 0:
                continue
            geo = sum(math.exp(m * a1) for m in range(1, L - n + 1))
            tot += ff * math.exp((n - k) * a2) * geo
        return tot

    for k in (1, 2):
        got = nm.pair_length_sum(l2, l1, L, k)
        want = np.vectorize(lambda a2, a1: direct(a2, a1, k))(l2, l1)
        assert got.shape == l2.shape
        assert np.allclose(got, want, rtol=3e-4, atol=0.0), (k, got, want)
    # the tuple form shares one power of phi2 between the k (phi2 for k = 1 once at the end):
    # the same sums up to rounding
    both = nm.pair_length_sum(l2, l1, L, (1, 2))
    assert np.allclose(both[0], nm.pair_length_sum(l2, l1, L, 1), rtol=1e-13, atol=0.0)
    assert np.array_equal(both[1], nm.pair_length_sum(l2, l1, L, 2))
    assert np.allclose(nm.pair_length_sum(l2, l1, L, (2, 1))[1], both[0], rtol=1e-13, atol=0.0)


def test_exp_flushed():
    """exp where the result is a normal double above ~1e-304, 0 below."""
    x = np.array([0.0, -1.0, -699.0, -700.5, -720.0, -1e6])
    got = nm.exp_flushed(x.copy())
    assert np.array_equal(got[:3], np.exp(x[:3]))
    assert np.all(got[3:] == 0.0)


def test_primitives_numeric_equals_symbolic():
    """The quadrature primitives of the rule against sympy's exact values."""
    import sympy as sp

    import sigprop.backend.symbolic as sm

    # Gamma expectation: exact for polynomials
    e = sm.expect_gamma(lambda x: x**3 + 2 * x, sp.Rational(3, 2), sp.Rational(1, 10))
    assert nm.expect_gamma(lambda x: x**3 + 2 * x, 1.5, 0.1) == pytest.approx(float(e.doit()), rel=1e-12)
    # sums over row lengths (harmonic numbers), exact part and Gauss-Legendre tail
    for L in (7, 16, 300):
        ex = float(sm.sum_over_lengths(lambda n: 1 / n, L).doit())
        assert nm.sum_over_lengths(lambda n: 1 / n, float(L)) == pytest.approx(ex, rel=2e-4)
    # causal pair weights
    l2, l1 = -0.013, -0.021
    for k in (1, 2):
        ex = float(sm.pair_length_sum(sp.Float(l2), sp.Float(l1), 40, k).doit())
        assert nm.pair_length_sum(np.array(l2), np.array(l1), 40, k) == pytest.approx(ex, rel=3e-4)
    # bivariate smoothing: E[exp(u + e) exp(w + e')] = exp(u + w + var (1 + rho)); the outer
    # Gaussian makes the double integral closed-form.
    var, rho = 0.7, 0.4

    def outer(u, w, S):
        return S[0] * nm.exp(-(u**2) - w**2) if not hasattr(u, "free_symbols") else S[0] * sp.exp(-(u**2) - w**2)

    num = nm.integrate_smoothed2(outer, [(np.exp, np.exp)], var, rho, window=(-9.0, 9.0))
    exact = math.pi * math.exp(0.5 + var * (1 + rho))   # int exp(-u^2 + u) du = sqrt(pi) e^(1/4)
    assert num == pytest.approx(exact, rel=2e-5)
    sym = sm.integrate_smoothed2(outer, [(sp.exp, sp.exp)], sp.Float(var), sp.Float(rho))
    assert isinstance(sym, sp.Integral)


def test_two_row_statistics_against_sampling():
    """C2 = E sum_j P_ij P_kj for correlated logit rows, by direct sampling (numpy only)."""
    from sigprop.rules.attention import _two_row

    rng = np.random.default_rng(0)
    for v, rho, n in [(2.0, 0.6, 30), (0.5, -0.3, 50)]:
        z = rng.standard_normal((40000, n))
        w = rho * z + math.sqrt(1 - rho**2) * rng.standard_normal((40000, n))
        P = np.exp(math.sqrt(v) * z); P /= P.sum(1, keepdims=True)
        Q = np.exp(math.sqrt(v) * w); Q /= Q.sum(1, keepdims=True)
        s = _two_row(nm, v, rho, float(n), 0)
        pq = (P * Q).sum(1)
        assert float(s["C2"]) == pytest.approx(pq.mean(), rel=4 * pq.std() / pq.mean() / 200)
        t2x = pq - (P * Q**2).sum(1) - (P**2 * Q).sum(1) + pq**2
        assert float(s["T2x"]) == pytest.approx(t2x.mean(), rel=4 * t2x.std() / t2x.mean() / 200)


# --- (d) hand-written backward against finite differences ---------------------------------
@pytest.mark.parametrize("causal", [0, 1])
def test_backward_finite_differences(causal):
    prm = _params(d=6, H=2, dh=3, L=5, wqk=1.3, wv=1.0, p=0.4, causal=causal,
                  q_bias_std=0.3, k_bias_std=0.2, v_bias_std=0.4, o_bias_std=0.1)
    rng = np.random.default_rng(1)
    W = COMPONENT.sample_weights(rng, prm, np.float64)
    X = rng.standard_normal((2, 5, 6))
    GY = rng.standard_normal((2, 5, 6))

    def loss(X):  # the dropout mask is fixed by reseeding the generator
        Y, _ = COMPONENT.forward(X, W, prm, np.random.default_rng(7))
        return float(np.sum(Y * GY))

    Y, cache = COMPONENT.forward(X, W, prm, np.random.default_rng(7))
    assert cache[5] is not None                     # a dropout mask is in play
    GX = COMPONENT.backward(GY, cache)
    num = np.zeros_like(X)
    h = 1e-6
    for idx in np.ndindex(*X.shape):
        Xp, Xm = X.copy(), X.copy()
        Xp[idx] += h
        Xm[idx] -= h
        num[idx] = (loss(Xp) - loss(Xm)) / (2 * h)
    np.testing.assert_allclose(GX, num, rtol=1e-6, atol=1e-8)
    paths = COMPONENT.backward_paths(GY, cache)
    np.testing.assert_allclose(paths["q"] + paths["k"] + paths["v"], GX, rtol=1e-12, atol=1e-12)


def test_causal_mask_blocks_future():
    prm = _params(d=8, H=1, dh=4, L=6, wqk=1.0, causal=1)
    rng = np.random.default_rng(2)
    W = COMPONENT.sample_weights(rng, prm, np.float64)
    X = rng.standard_normal((1, 6, 8))
    Y, _ = COMPONENT.forward(X, W, prm, rng)
    X2 = X.copy()
    X2[0, 4:] += 5.0                                 # change only the last two tokens
    Y2, _ = COMPONENT.forward(X2, W, prm, rng)
    np.testing.assert_allclose(Y[0, :4], Y2[0, :4], rtol=1e-12)


# --- (e) Monte Carlo agreement -----------------------------------------------------------
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("case", ["moderate", "wide-logits"])
def test_mc_agreement(case, causal):
    if case == "moderate":
        prm = _params(d=128, H=2, dh=32, L=48, wqk=0.7, p=0.2, causal=causal,
                      q_bias_std=0.3, v_bias_std=0.2, o_bias_std=0.1)
        x, g = Forward(0.5, 4.0, 0.3), Backward(1.0, 0.4)
    else:   # row logit variance ~ 2: query and key paths carry most of the gradient
        prm = _params(d=128, H=1, dh=64, L=64, wqk=1.0, p=0.0, causal=causal)
        x, g = Forward(0.0, 2.0, 0.0), Backward(1.0, 0.0)
    meas = measure(COMPONENT, prm, x, g, runs=24, batch=16, seed=11)
    y, gb = RULE.evaluate(x, g, **prm)
    for m_, se, pr, scale in ((meas.x.var, meas.x.var_se, y.var, y.var),
                              (meas.x.cov, meas.x.cov_se, y.corr * y.var, y.var),
                              (meas.g.var, meas.g.var_se, gb.var, gb.var),
                              (meas.g.cov, meas.g.cov_se, gb.corr * gb.var, gb.var)):
        assert abs(m_ - pr) <= 4 * se + 0.03 * abs(scale), (case, causal, m_, pr, se)


def test_sweep_spec():
    pts = SWEEP.points()
    assert len(pts) == 3**9 * 4
    assert {"causal", "multihead"} <= set(SWEEP.variants)
    case = SWEEP.make_case(pts[0])
    assert case.rule_params["n_heads"] == 1 and case.runs * case.batch >= 8
    mh = SWEEP.variants["multihead"]["grid"]
    case = SWEEP.make_case(SWEEP.points(mh)[0])
    assert case.rule_params["d"] == case.rule_params["n_heads"] * case.rule_params["d_head"]


# --- (e) the numeric evaluation path against values of the earlier (unbatched) code ---------
_EARLIER = [   # (L, causal, q/k std, p, bias scale): forward var, corr, backward var, corr at 2 points
    ((16, 0, 0.066, 0.1, 0.5), [0.0413506221616607, 0.16033762514894795, 0.5673616031785552, 0.9737674239654468,
                                0.2516351393343301, 0.5828463844385594, 0.07359337360744267, 0.10060737927104604]),
    ((128, 1, 0.04, 0.0, 0.0), [0.020828827684299722, 0.15353024245370026, 0.8590367372529547, 0.9964724407062743,
                                0.05498001676721838, 0.2503452688347256, 0.3236460068920575, 0.3326407537891703]),
    ((256, 0, 0.02, 0.1, 0.0), [0.017088112646799904, 0.15281439231634644, 0.997275536827164, 0.9995096125960484,
                                0.017740448062015888, 0.08689663295976892, 0.9790152337865077, 0.96901604893996]),
    ((16, 1, 0.066, 0.1, 0.5), [0.05404599972934665, 0.16671149722266257, 0.4777782972760165, 0.9374378792530885,
                                0.2825224999664312, 0.551579496625313, 0.056279240526094024, 0.10948158205995796]),
]


@pytest.mark.parametrize("case, expected", _EARLIER)
def test_batched_quadrature_matches_earlier_values(case, expected):
    """The batched integrals (shared smoothed factors, one grid per logit variance, all row
    statistics in one integral) reproduce the per-statistic, per-configuration evaluation
    to its quadrature noise (~3e-9 relative).  A regression pin: the expected values were
    computed by the implementation before the batching (commit 806ff4f); the rule's accuracy
    against sampling is tested by the Monte Carlo tests in this file and the component sweeps."""
    L, causal, s, p, b = case
    params = dict(d=1024, n_heads=16, d_head=64, L=L, p=p, causal=causal, q_std=s, k_std=s,
                  q_bias_std=0.3 * b, k_bias_std=0.1 * b, v_std=0.02, v_bias_std=0.05 * b,
                  o_std=0.02, o_bias_std=0.02 * b)
    y, g = RULE.evaluate(Forward(np.array([0.0, 0.1]), np.array([0.5, 1.0]), np.array([0.2, 0.9])),
                         Backward(np.array([1.0, 1.0]), np.array([0.1, 0.5])), **params)
    got = np.stack([y.var, y.corr, g.var, g.corr]).ravel()
    assert got == pytest.approx(np.array(expected), rel=1e-8)


def test_saturated_logits_are_outside_the_domain():
    """Row logit variances beyond ROW_LOGIT_VAR_MAX raise a DomainError (one clear line, exit 2
    from the CLI) instead of running for minutes and returning NaN (at ~1000 the quadratures
    broke down); just inside it the rule still evaluates."""
    import math

    from sigprop.errors import DomainError
    from sigprop.rules import get
    from sigprop.rules.attention import ROW_LOGIT_VAR_MAX
    from sigprop.state import Backward, Forward

    att = get("attention")
    d = 64
    base = dict(d=d, n_heads=1, d_head=64, L=16, p=0.0, causal=0, q_bias_std=0.0, k_bias_std=0.0,
                v_std=1 / math.sqrt(d), v_bias_std=0.0, o_std=1 / 8, o_bias_std=0.0)

    def qk(v_row):                          # q = k std giving mean row logit variance v_row at r = 0
        s = (v_row / d**2) ** 0.25
        return dict(base, q_std=s, k_std=s)

    y, g = att.evaluate(Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), **qk(0.9 * ROW_LOGIT_VAR_MAX))
    assert math.isfinite(float(y.var)) and math.isfinite(float(g.var))
    with pytest.raises(DomainError, match="row logit variance"):
        att.evaluate(Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), **qk(1.2 * ROW_LOGIT_VAR_MAX))


# --- (e) the sweeps' noise scoring ----------------------------------------------------------
def test_noise_scores_separate_noise_from_bias():
    """validate.noise_scores: errors in standard errors, and the p99 error the noise alone gives
    (for equal relative SEs s: 2.576 s); a rule biased by 3 SEs scores p50 ~3."""
    from sigprop.mc.validate import noise_scores

    rng = np.random.default_rng(0)
    n, s = 400, 0.01
    meas = 1 + s * rng.standard_normal(n)
    rows = [{"measured": {"x_var": m, "g_var": m}, "se": {"x_var": s, "g_var": s}} for m in meas]
    exact = noise_scores(rows, [{"x_var": 1.0, "g_var": 1.0}] * n)
    assert exact["x_var"]["z"]["p50"] == pytest.approx(0.674, abs=0.1)
    assert exact["g_var"]["noise_p99"] == pytest.approx(100 * 2.576 * s, rel=0.05)
    biased = noise_scores(rows, [{"x_var": 1.0 + 3 * s, "g_var": 1.0}] * n)
    assert biased["x_var"]["z"]["p50"] == pytest.approx(3.0, abs=0.3)


def test_sweep_rows_carry_standard_errors():
    """run_sweep's rows carry the measurement's standard errors (what validate stores)."""
    from sigprop.mc.sweep import run_sweep

    res = run_sweep(SWEEP, RULE, n=1, seed=3, grid={**SWEEP.variants["gqa"]["grid"], "L": (8,), "budget": (64,),
                                                      "max_seq": (8,), "min_runs": (4,)})
    se = res.rows[0]["se"]
    assert set(se) == {"x_mean", "x_var", "x_corr", "g_var", "g_corr"}
    assert all(np.isfinite(v) and v > 0 for k, v in se.items() if k != "x_mean")
