"""The solver's branch tables (sigprop.solve.blocks.BranchTable): an interpolation table of
sigprop.model.tables in t = sqrt(1 - r), held to the "solver" accuracy class against the rules
evaluated directly, falling back to them where its build fails, and kept in the store."""

from __future__ import annotations

import numpy as np
import pytest

from sigprop.model import tables
from sigprop.solve import blocks
from sigprop.solve.blocks import R_MAX, BranchTable, branch_rows, rows_at
from sigprop.state import Forward

FFN = (("linear", dict(d_in=256, d_out=1024, w_std=0.05, b_std=0.0)), ("relu", {}), ("dropout", dict(p=0.1)),
       ("linear", dict(d_in=1024, d_out=256, w_std=0.03, b_std=0.0)), ("dropout", dict(p=0.1)))
ATT = (("attention", dict(d=256, n_heads=4, d_head=64, L=32, p=0.1, causal=0, q_std=0.05, k_std=0.05,
                          v_std=0.06, o_std=0.06, q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0,
                          o_bias_std=0.0)), ("dropout", dict(p=0.1)))


def _direct(chain, var, r):
    return branch_rows(chain, Forward(0.0, var, float(r)))


@pytest.mark.parametrize("chain", [FFN, ATT], ids=["relu-ffn", "attention"])
def test_rows_match_the_rules_to_the_solver_class(chain):
    t = BranchTable(chain, 0.8, key="k")
    assert t.ok and t.counts[0] >= 17
    tol = tables.tolerance("solver")
    big = np.max(np.abs(t.vals), axis=1)
    rng = np.random.default_rng(3)
    for r in np.concatenate([rng.uniform(0, 1, 6), [0.0, 0.5, 0.999, R_MAX]]):
        r = min(float(r), R_MAX)
        got, want = t.rows(r), _direct(chain, 0.8, r)
        assert np.all(np.abs(got - want) <= tol * big), (r, got, want)
    assert t.covers(Forward(0.0, 0.8, 0.3), "k") and not t.covers(Forward(0.0, 0.8, 0.3), "other")
    assert not t.covers(Forward(0.0, 0.8, 1.0), "k") and not t.covers(Forward(0.1, 0.8, 0.3), "k")


def test_a_failed_build_evaluates_the_rules(monkeypatch):
    monkeypatch.setitem(tables.TOLERANCES, "solver", 1e-30)       # nothing passes
    t = BranchTable(FFN, 1.0, key="k")
    assert not t.ok
    for r in (0.0, 0.3, 0.9):
        assert np.array_equal(t.rows(r), _direct(FFN, 1.0, r))
        assert np.array_equal(rows_at(t, FFN, Forward(0.0, 1.0, r), "k"), _direct(FFN, 1.0, r))


def test_stored_table_loads_bit_for_bit_without_evaluating(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    built = BranchTable(FFN, 1.0)
    assert built.ok and not built.loaded

    def no_rules(*a, **k):
        raise AssertionError("evaluated the rules")

    monkeypatch.setattr(blocks, "branch_rows", no_rules)
    loaded = BranchTable(FFN, 1.0)
    assert loaded.loaded and loaded.ok and loaded.counts == built.counts
    for r in (0.0, 0.37, 0.99):
        assert np.array_equal(loaded.rows(r), built.rows(r))
    # another input variance is another table
    with pytest.raises(AssertionError, match="evaluated the rules"):
        BranchTable(FFN, 0.5)
