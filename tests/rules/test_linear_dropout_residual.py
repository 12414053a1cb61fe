"""Linear, dropout and residual: symbolic identities, properties, numeric == symbolic, finite
differences of the hand-written backward, and seeded Monte Carlo agreement."""

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import finite_difference_check, numeric_value, symbolic_value
from sigprop import symbols
from sigprop.errors import DomainError
from sigprop.mc import components as C
from sigprop.mc.sweep import run_sweep
from sigprop.rules import get
from sigprop.state import Backward, Forward

S = symbols.symbol


# ---- symbolic identities --------------------------------------------------------------
def test_linear_cov_equals_var_at_full_correlation():
    f = get("linear").symbolic()
    cov = f["x_corr"] * f["x_var"]
    assert sp.simplify((cov - f["x_var"]).subs(S("x_corr"), 1)) == 0


def test_linear_zero_mean_input_gives_textbook_gain():
    f = get("linear").symbolic()
    expr = f["x_var"].subs({S("x_mean"): 0, S("b_std"): 0})
    assert sp.simplify(expr - S("d_in") * S("w_std") ** 2 * S("x_var")) == 0


def test_dropout_zero_is_identity_symbolically():
    f = get("dropout").symbolic()
    assert sp.simplify(f["x_var"].subs(S("p"), 0) - S("x_var")) == 0
    assert sp.simplify(f["x_corr"].subs(S("p"), 0) - S("x_corr")) == 0
    assert sp.simplify(f["g_var"].subs(S("p"), 0) - S("g_var")) == 0


def test_dropout_keeps_covariance():
    f = get("dropout").symbolic()
    assert sp.simplify(f["x_corr"] * f["x_var"] - S("x_corr") * S("x_var")) == 0
    assert sp.simplify(f["g_corr"] * f["g_var"] - S("g_corr") * S("g_var")) == 0


def test_residual_unit_skip_zero_branch_is_identity():
    f = get("residual").symbolic()
    at = {S("a"): 1, S("b"): 0}
    assert sp.simplify(f["x_var"].subs(at) - S("x_var")) == 0
    assert sp.simplify(f["x_corr"].subs(at) - S("x_corr")) == 0


# ---- properties (hypothesis) ----------------------------------------------------------
states = st.tuples(st.floats(-10, 10), st.floats(1e-3, 100), st.floats(0, 1), st.floats(1e-6, 100), st.floats(-1, 1))


@settings(max_examples=200, deadline=None)
@given(states, st.integers(1, 4096), st.integers(1, 4096), st.floats(0, 3), st.floats(0, 3))
def test_linear_properties(state, din, dout, w, b):
    mu, var, r, gv, gr = state
    y, g = get("linear").evaluate(Forward(mu, var, r), Backward(gv, gr), d_in=din, d_out=dout, w_std=w, b_std=b)
    assert y.var >= 0 and g.var >= 0
    if y.var > 0:
        assert -1 - 1e-12 <= y.corr <= 1 + 1e-12


@settings(max_examples=200, deadline=None)
@given(states, st.floats(0, 0.99))
def test_dropout_properties(state, p):
    mu, var, r, gv, gr = state
    y, g = get("dropout").evaluate(Forward(mu, var, r), Backward(gv, gr), p=p)
    assert y.var >= var - 1e-12 and abs(y.corr) <= abs(r) + 1e-12
    assert g.var >= gv - 1e-12 and y.mean == mu


@settings(max_examples=100, deadline=None)
@given(states)
def test_dropout_p0_is_identity(state):
    mu, var, r, gv, gr = state
    y, g = get("dropout").evaluate(Forward(mu, var, r), Backward(gv, gr), p=0.0)
    assert (y.mean, y.var, g.var) == (mu, var, gv)
    assert y.corr == pytest.approx(r) and g.corr == pytest.approx(gr)


def test_vectorised_equals_pointwise():
    rng = np.random.default_rng(0)
    mu, var, r = rng.normal(size=50), rng.uniform(0.1, 3, 50), rng.uniform(0, 1, 50)
    din, w = rng.integers(1, 500, 50), rng.uniform(0, 0.2, 50)
    y, _ = get("linear").evaluate(Forward(mu, var, r), None, d_in=din, d_out=7, w_std=w)
    for i in (0, 17, 49):
        yi, _ = get("linear").evaluate(Forward(mu[i], var[i], r[i]), None, d_in=int(din[i]), d_out=7, w_std=w[i])
        assert y.var[i] == pytest.approx(yi.var) and y.corr[i] == pytest.approx(yi.corr)


# ---- domains --------------------------------------------------------------------------
@pytest.mark.parametrize("name,params", [
    ("dropout", {"p": 1.0}), ("dropout", {"p": -0.1}), ("linear", {"d_in": 0, "d_out": 3, "w_std": 1.0}),
    ("linear", {"d_in": 3, "d_out": 3, "w_std": -1.0}), ("linear", {"d_in": 3.5, "d_out": 3, "w_std": 1.0}),
    ("linear", {"d_in": 3, "d_out": 3, "w_std": 1.0, "bogus": 1}), ("linear", {"d_in": 3}),
])
def test_bad_params_raise(name, params):
    with pytest.raises(DomainError):
        get(name).evaluate(Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), **params)


@pytest.mark.parametrize("x,g", [(Forward(0, 1, 1.5), None), (Forward(0, -1, 0), None),
                                  (Forward(0, 1, 0), Backward(1, -2)), (Forward(float("nan"), 1, 0), None)])
def test_bad_states_raise(x, g):
    with pytest.raises(DomainError):
        get("dropout").evaluate(x, g, p=0.1)


# ---- numeric == symbolic --------------------------------------------------------------
@pytest.mark.parametrize("name", ["linear", "dropout", "residual"])
def test_numeric_equals_symbolic_on_grid_points(name):
    spec = C.SWEEPS[name]
    pts = spec.points()
    for i in np.random.default_rng(3).choice(len(pts), 5, replace=False):
        case = spec.make_case(pts[i])
        num = numeric_value(get(name), case.x, case.g, case.rule_params)
        sym = symbolic_value(get(name), case.x, case.g, case.rule_params)
        for k in num:
            assert num[k] == pytest.approx(sym[k], rel=1e-9, abs=1e-12), k


# ---- Monte Carlo ----------------------------------------------------------------------
@pytest.mark.parametrize("name,params,shape", [
    ("linear", {"d_in": 5, "d_out": 4, "w_std": 0.7, "b_std": 0.3}, (2, 3, 5)),
    ("dropout", {"p": 0.3, "d": 5}, (2, 3, 5)),
    ("residual", {"a": 0.8, "b": 0.5, "y_mean": 0.1, "y_var": 2.0, "y_corr": 0.3, "d": 5}, (2, 3, 5)),
])
def test_backward_matches_finite_differences(name, params, shape):
    analytic, numeric = finite_difference_check(C.get(name), params, shape)
    assert analytic == pytest.approx(numeric, rel=1e-6)


@pytest.mark.parametrize("name,bound", [("linear", 0.05), ("dropout", 0.03), ("residual", 0.03)])
def test_monte_carlo_agrees_on_grid_subset(name, bound):
    res = run_sweep(C.SWEEPS[name], get(name), n=4, seed=7)
    for row in res.rows:
        for mom, err in row["errors"].items():
            assert err < bound, (row["point"], mom, err)


def test_zero_variance_reports_zero_correlation_not_nan():
    y, g = get("linear").evaluate(Forward(0.0, 1.0, 0.5), Backward(0.0, 0.3), d_in=4, d_out=4, w_std=0.0)
    assert y.var == 0 and y.corr == 0 and g.var == 0 and g.corr == 0
