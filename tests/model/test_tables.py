"""Interpolation tables of whole branch chains (sigprop.model.tables): the prediction with
tables equals the rule-by-rule prediction, and a table matches direct evaluation at points
it was not built on."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.model import predict as pred_mod
from sigprop.model import tables
from sigprop.model.presets import resolve
from sigprop.state import Backward, Forward

FFN = [("residual", dict(a=1.0, b=0.0)), ("linear", dict(d_in=256, d_out=1024, w_std=0.05, b_std=0.01)),
       ("relu", {}), ("dropout", dict(p=0.1)), ("linear", dict(d_in=1024, d_out=256, w_std=0.03, b_std=0.0)),
       ("dropout", dict(p=0.1))]
ATT = [("attention", dict(d=256, n_heads=4, d_head=64, L=64, p=0.1, causal=0, q_std=0.05, k_std=0.05,
                          v_std=0.05, o_std=0.05, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0,
                          o_bias_std=0.0)), ("dropout", dict(p=0.1))]


def _direct(ops, r, var, gv, gc):
    ch = tables.Chain(ops)
    y, g = ch.evaluate(Forward(0.0, var, r), Backward(gv, gc))
    return np.array([y.var, y.corr, g.var, g.corr], dtype=float)


@pytest.mark.parametrize("ops", [FFN, ATT], ids=["ffn", "attention"])
def test_table_matches_direct_evaluation_off_the_nodes(ops):
    t = tables.Table(tables.Chain(ops), {}, 0.0, 1.0, 0.0)
    assert t.ok
    rng = np.random.default_rng(1)
    for r in np.concatenate([rng.uniform(0, 1, 6), [0.999, 0.99999]]):
        gc = rng.uniform(0, 1)
        var = 1.0 + rng.uniform(-5e-4, 5e-4)      # within the table's variance window
        y, g = t.forward(Forward(0.0, var, r)), t.backward(Forward(0.0, var, r), Backward(2.0, gc))
        got = np.array([y.var, y.corr, g.var, g.corr])
        want = _direct(ops, r, var, 2.0, gc)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-9)


def test_chain_is_the_composition_of_its_rules():
    from sigprop.rules import get

    x, g = Forward(0.0, 1.3, 0.4), Backward(0.7, 0.2)
    y, gb = tables.Chain(FFN).evaluate(x, g)
    states, h = [], x
    for name, p in FFN:
        states.append(h)
        h, _ = get(name).evaluate(h, None, **p)
    for (name, p), xin in zip(reversed(FFN), reversed(states)):
        _, g = get(name).evaluate(xin, g, **p)
    assert float(y.var) == float(h.var) and float(gb.var) == float(g.var) and float(gb.corr) == float(g.corr)


def _assert_same_trace(with_tables, direct):
    for a, b in zip(with_tables, direct):
        assert a.log_var == pytest.approx(b.log_var, abs=1e-5)
        assert a.log_gvar == pytest.approx(b.log_gvar, abs=1e-4)
        assert a.corr == pytest.approx(b.corr, abs=1e-6)
        assert a.gcorr == pytest.approx(b.gcorr, abs=1e-6)


@pytest.mark.parametrize("arch", ["preln", "postln"])
def test_prediction_with_tables_equals_rule_by_rule(arch, monkeypatch):
    m = resolve(arch, n_layers=16, d_model=256, n_heads=4, d_ff=1024, seq_len=64)
    cache = tables.TableCache()
    with_tables = pred_mod.predict(m, tables=cache)
    assert any(t.ok for ts in cache.tables.values() for t in ts)
    monkeypatch.setattr(tables, "BUILD_AFTER", 10**9)
    direct = pred_mod.predict(m)
    _assert_same_trace(with_tables, direct)


def test_layer_dependent_value_weights_share_a_table(monkeypatch):
    """DSLM scales W_v, W_o layer by layer: one table at reference stds serves every layer
    (the attention rule is homogeneous in v_std o_std), equal to the rule-by-rule prediction."""
    m = resolve("dslm", n_layers=12, d_model=256, n_heads=4, d_ff=1024, seq_len=64)
    assert len(set(m.attention.std["v"])) > 1
    cache = tables.TableCache()
    with_tables = pred_mod.predict(m, tables=cache)
    att_tables = [t for key, ts in cache.tables.items() for t in ts
                  if any(name == "attention" for name, _ in key[0])]
    assert len(att_tables) == 1 and att_tables[0].ok
    monkeypatch.setattr(tables, "BUILD_AFTER", 10**9)
    direct = pred_mod.predict(m)
    _assert_same_trace(with_tables, direct)


# -- tables over correlation and variance (LayerNorm Scaling) ----------------------------
ATT_SMALL = [("attention", dict(d=64, n_heads=2, d_head=32, L=16, p=0.1, causal=0, q_std=0.1, k_std=0.1,
                                v_std=0.1, o_std=0.1, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0,
                                o_bias_std=0.0)), ("dropout", dict(p=0.1))]


def test_var_table_matches_direct_evaluation_off_the_grid():
    t = tables.VarTable(tables.Chain(ATT_SMALL), 0.0, 1e-2, 1.0)
    assert t.ok
    rng = np.random.default_rng(2)
    points = [(rng.uniform(0, 0.999), float(np.exp(rng.uniform(np.log(1e-2), 0.0)))) for _ in range(8)]
    points += [(0.3, 1e-2), (0.7, 1.0), (0.99999, 0.05)]            # the range's ends
    for r, var in points:
        gc = rng.uniform(0, 1)
        y, g = t.forward_of(t.row(Forward(0.0, var, r))), t.backward_of(t.row(Forward(0.0, var, r)), Backward(2.0, gc))
        got = np.array([y.var, y.corr, g.var, g.corr])
        np.testing.assert_allclose(got, _direct(ATT_SMALL, r, var, 2.0, gc), rtol=1e-4, atol=1e-9)
    # outside the variance range, or above R_MAX, it does not cover the state
    assert not t.covers(Forward(0.0, 2.0, 0.5)) and not t.covers(Forward(0.0, 5e-3, 0.5))
    assert not t.covers(Forward(0.0, 0.5, 1.0)) and t.covers(Forward(0.0, 0.5, 0.5))


def test_var_table_store_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    built = tables.VarTable(tables.Chain(ATT_SMALL), 0.0, 0.1, 1.0, store_key="vt")
    loaded = tables.VarTable(tables.Chain(ATT_SMALL), 0.0, 0.1, 1.0, store_key="vt")
    assert built.ok and not built.loaded and loaded.loaded and loaded.ok
    x = Forward(0.0, 0.37, 0.42)
    assert loaded.row(x) == built.row(x)


def test_var_table_stored_failure_is_remembered(tmp_path, monkeypatch):
    """A table that failed verification is stored as a failure: a later process does not
    rebuild it and evaluates directly."""
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(tables.TOLERANCES, "chain", 1e-30)    # nothing can pass
    failed = tables.VarTable(tables.Chain(ATT_SMALL), 0.0, 0.1, 1.0, store_key="bad")
    assert not failed.ok and not failed.loaded
    monkeypatch.setitem(tables.TOLERANCES, "chain", 3e-5)
    again = tables.VarTable(tables.Chain(ATT_SMALL), 0.0, 0.1, 1.0, store_key="bad")
    assert again.loaded and not again.ok and not again.covers(Forward(0.0, 0.5, 0.5))


def test_attention_with_value_bias_gets_a_table():
    """A chain that is not rescaled to reference v/o stds (a value bias breaks the
    homogeneity) needs no homogeneity check, and its table is used (it used to fail that
    check always and fall back to rule by rule)."""
    ops = [(ATT[0][0], {**ATT[0][1], "v_bias_std": 0.02}), ATT[1]]
    cache = tables.TableCache()
    assert not cache.handle(ops).canonical and cache.handle(ATT).canonical
    t = cache.get(ops, Forward(0.0, 1.0, 0.3), eager=True)
    assert t is not None and t.ok
    y, g = t.forward(Forward(0.0, 1.0, 0.45)), t.backward(Forward(0.0, 1.0, 0.45), Backward(2.0, 0.3))
    np.testing.assert_allclose([y.var, y.corr, g.var, g.corr], _direct(ops, 0.45, 1.0, 2.0, 0.3), rtol=1e-4)


def _lns(n_layers, **kw):
    return resolve("lns", n_layers=n_layers, d_model=64, n_heads=2, d_ff=256, seq_len=16, **kw)


def test_var_tables_only_where_they_pay(monkeypatch):
    """No VarTable below VAR_TABLE_AFTER layers or for constant norm scales (causal models
    alike); the range covers LayerNorm outputs of small-variance streams (s2/(s2 + eps) < 1)."""
    assert pred_mod.Predictor(_lns(12)).var_ranges == {}
    assert pred_mod.Predictor(_lns(12, causal=True)).var_ranges == {}
    monkeypatch.setattr(pred_mod, "VAR_TABLE_AFTER", 8)
    assert pred_mod.Predictor(_lns(12, causal=True)).var_ranges == pred_mod.Predictor(_lns(12)).var_ranges
    assert pred_mod.Predictor(resolve("preln", n_layers=12, d_model=64, n_heads=2, d_ff=256, seq_len=16)).var_ranges == {}
    ranges = pred_mod.Predictor(_lns(12)).var_ranges
    assert set(ranges) == set(range(12)) and ranges[0] == pytest.approx((1 / 12 / 2, 1.0), rel=1e-12)
    records, _ = pred_mod.run(_lns(12, input_var=1e-4, init_std=1e-3))
    assert all(isinstance(r.chain_table, tables._Prescaled) for r in records if r.kind == "attention")


def test_layernorm_scaling_with_var_tables_equals_rule_by_rule(monkeypatch):
    """LayerNorm Scaling: every layer's attention branch sees a different input variance
    (1/l times a LayerNorm output's); one table over correlation and variance serves all of
    them, equal to the rule-by-rule prediction."""
    monkeypatch.setattr(pred_mod, "VAR_TABLE_AFTER", 16)
    m = _lns(24)
    records, grads = pred_mod.run(m)
    assert all(isinstance(r.chain_table, tables._Prescaled) for r in records if r.kind == "attention")
    with_tables = pred_mod._points(m, records, grads)
    monkeypatch.setattr(pred_mod, "VAR_TABLE_AFTER", 10**9)
    cache = tables.TableCache()
    direct = pred_mod.predict(m, tables=cache)
    assert not any(cache.var_tables.values())
    _assert_same_trace(with_tables, direct)


def test_var_table_for_a_correlation_below_its_range():
    """A request whose correlation lies below the first table's range gets a table of its own
    (a table's correlation range starts at min(0, corr) of the request that built it), built
    once; here the attention rule's domain at negative correlations leaves it unusable, and
    the request is evaluated directly."""
    cache = tables.TableCache()
    first = cache.get_var(ATT_SMALL, Forward(0.0, 0.5, 0.4), 0.1, 1.0)
    assert first is not None and first.table.lo == 0.0
    (built,) = cache.var_tables.values()
    assert cache.get_var(ATT_SMALL, Forward(0.0, 0.5, -0.05), 0.1, 1.0) is None
    assert len(built) == 2 and built[1].lo == -0.05 and not built[1].ok
    assert cache.get_var(ATT_SMALL, Forward(0.0, 0.5, -0.04), 0.1, 1.0) is None and len(built) == 2
    assert cache.get_var(ATT_SMALL, Forward(0.0, 0.5, 0.2), 0.1, 1.0) is first
    assert cache.get_var(ATT_SMALL, Forward(0.0, 2.0, 0.2), 0.1, 1.0) is None    # outside the variances


def test_progress_goes_to_stderr_only_and_only_when_asked(tmp_path):
    """A table build draws progress on stderr with SIGPROP_PROGRESS=1; without it (stderr not a
    terminal here) nothing is drawn and rich is never imported; stdout is the same either way."""
    import os
    import subprocess
    import sys

    code = ("import sys, json\n"
            "from sigprop.model import presets\n"
            "from sigprop.model.predict import predict\n"
            "m = presets.resolve('preln', n_layers=3, d_model=32, n_heads=2, seq_len=8)\n"
            "print(json.dumps([list(p) for p in predict(m)]))\n"
            "print('rich' in sys.modules)\n")
    out = {}
    for flag in ("1", None):
        env = {k: v for k, v in os.environ.items() if k != "SIGPROP_PROGRESS"}
        env["SIGPROP_CACHE_DIR"] = str(tmp_path / f"store-{flag}")
        if flag:
            env["SIGPROP_PROGRESS"] = flag
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        out[flag] = r
    assert out["1"].stderr and out["1"].stdout.splitlines()[-1] == "True"
    assert out[None].stderr == "" and out[None].stdout.splitlines()[-1] == "False"
    assert out["1"].stdout.splitlines()[0] == out[None].stdout.splitlines()[0]


@pytest.mark.slow
def test_causal_layernorm_scaling_with_var_tables_equals_rule_by_rule(monkeypatch):
    """Causal LayerNorm Scaling: the attention op through a VarTable of its own and the
    position profile's per-row terms through a profile.RowsVarTable over the same variance
    range, equal to the layer-by-layer direct evaluation (the rows table is held to 1e-4 of
    each quantity's scale; the trace moves far less)."""
    from sigprop.model import profile

    monkeypatch.setattr(pred_mod, "VAR_TABLE_AFTER", 8)
    m = _lns(12, causal=True)
    cache = tables.TableCache()
    with_tables = pred_mod.predict(m, tables=cache)
    assert any(cache.var_tables.values())
    rows_tabs = [t for (fam, _), ts in cache._theta.items() if fam == "rowsvar" for t in ts]
    assert rows_tabs and all(isinstance(t, profile.RowsVarTable) and t.ok for t in rows_tabs)
    monkeypatch.setattr(pred_mod, "VAR_TABLE_AFTER", 10**9)
    cache = tables.TableCache()
    direct = pred_mod.predict(m, tables=cache)
    assert not any(cache.var_tables.values())
    assert not any(fam == "rowsvar" for fam, _ in cache._theta)
    _assert_same_trace(with_tables, direct)


def test_rows_var_table_against_direct_rows():
    """profile.RowsVarTable between its nodes against profile._rows_direct: every per-row term
    within 1e-4 of its quantity's scale (its largest |value| over the table's nodes), at points
    off the verification grid; and a changed
    table (one node value moved) fails its own verification, so the test can fail."""
    from sigprop.model import profile

    m = _lns(12, causal=True)
    pr = pred_mod.Predictor(m)
    chain = pr._chain(0, 3, True, float(m.attention.norm_scale[3]))     # (sublayer 0: the attention)
    params = profile._canonical(next(p for r, p in chain if r == "attention"))
    t = profile.RowsVarTable(params, 0.0, 0.05, 1.0, 0.0)
    assert t.ok
    L = t.L
    for corr, var in ((0.3, 0.07), (0.71, 0.4), (0.93, 0.9)):
        got = t.at(Forward(0.0, var, corr))
        want = profile._rows_direct(params, Forward(0.0, var, corr))
        for i, k in enumerate(profile._KEYS):
            scale = np.max(np.abs(t.vals[i * L:(i + 1) * L]))
            assert np.max(np.abs(got[k] - want[k])) <= 1e-4 * scale
    nodes = t._nodes(t.vals.shape[1:])
    assert t._accept(nodes, t.vals, t.direct)
    bad = t.vals.copy()
    bad[:, 4, 4] *= 1.01
    assert not t._accept(nodes, bad, t.direct)


# -- the one table base -----------------------------------------------------------------------

def test_every_table_is_an_interp_table():
    from sigprop.model import profile

    for cls in (tables.Table, tables.VarTable, tables.ThetaTable, profile.RowsTable, profile.RowsVarTable):
        assert issubclass(cls, tables.InterpTable), cls


def test_verify_is_relative_to_the_larger_of_value_and_floor():
    tol = tables.TOLERANCES["chain"]
    direct = np.array([[1.0, 2.0], [1e-9, -1e-9]])
    approx = direct + np.array([[0.9 * tol, 0.0], [1e-9, 0.0]])
    # row 0 within tol of its values; row 1 off by 100% of its value, but within tol of
    # a floor of 1e-9 / (0.9 tol) (its quantity's scale)
    big, small = 1e-9 / (0.9 * tol), 1e-9 / (1.1 * tol)
    assert tables.verify(approx, direct, np.array([0.0, big]), "chain")
    assert not tables.verify(approx, direct, np.array([0.0, small]), "chain")
    assert not tables.verify(approx, direct, 0.0, "chain")
    assert tables.verify(approx, direct, big, "chain")
    # a tighter class refuses what the chain class accepts; the looser one accepts it
    assert not tables.verify(approx, direct, big, "solver") and tables.verify(approx, direct, big, "statistics")
    assert not tables.verify(approx + np.nan, direct, 1.0, "statistics")


def test_one_verification_policy():
    """Every accuracy class has a tolerance; each table class declares a class by name,
    and a stated tolerance must be a class's (a stray number is refused)."""
    from sigprop.model import profile
    from sigprop.solve.blocks import BranchTable

    assert set(tables.TOLERANCES) == {"chain", "statistics", "solver"}
    # the values the stored tables' keys and all predictions were made with
    assert (tables.TOLERANCES["chain"], tables.TOLERANCES["statistics"], tables.TOLERANCES["solver"]) == (3e-5, 1e-4, 1e-7)
    for cls, want in ((tables.Table, "chain"), (tables.VarTable, "chain"), (tables.ThetaTable, "statistics"),
                      (BranchTable, "solver")):
        assert cls.ACCURACY == want, cls
    assert tables.tolerance(profile.RowsVarTable.tol) == tables.TOLERANCES["statistics"]
    assert tables.tolerance("statistics") == 1e-4 and tables.tolerance(1e-4) == 1e-4
    for bad in ("exact", 2e-5, None):
        with pytest.raises(ValueError):
            tables.tolerance(bad)
    with pytest.raises(ValueError):
        tables.ThetaTable(_theta_fn, 0.0, 1.0, 0.0, None, accuracy=5e-5)


def _theta_fn(th):
    return np.array([np.cos(th) ** 2, np.sin(3 * th) + 2.0, np.exp(-th)])


def test_theta_table_interpolates_a_known_function_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    calls = []

    def fn(th):
        calls.append(th)
        return _theta_fn(th)

    t = tables.ThetaTable(fn, 0.0, 1.0, 0.0, "theta-known", accuracy="solver")
    assert t.ok and not t.loaded and t.counts == (17,)         # 9 nodes do not reach 1e-7
    for r in (0.05, 0.3, 0.62, 0.999):
        np.testing.assert_allclose(t.values(r), _theta_fn(np.arccos(r)), rtol=2e-6)
    n_built = len(calls)
    again = tables.ThetaTable(fn, 0.0, 1.0, 0.0, "theta-known", accuracy="solver")
    assert again.loaded and again.ok and len(calls) == n_built     # loaded, not evaluated
    assert np.array_equal(again.values(0.37), t.values(0.37))
    # the stored numbers are held to the build's test: a looser entry is not taken at a
    # stricter tolerance, it is rebuilt
    monkeypatch.setitem(tables.TOLERANCES, "solver", 1e-20)
    strict = tables.ThetaTable(fn, 0.0, 1.0, 0.0, "theta-known", accuracy="solver")
    assert not strict.loaded and not strict.ok and len(calls) > n_built


def test_a_rough_function_fails_and_is_remembered_as_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    kink = lambda th: np.array([abs(th - 0.5) + 1.0])             # noqa: E731
    t = tables.ThetaTable(kink, 0.0, 1.0, 0.0, "theta-kink", accuracy="solver")
    assert not t.ok and not t.covers(Forward(0.0, 1.0, 0.5))
    again = tables.ThetaTable(lambda th: pytest.fail("rebuilt"), 0.0, 1.0, 0.0, "theta-kink", accuracy="solver")
    assert again.loaded and not again.ok


def test_cache_memo_is_per_prediction():
    a, b = tables.TableCache(), tables.TableCache()
    calls = []

    def compute():
        calls.append(1)
        return [len(calls)]

    first = a.remember("k", compute)
    assert a.remember("k", compute) is first and a.untabulated.remember("k", compute) is first
    assert a.untabulated.theta("rows", "k", Forward(0.0, 1.0, 0.5), lambda: pytest.fail("built")) is None
    assert b.remember("k", compute) == [2]                        # another cache computes afresh
    assert len(calls) == 2


def test_graded_grid_is_shared_read_only():
    from sigprop.model import positions

    g = positions.grid_for(positions.EXACT_MAX + 100)
    assert positions.grid_for(positions.EXACT_MAX + 100) is g
    with pytest.raises(ValueError):
        g.n[0] = 5.0


# ---- the one build loop, in both correlation variables (hypothesis) ---------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sigprop.solve.blocks import T_MIN, BranchTable  # noqa: E402


class _FnTable(tables.InterpTable):
    """A vector function of the correlation r on the base's build loop; the subclasses take
    the grids, checks, variable and accuracy class of a real table class."""

    LABEL = "test table"

    def __init__(self, fn, axis):
        self.fn, self.evaluated = fn, 0
        self._setup([axis], None)

    def _compute(self, x):
        self.evaluated += len(x)
        return np.atleast_2d(self.fn(self.corr_of(x)))

    def _floor(self, vals):
        return np.max(np.abs(vals), axis=1)


class _ArccosTable(_FnTable):      # as tables.Table: theta = arccos r, 17/33/65 nodes, "chain"
    GRIDS, CHECKS, VARIABLE, ACCURACY = tables.Table.GRIDS, tables.Table.CHECKS, "arccos", "chain"

    def __init__(self, fn):
        super().__init__(fn, (tables.TH_MIN, float(np.arccos(0.0))))


class _RootTable(_FnTable):        # as the solver's BranchTable: t = sqrt(1 - r), nested, "solver"
    GRIDS, CHECKS, NESTED = BranchTable.GRIDS, BranchTable.CHECKS, True
    VARIABLE, ACCURACY = BranchTable.VARIABLE, BranchTable.ACCURACY

    def __init__(self, fn):
        super().__init__(fn, (T_MIN, 1.0))


def _smooth(a, b, c, w):
    """Smooth in both variables: sqrt(1 - r^2) is sin(theta) and t sqrt(2 - t^2)."""
    return lambda r: np.array([a * np.sqrt(1 - r * r) + b * r + 1.0, c * np.exp(w * r) + np.cos(w * r) ** 2])


@pytest.mark.parametrize("cls", [_ArccosTable, _RootTable], ids=["arccos", "sqrt(1-r)"])
@settings(max_examples=25, deadline=None)
@given(a=st.floats(-2, 2), b=st.floats(-2, 2), c=st.floats(0.1, 2), w=st.floats(-3, 3),
       rs=st.lists(st.floats(0.0, 0.999), min_size=5, max_size=5))
def test_a_table_reproduces_a_smooth_function_to_its_accuracy_class(cls, a, b, c, w, rs):
    fn = _smooth(a, b, c, w)
    t = cls(fn)
    assert t.ok
    tol = tables.tolerance(cls.ACCURACY)
    big = np.max(np.abs(t.vals), axis=1)
    for r in rs:
        err = np.abs(t.interp(t.x_of(r)) - fn(np.array(r)))
        assert np.all(err <= tol * np.maximum(np.abs(fn(np.array(r))), big)), (r, err)


@pytest.mark.parametrize("cls", [_ArccosTable, _RootTable], ids=["arccos", "sqrt(1-r)"])
@settings(max_examples=15, deadline=None)
@given(r0=st.floats(0.05, 0.95), slope=st.floats(0.1, 3.0))
def test_verification_rejects_a_kink(cls, r0, slope):
    t = cls(lambda r: np.array([slope * np.abs(r - r0) + 1.0, r]))
    assert not t.ok
    assert t.evaluated > 0


def test_a_nested_build_reuses_every_evaluation_and_keeps_the_refined_grid():
    """9 -> 17 -> 33 ...: each refinement evaluates only the nodes it adds, and the accepted
    interpolant goes through all of them (2n - 1 nodes for the n-node grid that passed)."""
    fn = _smooth(1.0, 0.5, 1.0, 2.0)
    t = _RootTable(fn)
    assert t.ok and t.counts[0] == 2 * t.grid_counts[0] - 1 and t.grid_counts in _RootTable.GRIDS
    assert t.evaluated == t.counts[0]                 # each node evaluated once
    assert t.grid_counts != _RootTable.GRIDS[0]      # this function needs a refinement
    np.testing.assert_allclose(t.vals, fn(t.corr_of(t.nodes_per_axis[0])), rtol=0, atol=0)
