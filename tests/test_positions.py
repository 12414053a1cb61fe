"""The graded position grid (sigprop.model.positions) against the exact position sums.

Expected values come from the exact O(L^2) position model (sigprop.model.profile's own
L x L functions) or from brute-force sums, never from the grid under test."""

import math

import numpy as np
import pytest

from sigprop.model import positions, profile
from sigprop.model.predict import Predictor, _points, predict
from sigprop.model.presets import resolve


def _sym(L, seed=0):
    """A smooth symmetric test matrix over positions with a zero diagonal."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(0.5, 1.5, 2)
    t = np.log1p(np.arange(L, dtype=float))
    X = a * np.exp(-0.1 * np.abs(t[:, None] - t[None, :])) + b / (1.0 + np.add.outer(t, t))
    np.fill_diagonal(X, 0.0)
    return X


def test_singleton_grid_reduces_to_the_exact_sums():
    L = 40
    g = positions.Grid(L, p0=L)
    assert g.size == L and np.all(g.w == 1)
    X = _sym(L)
    n = np.arange(1.0, L + 1)
    y = np.cos(np.arange(L))
    assert np.allclose(g.UtXU(X), profile._UtXU(X), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.UXUt(X), profile.UXUt(X), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.UtDU(y), profile._UtDU(y), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.suffix_h(y), profile.suffix(y / n, 0), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.suffix(y), profile.suffix(y, 0), rtol=1e-12, atol=1e-14)
    assert math.isclose(g.mean_off(X + 0.3), profile.mean_off(X + 0.3), rel_tol=1e-12)
    assert math.isclose(g.mean(y), float(np.mean(y)), rel_tol=1e-12, abs_tol=1e-15)


def test_graded_kernels_match_the_exact_ones_on_smooth_matrices():
    """Block sums against the exact L x L kernels at the representative positions: the
    quadrature error of smooth (in log position) inputs."""
    L = 3000
    g = positions.Grid(L)
    assert g.size < 200
    X = _sym(L)
    r = g.rep
    Xg = X[np.ix_(r, r)]
    ex = profile._UtXU(X)[np.ix_(r, r)]
    assert np.max(np.abs(g.UtXU(Xg) / ex - 1)) < 5e-3
    ex = profile.UXUt(X)[np.ix_(r, r)]
    nz = ex != 0                                  # (row 0 with itself: U X U^T is 0 there)
    assert np.max(np.abs(g.UXUt(Xg)[nz] / ex[nz] - 1)) < 5e-3
    assert np.all(g.UXUt(Xg)[~nz] == 0)
    assert abs(g.mean_off(Xg) / profile.mean_off(X) - 1) < 5e-3
    # a grid with the blocks coarser is measurably worse: the test can fail
    c = positions.Grid(L, p0=4, q=1.5)
    Xc = X[np.ix_(c.rep, c.rep)]
    assert np.max(np.abs(c.UtXU(Xc) / profile._UtXU(X)[np.ix_(c.rep, c.rep)] - 1)) > 1e-2


def test_short_sequences_keep_the_exact_model():
    assert positions.grid_for(positions.EXACT_MAX) is None
    assert positions.grid_for(positions.EXACT_MAX + 1) is not None


def _run(m, exact_max, monkeypatch):
    monkeypatch.setattr(positions, "EXACT_MAX", exact_max)
    pr = Predictor(m)
    recs = pr.forward()
    grads = pr.backward(recs)
    return _points(m, recs, grads), recs[0].g_prof, pr.grid


@pytest.mark.parametrize("arch", ["preln", "postln"])
def test_graded_prediction_matches_the_exact_position_model(arch, monkeypatch):
    """The whole prediction on the graded grid against the exact position model at L 600,
    small width and depth.  Measured (docs/validation.md): relative errors <= 1e-6 on the
    trace and <= 1e-4 on the gradient profile; the tolerance is 1e-4 on the trace and 1e-3
    on the profile."""
    L = 600
    m = resolve(arch, None, n_layers=2, causal=True, seq_len=L, d_model=32, n_heads=2, d_ff=128)
    ex, pex, _ = _run(m, 10 ** 9, monkeypatch)
    gr, pgr, grid = _run(m, 0, monkeypatch)
    assert grid is not None and grid.size < L // 3
    for a, b in zip(gr, ex):
        assert abs(math.exp(a.log_var - b.log_var) - 1) < 1e-4
        assert abs(a.corr - b.corr) < 1e-4
        assert abs(math.exp(a.log_gvar - b.log_gvar) - 1) < 1e-4
        assert abs(a.gcorr - b.gcorr) < 1e-4
    for i in (0, 1, 2, 10, 100, L - 1):
        blk = int(np.searchsorted(grid.end, i, side="right"))
        assert abs(pgr[blk] / pex[i] - 1) < 1e-3, (i, pgr[blk], pex[i])


def test_a_long_sequence_runs_on_a_few_hundred_blocks():
    """seq 131072: the position arrays are the grid's (271 blocks), not L long."""
    m = resolve("preln", None, n_layers=1, causal=True, seq_len=131072, d_model=32, n_heads=2, d_ff=128)
    pr = Predictor(m)
    assert pr.npos == pr.grid.size < 300
    recs = pr.forward()
    pr.backward(recs)
    assert recs[0].g_prof.shape == (pr.grid.size,)
    assert all(np.isfinite(p.log_gvar) and np.isfinite(p.log_var) for p in predict(m))


@pytest.mark.parametrize("shape", [(1, 5), (7, 9), (256, 256), (214, 214)])
def test_cumsum_inplace_is_numpys_cumsum_bit_for_bit(shape):
    """The row-wise running sum (axis 0 of a C-ordered matrix) and the fallbacks (axis 1, a
    transposed view, 1-D) give np.cumsum's numbers exactly, in the array given."""
    rng = np.random.default_rng(1)
    A = rng.standard_normal(shape) * np.exp(rng.uniform(-20, 20, shape))
    for axis in (0, 1):
        B = A.copy()
        out = positions.cumsum_inplace(B, axis)
        assert out is B
        np.testing.assert_array_equal(B, np.cumsum(A, axis=axis))
    T = A.copy().T                                  # not C-ordered
    np.testing.assert_array_equal(positions.cumsum_inplace(T, 0), np.cumsum(A.T, axis=0))
    v = A[0].copy()
    np.testing.assert_array_equal(positions.cumsum_inplace(v, 0), np.cumsum(A[0]))


def test_kernel_shortcuts_against_brute_force_sums():
    """The kernels' shortcuts against dense sums: the diagonal of U^T X U with one suffix sum
    (exact and graded), and the mean over pairs as w^T K w (graded, against the within-block
    pairs summed out)."""
    L = 37
    X = _sym(L, seed=3)
    X = X + np.random.default_rng(4).uniform(-0.1, 0.1, (L, L))
    X = X + X.T
    np.fill_diagonal(X, 0.0)
    n = np.arange(1.0, L + 1)
    U = np.tril(np.ones((L, L))) / n[:, None]
    dense = U.T @ X @ U
    np.testing.assert_allclose(profile._UtXU_diag(X), np.diag(dense), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(profile._UtXU(X), dense, rtol=1e-12, atol=1e-15)
    g = positions.Grid(3000, p0=16, q=1.3)
    K = _sym(g.size, seed=5) + 0.2
    np.fill_diagonal(K, np.linspace(1.0, 2.0, g.size))
    np.testing.assert_allclose(g.UtXU_diag(K), np.diag(g.UtXU(K)), rtol=1e-12, atol=1e-15)
    Kin = K.copy()
    g.UtXU_diag(Kin, inplace=True)                  # may overwrite the diagonal only
    off = ~np.eye(g.size, dtype=bool)
    np.testing.assert_array_equal(Kin[off], K[off])
    # mean over the L (L - 1) ordered pairs of distinct positions: pairs in blocks a != b
    # take K_ab, pairs inside block a its within-block value
    wd = g.within_diag(K)
    tot = sum(g.w[a] * g.w[b] * K[a, b] for a in range(g.size) for b in range(g.size) if a != b)
    tot += float(np.sum(g.w * (g.w - 1) * wd))
    assert math.isclose(g.mean_off(K), tot / (3000 * 2999), rel_tol=1e-12)


def test_keep_heap_is_idempotent():
    """positions.keep_heap applies once per process (glibc) and says so on every call."""
    first = positions.keep_heap()
    assert positions.keep_heap() is first
    assert isinstance(first, bool)


@pytest.mark.parametrize("kind", ["decreasing", "increasing", "mixed"])
def test_UtDU_outer_shortcut_equals_the_gather(kind):
    """U^T diag(a) U through an outer minimum/maximum where the suffix sums are monotone is
    bit for bit the gather s[max(k, l)] (and the gather is kept where they are not)."""
    g = positions.Grid(4096)
    t = np.arange(g.size, dtype=float)
    a = {"decreasing": 1.0 + 0.01 * t, "increasing": -(1.0 + 0.01 * t),
         "mixed": np.cos(0.3 * t)}[kind]
    s = g._from_rep(a, g.h2, g.h2p)
    step = np.diff(s)
    assert (kind == "mixed") == (not (np.all(step <= 0) or np.all(step >= 0)))
    i = np.arange(g.size)
    assert np.array_equal(g.UtDU(a), s[np.maximum.outer(i, i)])


def test_symmetric_kernels_equal_the_row_and_column_sums():
    """UtXU and UXUt of a symmetric matrix (summed along columns, then transposed) against
    the dense products with the grid's block weights (brute force)."""
    g = positions.Grid(2048)
    X = _sym(g.size, seed=3)
    A = g._A                                          # suffix weights with 1/n
    Xx = g.within(X)
    want = A @ Xx @ A.T - g.UtDU(np.diag(Xx))
    assert np.allclose(g.UtXU(X), want, rtol=1e-12, atol=1e-14)
    lower = np.tril(np.ones((g.size, g.size)), -1) * g.w[None, :] + np.diag(g.head)
    P = lower @ Xx @ lower.T - (lower @ np.diag(Xx))[g.imin]
    assert np.allclose(g.UXUt(X), P / np.outer(g.n, g.n), rtol=1e-12, atol=1e-14)


def test_pair_polynomial_interpolates_through_the_chebyshev_nodes():
    """The position-wise branch's polynomial over the pair correlations (power-basis
    coefficients from the precomputed inverse Vandermonde matrix) reproduces any polynomial
    of degree 6 and agrees with NumPy's Chebyshev interpolation of a smooth function."""
    from sigprop.model import predict as pm

    t = pm._PAIR_T
    c = np.array([0.3, -1.2, 0.5, 2.0, -0.7, 0.1, 0.05])
    assert np.allclose(pm._PAIR_INV @ np.polyval(c[::-1], t), c, rtol=0, atol=1e-13)
    f = np.exp(t) / (2.0 + t)
    x = np.linspace(-1, 1, 41)
    ours = np.polyval((pm._PAIR_INV @ f)[::-1], x)
    ref = np.polynomial.Chebyshev.fit(t, f, len(t) - 1, domain=[-1, 1])(x)
    assert np.allclose(ours, ref, rtol=0, atol=1e-13)
