"""Softmax: the exact rule (and the softmax-moment machinery behind it) and the two published
forms.  Symbolic identities, hypothesis properties, numeric == evaluation of the symbolic
Integral, independent references (L = 2 one-dimensional integrals, brute-force sampling),
finite differences of the hand-written MC backward, seeded Monte Carlo agreement."""

import importlib
import math

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

# Rule.symbolic() does ``from sigprop.backend import symbolic``; until the submodule has been
# imported that name is the package's lazy-loader *function*, not the namespace module.
import sigprop.backend.symbolic  # noqa: F401
from tests.conftest import finite_difference_check
from sigprop import symbols
from sigprop.backend import numeric as nm
from sigprop.errors import DomainError
from sigprop.mc import components as C
from sigprop.mc.component import measure
from sigprop.mc.sweep import run_sweep
from sigprop.rules import get
from sigprop.rules.softmax_moments import softmax_expect, softmax_expect_sum
from sigprop.state import Backward, Forward

sm = importlib.import_module("sigprop.backend.symbolic")
S = symbols.symbol
NAMES = ("softmax", "softmax-approx", "softmax-full")


# ---- independent references -----------------------------------------------------------
def _l2_expect(f, v, n=200_001):
    """E[f(P_1)] for L = 2: P_1 = sigmoid(x), x = e_1 - e_2 ~ N(0, 2v); fine trapezoid."""
    sd = math.sqrt(2 * v)
    x = np.linspace(-14 * sd, 14 * sd, n)
    w = np.exp(-0.5 * (x / sd) ** 2) / (sd * math.sqrt(2 * math.pi)) * (x[1] - x[0])
    p = 0.5 * (1 + np.tanh(x / 2))
    return float(np.sum(w * f(p)))


def _sample_rows(rng, v, L, rows):
    e = rng.standard_normal((rows, L)) * math.sqrt(v)
    P = np.exp(e - e.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return e, P


def _outermost_integrals(e):
    if isinstance(e, sp.Integral):
        return {e}
    out = set()
    for a in e.args:
        out |= _outermost_integrals(a)
    return out


def _gauss_legendre(lo, hi, width, k=12):
    x, w = np.polynomial.legendre.leggauss(k)
    nseg = max(1, math.ceil((hi - lo) / width))
    edges = np.linspace(lo, hi, nseg + 1)
    a, b = edges[:-1, None], edges[1:, None]
    return ((a + b) / 2 + (b - a) / 2 * x).ravel(), ((b - a) / 2 * w).ravel()


def eval_nested(expr, ranges, env=None):
    """Evaluate a sympy expression with nested Integrals (all other symbols substituted):
    every Integral is replaced by composite Gauss-Legendre on the finite range
    ``ranges(variable) -> (lo, hi, segment width)``, vectorised with numpy (an independent
    evaluation of the symbolic formula: no code shared with the numeric backend)."""
    env = env or {}
    ints = sorted(_outermost_integrals(expr), key=str)
    holders = [sp.Dummy(f"I{k}") for k in range(len(ints))]
    values = []
    for integral in ints:
        (x, _, _), = integral.limits
        lo, hi, width = ranges(x)
        nodes, weights = _gauss_legendre(lo, hi, width)
        inner_env = {s: np.asarray(a)[..., None] for s, a in env.items()}
        ndim = max([np.ndim(a) for a in inner_env.values()], default=0)
        inner_env[x] = nodes.reshape((1,) * max(ndim - 1, 0) + (-1,)) if ndim else nodes
        vals = eval_nested(integral.function, ranges, inner_env)
        values.append(np.sum(np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), weights.shape))
                             * weights, axis=-1))
    body = expr.xreplace(dict(zip(ints, holders)))
    syms = list(env) + holders
    return sp.lambdify(syms, body, "numpy")(*env.values(), *values)


def _ranges(v, L):
    sd = math.sqrt(v)

    def ranges(x):
        if str(x).startswith("e"):
            return -12 * sd, 12 * sd, min(0.5, sd / 2)
        return -(math.log(L) + v / 2 + 60 + 10 * sd), 10 * sd + 10, 0.5
    return ranges


# ---- symbolic identities ----------------------------------------------------------------
def test_gamma_identity_behind_the_integral():
    t, s = sp.symbols("t s", positive=True)
    for n in (1, 2, 3, 4):
        lhs = sp.integrate(t ** (n - 1) * sp.exp(-t * s), (t, 0, sp.oo)) / sp.gamma(n)
        assert sp.simplify(lhs - s ** -n) == 0


@pytest.mark.parametrize("name", NAMES)
def test_mean_and_correlations_are_the_exact_row_constraints(name):
    f = get(name).symbolic()
    L = S("L")
    assert sp.simplify(f["x_mean"] - 1 / L) == 0
    assert sp.simplify(f["x_corr"] + 1 / (L - 1)) == 0
    assert sp.simplify(f["g_corr"] + 1 / (L - 1)) == 0


def test_exact_rule_ignores_the_mean():
    f = get("softmax").symbolic()
    for key in ("x_var", "g_var"):
        assert S("x_mean") not in f[key].free_symbols


def test_published_forms_small_variance_limits():
    f_a, f_f = get("softmax-approx").symbolic(), get("softmax-full").symbolic()
    s, r, L = S("x_std"), S("x_corr"), S("L")
    v = sp.Symbol("v", positive=True)
    va = f_a["x_var"].subs(s, sp.sqrt(v / (1 - r)))
    vf = f_f["x_var"].subs(s, sp.sqrt(v / (1 - r)))
    assert sp.simplify(sp.limit(va / v, v, 0) - 1 / L**2) == 0
    assert sp.simplify(sp.limit(vf / v, v, 0) - L / ((L - 1) * L**2)) == 0
    # both vanish for fully correlated logits
    assert sp.simplify(f_a["x_var"].subs(r, 1)) == 0
    assert sp.simplify(f_f["x_var"].subs(r, 1)) == 0


def test_published_forms_reproduce_the_quoted_numbers():
    x, g = Forward(0.0, 4.0, 0.2), Backward(1.0, 0.0)
    assert float(get("softmax-approx").evaluate(x, g, L=300)[0].var) == pytest.approx(2.61e-4, rel=3e-3)
    assert float(get("softmax-full").evaluate(x, g, L=300)[0].var) == pytest.approx(2.72e-4, rel=3e-3)


# ---- softmax_expect against independent references ---------------------------------------
@pytest.mark.parametrize("v", [1e-3, 0.3, 2.0, 9.0, 25.0])
def test_softmax_expect_L2_against_1d_integrals(v):
    for a, f in [(1, lambda p: p), (2, lambda p: p**2), (3, lambda p: p**3), (4, lambda p: p**4)]:
        assert softmax_expect(nm, v, 2, ((a, 0),)) == pytest.approx(_l2_expect(f, v), rel=1e-9)
    pair = _l2_expect(lambda p: p**2 * (1 - p) ** 2, v)
    assert softmax_expect(nm, v, 2, ((2, 0), (2, 0))) == pytest.approx(pair, rel=1e-9)


def test_L_equal_one_gives_one():
    v = np.array([1e-6, 0.01, 1.0, 9.0, 20.0])
    for a in (1, 2, 3):
        assert np.allclose(softmax_expect(nm, v, 1, ((a, 0),)), 1.0, rtol=1e-11)


def test_pure_gaussian_moments_need_no_integral():
    assert softmax_expect(nm, 2.0, 10, ((0, 2),)) == 2.0
    assert softmax_expect(nm, 2.0, 10, ((0, 4), (0, 2))) == 24.0   # 3 v^2 * v
    assert softmax_expect(nm, 2.0, 10, ((0, 1),)) == 0


def test_sum_rules_hold():
    """sum_j P_j = 1 gives L E P_1 = 1 and L E P_1^2 + L (L-1) E P_1 P_2 = 1; Stein's lemma
    and shift invariance (sum_j dP_1/de_j = 0) give E[P_1 e_1] + (L-1) E[P_1 e_2] = 0."""
    v = np.array([1e-4, 0.5, 4.0, 16.0])
    for L in (3, 50, 2000):
        assert np.allclose(L * softmax_expect(nm, v, L, ((1, 0),)), 1, rtol=1e-10)
        s = softmax_expect_sum(nm, v, L, [(L, ((2, 0),)), (L * (L - 1), ((1, 0), (1, 0)))])
        assert np.allclose(s, 1, rtol=1e-10)
        t = softmax_expect_sum(nm, v, L, [(1, ((1, 1),)), (L - 1, ((1, 0), (0, 1)))])
        assert np.allclose(t, 0, atol=1e-12)


def test_softmax_expect_against_brute_force_sampling():
    rng = np.random.default_rng(5)
    v, L, rows = 2.0, 10, 400_000
    e, P = _sample_rows(rng, v, L, rows)
    for terms, sample in [(((2, 2),), P[:, 0] ** 2 * e[:, 0] ** 2),
                          (((1, 1), (1, 1)), P[:, 0] * e[:, 0] * P[:, 1] * e[:, 1]),
                          (((2, 0), (2, 0)), P[:, 0] ** 2 * P[:, 1] ** 2),
                          (((1, 2), (0, 2)), P[:, 0] * e[:, 0] ** 2 * e[:, 1] ** 2)]:
        se = sample.std() / math.sqrt(rows)
        assert abs(softmax_expect(nm, v, L, terms) - sample.mean()) < 4.5 * se, terms


def test_variance_combination_stays_accurate_as_v_goes_to_zero():
    """Var P_1 ~ v (L-1)/L^3 (1 + O(v)); the one-integral difference keeps it, the difference
    of two separately computed moments would not."""
    for L in (2, 32, 10_000):
        v = np.array([1e-10, 1e-8, 1e-6, 1e-4])
        var = get("softmax").evaluate(Forward(0.0, v, 0.0), L=L)[0].var
        ratio = var / (v * (L - 1) / L**3)
        assert np.all(np.abs(ratio - 1) < 2 * v + 1e-5)


def test_vectorised_equals_pointwise_and_broadcasts():
    v = np.array([[1e-4, 0.3, 2.0], [5.0, 9.0, 0.01]])
    L = np.array([[2, 300, 32], [10_000, 100, 7]])
    got = softmax_expect(nm, v, L, ((2, 0), (1, 1)))
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert got[i, j] == pytest.approx(softmax_expect(nm, v[i, j], L[i, j], ((2, 0), (1, 1))),
                                              rel=1e-12)


def test_inside_an_outer_gaussian_expectation():
    """v itself random (log-normal here): nested use through expect_normal broadcasts."""
    L = np.array([30.0, 300.0])
    got = nm.expect_normal(lambda x: softmax_expect(nm, np.exp(x), L, ((2, 0),)),
                           np.full(2, 0.25), -0.5, n=24)
    x, w = np.polynomial.hermite_e.hermegauss(24)
    ref = [sum(wk / math.sqrt(2 * math.pi) * softmax_expect(nm, math.exp(-0.5 + 0.5 * xk), l, ((2, 0),))
               for xk, wk in zip(x, w)) for l in L]
    assert np.allclose(got, ref, rtol=1e-12)


# ---- numeric == symbolic -------------------------------------------------------------------
@pytest.mark.parametrize("v,L,terms", [(1.0, 5, ((2, 0),)), (3.2, 40, ((1, 1), (1, 1))),
                                       (0.2, 300, ((2, 2),)), (9.0, 8, ((4, 0),))])
def test_softmax_expect_equals_its_symbolic_integral(v, L, terms):
    vs, Ls = sp.Symbol("v", positive=True), sp.Symbol("L", positive=True)
    expr = softmax_expect(sm, vs, Ls, terms).subs({vs: v, Ls: L})
    assert float(eval_nested(expr, _ranges(v, L))) == pytest.approx(
        softmax_expect(nm, v, L, terms), rel=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_rule_numeric_equals_symbolic(name):
    rule = get(name)
    f = rule.symbolic()
    for s2, r, L, gv, gr in [(4.0, 0.2, 300, 1.0, 0.0), (0.5, 0.0, 30, 2.0, 0.5),
                             (9.0, 0.6, 12, 0.3, -0.05)]:
        subs = {S("x_std"): math.sqrt(s2), S("x_corr"): r, S("L"): L, S("g_std"): math.sqrt(gv),
                S("g_corr"): gr, S("x_mean"): 0.3}
        y, g = rule.evaluate(Forward(0.3, s2, r), Backward(gv, gr), L=L)
        num = {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": g.var, "g_corr": g.corr}
        for key, expr in f.items():
            val = float(eval_nested(sp.sympify(expr).subs(subs), _ranges((1 - r) * s2, L)))
            assert float(num[key]) == pytest.approx(val, rel=1e-8), (name, key, s2, r, L)


@pytest.mark.slow
def test_softmax_expect_equals_mpmath_evaluation_of_the_symbolic_integral():
    """sympy -> mpmath (lambdify), infinite limits truncated to +-12 sd (e) and a wide u
    range; ~1 minute."""
    import mpmath as mp

    v, L = 1.0, 3
    vs, Ls = sp.Symbol("v", positive=True), sp.Symbol("L", positive=True)
    expr = softmax_expect(sm, vs, Ls, ((2, 0),)).subs({vs: v, Ls: L})

    def finite(I):
        (x, _, _), = I.limits
        body = I.function.replace(lambda z: isinstance(z, sp.Integral), finite)
        lo, hi, _ = _ranges(v, L)(x)
        return sp.Integral(body, (x, max(lo, -40), hi))

    expr = expr.replace(lambda z: isinstance(z, sp.Integral), finite)
    mp.mp.dps = 12
    val = float(sp.lambdify([], expr, "mpmath")())
    assert softmax_expect(nm, v, L, ((2, 0),)) == pytest.approx(val, rel=1e-9)


# ---- properties ------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(s2=st.floats(1e-6, 12.0), r=st.floats(0.0, 0.95), L=st.integers(2, 20_000),
       gv=st.floats(0.0, 10.0), gr=st.floats(0.0, 1.0))
def test_properties(s2, r, L, gv, gr):
    y, g = get("softmax").evaluate(Forward(0.0, s2, r), Backward(gv, gr), L=L)
    var, gvar = float(y.var), float(g.var)
    assert float(y.mean) == pytest.approx(1 / L)
    assert 0 <= var <= 1 / L - 1 / L**2 + 1e-15          # P in [0, 1] with mean 1/L
    assert 0 <= gvar <= 2 * gv * (1 - gr) * (var + 1 / L**2) + 1e-15
    assert -1 <= float(y.corr) <= 0 and -1 <= float(g.corr) <= 0
    # softmax variance grows with the logit variance
    y2 = get("softmax").evaluate(Forward(0.0, s2 * 1.5, r), L=L)[0]
    assert float(y2.var) > var


def test_large_variance_limit_is_one_hot():
    """v -> oo: one logit takes the whole row, var -> 1/L - 1/L^2 (deviation O(1/sqrt v))."""
    L, top = 4, 1 / 4 - 1 / 16
    dev = [top - float(get("softmax").evaluate(Forward(0.0, s2, 0.0), L=L)[0].var)
           for s2 in (25.0, 100.0, 400.0)]
    assert 0 < dev[2] < dev[1] < dev[0] and dev[2] < 0.2 * top


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("x,g,params", [
    (Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), {"L": 1}),
    (Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), {"L": 2.5}),
    (Forward(0.0, 1.0, -0.2), Backward(1.0, 0.0), {"L": 10}),
    (Forward(0.0, 1.0, 0.0), Backward(1.0, -0.5), {"L": 10}),
    (Forward(0.0, -1.0, 0.0), Backward(1.0, 0.0), {"L": 10}),
    (Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), {}),
])
def test_domain_errors(name, x, g, params):
    with pytest.raises(DomainError):
        get(name).evaluate(x, g, **params)


def test_any_mean_and_negative_correlation_down_to_the_floor():
    a = get("softmax").evaluate(Forward(5.0, 2.0, -0.1), Backward(1.0, -0.1), L=10)
    b = get("softmax").evaluate(Forward(0.0, 2.0 * 1.1 / 1.0, 0.0), Backward(1.1, 0.0), L=10)
    assert float(a[0].var) == pytest.approx(float(b[0].var), rel=1e-12)
    assert float(a[1].var) == pytest.approx(float(b[1].var), rel=1e-12)


# ---- Monte Carlo -----------------------------------------------------------------------
def test_backward_finite_differences():
    comp = C.get("softmax")
    for L in (2, 7, 50):
        analytic, numeric = finite_difference_check(comp, {"L": L}, (3, L, 1))
        assert analytic == pytest.approx(numeric, rel=1e-7, abs=1e-10)


def test_exact_rule_matches_sampling_at_logit_std_2_where_published_forms_fail():
    x, g = Forward(0.0, 4.0, 0.2), Backward(1.0, 0.3)
    meas = measure(C.get("softmax"), {"L": 300}, x, g, runs=8, batch=1500, seed=3)
    y, gb = get("softmax").evaluate(x, g, L=300)
    assert abs(meas.x.var - float(y.var)) < 4.5 * meas.x.var_se
    assert abs(meas.g.var - float(gb.var)) < 4.5 * meas.g.var_se
    assert meas.x.var_se < 0.02 * meas.x.var
    for name in ("softmax-approx", "softmax-full"):
        yp, gp = get(name).evaluate(x, g, L=300)
        assert float(yp.var) / meas.x.var > 1.7      # published: off by ~1.8x
        assert float(gp.var) / meas.g.var > 2.0


def test_seeded_sweep_subset():
    spec = C.SWEEPS["softmax"]
    res = run_sweep(spec, get("softmax"), n=6, seed=1)
    for row in res.rows:
        for mom, err in row["errors"].items():
            assert err < 0.02, (row["point"], mom, err)
