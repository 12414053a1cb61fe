"""The causal predictor's faster forms against the plain ones they replace (same numbers up to
rounding): the per-key weights' series as a per-row quadratic against the series written out in
R1 and R2, its node coefficients through the table store, the node grid's shared prefix sums,
several table rows in one product, the rotary row moments memoised, the attention backward's
pair kernels' diagonal as a sum of two, the per-row terms memoised for a prediction, the
correlation matrix's deviation formed in place."""

import math

import numpy as np
import pytest

from sigprop import memo
from sigprop.model import positions, profile, store, tables
from sigprop.rules import attention as A
from sigprop.state import Forward


def _series_written_out(dv, counts, s0):
    """The series as its docstring writes it: h + A x + B R1 + A2 x^2/2 + C x R1 + B2 R2/2
    + E (R1^2 - R2)/2 over h, from the finite-difference coefficients at the four nodes
    interpolated in log s0 (cubic Lagrange), rows of one key at 1."""
    n = counts.sum(axis=1)
    key = np.ascontiguousarray(n, dtype=float).tobytes()
    x = math.log(s0) / A._KEY_COEF_STEP
    k0 = int(math.floor(x)) - 1
    t = x - k0
    wts = [math.prod((t - q) / (j - q) for q in range(4) if q != j) for j in range(4)]
    coef = sum(w * A._series_coefs_at(k0 + j, key) for j, w in enumerate(wts))
    D1 = (counts * dv).sum(axis=1)[:, None]
    D2 = (counts * dv * dv).sum(axis=1)[:, None]
    R1, R2 = D1 - dv, D2 - dv * dv
    out = []
    for f0, a, b, a2, c, b2, e in coef:
        f0, a, b, a2, c, b2, e = (v[:, None] for v in (f0, a, b, a2, c, b2, e))
        m = f0 + a * dv + b * R1 + a2 * dv * dv / 2 + c * dv * R1 + b2 * R2 / 2 + e * (R1 * R1 - R2) / 2
        out.append(np.where((n[:, None] > 1) & (f0 > 0), m / f0, 1.0))
    return out


@pytest.mark.parametrize("L,s0", [(12, 0.3), (40, 2.5)])
def test_series_quadratic_equals_the_series_written_out(L, s0):
    rng = np.random.default_rng(3)
    counts = np.tril(np.ones((L, L)))
    dv = np.where(counts > 0, rng.uniform(-0.05, 0.05, (L, L)), 0.0)
    w1, w2 = A._key_weights_series(dv, counts, s0)
    e1, e2 = _series_written_out(dv, counts, s0)
    assert np.max(np.abs(w2 - 1)) > 1e-4                 # the weights are not trivially 1
    np.testing.assert_allclose(w1, e1, rtol=1e-13, atol=0)
    np.testing.assert_allclose(w2, e2, rtol=1e-13, atol=0)
    # a read-only counts array (a grid's quadrature weights: memoised row lengths) gives the same
    ro = counts.copy()
    ro.flags.writeable = False
    r1, r2 = A._key_weights_series(dv, ro, s0)
    assert np.array_equal(r1, w1) and np.array_equal(r2, w2)


def test_series_node_coefficients_through_the_store_are_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("SIGPROP_CACHE_DIR", str(tmp_path))
    key = np.arange(1.0, 20.0).tobytes()
    direct = A._series_coefs_at(-3, key)
    with memo.using(memo.Memos()):
        built = profile._stored_series_coefs(-3, key)        # computed and written
    assert np.array_equal(built, direct) and not built.flags.writeable
    assert store.load(store.key("keyseries", -3, key)) is not None
    with memo.using(memo.Memos()):
        loaded = profile._stored_series_coefs(-3, key)       # read back
    assert loaded is not built and np.array_equal(loaded, direct)


@pytest.mark.parametrize("L", [300, 8192])
def test_shared_prefix_sums_give_the_same_kernels(L):
    g = positions.grid_for(L)
    rng = np.random.default_rng(0)
    S = rng.uniform(-0.02, 0.02, (g.size, g.size))
    S = S + S.T
    np.fill_diagonal(S, 0.0)
    pre = g.prefix_sums(S)
    assert np.array_equal(g.UXUt(S, pre), g.UXUt(S))
    a = profile.key_logit_scales(S, 0.4, g, pre)
    b = profile.key_logit_scales(S, 0.4, g)
    assert np.array_equal(a[0], b[0]) and a[1] is b[1]
    assert np.array_equal(pre[0], g.prefix_sums(S)[0])   # not changed by its users


def test_pair_kernel_diagonal_is_the_sum_of_the_two_kernels():
    """pu = diag(U^T (C' + C' o M) U) taken as diag(U^T C' U) + diag(U^T (C' o M) U)."""
    g = positions.grid_for(1000)
    rng = np.random.default_rng(2)
    C = rng.uniform(0.1, 0.3, (g.size, g.size))
    C = C + C.T
    Co = C.copy()
    np.fill_diagonal(Co, 0.0)
    Mk = Co * g.key_pair_weights()
    want = g.UtXU_diag(Co + Mk)
    # (the last key, which no pair of rows attends to, is 0 up to rounding)
    np.testing.assert_allclose(np.diag(g.UtXU(Co)) + g.UtXU_diag(Mk), want, rtol=1e-13,
                               atol=1e-13 * np.max(np.abs(want)))


@pytest.mark.parametrize("L", [None, 300])
def test_normalised_deviation_in_place_equals_the_plain_form(L):
    """profile.normalised_deviation (the deviation written over the correlation matrix) and
    deviation(inplace=True) against deviation(normalise(K)) as written before: bit for bit."""
    g = None if L is None else positions.grid_for(L)
    nb = 40 if g is None else g.size
    rng = np.random.default_rng(5)
    A = rng.standard_normal((nb, nb + 3))
    K = A @ A.T / nb + 0.3
    Kc = K.copy()
    want = profile.deviation(profile.normalise(K), g)
    got = profile.normalised_deviation(K, g)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])
    assert np.array_equal(K, Kc)                         # its input is left alone
    c, S = profile.deviation(Kc, g, inplace=True)
    plain = profile.deviation(K, g)
    assert S is Kc and c == plain[0] and np.array_equal(S, plain[1])


def _relu_chain():
    return (("linear", dict(d_in=64, d_out=256, w_std=0.1, b_std=0.0)), ("relu", {}),
            ("linear", dict(d_in=256, d_out=64, w_std=0.06, b_std=0.0)))


class _ChainRule:
    """A tiny rule chain for the tables (evaluate: each rule in turn)."""

    def __init__(self, ops):
        from sigprop.rules import get
        self.ops = [(get(r), p) for r, p in ops]

    def evaluate(self, x, g, **_):
        for r, p in self.ops:
            x, g = r.evaluate(x, g, **p)
        return x, g


@pytest.mark.parametrize("var", [1.0, 1.02])
def test_table_rows_at_equals_row_by_row(var):
    t = tables.Table(_ChainRule(_relu_chain()), {}, 0.0, 1.0, lo=0.0)
    assert t.ok
    corrs = [0.1, 0.35, 0.6, 0.93]
    got = t.rows_at(corrs, var)
    want = np.array([t.row(Forward(0.0, var, c)) for c in corrs]).T
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_var_table_and_prescaled_rows_at_equal_row_by_row():
    t = tables.VarTable(_ChainRule(_relu_chain()), 0.0, 0.5, 2.0, lo=0.0)
    assert t.ok
    corrs = [0.2, 0.5, 0.8]
    got = t.rows_at(corrs, 1.3)
    want = np.array([t.row(Forward(0.0, 1.3, c)) for c in corrs]).T
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    p = tables._Prescaled(t, ("residual", dict(a=0.8, b=0.0)))
    got = p.rows_at(corrs, 1.5)
    want = np.array([p.row(Forward(0.0, 1.5, c)) for c in corrs]).T
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)


def test_rotary_row_moments_memo_equals_the_direct_evaluation():
    from sigprop.backend import numeric as m
    with memo.using(memo.Memos()):
        first = A._rope_row_moments(m, 512.0, 1e4, 64.0)
        again = A._rope_row_moments(m, 512.0, 1e4, 64.0)
        assert again is first
        assert np.array_equal(first[0], A._kappa_bar(m, 512.0, 1e4, 64.0))
        assert np.array_equal(first[1], A._kappa_moments(m, 512.0, 1e4, 64.0)[1])
        assert all(np.array_equal(a, b) for a, b in zip(first[3], A._field_moments(m, 512.0, 1e4, 64.0)))
        # arrays (a vectorised evaluation) are not memoised
        A._rope_row_moments(m, np.array([256.0, 512.0]), 1e4, 64.0)
        assert len(A._ROPE_ROWS.map()) == 1


@pytest.mark.parametrize("arch", ["preln", "lns"])
def test_causal_rows_terms_evaluated_once_per_state(arch, monkeypatch):
    """A causal prediction's forward and backward ask a rows table for the same state of each
    attention layer, the backward after the whole forward pass: the table evaluates each state
    once (the terms are memoised for the prediction), and the prediction is the same as with
    every request evaluated afresh."""
    from sigprop.model.predict import predict
    from sigprop.model.presets import resolve

    m = resolve(arch, None, n_layers=24, dropout=0.0, causal=True, d_model=64, n_heads=2, d_ff=256, seq_len=256)
    calls = []
    count = calls.append
    for cls, fn in ((profile.RowsTable, "values"), (profile.RowsVarTable, "interp")):
        orig = getattr(cls, fn)

        def counted(self, *a, _orig=orig):
            count((id(self),) + a)
            return _orig(self, *a)
        monkeypatch.setattr(cls, fn, counted)
    remember = tables.TableCache.remember

    def counted_remember(self, key, compute):           # direct evaluations (no table)
        return remember(self, key, lambda: (count(key), compute())[1])
    monkeypatch.setattr(tables.TableCache, "remember", counted_remember)
    memoised = predict(m)
    assert calls and len(calls) == len(set(calls))
    monkeypatch.setattr(tables, "MEMO_SIZE", 1)        # every request evaluated afresh
    calls.clear()
    fresh = predict(m)
    assert len(calls) > len(set(calls))
    assert [tuple(p) for p in memoised] == [tuple(p) for p in fresh]
