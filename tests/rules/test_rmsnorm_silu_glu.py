"""RMSNorm, SiLU and the gated FFN cores (reglu, geglu, swiglu): reference values, symbolic
identities and limits, hypothesis properties, numeric == symbolic, finite differences of the
hand-written Monte Carlo backward, and seeded Monte Carlo agreement on grid points."""

from __future__ import annotations

import dataclasses
import math

import mpmath as mp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import sigprop.backend.symbolic  # noqa: F401  (see tests/rules/test_activation.py)
from tests.conftest import finite_difference_check, numeric_value, symbolic_value
from sigprop.errors import DomainError
from sigprop.mc import components as C
from sigprop.mc.component import measure
from sigprop.rules import REGISTRY, compose, get
from sigprop.state import Backward, Forward
from sigprop.symbols import symbol

S = symbol
GLUS = ("reglu", "geglu", "swiglu")


# =========================================================================== SiLU
def _mp_moment(h, s2):
    """E[h(x)], x ~ N(0, s2), by mpmath adaptive quadrature (independent of sigprop)."""
    s = mp.sqrt(s2)
    return float(mp.quad(lambda z: h(s * z) * mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi), [-mp.inf, -1, 0, 1, mp.inf]))


def _mp_silu(x):
    return x / (1 + mp.exp(-x))


def _mp_silu_prime(x):
    s = 1 / (1 + mp.exp(-x))
    return s * (1 + x * (1 - s))


def test_silu_unit_variance_reference_values():
    # E[silu] = 0.2066, E[silu^2] = 0.3558, E[silu'^2] = 0.3795 for x ~ N(0, 1)
    y, g = get("silu").evaluate(Forward(0.0, 1.0, 0.3), Backward(1.0, 0.0))
    assert float(y.mean) == pytest.approx(0.2066, abs=5e-5)
    assert float(y.var + y.mean**2) == pytest.approx(0.3558, abs=5e-5)
    assert float(g.var) == pytest.approx(0.3795, abs=5e-5)


@pytest.mark.parametrize("s2", [1e-3, 1.0, 100.0, 1e4])
def test_silu_matches_mpmath(s2):
    """The trapezoid quadrature against mpmath, also where Gauss-Hermite fails (s2 >= 100)."""
    mp.mp.dps = 20
    m0 = _mp_moment(_mp_silu, s2)
    m2 = _mp_moment(lambda x: _mp_silu(x) ** 2, s2)
    k2 = _mp_moment(lambda x: _mp_silu_prime(x) ** 2, s2)
    y, g = get("silu").evaluate(Forward(0.0, s2, 0.5), Backward(1.0, 1.0))
    rel = 1e-10 if s2 <= 1e3 else 5e-6
    assert float(y.mean) == pytest.approx(m0, rel=rel)
    assert float(y.var) == pytest.approx(m2 - m0**2, rel=rel)
    assert float(g.var) == pytest.approx(k2, rel=rel)


_Z, _W = np.polynomial.hermite_e.hermegauss(200)
_W = _W / math.sqrt(2 * math.pi)


@pytest.mark.parametrize("s2", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("r", [-0.5, 0.3, 0.9])
def test_silu_cross_moments_match_gauss_hermite(s2, r):
    """Cross-token moments against 2-D Gauss-Hermite (200 x 200 nodes, accurate for these
    variances: poles of silu at +-i pi stay far from the real axis in z)."""
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    f = lambda x: x * sig(x)  # noqa: E731
    fp = lambda x: sig(x) * (1 + x * (1 - sig(x)))  # noqa: E731
    s, q = math.sqrt(s2), math.sqrt(1 - r * r)
    z1, z2 = np.meshgrid(_Z, _Z, indexing="ij")
    mean = float(_W @ f(s * _Z))
    cross = float(_W @ (f(s * z1) * f(s * (r * z1 + q * z2))) @ _W)
    gcross = float(_W @ (fp(s * z1) * fp(s * (r * z1 + q * z2))) @ _W)
    y, g = get("silu").evaluate(Forward(0.0, s2, r), Backward(1.0, 1.0))
    assert float(y.corr * y.var) == pytest.approx(cross - mean**2, rel=1e-9, abs=1e-13)
    assert float(g.corr * g.var) == pytest.approx(gcross, rel=1e-9)


def test_silu_limits():
    # small input: silu(x) = x/2 + x^2/4 + O(x^4): var s2/4, corr r, grad var g2/4
    y, g = get("silu").evaluate(Forward(0.0, 1e-6, 0.4), Backward(2.0, 0.6))
    assert float(y.var) == pytest.approx(0.25e-6, rel=1e-5)
    assert float(y.corr) == pytest.approx(0.4, abs=1e-5)
    assert float(g.var) == pytest.approx(0.5, rel=1e-5)
    assert float(g.corr) == pytest.approx(0.6, abs=1e-5)
    # large input: silu -> relu (differences O(1/s) relative)
    x = Forward(0.0, 1e4, 0.5)
    (y, g), (yr, gr) = get("silu").evaluate(x, Backward(1.0, 0.5)), get("relu").evaluate(x, Backward(1.0, 0.5))
    for a, b in ((y.var, yr.var), (y.corr, yr.corr), (g.var, gr.var), (g.corr, gr.corr)):
        assert float(a) == pytest.approx(float(b), rel=0.02)


@settings(max_examples=60, deadline=None)
@given(s2=st.floats(1e-4, 1e3), r=st.floats(-1, 1), rg=st.floats(-1, 1), g2=st.floats(0, 1e3))
def test_silu_properties(s2, r, rg, g2):
    y, g = get("silu").evaluate(Forward(0.0, s2, r), Backward(g2, rg))
    assert float(y.var) > 0 and abs(float(y.corr)) <= 1 and float(g.var) >= 0 and abs(float(g.corr)) <= 1
    assert float(y.mean) > 0            # E[x sigmoid(x)] = s2 E[sigmoid'(x)] > 0
    y0, _ = get("silu").evaluate(Forward(0.0, s2, 0.0))
    assert abs(float(y0.corr)) < 1e-9   # independent tokens stay independent
    y1, g1 = get("silu").evaluate(Forward(0.0, s2, 1.0), Backward(1.0, 1.0))
    assert float(y1.corr) == pytest.approx(1.0, abs=1e-9) and float(g1.corr) == pytest.approx(1.0, abs=1e-9)


def test_silu_zero_mean_only():
    with pytest.raises(DomainError):
        get("silu").evaluate(Forward(0.5, 1.0, 0.0))


# =========================================================================== RMSNorm
RMS = REGISTRY["rmsnorm"]


@pytest.fixture(scope="module")
def rms_expr():
    return RMS.symbolic()


def test_rmsnorm_second_moment_is_one_without_eps(rms_expr):
    e = rms_expr["x_var"] + rms_expr["x_mean"] ** 2
    assert sp.simplify(e.subs(S("eps"), 0)) == 1


def test_rmsnorm_zero_mean_is_layernorm_series_with_n_equal_d(rms_expr):
    r, d, k = S("x_corr"), S("d"), S("kappa_rms")
    corr = rms_expr["x_corr"].subs({S("x_mean"): 0, k: 1})
    assert sp.simplify(corr - r * (1 - (1 - r**2) / (2 * d))) == 0
    gcorr = rms_expr["g_corr"].subs({S("x_mean"): 0, k: 1, S("g_generic_rms"): 1})
    assert sp.simplify(gcorr - S("g_corr") * (1 - 3 * (1 - r**2) / (2 * d))) == 0
    # exact inverse chi-square gradient gain at eps = 0: g2 (d-1)/(s2 (d-2))
    gvar = rms_expr["g_var"].subs({S("x_mean"): 0, k: 1, S("g_generic_rms"): 1, S("eps"): 0,
                                   S("g_slope_rms"): 0})
    assert sp.simplify(gvar - S("g_var") * (d - 1) / (S("x_var") * (d - 2))) == 0


def test_rmsnorm_wide_limit_and_the_next_linear_layer(rms_expr):
    """d -> oo: mean mu/sqrt(s2+mu^2), var s2/(s2+mu^2); after a zero-mean linear layer the
    token correlation is (s2 r + mu^2)/(s2 + mu^2)."""
    mu, s2, r, d = S("x_mean"), S("x_var"), S("x_corr"), S("d")
    lim = {k: sp.limit(v.subs(S("eps"), 0), d, sp.oo) for k, v in rms_expr.items() if k.startswith("x_")}
    assert sp.simplify(lim["x_mean"] - mu / sp.sqrt(s2 + mu**2)) == 0
    assert sp.simplify(lim["x_var"] - s2 / (s2 + mu**2)) == 0
    assert sp.simplify(lim["x_corr"] - r) == 0
    y, _ = compose([("rmsnorm", {"d": 10**9, "eps": 0.0, "kappa_rms": 1.0, "g_generic_rms": 1.0}),
                    ("linear", {"d_in": 64, "d_out": 64, "w_std": 0.125, "b_std": 0.0})],
                   Forward(1.5, 0.5, 0.2), Backward(1.0, 0.0), __import__("sigprop.backend.numeric").backend.numeric)
    assert y.corr == pytest.approx((0.5 * 0.2 + 1.5**2) / (0.5 + 1.5**2), rel=1e-8)


def test_rmsnorm_large_mean_limit():
    # |mu| >> sigma: y = 1 + (sigma/mu)(a - mean_f a): var (s2/mu^2)(1 - 1/d), corr r
    d, s2, mu, r = 64, 1e-6, 1.0, 0.4
    y, _ = RMS.evaluate(Forward(mu, s2, r), None, d=d, eps=0.0)
    assert float(y.var) == pytest.approx(s2 / mu**2 * (1 - 1 / d), rel=1e-5)
    assert float(y.corr) == pytest.approx(r, abs=1e-5)


@settings(max_examples=150, deadline=None)
@given(d=st.integers(4, 100_000), r=st.floats(-1, 1), rg=st.floats(-1, 1), s2=st.floats(1e-6, 1e6),
       m=st.floats(-30, 30), g2=st.floats(0, 1e6))
def test_rmsnorm_properties(d, r, rg, s2, m, g2):
    mu = m * math.sqrt(s2)
    y, g = RMS.evaluate(Forward(mu, s2, r), Backward(g2, rg), d=d, eps=0.0)
    assert 0 < y.var <= 1 and abs(y.mean) < 1 and np.sign(y.mean) == np.sign(mu)
    assert abs(y.corr) <= 1 and g.var >= 0 and abs(g.corr) <= abs(rg) + 1e-15
    # scale invariance: forward unchanged, gradient variance divided by c^2
    y2, g2b = RMS.evaluate(Forward(3 * mu, 9 * s2, r), Backward(g2, rg), d=d, eps=0.0)
    assert y2.corr == pytest.approx(y.corr, rel=1e-9, abs=1e-12) and y2.var == pytest.approx(y.var, rel=1e-9)
    assert g2b.var == pytest.approx(g.var / 9, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(d=st.integers(16, 100_000), r=st.floats(-1, 1), rg=st.floats(-1, 1), s2=st.floats(1e-3, 1e3))
def test_rmsnorm_equals_layernorm_for_zero_mean_up_to_1_over_d(d, r, rg, s2):
    x, g = Forward(0.0, s2, r), Backward(1.0, rg)
    (y, gb), (yl, gl) = RMS.evaluate(x, g, d=d, eps=0.0), get("layernorm").evaluate(x, g, d=d, eps=0.0)
    assert y.mean == 0 and y.var == pytest.approx(yl.var, abs=1e-12)
    assert abs(y.corr - yl.corr) <= 2.0 / d**2 + 1e-12          # the centred dimension is O(1/d^2)
    assert abs(gb.corr - gl.corr) <= 3.0 / d**2 + 1e-12
    assert gb.var * s2 == pytest.approx(gl.var * s2, rel=2.0 / d**2)


def test_rmsnorm_domain():
    with pytest.raises(DomainError):
        RMS.evaluate(Forward(0.0, 1.0, 0.0), None, d=3)
    with pytest.raises(DomainError):
        RMS.evaluate(Forward(0.0, 1.0, 0.0), None, d=64, kappa_rms=-1)


@pytest.mark.parametrize("name,pt,params", [
    ("rmsnorm", (1.3, 0.7, 0.4, 2.0, 0.3), dict(d=32, eps=1e-3, kappa_rms=0.6, g_generic_rms=0.3)),
    ("rmsnorm", (-4.0, 10.0, -0.2, 0.5, 0.9), dict(d=1000, eps=1e-6)),
    ("reglu", (0.8, 1.5, 0.3, 2.0, 0.4), dict(d_in=64, d_ff=170, gate_std=0.2, up_std=0.05, gate_b_std=0.1, up_b_std=0.2)),
    ("geglu", (0.0, 0.7, -0.3, 1.0, 0.5), dict(d_in=100, d_ff=300, gate_std=0.3, up_std=0.1)),
])
def test_numeric_equals_symbolic(name, pt, params):
    rule = get(name)
    x, g = Forward(*pt[:3]), Backward(*pt[3:])
    num, sym = numeric_value(rule, x, g, params), symbolic_value(rule, x, g, params)
    for k in num:
        assert num[k] == pytest.approx(sym[k], rel=1e-10, abs=1e-14), k


def test_numeric_equals_symbolic_integrals():
    """SiLU and SwiGLU: the symbolic moments are unevaluated integrals; mpmath (through
    lambdify) evaluates them independently of the numeric trapezoid rule."""
    x, g = Forward(0.0, 0.8, 0.5), Backward(1.5, 0.4)
    for name, params in (("silu", {}), ("swiglu", dict(d_in=50, d_ff=120, gate_std=0.15, up_std=0.2))):
        rule = get(name)
        num = numeric_value(rule, x, g, params)
        subs = {S("x_mean"): x.mean, S("x_std"): math.sqrt(x.var), S("x_corr"): x.corr, S("g_std"): math.sqrt(g.var),
                S("g_corr"): g.corr, **{S(k): v for k, v in params.items()}}
        if "gate_b_std" in {q.name for q in rule.params}:
            subs.update({S("gate_b_std"): 0, S("up_b_std"): 0})
        expr = rule.symbolic()
        for key in ("x_mean", "x_var", "g_var"):       # single (not nested) integrals
            v = _mp_integrals(expr[key].subs(subs))
            assert float(v) == pytest.approx(num[key], rel=1e-8), (name, key)


def _mp_integrals(e):
    """Every (1-D, fully substituted) sympy Integral in ``e`` replaced by mpmath's quadrature
    of its lambdified integrand."""
    mp.mp.dps = 20

    def quad(integral):
        (var, lo, hi), = integral.limits
        f = sp.lambdify(var, integral.function, modules="mpmath")
        return sp.Float(mp.quad(f, [-mp.inf, -1, 0, 1, mp.inf]), 20)

    return sp.N(e.replace(lambda t: isinstance(t, sp.Integral), quad), 15)


def test_rmsnorm_needs_its_finite_d_terms():
    """At d = 16 with a mean the 1/d terms are percent-sized: the Monte Carlo matches the rule
    and rejects the wide-limit moments."""
    comp = C.get("rmsnorm")
    x, g = Forward(0.8, 1.0, 0.5), Backward(1.0, 0.5)
    d = 16
    px, pg = RMS.evaluate(x, g, d=d, eps=1e-6)
    meas = measure(comp, {"d": d, "L": 4, "eps": 1e-6}, x, g, runs=16, batch=8000, seed=7)
    k = 4.5
    assert abs(meas.x.mean - px.mean) <= k * meas.x.mean_se + 1e-4
    assert abs(meas.x.cov - px.corr * px.var) <= k * meas.x.cov_se + 1e-4
    assert abs(meas.g.var - pg.var) <= k * meas.g.var_se
    assert abs(meas.g.cov - pg.corr * pg.var) <= k * meas.g.cov_se + 1e-4
    Q = x.var + x.mean**2
    assert abs(meas.g.var - g.var / Q) > 10 * meas.g.var_se                 # wide-limit gradient
    assert abs(meas.x.corr - x.corr) > 10 * meas.x.corr_se                  # wide-limit correlation


# =========================================================================== gated FFN
@settings(max_examples=80, deadline=None)
@given(d=st.integers(1, 4096), dff=st.integers(1, 16384), mu=st.floats(-3, 3), s2=st.floats(1e-3, 10),
       r=st.floats(0, 1), rg=st.floats(-1, 1), sg=st.floats(1e-3, 1), su=st.floats(1e-3, 1),
       bg=st.floats(0, 1), bu=st.floats(0, 1))
def test_reglu_is_the_factorised_product(d, dff, mu, s2, r, rg, sg, su, bg, bu):
    """ReGLU typed out from the factorisation: gate and up Gaussian with the linear layer's
    moments, E[relu^2] = V/2, E[relu'^2] = 1/2 and the degree-1 arc-cosine kernel."""
    y, g = get("reglu").evaluate(Forward(mu, s2, r), Backward(2.0, rg), d_in=d, d_ff=dff, gate_std=sg,
                                 up_std=su, gate_b_std=bg, up_b_std=bu)
    Q, Cx = s2 + mu**2, r * s2 + mu**2
    vg, cg = d * sg**2 * Q + bg**2, d * sg**2 * Cx + bg**2
    vu, cu = d * su**2 * Q + bu**2, d * su**2 * Cx + bu**2
    rho = min(1.0, cg / vg)
    k = vg * (math.sqrt(1 - rho**2) + (math.pi - math.acos(rho)) * rho) / (2 * math.pi)
    kp = 0.25 + math.asin(rho) / (2 * math.pi)
    assert y.mean == 0
    assert y.var == pytest.approx(vg / 2 * vu, rel=1e-10)
    assert y.corr * y.var == pytest.approx(k * cu, rel=1e-9, abs=1e-12 * y.var)
    gv = dff * 2.0 * (sg**2 * vu / 2 + su**2 * vg / 2)
    assert g.var == pytest.approx(gv, rel=1e-10)
    assert g.corr * g.var == pytest.approx(dff * 2.0 * rg * (sg**2 * kp * cu + su**2 * k), rel=1e-9, abs=1e-12 * gv)


def test_swiglu_unit_gate_matches_silu_moments():
    # unit-variance gate and up: E[y^2] = E[silu^2] = 0.3558; Var(dg) = E[silu'^2] Var(dy) per
    # unit up variance, Var(du) = E[silu^2] Var(dy)
    d = 256
    y, g = get("swiglu").evaluate(Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), d_in=d, d_ff=d,
                                  gate_std=1 / math.sqrt(d), up_std=1 / math.sqrt(d))
    assert float(y.var) == pytest.approx(0.3558, abs=5e-5)
    assert float(g.var) == pytest.approx(0.3795 + 0.3558, abs=1e-4)


@pytest.mark.parametrize("name", GLUS)
def test_glu_backward_finite_differences(name):
    params = {"d_in": 6, "d_ff": 9, "gate_std": 0.5, "up_std": 0.4, "gate_b_std": 0.3, "up_b_std": 0.2, "L": 3}
    a, n = finite_difference_check(C.get(name), params, (2, 3, 6), seed=4)
    assert a == pytest.approx(n, rel=1e-6)


@pytest.mark.parametrize("name,params,shape", [
    ("silu", {"d": 7, "L": 3}, (2, 3, 7)),
    ("rmsnorm", {"d": 7, "L": 3, "eps": 0.0}, (2, 3, 7)),
    ("rmsnorm", {"d": 7, "L": 3, "eps": 0.5}, (2, 3, 7)),
])
def test_backward_finite_differences(name, params, shape):
    a, n = finite_difference_check(C.get(name), params, shape, seed=2)
    assert a == pytest.approx(n, rel=1e-6)


def test_rmsnorm_mc_forward_is_the_definition():
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((3, 5, 64)) * 0.5 + 1.0).astype(np.float32)
    Y, _ = C.get("rmsnorm").forward(X, {}, {"d": 64, "eps": 1e-6}, rng)
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(Y, X64 / np.sqrt((X64**2).mean(-1, keepdims=True) + 1e-6), rtol=2e-6)


def test_glu_mc_forward_is_the_definition():
    comp = C.get("swiglu")
    params = {"d_in": 8, "d_ff": 12, "gate_std": 0.3, "up_std": 0.2, "gate_b_std": 0.1}
    rng = np.random.default_rng(1)
    W = comp.sample_weights(rng, params, np.float64)
    X = rng.standard_normal((2, 3, 8))
    Y, _ = comp.forward(X, W, params, rng)
    g = X @ W["gate"][0] + W["gate"][1]
    assert W["up"][1] is None
    np.testing.assert_allclose(Y, g / (1 + np.exp(-g)) * (X @ W["up"][0]), rtol=1e-12)


# --------------------------------------------------------------------- seeded Monte Carlo
def _agree(name, case, seed, tol):
    rule = get(name)
    px, pg = rule.evaluate(case.x, case.g, **case.rule_params)
    meas = measure(C.get(name), case.sim_params, case.x, case.g, runs=case.runs, batch=case.batch, seed=seed)
    from sigprop.mc.sweep import errors

    err = errors(px, pg, meas)
    for k, e in err.items():
        assert e < tol, (name, k, e, meas)


@pytest.mark.parametrize("pt", [
    dict(x_std=1.0, x_corr=0.6, g_corr=0.4, g_std=1.0, d=100),
    dict(x_std=3.16, x_corr=0.2, g_corr=0.8, g_std=0.316, d=100),
])
def test_silu_mc_agrees(pt):
    _agree("silu", C.SWEEPS["silu"].make_case(pt), 3, 0.02)


@pytest.mark.parametrize("pt", [
    dict(x_std=0.316, x_mean=1.0, x_corr=2 / 3, g_corr=1 / 3, g_std=1.0, d=100, L=16),
    dict(x_std=3.16, x_mean=-3.33, x_corr=1 / 3, g_corr=2 / 3, g_std=3.16, d=316, L=16),
])
def test_rmsnorm_mc_agrees(pt):
    _agree("rmsnorm", C.SWEEPS["rmsnorm"].make_case(pt), 5, 0.02)


@pytest.mark.parametrize("name", GLUS)
def test_glu_mc_agrees(name):
    pt = dict(x_std=1.0, x_mean=0.0, x_corr=0.4, g_corr=0.5, gate_std_sqrt_din=1.0, up_std_sqrt_din=3.16,
              b_std=0.0, d_in=256)
    case = C.SWEEPS[name].make_case(pt)
    _agree(name, dataclasses.replace(case, runs=4), 9, 0.03)


# ------------------------------------------------------------------------- listing, export
def test_registered_everywhere():
    from sigprop.export.components import components_latex

    for name in ("silu", "rmsnorm", *GLUS):
        assert name in REGISTRY and C.get(name).rule == name and name in C.SWEEPS
    tex = components_latex([get("rmsnorm"), get("swiglu")])
    assert "RMSNorm" in tex and "SwiGLU" in tex and r"\kappa_{\mathrm{RMS}}" in tex


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, timeout=300)


def test_cli_lists_and_checks():
    out = _cli("rules", "silu", "rmsnorm", "reglu")
    assert out.returncode == 0 and all(n in out.stdout for n in ("silu", "rmsnorm", "reglu")), out.stderr
    res = _cli("check-component", "swiglu", "-p", "d_in=64", "-p", "d_ff=128", "-p", "gate_std=0.125",
               "-p", "up_std=0.125", "--runs", "4", "--batch", "64", "--json")
    assert res.returncode in (0, 1), res.stderr
    assert "seed" in res.stdout
    for bad in (["check-component", "rmsnorm", "-p", "d=2"], ["check-component", "silu", "--x-mean", "1"]):
        r = _cli(*bad)
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr, (bad, r.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("name,limit", [("silu", 1.0), ("rmsnorm", 1.0), *((g, 2.5) for g in GLUS)])
def test_sweep_p99_within_target(name, limit):
    """p99 of a 40-point seeded subset of each grid.  Measured at seed 0 (docs/validation.md):
    SiLU <= 0.60%, RMSNorm <= 0.35%; the gated FFN cores up to 1.97% on the output variance,
    of which about 0.8% at d_in 256 is the rule's 1/d_in bias (sigprop.rules.glu), hence 2.5%."""
    from sigprop.mc.sweep import run_sweep

    res = run_sweep(C.SWEEPS[name], get(name), n=40, seed=1)
    for mom, pct in res.percentiles.items():
        assert pct["p99"] <= limit, (name, mom, pct)


@pytest.mark.parametrize("scale", [1e100, 1e200, 1e300])
def test_rmsnorm_is_scale_free_up_to_the_float64_range(scale):
    # (its finite-d terms divided by (s2 + mu^2)^2, which overflowed from ~1e154 on: NaN, where
    # LayerNorm's rule was fine; `predict --norm rmsnorm --input-var 1e200` ended in exit 3)
    r = get("rmsnorm")
    g = Backward(1.0, 0.3)
    y1, g1 = r.evaluate(Forward(0.3, 1.0, 0.5), g, d=64, eps=0.0)
    ys, gs = r.evaluate(Forward(0.3 * scale**0.5, scale, 0.5), g, d=64, eps=0.0)
    for a, b in ((y1.mean, ys.mean), (y1.var, ys.var), (y1.corr, ys.corr), (g1.corr, gs.corr)):
        assert float(b) == pytest.approx(float(a), rel=1e-12)
    assert float(gs.var) * scale == pytest.approx(float(g1.var), rel=1e-12)
