"""Position grids for long causal sequences.

The causal position model (:mod:`sigprop.model.profile`) carries, per position, variance
profiles and L x L covariance matrices over positions.  Beyond ``EXACT_MAX`` positions the
predictor carries them on a :class:`NodeGrid` instead (:func:`grid_for`): values at a few dozen
nodes in log position (every position below ``HEAD``, then nodes ``H_LOG`` apart in log row
length), with product quadratures for the sums over positions that are exact for a piecewise
polynomial of degree ``ORDER - 1`` through the nodes, sum the uniform causal weights 1/n
exactly, and keep the diagonal's kink apart (see the class).  Its cost per sublayer and its
memory do not grow with L beyond the logarithmic growth of the number of nodes (34 at L 256,
52 at L 8192, 66 at L 131072).

:class:`Grid`, the earlier block grid (every position below ``P0`` its own block, then blocks
growing geometrically by ``Q``, each represented by one position and taken constant over it:
first order in the block size, 214 blocks at L 8192), is kept for comparison
(tests/model/test_positions.py holds both to the exact position sums).  Its description:

Each block ``b`` covers the
positions ``start[b] .. end[b] - 1`` (``w[b]`` of them) and is represented by one position
``rep[b]`` (row length ``n[b] = rep[b] + 1``, the block's geometric-mean row length rounded);
a quantity is taken constant over a block at its value at ``rep[b]``.  Sums over positions
become weighted sums over the blocks: plain sums with the block sizes, the attention's
``sum_i y_i / n_i`` with the exact sums of ``1/n`` (and ``1/n^2``) over each block (so the
uniform causal weights are integrated exactly, the smooth factors by the midpoint rule), and
the part of a block beyond the representative position counted separately where a sum starts
there.  A matrix over positions becomes ``nb x nb``: off the diagonal the value of the pair of
representative positions, on the diagonal the value at the representative position itself;
pairs of distinct positions inside one block take the mean of the block's neighbouring
off-diagonal entries (their value near the diagonal).  With every block a single position the
formulas reduce to the exact sums (tested).

The discretisation errors against the exact position model are measured in the tests and in
docs/validation.md ("Causal models at long context").
"""

from __future__ import annotations

import numpy as np

from sigprop import memo

#: sequences up to this length keep the exact position model (every position its own node)
EXACT_MAX = 64
#: the block grid (Grid, kept for comparison): every position below P0 is its own block
P0 = 128
#: the block grid: growth ratio of the blocks beyond P0
Q = 1.05


def set_diag(X: np.ndarray, v) -> None:
    """``np.fill_diagonal(X, v)`` for a square matrix, through a strided view of a C-ordered
    one (one assignment instead of ~3 us of Python around it)."""
    if X.flags.c_contiguous:
        X.reshape(-1)[::X.shape[1] + 1] = v
    else:
        np.fill_diagonal(X, v)


def cumsum_inplace(A: np.ndarray, axis: int = 0) -> np.ndarray:
    """``np.cumsum(A, axis, out=A)``, bit for bit; along axis 0 of a C-ordered matrix as a
    running sum of its rows (one vectorised add per row), which is 2-8x faster than NumPy's
    accumulate there (that walks each column with the row stride, and at power-of-two widths
    such as L 256 or 512 the column's entries alias in the cache: measured 1.4 ms against
    0.17 ms at 256 x 256)."""
    if axis == 0 and A.ndim == 2 and A.flags.c_contiguous and len(A) > 1:
        add = np.add
        rows = iter(A)
        prev = next(rows)
        for r in rows:
            add(prev, r, out=r)
            prev = r
        return A
    return np.cumsum(A, axis=axis, out=A)


def _at_max_index(s: np.ndarray, imax: np.ndarray) -> np.ndarray:
    """The matrix s[max(k, l)]: where s is monotone that is an outer minimum (non-increasing s)
    or maximum (non-decreasing s), ~5x faster than the gather through the index matrix imax."""
    step = s[1:] - s[:-1]
    if np.all(step <= 0):
        return np.fmin.outer(s, s)
    if np.all(step >= 0):
        return np.fmax.outer(s, s)
    return s[imax]


def _flat_kernel_means(grid) -> tuple[float, float, float]:
    """Diagonal and off-diagonal means of U^T (1 1^T - I) U, and the diagonal mean of
    U^T ((1 1^T - I) o M) U (M the key pair weights), on ``grid``: the kernels of a flat
    covariance, which normalise the causal attention's gradient kernels (built with the
    grid)."""
    off = np.ones((grid.size, grid.size))
    set_diag(off, 0.0)
    Kf = grid.UtXU(off)
    Kk = grid.UtXU(off * grid.key_pair_weights())
    return grid.mean_diag(Kf), grid.mean_off(Kf), grid.mean_diag(Kk)


class Grid:
    """Blocks of positions of a length-``L`` causal sequence (see the module docstring)."""

    def __init__(self, L: int, p0: int = P0, q: float = Q):
        L = int(L)
        self.L, self.p0, self.q = L, int(p0), float(q)
        starts = list(range(min(self.p0, L)))
        b = self.p0
        while b < L:
            starts.append(b)
            b = max(b + 1, int(round(b * self.q)))
        s = np.asarray(starts, dtype=np.int64)
        e = np.append(s[1:], L)
        self.start, self.end = s, e
        self.w = (e - s).astype(float)
        # representative row length: the block's geometric mean (row lengths s+1 .. e)
        rep = np.clip(np.rint(np.sqrt((s + 1.0) * e)).astype(np.int64) - 1, s, e - 1)
        self.rep = rep
        self.n = rep + 1.0
        self.size = len(s)
        # exact harmonic sums over each block: sum 1/n, and from the representative on
        k = np.arange(1.0, L + 1)
        H1 = np.concatenate([[0.0], np.cumsum(1.0 / k)])
        H2 = np.concatenate([[0.0], np.cumsum(1.0 / (k * k))])
        self.h, self.hp = H1[e] - H1[s], H1[e] - H1[rep]
        self.h2, self.h2p = H2[e] - H2[s], H2[e] - H2[rep]
        nb = self.size
        # the sums from the representative position on and up to it are cumulative sums over
        # the blocks (no matrix products: O(nb^2) per matrix, and no BLAS threads)
        self.tail = (e - rep).astype(float)            # positions rep_a .. end_a - 1
        self.head = (rep - s + 1).astype(float)        # positions start_a .. rep_a
        upper = np.triu(np.ones((nb, nb)), 1)
        self.Mw_strict = upper * self.w[None, :] + np.diag(self.tail - 1.0)
        self.ww = np.outer(self.w, self.w)
        i = np.arange(nb)
        self.imax = np.maximum.outer(i, i)
        self.imin = np.minimum.outer(i, i)
        self.pairs = L * (L - 1.0)
        # the neighbours averaged for the pairs inside a block (never the block itself: with
        # one block, nb = 1, there are none and its own entry is kept)
        lo, hi = np.maximum(i - 1, 0), np.minimum(i + 1, nb - 1)
        self._lo = np.where(lo == i, hi, lo)
        self._hi = np.where(hi == i, lo, hi)
        self._i = i
        # the same neighbours as indices into the flattened (C-ordered) matrix
        self._flo, self._fhi = i * nb + self._lo, i * nb + self._hi
        self.w2 = self.w * self.w
        self.ww_w = self.w2 - self.w                # weights of the diagonal in mean_off
        # constant matrices of the kernels, built once per grid
        self._kpw = 1.0 - 1.0 / self.n[self.imin]
        M = 1.0 / self.n[self.imax]
        np.fill_diagonal(M, 0.0)
        self._inv_nmax = M
        # suffix weights as a matrix: (A Y)_k = sum over the positions from rep_k on of Y
        # with the weights 1/n, A_ki = h_i (i > k), hp_k (i = k) (for the diagonal of U^T X U)
        self._A = np.triu(np.ones((nb, nb)), 1) * self.h[None, :] + np.diag(self.hp)
        self.lower = np.tril(np.ones((nb, nb), dtype=bool))
        self.flat_kernel_means = _flat_kernel_means(self)

    # -- means ---------------------------------------------------------------------------
    def mean(self, f: np.ndarray) -> float:
        """Mean over the positions of a quantity given per block."""
        return float(self.w @ f) / self.L

    def within_diag(self, K: np.ndarray) -> np.ndarray:
        """The value of pairs of distinct positions inside each block: the mean of the
        block's neighbouring off-diagonal entries of K."""
        if K.flags.c_contiguous:
            f = K.reshape(-1)
            return 0.5 * (f[self._flo] + f[self._fhi])
        i = self._i
        return 0.5 * (K[i, self._lo] + K[i, self._hi])

    def within(self, K: np.ndarray, inplace: bool = False) -> np.ndarray:
        """K with its diagonal replaced by the value of pairs of distinct positions inside
        each block (:meth:`within_diag`); ``inplace``: K itself is changed and returned."""
        d = self.within_diag(K)
        X = K if inplace else K.copy()
        set_diag(X, d)
        return X

    def mean_diag(self, K: np.ndarray) -> float:
        return float(self.w @ K.diagonal()) / self.L

    def mean_off(self, K: np.ndarray) -> float:
        """Mean over the L (L - 1) ordered pairs of distinct positions: w^T K w with the
        diagonal's terms replaced by the within-block pairs' (w_b^2 - w_b of them)."""
        d = self.within_diag(K)
        kd = K.diagonal()
        tot = float(self.w @ (K @ self.w)) - float(self.w2 @ kd) + float(self.ww_w @ d)
        return tot / self.pairs

    def _from_rep(self, Y: np.ndarray, full: np.ndarray, part: np.ndarray, axis: int = 0) -> np.ndarray:
        """sum over the positions from each representative on of Y (per block) times the
        block weights ``full`` (whole blocks) and ``part`` (the representative's own block):
        the sum over the blocks after each one (total - prefix) plus its own part."""
        sh = [1] * Y.ndim
        sh[axis] = -1
        # (a transposed view comes out C-ordered, so that the running sum goes over its rows)
        c = np.multiply(Y, full.reshape(sh), order="C")
        cumsum_inplace(c, axis)
        last = c[-1:] if axis == 0 else c[..., -1:]
        np.subtract(last, c, out=c)
        c += Y * part.reshape(sh)
        return c

    def _to_rep(self, Y: np.ndarray, axis: int = 0) -> np.ndarray:
        """sum over the positions up to each representative of Y (per block)."""
        sh = [1] * Y.ndim
        sh[axis] = -1
        c = np.multiply(Y, self.w.reshape(sh), order="C")
        cumsum_inplace(c, axis)
        c -= Y * (self.w - self.head).reshape(sh)
        return c

    # -- the uniform causal attention matrix U (U_ij = 1/n_i, j <= i) -------------------
    def suffix_h(self, y: np.ndarray) -> np.ndarray:
        """sum_{i >= k} y_i / n_i at each representative position k."""
        return self._from_rep(y, self.h, self.hp)

    def suffix(self, y: np.ndarray) -> np.ndarray:
        """sum_{i >= k} y_i at each representative position k (y per block, midpoint rule)."""
        return self._from_rep(y, self.w, self.tail)

    def right_of_diagonal(self, W: np.ndarray, f: np.ndarray) -> np.ndarray:
        """sum_{s > t} W_ts f_s for every representative t (W symmetric)."""
        return np.sum(self.Mw_strict * (self.within(W) * f[None, :]), axis=1)

    def UtXU(self, X: np.ndarray, inplace: bool = False) -> np.ndarray:
        """U^T X U for a symmetric X zero on the diagonal of positions (its within-block pairs as in
        :meth:`within`): the block sums with the exact weights 1/n, less the i = j terms.
        ``inplace``: X's diagonal may be overwritten."""
        Xx = self.within(X, inplace)
        # Xx symmetric: the sums along its rows (Xx A^T) are the transpose of those along its
        # columns (A Xx), which run as vectorised adds of whole rows (NumPy's cumulative sum
        # along a row is a serial loop, ~2x slower at 214 blocks)
        Y = self._from_rep(self._from_rep(Xx, self.h, self.hp, 0).T, self.h, self.hp, 0)
        Y -= self.UtDU(Xx.diagonal())
        return Y

    def UtXU_diag(self, X: np.ndarray, inplace: bool = False) -> np.ndarray:
        """The diagonal of :meth:`UtXU` only: (A Xx A^T)_kk = sum_j (A Xx)_kj A_kj with one
        suffix sum over the blocks (A the suffix weights, Xx symmetric)."""
        Xx = self.within(X, inplace)
        s = self._from_rep(Xx.diagonal(), self.h2, self.h2p)
        Y = self._from_rep(Xx, self.h, self.hp, 0)
        Y *= self._A
        return Y.sum(axis=1) - s

    def UtDU(self, a: np.ndarray) -> np.ndarray:
        """U^T diag(a) U: entry (k, l) is sum_{i >= max(k, l)} a_i / n_i^2, i.e. s[max(k, l)]
        for the suffix sums s; where s is monotone (a of one sign) that is the smaller or the
        larger of s_k and s_l, an outer minimum (or maximum) instead of a gather through the
        index matrix (the same values, ~5x faster at 214 blocks)."""
        s = self._from_rep(a, self.h2, self.h2p)
        return _at_max_index(s, self.imax)

    def UtDU_offmean(self, a: np.ndarray) -> float:
        """``mean_off(UtDU(a))``."""
        return self.mean_off(self.UtDU(a))

    def UXUt(self, X: np.ndarray) -> np.ndarray:
        """U X U^T for a symmetric X zero on the diagonal of positions: (1 / n_i n_k) sum_{j <= i, l <= k} X_jl."""
        Xx = self.within(X)
        P = self._to_rep(self._to_rep(Xx, 0).T, 0)          # X symmetric, as in UtXU
        P -= self._to_rep(Xx.diagonal())[self.imin]
        P *= self._inv_nn
        return P

    @property
    def _inv_nn(self) -> np.ndarray:
        m = getattr(self, "_inv_nn_m", None)
        if m is None:
            m = self._inv_nn_m = 1.0 / np.outer(self.n, self.n)
        return m

    def inv_nmax(self) -> np.ndarray:
        """1 / n_max(i, k) (U U^T) at the representative positions, zero diagonal (shared:
        not to be changed)."""
        return self._inv_nmax

    def key_pair_weights(self) -> np.ndarray:
        """1 - 1/min(n_i, n_i') at the representative positions (shared: not to be changed)."""
        return self._kpw

    def expand(self, f: np.ndarray) -> np.ndarray:
        """A per-block quantity at every position (constant over each block)."""
        return np.repeat(f, (self.end - self.start))

    def signature(self) -> tuple:
        return ("graded", self.L, self.p0, self.q)


# -- log-position nodes with kink-aware product quadrature ------------------------------------

#: every position below HEAD is a node of the node grid
HEAD = 16
#: spacing of the node grid's nodes beyond the head, in log row length
H_LOG = 0.2
#: points of the local interpolation stencils (4: piecewise cubic in log row length)
ORDER = 4
#: the node grid's last panel split into this many, evenly in log row length
END_SPLIT = 4

_G_ONE, _G_H, _G_H2 = 0, 1, 2
#: positions per pass when a node grid sums its panels' moments over every position
_CHUNK = 1 << 20


class RowOperator:
    """A stack of nb x nb matrices A[r], one per row r of its input, applied row by row:
    ``apply(X)[r] = A[r] @ X[r]``.  The node grid's kinked sums are of this kind, and their
    matrices differ from row to row only in the columns within a few nodes of the row's own
    (the stencils next to the diagonal): A[r] = F + B_r with one shared F and B_r zero outside
    the columns r - reach .. r + reach.  So the stack is kept as F (nb x nb) and the bands
    (nb x nb x (2 reach + 1)), ~5x smaller than the dense nb^3 array (1.1 MB at 52 nodes),
    which a deep model reads twice per sublayer and which no longer stayed in the cache
    between layers; a product is one matrix product with F plus a batched product with the
    bands.  The same sums as the dense stack up to rounding (F + B_r equals A[r] to an
    ulp of its entries).  Where the difference is not banded (a grid of few nodes) the dense
    stack is kept."""

    def __init__(self, A: np.ndarray):
        nb = A.shape[0]
        self.nb = nb
        self.dense = None
        r = np.arange(nb)
        # F: column j from the row farthest from j (the last row for the first half)
        far = np.where(r > (nb - 1) / 2.0, 0, nb - 1)
        F = A[far, :, r].T.copy()
        D = A - F[None]
        rows, _, cols = np.nonzero(D)
        reach = int(np.max(np.abs(cols - rows))) if len(rows) else 0
        if 2 * reach + 1 >= nb // 2:
            self.dense = A
            return
        t = np.arange(-reach, reach + 1)
        c = r[:, None] + t[None, :]                       # the band's columns of row r
        inside = (c >= 0) & (c < nb)
        c = np.clip(c, 0, nb - 1)
        # B[r, l, k] = D[r, l, c[r, k]] (zero where the band leaves the matrix)
        B = np.take_along_axis(D, np.broadcast_to(c[:, None, :], (nb, nb, len(t))), axis=2)
        B *= inside[:, None, :]
        self.F, self.FT = F, np.ascontiguousarray(F.T)
        self.B = B
        self.BT = np.ascontiguousarray(B.transpose(0, 2, 1))     # BT[r, k, l] = B[r, l, k]
        self.cols = c
        self.flat = (r[:, None] * nb + c).ravel()                 # the band's entries in X.ravel()
        self.width = len(t)
        for a in (self.F, self.FT, self.B, self.BT, self.cols, self.flat):
            a.flags.writeable = False

    def apply(self, X: np.ndarray) -> np.ndarray:
        """out[r, l] = sum_j A[r, l, j] X[r, j] (X C-ordered, nb x nb)."""
        if self.dense is not None:
            return np.matmul(self.dense, X[:, :, None])[:, :, 0]
        out = X @ self.FT
        Xb = X.ravel().take(self.flat).reshape(self.nb, self.width)
        out += np.matmul(self.B, Xb[:, :, None])[:, :, 0]
        return out

    def apply_weighted(self, X: np.ndarray, W: np.ndarray) -> np.ndarray:
        """out[r, l] = sum_j A[r, l, j] X[r, j] W[j, l]: each output column l with its own
        weights on the input's columns."""
        if self.dense is not None:
            return np.einsum("rlj,rj,jl->rl", self.dense, X, W)
        out = X @ (self.FT * W)
        Wb = W.take(self.cols.ravel(), axis=0).reshape(self.nb, self.width, self.nb)   # W[c[r, k], l]
        Wb *= self.BT
        Xb = X.ravel().take(self.flat).reshape(self.nb, 1, self.width)
        out += np.matmul(Xb, Wb)[:, 0, :]
        return out


def _lagrange(U: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Lagrange basis of the nodes U evaluated at the points u: an array (len(u), len(U))."""
    B = np.ones((len(u), len(U)))
    for t in range(len(U)):
        for s in range(len(U)):
            if s != t:
                B[:, t] *= (u - U[s]) / (U[t] - U[s])
    return B


class NodeGrid:
    """Nodes over the positions of a length-``L`` causal sequence, for the causal position
    model (the log-position node representation).

    Nodes: every position below ``head``, then positions whose row lengths n = position + 1
    are spaced evenly in log n (spacing at most ``h``) up to the last position L - 1.  A
    profile is carried as its values at the nodes; a matrix over positions as its values at
    pairs of nodes, off the diagonal the value of the pair of distinct positions, on the
    diagonal the value at the node's position itself (the two differ: the diagonal is not
    the limit of the off-diagonal entries).  Products and other pointwise maps act on the
    nodal values.

    Sums over positions are quadratures exact for the piecewise polynomial of degree
    ``order - 1`` in u = log n through the nodes: panel p holds the positions from node p up to
    the next node, its values interpolated through ``order`` consecutive nodes (centred on the
    panel where possible), and the weights are the exact sums over the panel's integer
    positions of the Lagrange basis times the known factor (1, 1/n or 1/n^2), computed once per
    grid.  So the uniform causal weights are summed exactly and only the smooth factors are
    interpolated.  A matrix's off-diagonal values, seen along one row i, are smooth on either
    side of the diagonal but not across it (e.g. 1/n_max(i, j)): row i's sums take the panels
    left of node i through nodes below i only and the panels right of it through nodes above
    i only (extrapolating over the panels next to the diagonal), never the node i itself (the
    i = j term is excluded, as in the exact sums; the diagonal is summed with its own weights).
    The inner sum of a double sum (U^T X U, U X U^T) is smooth up to its first derivative
    across its start or end node; the outer sum takes its panels on either side of that node
    through the nodes on that side (the node included).  These weights are read-only arrays
    of nb^3 entries (nb the number of nodes), and every kernel is a handful of dense small
    operations (two batched matrix-vector products for U^T X U).

    With every position a node (``head`` >= L) every weight is the exact sum's (tested).  The
    number of nodes is about ``head + log(L / head) / h`` plus ``END_SPLIT`` (the last panel,
    where a row's sums beyond the diagonal see few nodes, is split finer): 34 at L 256, 38 at
    L 512, 52 at L 8192, 66 at L 131072.  The discretisation error against the exact
    position model is measured in the tests and in docs/validation.md ("Causal models at long
    context")."""

    kind = "nodes"

    def __init__(self, L: int, head: int = HEAD, h: float = H_LOG, order: int = ORDER):
        L = int(L)
        if L < 1:
            raise ValueError("a causal sequence has at least one position")
        self.L, self.head, self.h, self.order = L, max(1, min(int(head), L)), float(h), int(order)
        x = list(range(self.head))
        if L > self.head:
            nh = float(self.head)
            m = max(1, int(np.ceil(np.log(L / nh) / self.h - 1e-9)))
            for v in np.rint(nh * (L / nh) ** (np.arange(1, m + 1) / m)).astype(np.int64):
                if v - 1 > x[-1]:
                    x.append(int(v) - 1)
            x[-1] = L - 1
            # near the end a row's sums beyond its diagonal see few nodes: the last panel is
            # split into END_SPLIT, evenly in log n, and the last of those once more in two
            for parts in (END_SPLIT, 2):
                if len(x) > 1 and x[-1] - x[-2] > 1:
                    a, b = np.log(x[-2] + 1.0), np.log(float(L))
                    new = np.rint(np.exp(a + (b - a) * np.arange(1, parts) / parts)).astype(np.int64) - 1
                    x = sorted(set(x) | {int(v) for v in new if x[-2] < v < L - 1})
        self.x = np.asarray(x, dtype=np.int64)
        self.n = self.x + 1.0
        self.u = np.log(self.n)
        nb = self.size = len(x)
        self.pe = np.append(self.x[1:], L)            # panel p: positions x[p] .. pe[p] - 1
        self._moments: dict = {}
        self._limits: dict = {}
        # per panel, the sums of g(m) (u_m - u_p)^k over its positions (k < order), for the
        # three factors g: 1, 1/n, 1/n^2 (one pass over the positions, in chunks of at most
        # _CHUNK positions: memory does not grow with L)
        self._pw = [np.zeros((nb, self.order)) for _ in range(3)]
        for a in range(0, L, _CHUNK):
            m = np.arange(a, min(L, a + _CHUNK), dtype=float)
            pan = np.searchsorted(self.x, m, side="right") - 1
            d = np.log(m + 1.0) - self.u[pan]
            # the panels this chunk touches, and where each starts within it
            first = np.flatnonzero(np.r_[True, pan[1:] != pan[:-1]])
            for pw, gm in zip(self._pw, (np.ones(len(m)), 1.0 / (m + 1.0), 1.0 / ((m + 1.0) * (m + 1.0)))):
                t = gm
                for k in range(self.order):
                    pw[pan[first], k] += np.add.reduceat(t, first)
                    t = t * d
        del m, pan, d, t
        # smooth sums (no kink): plain quadrature weights and suffix weights
        sm = [self._panels(_G_ONE, 0, nb - 1), self._panels(_G_H, 0, nb - 1), self._panels(_G_H2, 0, nb - 1)]
        self.q = sm[0].sum(axis=0)                     # sum over all positions
        self.S1, self.Sh, self.S2 = (np.cumsum(P[::-1], axis=0)[::-1].copy() for P in sm)
        # row sums with the diagonal kink: T[i, l] = weights of sum_{j >= x_l, j != x_i} X_ij g_j
        T1 = self._kinked(_G_ONE, prefix=False)
        self.R = np.ascontiguousarray(T1[np.arange(nb), np.arange(nb)])       # sum over j > x_i
        self.Moff = self.q[:, None] * T1[:, 0, :]      # w . K for the mean over ordered pairs
        self.pairs = L * (L - 1.0)
        del T1
        # the double sums of U^T X U and U X U^T: the inner sums with the i = j term at the
        # diagonal limit D_i (continuous in i across the outer sum's start), less the sums of
        # D over the pairs i = j after (before) both nodes
        self.Wh = self._kinked(_G_H, prefix=False, skip=False)
        self.Vh = self._broken(_G_H, prefix=False)
        self.Wp = self._kinked(_G_ONE, prefix=True, skip=False)
        self.Vp = self._broken(_G_ONE, prefix=True)
        self.E = np.zeros((nb, nb))                    # D = (X o E) 1
        for i in range(nb):
            st, c = self._limit(i)
            self.E[i, st] = c
        self.Pf = self._accumulate(sm[0][None], True, _G_ONE, False)[0]   # up to x_k
        self.imin = np.minimum.outer(np.arange(nb), np.arange(nb))
        self._moments, self._pw, self._limits = {}, None, {}
        i = np.arange(nb)
        self.imax = np.maximum.outer(i, i)
        self._inv_nn = 1.0 / np.outer(self.n, self.n)
        M = 1.0 / self.n[self.imax]
        np.fill_diagonal(M, 0.0)
        self._inv_nmax = M
        self._kpw = 1.0 - 1.0 / np.minimum.outer(self.n, self.n)
        # the row-by-row products of the double sums, as shared matrices plus bands
        self._wh, self._vh = RowOperator(self.Wh), RowOperator(self.Vh)
        self._wp, self._vp = RowOperator(self.Wp), RowOperator(self.Vp)
        # the diagonal of U^T X U: entry l is sum_i Vh[l, l, i] Z[i, l] (Z the inner sums)
        # less sum_i S2[l, i] D_i (the diagonal limits' pairs); both weights transposed
        self._vdT = np.ascontiguousarray(self.Vh[i, i].T)
        self._S2T = np.ascontiguousarray(self.S2.T)
        # the pairs of nodes on and below the diagonal (rows i >= key j)
        self.lower = np.tril(np.ones((nb, nb), dtype=bool))
        # the off-diagonal mean of U^T diag(a) U as one dot product with a: U^T diag(a) U is
        # s[max(k, l)] for s = S2 a, so its mean over the pairs weighs s_m with the pair
        # weights of every (k, l) whose larger index is m
        at_max = np.zeros(nb)
        np.add.at(at_max, self.imax.ravel(), self.Moff.ravel())
        self.utdu_offmean = (at_max @ self.S2) / self.pairs
        # diagonal and off-diagonal means of U^T (1 1^T - I) U and the diagonal mean of
        # U^T ((1 1^T - I) o M) U, M the key pair weights: the flat covariance's kernels
        self.flat_kernel_means = _flat_kernel_means(self)

    # -- construction ------------------------------------------------------------------
    def _g(self, g: int, m: np.ndarray) -> np.ndarray:
        n = m + 1.0
        return np.ones_like(n) if g == _G_ONE else (1.0 / n if g == _G_H else 1.0 / (n * n))

    def _moment(self, p: int, lo: int, hi: int, g: int, skip: int = 0) -> np.ndarray:
        """Weights over the nodes of the sum of g(m) f(m) over panel p's positions (its first
        ``skip`` left out), f interpolated through nodes in lo..hi."""
        a, b = int(self.x[p]) + skip, int(self.pe[p])
        k = min(self.order, hi - lo + 1)
        start = min(max(p - (self.order // 2 - 1), lo), hi - k + 1)
        key = (p, start, k, g, skip)
        hit = self._moments.get(key)
        if hit is None:
            hit = np.zeros(self.size)
            if a < b:
                if k < 1:
                    raise ValueError("no nodes to interpolate a panel through")
                # the basis in powers of (u - u_p): C = V^-1, V_tk = (u_t - u_p)^k
                pw = self._pw[g][p, :k].copy()
                if skip:
                    pw[0] -= float(self._g(g, np.array([float(self.x[p])]))[0])
                st = np.arange(start, start + k)
                V = np.power.outer(self.u[st] - self.u[p], np.arange(k))
                hit[st] = np.linalg.solve(V.T, pw)
            self._moments[key] = hit
        return hit

    def _panels(self, g: int, lo: int, hi: int) -> np.ndarray:
        return np.stack([self._moment(p, lo, hi, g) for p in range(self.size)])

    def _kinked(self, g: int, prefix: bool, skip: bool = True) -> np.ndarray:
        """T[i, l, :]: weights of the sum over j from x_l on (prefix: up to x_l) of X_ij g_j,
        j != x_i, for X smooth off the diagonal on either side of it; ``skip`` False: with the
        j = x_i term taken at the diagonal limit D_i of row i's off-diagonal values."""
        nb, w = self.size, self.order + 1
        P = np.repeat(self._panels(g, 0, nb - 1)[None], nb, axis=0)
        for i in range(nb):
            # node i stands for the limit of row i's off-diagonal values at the diagonal,
            # D_i, itself extrapolated from one side (_limit): its weight is handed on.  Only
            # the panels within ``order`` of i take stencils other than the free ones
            for p in range(max(0, i - w), min(nb, i + w)):
                P[i, p] = (self._moment(p, 0, i, g) if p < i else
                           self._moment(p, i, nb - 1, g, 1 if p == i and skip else 0))
        T = self._accumulate(P, prefix, g, skip)
        for i in range(nb):
            st, c = self._limit(i)
            T[i][:, st] += T[i][:, i:i + 1] * c[None, :]
            T[i][:, i] = 0.0
        return T

    def _limit(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(nodes, coefficients) extrapolating row i's off-diagonal values to the diagonal,
        from the ``order`` nearest nodes below i (above i where there are fewer below)."""
        hit = self._limits.get(i)
        if hit is None:
            nb, k = self.size, self.order
            if i >= k or i >= nb - 1 - i:
                st = np.arange(max(0, i - k), i)
            else:
                st = np.arange(i + 1, min(nb, i + 1 + k))
            c = _lagrange(self.u[st], self.u[i:i + 1])[0] if len(st) else np.zeros(0)
            hit = self._limits[i] = (st, c)
        return hit

    def _broken(self, g: int, prefix: bool) -> np.ndarray:
        """T[l, k, :]: weights of the sum over i from x_k on (prefix: up to x_k) of Z_i g_i for
        Z smooth on either side of node l and continuous with its derivative there."""
        nb, w = self.size, self.order + 1
        P = np.repeat(self._panels(g, 0, nb - 1)[None], nb, axis=0)
        for l in range(nb):
            for p in range(max(0, l - w), min(nb, l + w)):
                P[l, p] = self._moment(p, 0, l, g) if p < l else self._moment(p, l, nb - 1, g)
        return self._accumulate(P, prefix, g, False)

    def _accumulate(self, P: np.ndarray, prefix: bool, g: int, skip: bool) -> np.ndarray:
        """For panel weights P[r, p, :] (per row r): the suffix sums over the panels from each
        node on, or the prefix sums up to each node: the panels before it and the node's own
        position (not the row's own node where ``skip``)."""
        if not prefix:
            return np.cumsum(P[:, ::-1], axis=1)[:, ::-1].copy()
        nb = self.size
        out = np.zeros_like(P)
        np.cumsum(P[:, :-1], axis=1, out=out[:, 1:])
        # the node's own position, the first of its panel: its nodal value (a panel's
        # stencils always hold its own node where that node is allowed)
        i = np.arange(nb)
        own = np.broadcast_to(self._g(g, self.x.astype(float)), (len(P), nb)).copy()
        if skip:
            own[i, i] = 0.0
        out[:, i, i] += own
        return out

    # -- means -------------------------------------------------------------------------
    def mean(self, f: np.ndarray) -> float:
        """Mean over the positions of a quantity given at the nodes."""
        return float(self.q @ f) / self.L

    def mean_diag(self, K: np.ndarray) -> float:
        return float(self.q @ K.diagonal()) / self.L

    def mean_off(self, K: np.ndarray) -> float:
        """Mean over the L (L - 1) ordered pairs of distinct positions."""
        return float(np.vdot(K, self.Moff)) / self.pairs

    # -- the uniform causal attention matrix U (U_ij = 1/n_i, j <= i) -------------------
    def suffix_h(self, y: np.ndarray) -> np.ndarray:
        """sum_{i >= k} y_i / n_i at each node k."""
        return self.Sh @ y

    def suffix(self, y: np.ndarray) -> np.ndarray:
        """sum_{i >= k} y_i at each node k."""
        return self.S1 @ y

    def right_of_diagonal(self, W: np.ndarray, f: np.ndarray) -> np.ndarray:
        """sum_{s > t} W_ts f_s for every node t."""
        return (W * self.R) @ f

    def _inner(self, X: np.ndarray) -> np.ndarray:
        """Z[i, l] = sum_{j >= x_l, j != x_i} X_ij / n_j."""
        return self._wh.apply(X)

    def _limit_values(self, X: np.ndarray) -> np.ndarray:
        """D_i: the limit of row i's off-diagonal values at the diagonal."""
        D = X * self.E
        return D.sum(axis=1)

    def UtXU(self, X: np.ndarray, inplace: bool = False) -> np.ndarray:
        """U^T X U for a symmetric X whose diagonal is not read (the i = j terms are left out,
        as for a zero diagonal)."""
        Z = self._inner(X)
        Y = self._vh.apply(np.ascontiguousarray(Z.T))
        Y += Y.T.copy()
        Y *= 0.5
        Y -= (self.S2 @ self._limit_values(X))[self.imax]
        return Y

    def UtXU_diag(self, X: np.ndarray, inplace: bool = False) -> np.ndarray:
        """The diagonal of :meth:`UtXU` only."""
        T = self._vdT * self._inner(X)
        return T.sum(axis=0) - self.S2 @ self._limit_values(X)

    def UtXU_diag_weighted(self, X: np.ndarray, W: np.ndarray) -> np.ndarray:
        """Entry j of the diagonal of U^T (X o w_j w_j^T) U for every j, w_j = W[:, j] (a
        weight per row for each column j): the double sum of :meth:`UtXU_diag` with the
        weights w_j inside, Q[i, j] = sum_k Wh[i, j, k] X[i, k] W[k, j] and
        e[i, j] = sum_k E[i, k] X[i, k] W[k, j] (the diagonal limits), then
        sum_i W[i, j] (Vh[j, j, i] Q[i, j] - S2[j, i] e[i, j])."""
        Q = self._wh.apply_weighted(X, W)
        e = (X * self.E) @ W
        Q *= self._vdT
        e *= self._S2T
        Q -= e
        Q *= W
        return Q.sum(axis=0)

    def UtDU(self, a: np.ndarray) -> np.ndarray:
        """U^T diag(a) U: entry (k, l) is sum_{i >= max(k, l)} a_i / n_i^2."""
        s = self.S2 @ a
        return _at_max_index(s, self.imax)

    def UtDU_offmean(self, a: np.ndarray) -> float:
        """``mean_off(UtDU(a))`` without the matrix."""
        return float(self.utdu_offmean @ a)

    def prefix_sums(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(P, D) for a symmetric X whose diagonal is not read: the kinked prefix sums
        P[j, l] = sum_{k <= x_l} X_jk with the j = k term at row j's diagonal limit, and those
        limits D (:meth:`_limit_values`); what :meth:`UXUt` starts from (a caller that needs
        them too passes them on)."""
        return self._wp.apply(X), self._limit_values(X)

    def UXUt(self, X: np.ndarray, pre=None) -> np.ndarray:
        """U X U^T for a symmetric X whose diagonal is not read: (1 / n_i n_k) sum_{j <= i,
        l <= k, j != l} X_jl.  ``pre``: :meth:`prefix_sums` of X, where the caller has them."""
        P, D = self.prefix_sums(X) if pre is None else pre
        Y = self._vp.apply(np.ascontiguousarray(P.T))
        Y += Y.T.copy()
        Y *= 0.5
        Y -= (self.Pf @ D)[self.imin]
        Y *= self._inv_nn
        return Y

    def inv_nmax(self) -> np.ndarray:
        """1 / n_max(i, k) (U U^T) at the nodes, zero diagonal (shared: not to be changed)."""
        return self._inv_nmax

    def key_pair_weights(self) -> np.ndarray:
        """1 - 1/min(n_i, n_i') at the nodes (shared: not to be changed)."""
        return self._kpw

    def at(self, f: np.ndarray, pos) -> np.ndarray:
        """A profile given at the nodes, interpolated to the positions ``pos`` (a node's own
        value there)."""
        pos = np.atleast_1d(np.asarray(pos, dtype=np.int64))
        out = np.empty(len(pos))
        for c, m in enumerate(pos):
            p = int(np.searchsorted(self.x, m, side="right")) - 1
            k = min(self.order, self.size)
            start = min(max(p - (self.order // 2 - 1), 0), self.size - k)
            st = np.arange(start, start + k)
            out[c] = float(_lagrange(self.u[st], np.log([m + 1.0]))[0] @ f[st])
        return out

    def signature(self) -> tuple:
        return ("nodes", self.L, self.head, self.h, self.order)


def grid_for(L: int, exact_max: int | None = None) -> NodeGrid | None:
    """The node grid for a causal sequence of length L, or None where the exact position
    model is used (L <= ``exact_max``, default EXACT_MAX)."""
    lim = EXACT_MAX if exact_max is None else exact_max
    if int(L) <= lim:
        return None
    return _grid(int(L))


@memo.memoised(memo.Kind("positions.grid", 8, "NodeGrid per L"))
def _grid(L: int) -> NodeGrid:
    """``NodeGrid(L)``, memoised: a grid is a function of L alone (HEAD, H_LOG, ORDER are
    constants) and its arrays are made read-only once built, so a grid shared by the
    predictions of one process carries nothing from one to the next."""
    g = NodeGrid(L)
    for a in vars(g).values():
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return g
