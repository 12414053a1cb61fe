"""The shipped table of the attention rule's one-row statistics (sigprop/rules/row_table.py):
it is what the module builds from the integrals, it matches the integrals off its nodes to its
stated tolerance, and the attention rule gives the same numbers with it as without it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sigprop import memo
from sigprop.rules import row_table as R
from sigprop.state import Backward, Forward

TAGS = ("rows", "rows4", "rows.T2e2", "rows.T2e2.k4")


def test_the_file_is_shipped_and_small():
    assert R.PATH.is_file(), "python -m sigprop.rules.row_table --write"
    assert R.PATH.stat().st_size < 4e6
    for tag in TAGS:
        assert R.table(tag) is not None, tag


@pytest.mark.parametrize("tag", TAGS)
def test_the_shipped_file_is_what_the_module_builds(tag):
    fresh = R.build(tag)[f"{tag}.values"]
    shipped = R.table(tag)
    assert fresh.shape == shipped.values.shape
    scale = np.max(np.abs(fresh), axis=(1, 2), keepdims=True)
    assert np.all(np.abs(fresh - shipped.values) <= 1e-10 * (np.abs(fresh) + scale))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("tag", TAGS)
def test_the_table_matches_the_integrals_off_its_nodes(tag, seed):
    names, err = R.errors(tag, points=300, seed=seed)
    worst = {nm: float(e.max()) for nm, e in zip(names, err)}
    assert max(worst.values()) <= R.TOLERANCE, worst


def test_covered_and_uncovered_points_mix():
    """Points outside the table (large v, long rows, non-integer short rows) are integrated; the
    call's result is the integrals' wherever it is not the table's."""
    from sigprop.backend import numeric
    from sigprop.rules import attention as A

    v = np.array([0.3, 80.0, 0.3, 0.3, 1e-40, 2.0])
    n = np.array([64.0, 64.0, 2.0 ** 18, 5.5, 64.0, 7.0])
    assert list(R.RowTable.covers(np.maximum(v, 1e-30), n)) == [True, False, False, False, True, True]
    got = A._row_stats_tabled(numeric, "rows", v, n, A._ROW_SHARED, False)
    want = A._row_stats(numeric, v, n, A._ROW_SHARED, False)
    for k in A._ROW_SHARED:
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert np.all(np.abs(g - w) <= 1e-7 * np.maximum(np.abs(w), 1e-9)), k
        assert np.array_equal(g[[1, 2, 3]], w[[1, 2, 3]]), k        # the integrals themselves


def _evaluate(params, x, g):
    from sigprop.rules import get

    with memo.using(memo.Memos()):
        y, gb = get("attention").evaluate(x, g, **params)
    return np.array([y.mean, y.var, y.corr, gb.var, gb.corr], dtype=float)


GRID = [dict(L=L, causal=c, **extra)
        for L in (16, 256)
        for c in (0, 1)
        for extra in ({}, {"rope": 10000.0}, {"qk_norm": 2})]


@pytest.mark.parametrize("wqk", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("case", range(len(GRID)))
def test_the_attention_rule_agrees_with_and_without_the_table(monkeypatch, case, wqk):
    """Whole rule evaluations over sequence lengths, masks, rotary positions and QK-norm, at
    small to large logit variances: the table moves no moment by more than 1e-8 relative (measured
    at most 4e-10 over this grid; the rule's own quadrature is ~1e-6 .. 1e-5)."""
    d = 256
    s = wqk / math.sqrt(d)          # query and key stds: logit variances ~ wqk^4 d_head
    p = dict(GRID[case], d=d, n_heads=4, d_head=64, q_std=s, k_std=s, v_std=1 / math.sqrt(d),
             o_std=1 / math.sqrt(d))
    x, g = Forward(0.0, 1.0, 0.3), Backward(1.0, 0.1)
    on = _evaluate(p, x, g)
    monkeypatch.setenv("SIGPROP_ROW_TABLE", "off")
    off = _evaluate(p, x, g)
    assert np.all(np.isfinite(on))
    assert np.all(np.abs(on - off) <= 1e-8 * np.maximum(np.abs(off), 1e-6)), (p, on, off)


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("SIGPROP_ROW_TABLE", "off")
    assert R.table("rows") is None
    monkeypatch.delenv("SIGPROP_ROW_TABLE")
    assert R.table("rows") is not None


def test_the_panels_cover_their_range():
    assert math.isclose(R._v_edges()[-1], R.LOG_V_MAX)
    assert R.v_nodes().size == (len(R._v_edges())) * (R.DEGREE + 1)
    assert R.n_nodes().size == R.N_EXACT + R.N_PANELS * (R.DEGREE + 1)
    assert R.n_nodes()[R.N_EXACT:].min() > R.N_EXACT and R.n_nodes().max() < R.N_MAX
