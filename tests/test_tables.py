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
    monkeypatch.setattr(pred_mod, "_TABLES", tables.TableCache())
    with_tables = pred_mod.predict(m)
    assert any(t.ok for ts in pred_mod._TABLES.tables.values() for t in ts)
    monkeypatch.setattr(tables, "BUILD_AFTER", 10**9)
    monkeypatch.setattr(pred_mod, "_TABLES", tables.TableCache())
    direct = pred_mod.predict(m)
    _assert_same_trace(with_tables, direct)


def test_layer_dependent_value_weights_share_a_table(monkeypatch):
    """DSLM scales W_v, W_o layer by layer: one table at reference stds serves every layer
    (the attention rule is homogeneous in v_std o_std), equal to the rule-by-rule prediction."""
    m = resolve("dslm", n_layers=12, d_model=256, n_heads=4, d_ff=1024, seq_len=64)
    assert len(set(m.attention.std["v"])) > 1
    monkeypatch.setattr(pred_mod, "_TABLES", tables.TableCache())
    with_tables = pred_mod.predict(m)
    att_tables = [t for key, ts in pred_mod._TABLES.tables.items() for t in ts
                  if any(name == "attention" for name, _ in key[0])]
    assert len(att_tables) == 1 and att_tables[0].ok
    monkeypatch.setattr(tables, "BUILD_AFTER", 10**9)
    monkeypatch.setattr(pred_mod, "_TABLES", tables.TableCache())
    direct = pred_mod.predict(m)
    _assert_same_trace(with_tables, direct)
