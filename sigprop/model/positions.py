"""A graded grid over the positions of a causal sequence, for long sequences.

The causal position model (:mod:`sigprop.model.profile`) carries, per position, variance
profiles and L x L covariance matrices over positions.  Beyond ``EXACT_MAX`` positions it
carries them on a graded grid instead: every position below ``P0`` (where a causal attention
concentrates the gradient, and where the row lengths differ most in relative terms), then
blocks of positions growing geometrically by the ratio ``Q``.  Each block ``b`` covers the
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
formulas reduce to the exact sums (tested), and the number of blocks is
``P0 + log(L / P0) / log(Q)`` (214 at L 8192, 271 at L 131072): the cost and memory of a
causal prediction no longer grow with the sequence beyond that (a few arrays of length L are
built once per grid, for the harmonic sums).

The discretisation error against the exact position model is measured in the tests and in
docs/validation.md ("Causal models at long context").
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

#: sequences up to this length keep the exact position model (every position its own block)
EXACT_MAX = 512
#: every position below P0 is its own block
P0 = 128
#: growth ratio of the blocks beyond P0
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
        step = s[1:] - s[:-1]
        if np.all(step <= 0):
            return np.fmin.outer(s, s)
        if np.all(step >= 0):
            return np.fmax.outer(s, s)
        return s[self.imax]

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


#: glibc's mallopt parameter for the free memory at the top of the heap that is kept
_M_TRIM_THRESHOLD = -1
_HEAP = {"kept": None}


def keep_heap(trim: int = 64 << 20) -> bool:
    """Keep up to ``trim`` bytes of freed memory at the top of the C heap for reuse (glibc
    only; elsewhere nothing happens).  A causal prediction allocates and frees several position
    matrices (0.3-2 MB) per operation, thousands per model; glibc serves them from the heap
    once its dynamic threshold has risen above their size, but gives the heap's top back to
    the system whenever more than twice that is free, so the next matrices were faulted in
    again page by page (measured: system time ~1/3 of a 768-layer run, 1.1 of 3.4 s CPU at
    L 8192).  A 4 MB block is allocated and freed first, which raises the dynamic threshold
    above the matrices' sizes (a block that large is mapped on its own; freeing it sets the
    threshold to its size); mallopt then fixes the thresholds there with the larger trim.
    Process-wide, idempotent; the peak memory is unchanged (freed blocks are reused).
    Returns whether it applied."""
    if _HEAP["kept"] is None:
        ok = False
        try:
            libc = ctypes.CDLL(None)                 # the process's own symbols
            mallopt = getattr(libc, "mallopt", None)
            if mallopt is not None:
                block = np.ones(1 << 19)
                del block
                ok = bool(mallopt(_M_TRIM_THRESHOLD, int(trim)))
        except (OSError, AttributeError, TypeError):
            ok = False
        _HEAP["kept"] = ok
    return _HEAP["kept"]


def grid_for(L: int, exact_max: int | None = None) -> Grid | None:
    """The graded grid for a causal sequence of length L, or None where the exact position
    model is used (L <= ``exact_max``, default EXACT_MAX)."""
    lim = EXACT_MAX if exact_max is None else exact_max
    if int(L) <= lim:
        return None
    return _grid(int(L))


@functools.lru_cache(maxsize=8)
def _grid(L: int) -> Grid:
    """``Grid(L)``, memoised: a grid is a function of L alone (P0 and Q are constants) and its
    arrays are made read-only once built, so a grid shared by the predictions of one process
    carries nothing from one to the next."""
    g = Grid(L)
    for a in vars(g).values():
        if isinstance(a, np.ndarray):
            a.flags.writeable = False
    return g
