"""The position grids (sigprop.model.positions: the node grid the predictor uses, and the block
grid kept for comparison) against the exact position sums.

Expected values come from the exact O(L^2) position model (sigprop.model.profile's own
L x L functions) or from brute-force sums, never from the grid under test."""

import math

import numpy as np
import pytest

from sigprop.model import positions, profile
from sigprop.model.predict import Predictor, _points, predict, with_gains
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
    grads, gains = pr.backward(recs)
    recs = with_gains(recs, gains)
    return _points(m, recs, grads), recs[0].g_prof, pr.grid


@pytest.mark.parametrize("arch,init,d", [("preln", None, 32), ("postln", None, 32),
                                         ("postln", "torch-default", 128)])
def test_node_grid_prediction_matches_the_exact_position_model(arch, init, d, monkeypatch):
    """The whole prediction on the node grid against the exact position model at L 600,
    small depth.  Measured (docs/validation.md, at 12 layers and L 256-2048): relative errors
    <= 3e-6 on the trace and <= 7e-5 on the gradient profile, also where it peaks 29x at
    position 0 (Post-LN torch-default); the tolerance is 1e-5 on the trace and 2e-4 on the
    profile (the block grid's errors were 1e-4 and 2e-3)."""
    L = 600
    m = resolve(arch, init, n_layers=2, causal=True, seq_len=L, d_model=d, n_heads=2, d_ff=4 * d)
    ex, pex, _ = _run(m, 10 ** 9, monkeypatch)
    gr, pgr, grid = _run(m, 0, monkeypatch)
    assert isinstance(grid, positions.NodeGrid) and grid.size < 40
    for a, b in zip(gr, ex):
        assert abs(math.exp(a.log_var - b.log_var) - 1) < 1e-5
        assert abs(a.corr - b.corr) < 1e-5
        assert abs(math.exp(a.log_gvar - b.log_gvar) - 1) < 1e-5
        assert abs(a.gcorr - b.gcorr) < 1e-5
    idx = [0, 1, 2, 10, 100, L - 1]
    for i, v in zip(idx, grid.at(pgr, idx)):
        assert abs(v / pex[i] - 1) < 2e-4, (i, v, pex[i])


def test_a_long_sequence_runs_on_a_few_dozen_nodes():
    """seq 131072: the position arrays are the node grid's (66 nodes), not L long."""
    m = resolve("preln", None, n_layers=1, causal=True, seq_len=131072, d_model=32, n_heads=2, d_ff=128)
    pr = Predictor(m)
    assert pr.npos == pr.grid.size < 70
    recs = pr.forward()
    recs = with_gains(recs, pr.backward(recs)[1])
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


# -- the node grid ---------------------------------------------------------------------------


def test_node_grid_with_every_position_a_node_is_the_exact_model():
    """With ``head`` >= L every position is a node and every panel one position: the weights
    are the exact sums'."""
    from sigprop.rules.attention import _right_of_diagonal

    L = 30
    g = positions.NodeGrid(L, head=L)
    assert g.size == L and np.array_equal(g.x, np.arange(L))
    X = _sym(L)
    n = np.arange(1.0, L + 1)
    y = np.cos(np.arange(L))
    W = X + 0.3
    np.fill_diagonal(W, 2.0)
    # the diagonal of X is not read (the i = j terms are left out)
    Xd = X.copy()
    np.fill_diagonal(Xd, 5.0)
    assert np.allclose(g.UtXU(Xd), profile._UtXU(X), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.UtXU_diag(Xd), profile._UtXU_diag(X), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.UXUt(Xd), profile.UXUt(X), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.UtDU(y), profile._UtDU(y), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.suffix_h(y), profile.suffix(y / n, 0), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.suffix(y), profile.suffix(y, 0), rtol=1e-12, atol=1e-14)
    assert np.allclose(g.right_of_diagonal(W, y), _right_of_diagonal(W, y), rtol=1e-12, atol=1e-14)
    assert math.isclose(g.mean_off(W), profile.mean_off(W), rel_tol=1e-12)
    assert math.isclose(g.mean_diag(W), float(np.mean(np.diag(W))), rel_tol=1e-12)
    assert math.isclose(g.mean(y), float(np.mean(y)), rel_tol=1e-12, abs_tol=1e-15)
    assert np.array_equal(g.inv_nmax(), profile._inv_nmax(L)[0])
    assert np.allclose(g.key_pair_weights(), profile._key_pair_weights(L), rtol=1e-15)


def _node_errors(g, X, L):
    x = g.x
    Xg = X[np.ix_(x, x)]

    def rel(a, b):
        nz = b != 0
        return float(np.max(np.abs(a[nz] / b[nz] - 1)))
    return (rel(g.UtXU(Xg), profile._UtXU(X)[np.ix_(x, x)]),
            rel(g.UXUt(Xg), profile.UXUt(X)[np.ix_(x, x)]),
            abs(g.mean_off(Xg) / profile.mean_off(X) - 1))


def test_node_grid_kernels_match_the_exact_ones_on_matrices_with_a_diagonal_kink():
    """At L 3000 on 45 nodes, for a symmetric matrix smooth in log position on either side of
    the diagonal but not across it (exp(-0.1 |log n_i - log n_j|)): U^T X U, U X U^T and the
    mean over pairs against the exact L x L sums at the nodes.  Measured: 3.8e-4 (U^T X U, at
    the last nodes, where a row's sums beyond the diagonal see two nodes), 1.7e-6, 1.3e-6; a
    coarser grid (linear stencils, nodes 0.6 apart in log n) is measurably worse (2.6e-3,
    2.7e-3, 9e-4): the test can fail."""
    L = 3000
    X = _sym(L)
    g = positions.NodeGrid(L)
    assert g.size < 50
    e = _node_errors(g, X, L)
    assert e[0] < 1e-3 and e[1] < 1e-5 and e[2] < 1e-5, e
    c = _node_errors(positions.NodeGrid(L, head=4, h=0.6, order=2), X, L)
    assert max(c) > 2e-3 and c[1] > 100 * e[1], c


def test_node_grid_sums_of_smooth_profiles():
    """Suffix sums with the causal weights 1/n and 1/n^2 and the plain mean of a profile smooth
    in log position, against brute-force sums over every position (measured: 5e-6, 6e-6,
    1.2e-5, the mean 4e-6, the interpolation 3e-5)."""
    L = 5000
    g = positions.NodeGrid(L)
    t = np.log1p(np.arange(L, dtype=float))
    f = (1.0 + 0.5 * np.sin(t)) / np.sqrt(1.0 + t)
    n = np.arange(1.0, L + 1)
    fx = f[g.x]
    for got, want in ((g.suffix(fx), profile.suffix(f, 0)), (g.suffix_h(fx), profile.suffix(f / n, 0)),
                      (g.S2 @ fx, profile.suffix(f / n ** 2, 0))):
        assert np.max(np.abs(got / want[g.x] - 1)) < 1e-4
    assert abs(g.mean(fx) / np.mean(f) - 1) < 2e-5
    # and the interpolation back to every position
    assert np.max(np.abs(g.at(fx, np.arange(L)) / f - 1)) < 1e-4
    assert np.array_equal(g.at(fx, g.x), fx)


def test_node_grid_size_grows_with_log_L_and_is_shared_read_only():
    sizes = [positions.NodeGrid(L).size for L in (512, 8192, 131072)]
    assert sizes == sorted(sizes) and sizes[-1] < 70
    g = positions.grid_for(8192)
    assert isinstance(g, positions.NodeGrid) and positions.grid_for(8192) is g
    assert not g.Wh.flags.writeable and not g.Moff.flags.writeable
    with pytest.raises(ValueError):
        g.Wh[0, 0, 0] = 1.0


def test_utxu_diag_weighted_is_the_diagonal_of_each_weighted_product():
    from sigprop.model.positions import NodeGrid

    rng = np.random.default_rng(3)
    g = NodeGrid(300)
    nb = g.size
    X = rng.standard_normal((nb, nb))
    X = X + X.T
    W = 1 + 0.3 * rng.standard_normal((nb, nb))
    want = np.array([g.UtXU_diag(X * np.outer(W[:, j], W[:, j]))[j] for j in range(nb)])
    np.testing.assert_allclose(g.UtXU_diag_weighted(X, W), want, rtol=1e-11, atol=1e-13 * np.abs(want).max())


@pytest.mark.parametrize("L, head", [(8192, positions.HEAD), (300, positions.HEAD), (40, 40), (10, 10)])
def test_row_operators_equal_their_dense_stacks(L, head):
    # the node grid keeps its kinked row sums as a shared matrix plus bands (RowOperator); the
    # products must be those of the dense nb^3 stacks, up to rounding; a grid of few nodes
    # keeps the dense stack
    g = positions.NodeGrid(L, head=head)
    nb = g.size
    rng = np.random.default_rng(5)
    X = rng.standard_normal((nb, nb))
    W = 1 + 0.3 * rng.standard_normal((nb, nb))
    for A, op in ((g.Wh, g._wh), (g.Vh, g._vh), (g.Wp, g._wp), (g.Vp, g._vp)):
        assert (op.dense is None) == (L > 10)
        want = np.einsum("rlj,rj->rl", A, X)
        np.testing.assert_allclose(op.apply(X), want, rtol=0, atol=1e-13 * np.abs(want).max())
        want = np.einsum("rlj,rj,jl->rl", A, X, W)
        np.testing.assert_allclose(op.apply_weighted(X, W), want, rtol=0, atol=1e-13 * np.abs(want).max())
    if L > 64:
        assert g._wh.B.size < g.Wh.size / 3


def test_exact_position_constants_are_one_read_only_object_per_L():
    # the exact position model's constant matrices (profile.ExactPositions) are built once per
    # L and shared read-only, like a node grid's: nothing a prediction does can change them
    from sigprop.model import profile

    ex = profile.exact_positions(12)
    assert profile.exact_positions(12) is ex
    for a in (ex.diag_w, ex.imax, ex.kpw, ex.inv_nmax):
        assert not a.flags.writeable
    n = np.arange(1.0, 13)
    assert np.array_equal(ex.kpw, 1.0 - 1.0 / np.minimum.outer(n, n))
    M = 1.0 / np.maximum.outer(n, n)
    np.fill_diagonal(M, 0.0)
    assert np.array_equal(ex.inv_nmax, M) and ex.inv_nmax_mean == pytest.approx(M.sum() / (12 * 11), rel=1e-15)


def test_node_grid_panel_sums_in_chunks_match_one_pass(monkeypatch):
    """The panels' moment sums run over the positions in chunks (memory bounded in L); chunk
    boundaries inside panels give the same grid as one pass, to rounding."""
    one = positions.NodeGrid(5000)
    monkeypatch.setattr(positions, "_CHUNK", 777)
    many = positions.NodeGrid(5000)
    for name in ("q", "S1", "Sh", "S2", "R", "Moff", "E", "Pf", "Wh", "Vh", "Wp", "Vp"):
        a, b = getattr(one, name), getattr(many, name)
        assert np.allclose(a, b, rtol=1e-11, atol=1e-14 * np.abs(a).max()), name
