"""Position profiles of a causal model (used by the predictor only when the mask is causal).

With a causal mask the query at position i sees keys 0..i, so the statistics of a stream are
position-dependent: the attention output of row i has the variance of a row of n = i + 1
keys (row 0 copies its own value), and, backward, key j collects the gradient of the rows
i >= j, each sharing its attention gradient among its n_i = i + 1 keys, so the first
positions collect by far the most.  The mean-field state (one variance for all positions)
misses the correlation between the two: the rows that carry the most gradient (the first
ones) are the ones with the largest attention weights ~ 1/n.  So beside every mean the
predictor carries a *profile*: the variance at each position over the mean over positions
(an array of length L, mean 1), forward for the stream and backward for the gradient.

The per-row quantities come from the attention rule (``Attention.rows``: the same statistics
and combinations as its forward/backward, at one row length); this module only distributes
them over positions:

* forward: the attention branch output has profile var(n_i) / mean; a sum a x + b y mixes
  the profiles with the variance weights; a LayerNorm output is flat (every token has unit
  variance), except a norm on a branch output whose input is comparable to its eps
  (:func:`branch_norm_eps`);
* backward, the gradient is carried as a covariance matrix over positions C (L x L, mean
  diagonal 1): the gradients of the first positions are strongly correlated with each other
  (measured: ~0.27 among positions 0..7 where the average correlation is 0.02), because
  every later row attends to all of them, and at the next attention layer down those
  correlations add up in the rows' value-path sums.  Through attention (U the uniform causal
  attention matrix, U_ij = 1/n_i for j <= i; per-length terms from the rule):
  key j's variance ``sum_{i >= j} C_ii spread(n_i) / n_i`` (value and key paths, one row's
  keys exchangeable) + ``C_jj local(n_j)`` (query path) + the pair-of-rows part, the rule's
  ``cross`` per unit correlation, its value-path part at uniform attention weights
  (``cross_u``) distributed as diag(U^T C' U) (C' = C off the diagonal), and the rest of it
  (the value path's softmax part, first order ~ (1 - 1/min(n_i, n_i')), and the key-path part
  ``cross_k``) as diag(U^T (C' o M) U), M_ii' = 1 - 1/min(n_i, n_i') (_key_pair_weights,
  _pair_scales); where the row logit variance times the rows' logit correlation is at least
  ``pair_rows.LINEAR``, the two paths' weights at the two rows' lengths instead
  (:mod:`sigprop.model.pair_rows`), the key path's part of ``cross_c`` (-``cross_k``/(L - 1))
  then with them too;
  covariance of keys j != j': ``sum_{i >= max(j, j')} C_ii same_c(n_i) / (n_i (n_i - 1))``
  (value and key paths within one row) + the rule's ``cross_c`` distributed as U^T C' U +
  ``qry_c`` C'_jj' (with rotary positions the key path's part of the one-row term, ``same_k``,
  and the query path's times kappa(j - j') / kbar(L), :func:`_offset_kernel`).  Each kernel
  is normalised so that the flat covariance (diagonal 1, off-diagonal rg) gives back the
  rule's value; the branch's gradient variance is the rule's
  (flat) value times mean diag(out(C)) / mean diag(out(flat)), its covariance the rule's
  times the same ratio of the off-diagonal means;
* a LayerNorm's backward divides the gradient at position i by that position's standard
  deviation: C_ik / sqrt(f_i f_k) (f the profile of the LayerNorm's input; Post-LN: of its
  harmonic per-token variance, layernorm_input);
* position-wise maps (FFN, dropout, scales, LayerNorm) scale the diagonal by their
  variance gain and the off-diagonal by their covariance gain (the rules' own gains, at the
  mean correlation: a pair of positions whose input correlation differs passes a different
  share, not modelled; docs/design.md).
"""

from __future__ import annotations

import numpy as np

from sigprop import memo
from sigprop.backend import numeric
from sigprop.model import logit_law, pair_rows, store, tables
from sigprop.model.positions import cumsum_inplace, set_diag
from sigprop.rules import attention as attention_rule, get
from sigprop.rules.layernorm import combine_token_stats, harmonic_token_var
from sigprop.state import Backward, Forward


def flat(L: int, grid=None) -> np.ndarray:
    """A flat profile: over the L positions, or over the nodes (blocks) of a position ``grid``
    (sigprop.model.positions)."""
    return np.ones(grid.size if grid is not None else int(L))


_KEYS = ("var", "spread", "local", "same_c", "same_k")   # per row length (arrays of L)
_SCALARS = ("cross", "cross_c", "qry_c", "cross_k", "cross_u")    # row-pair averages


def _rows_direct(params: dict, x: Forward, n: np.ndarray | None = None) -> dict:
    """``Attention.rows`` at input ``x`` for every row length n = 1..L (or the row lengths
    ``n`` given: a position grid's nodes' row lengths), unit gradient variance (the per-row
    terms are linear in it, and independent of the gradient correlation)."""
    rule = get("attention")
    p = rule.param_values(params)
    n = np.arange(1.0, int(params["L"]) + 1) if n is None else np.asarray(n, dtype=float)
    x = Forward(np.float64(x.mean), np.float64(x.var), np.float64(x.corr))
    g = Backward(np.float64(1.0), np.float64(0.0))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        r = rule.rows(numeric, x, g, p, n)
    return {k: np.broadcast_to(np.asarray(r[k], dtype=float), n.shape).copy() if k in _KEYS
            else float(r[k]) for k in _KEYS + _SCALARS}


def _canonical(params: dict) -> dict:
    """Only ratios and shapes of the per-row terms are used here, and the attention rule makes
    them homogeneous of degree 2 in v_std o_std (rules.attention.at_unit_value_gain), so layers
    that differ only in those scales (DeepScaleLM) share one table at the rule's reference
    scales."""
    return attention_rule.at_unit_value_gain(params)


def _row_values(r: dict) -> np.ndarray:
    """The per-row terms as one vector: each per-row quantity's values, then the scalars."""
    return np.concatenate([r[k] for k in _KEYS] + [[r[k] for k in _SCALARS]])


def _row_terms(v: np.ndarray, L: int) -> dict:
    """:func:`_row_values` undone."""
    out = {k: v[i * L:(i + 1) * L] for i, k in enumerate(_KEYS)}
    out.update({k: float(v[len(_KEYS) * L + i]) for i, k in enumerate(_SCALARS)})
    return out


def _quantity_floor(vals: np.ndarray, L: int) -> np.ndarray:
    """Each entry's verification floor: its quantity's largest |value| over the nodes (entries
    such as the query path of a one-key row, or near r = 1, are zero up to rounding)."""
    big = np.max(np.abs(vals.reshape(len(vals), -1)), axis=1)
    return np.concatenate([np.full(L, np.max(big[i * L:(i + 1) * L])) for i in range(len(_KEYS))]
                          + [big[-len(_SCALARS):]])


class RowsTable(tables.ThetaTable):
    """``Attention.rows`` as a function of the input correlation (a
    :class:`sigprop.model.tables.ThetaTable`: theta = arccos(r), 9 nodes or 17, STATS_TOL of
    each quantity's largest value), for one attention parameter set and one input mean and
    variance (the branch input of a Pre-LN layer, or a Post-LN stream, is the same at every
    layer but for its correlation).  One ``rows`` evaluation costs ~0.25 s at L 256 (every row
    length, every quadrature), so a causal model evaluated layer by layer would pay it twice
    per attention layer.  Kept in the on-disk store."""

    ROWS_TOL = tables.STATS_TOL

    def __init__(self, params: dict, mean: float, var: float, lo: float, grid=None):
        self.params = params
        self._memo = memo.Bounded(tables.MEMO_SIZE)
        self.n = None if grid is None else grid.n
        self.L = int(params["L"]) if grid is None else grid.size     # values per quantity
        parts = ("rows", tuple(sorted(params.items())), mean, var, lo, self.ROWS_TOL)
        key = store.key(*parts) if grid is None else store.key(*parts, grid.signature())
        super().__init__(self._flat, mean, var, lo, key, self.ROWS_TOL,
                         size=lambda vals: _quantity_floor(vals, self.L),
                         n_values=len(_KEYS) * self.L + len(_SCALARS))

    def _flat(self, th: float) -> np.ndarray:
        return _row_values(_rows_direct(self.params, Forward(self.mean, self.var, float(np.cos(th))), self.n))

    def at(self, corr: float) -> dict:
        """The terms at input correlation ``corr`` (memoised for the table's life: a layer's
        forward and backward ask for the same)."""
        return self._memo.get(corr, lambda: _row_terms(self.values(corr), self.L))


class RowsVarTable(tables.InterpTable):
    """``Attention.rows`` as a function of the input correlation *and* variance, for the
    attention ops of a model whose branch input changes its variance from layer to layer
    (LayerNorm Scaling: n_l times a LayerNorm output), where a :class:`RowsTable` (one
    variance) would serve a single layer: a :class:`sigprop.model.tables.InterpTable` over
    theta = arccos(r) and u = log var (over [log v_lo, log v_hi]), on a 9 x 9 grid (17 x 13
    if that fails), checked as a :class:`RowsTable` (every entry within STATS_TOL of its
    quantity's largest value) at the theta midpoints nearest both ends and in the middle, each
    at every u midpoint; kept in the on-disk store."""

    ROWS_TOL = tables.STATS_TOL
    GRIDS = ((9, 9), (17, 13))
    CHECKS = ("ends+middle", "all")
    LABEL = "sigprop: building an attention statistics table (correlation x variance)"
    DOMAIN_FAILS = False
    tol = ROWS_TOL

    def __init__(self, params: dict, mean: float, v_lo: float, v_hi: float, lo: float, grid=None):
        self.params, self.mean, self.v_lo, self.v_hi, self.lo = params, mean, v_lo, v_hi, lo
        self.n = None if grid is None else grid.n
        self.L = int(params["L"]) if grid is None else grid.size
        self.k = len(_KEYS) * self.L + len(_SCALARS)
        u0, u_span = float(np.log(v_lo)), float(np.log(v_hi) - np.log(v_lo))
        parts = ("rowsvar", tuple(sorted(params.items())), mean, v_lo, v_hi, lo, self.ROWS_TOL, tables.TH_MIN)
        key = store.key(*parts) if grid is None else store.key(*parts, grid.signature())
        self._memo = memo.Bounded(tables.MEMO_SIZE)
        self._setup([(tables.TH_MIN, float(np.arccos(lo))), (u0, u0 + u_span, u_span)], key)

    def _compute(self, th: np.ndarray, u: np.ndarray) -> np.ndarray:
        return np.stack([np.stack([self._terms_at(t, w) for w in u], axis=1) for t in th], axis=1)

    def _floor(self, vals: np.ndarray) -> np.ndarray:
        return _quantity_floor(vals, self.L)

    def _terms_at(self, th: float, u: float) -> np.ndarray:
        # (not ``_flat``: the base class keeps its coefficients under that name)
        return _row_values(_rows_direct(self.params, Forward(self.mean, float(np.exp(u)), float(np.cos(th))), self.n))

    def covers(self, x: Forward) -> bool:
        return (self.ok and float(x.mean) == self.mean and self.v_lo <= float(x.var) <= self.v_hi
                and self.lo <= float(x.corr) <= tables.R_MAX)

    def at(self, x: Forward) -> dict:
        """The terms at input ``x`` (memoised for the table's life: a layer's forward and backward
        ask for the same state)."""
        corr, var = min(1.0, max(-1.0, float(x.corr))), float(x.var)
        return self._memo.get((corr, var), lambda: _row_terms(self.interp(float(np.arccos(corr)), float(np.log(var))),
                                                              self.L))


_CANON = memo.Kind("profile.canonical", 4096, "a parameter dict's canonical parameters and their sorted items, "
                   "per dict (identity) for :func:`rows`")


def rows(params: dict, x: Forward, table=None, grid=None, var_range=None) -> dict:
    """The per-row-length terms at attention input ``x``: through a :class:`RowsTable` of
    the prediction's table cache ``table`` (a :class:`sigprop.model.tables.TableCache`: the
    predictor passes it when at least three layers share these parameters, as for its branch
    tables, so a table is never built for one use, and else the cache's ``untabulated`` view),
    else evaluated directly (memoised in the cache on the exact inputs, so a layer's forward
    and backward share one evaluation).  With a position ``grid`` the terms are evaluated at its
    nodes' row lengths only.  ``var_range`` (v_lo, v_hi): the layers sharing these
    parameters see input variances in that range (LayerNorm Scaling), and a
    :class:`RowsVarTable` over it serves them all (a state outside it, or beyond the tables'
    correlation range, is evaluated directly).  The canonical parameters and their key are
    memoised on the identity of ``params`` (as in Rule.fast: a dict is not changed after it was
    passed here)."""
    def canonical():
        c = _canonical(params)
        return c, tuple(sorted(c.items()))

    canon, items = _CANON.for_object(params, canonical)
    key = (items, float(x.mean), None if grid is None else grid.signature())
    if table is None:
        return _rows_direct(canon, x, None if grid is None else grid.n)
    if var_range is not None and var_range[0] <= float(x.var) <= var_range[1] and float(x.corr) <= tables.R_MAX:
        v_lo, v_hi = var_range
        t = table.theta("rowsvar", key + (v_lo, v_hi), x, lambda: RowsVarTable(
            canon, float(x.mean), v_lo, v_hi, min(0.0, float(x.corr)), grid))
        if t is not None:
            return t.at(x)
    else:
        t = table.theta("rows", key, x, lambda: RowsTable(canon, float(x.mean), float(x.var),
                                                          min(0.0, float(x.corr)), grid))
        if t is not None:
            return t.at(float(x.corr))
    return table.remember(("rows", key, float(x.var), float(x.corr)),
                          lambda: _rows_direct(canon, x, None if grid is None else grid.n))


def attention_forward(params: dict, x: Forward, table=None, grid=None, var_range=None) -> np.ndarray:
    """Profile of the attention output (attention parameters, attention input state)."""
    v = rows(params, x, table, grid, var_range)["var"]
    return v / (v.mean() if grid is None else grid.mean(v))


def mix(v1: float, f1: np.ndarray, v2: float, f2: np.ndarray) -> np.ndarray:
    """Profile (or normalised covariance over positions) of the sum of two independent signals
    of variances v1, v2 with profiles (covariances) f1, f2."""
    tot = v1 + v2
    if not tot > 0:
        return f1
    out = v1 * f1
    out += v2 * f2
    out /= tot
    return out


def _offdiag(C: np.ndarray) -> np.ndarray:
    out = C.copy()
    set_diag(out, 0.0)
    return out


def suffix(A: np.ndarray, axis: int) -> np.ndarray:
    """Reversed cumulative sum along ``axis`` (sum over the entries from here to the end),
    as total - prefix + entry: contiguous passes instead of reversed views."""
    c = cumsum_inplace(A.copy(), axis)
    last = c[-1:] if axis == 0 else c[..., -1:]
    np.subtract(last, c, out=c)
    c += A
    return c


class ExactPositions:
    """The constant matrices of the exact position model (every position its own node) for a
    causal sequence of L positions, built once per L (:func:`exact_positions`) as read-only
    arrays: what the kernels below need beside their inputs, as a position grid
    (sigprop.model.positions.NodeGrid) holds its own."""

    def __init__(self, L: int):
        L = int(L)
        n = np.arange(1.0, L + 1)
        i = np.arange(L)
        self.L, self.n = L, n
        #: weights of the diagonal of U^T X U after the row sums (row i >= k, times 1/n_i)
        self.diag_w = np.tril(np.ones((L, L))) / n[:, None]
        #: max(k, l) (U^T diag(a) U's index matrix)
        self.imax = np.maximum.outer(i, i)
        #: the key path's pair-of-rows weights (:func:`_key_pair_weights`)
        self.kpw = 1.0 - 1.0 / np.minimum.outer(n, n)
        #: U U^T with a zero diagonal, 1 / n_max(i, k), and its off-diagonal mean
        M = 1.0 / (self.imax + 1.0)
        np.fill_diagonal(M, 0.0)
        pairs = np.float64(L * (L - 1))
        with np.errstate(divide="ignore", invalid="ignore"):    # (no pairs at L = 1: nan)
            self.inv_nmax_mean = float(M.sum() / pairs)
            Kf = _UtXU(_offdiag(np.ones((L, L))))
            Kk = _UtXU(_offdiag(self.kpw))
            #: diagonal and off-diagonal means of U^T (1 1^T - I) U, and the diagonal mean of
            #: the key path's U^T ((1 1^T - I) o M) U: the flat covariance's kernels
            self.flat_kernel_means = (float(np.trace(Kf) / L), float((Kf.sum() - np.trace(Kf)) / pairs),
                                      float(np.trace(Kk) / L))
        self.inv_nmax = M
        for a in vars(self).values():
            if isinstance(a, np.ndarray):
                a.flags.writeable = False

    # the operators the kernels below take from a position grid (NodeGrid), over every
    # position: sums are plain sums, means plain means
    @property
    def size(self) -> int:
        """The number of nodes: every position."""
        return self.L

    def UtXU(self, X: np.ndarray) -> np.ndarray:
        return _UtXU(X)

    def UtXU_diag(self, X: np.ndarray) -> np.ndarray:
        return _UtXU_diag(X)

    def UtDU(self, a: np.ndarray) -> np.ndarray:
        return _UtDU(a)

    def UtDU_offmean(self, a: np.ndarray) -> float:
        return _UtDU_offmean(a)

    def suffix_h(self, y: np.ndarray) -> np.ndarray:
        """sum over the rows i >= j of y_i / n_i."""
        return suffix(y / self.n, 0)

    def key_pair_weights(self) -> np.ndarray:
        return self.kpw

    def mean(self, f: np.ndarray) -> float:
        return float(np.mean(f))

    def mean_diag(self, K: np.ndarray) -> float:
        return np.trace(K) / self.L

    def mean_off(self, K: np.ndarray) -> float:
        return mean_off(K)


@memo.memoised(memo.Kind("profile.exact_positions", 8, "ExactPositions per L"))
def exact_positions(L: int) -> ExactPositions:
    """``ExactPositions(L)``, memoised: a function of L alone, read-only (as positions.grid_for's
    grids)."""
    return ExactPositions(L)


def _positions(L: int, grid):
    """The position operators the attention kernels sum with: ``grid``, or every one of L
    positions (:class:`ExactPositions`) where there is none."""
    return exact_positions(L) if grid is None else grid


def _UtXU(X: np.ndarray) -> np.ndarray:
    """U^T X U for the uniform causal attention matrix U (U_ij = 1/n_i, j <= i), in O(L^2):
    (X U)_ik = sum_{j >= k} X_ij / n_j and (U^T Y)_kl = sum_{i >= k} Y_il / n_i are reversed
    cumulative sums (the dense products cost O(L^3), ~10 ms per attention layer at L 256)."""
    n = np.arange(1.0, len(X) + 1)
    Y = suffix(X / n[None, :], 1)
    Y /= n[:, None]
    return suffix(Y, 0)


def _UtXU_diag(X: np.ndarray) -> np.ndarray:
    """The diagonal of :func:`_UtXU` for a symmetric X with one suffix sum:
    (U^T X U)_kk = sum_{i >= k} Y_ik / n_i, Y_ik = sum_{j >= k} X_ij / n_j."""
    ex = exact_positions(len(X))
    Y = suffix(X / ex.n[None, :], 1)
    Y *= ex.diag_w
    return Y.sum(axis=0)


def _UtDU(a: np.ndarray) -> np.ndarray:
    """U^T diag(a) U: entry (k, l) is sum_{i >= max(k, l)} a_i / n_i^2."""
    ex = exact_positions(len(a))
    s = suffix(a / ex.n**2, 0)
    return s[ex.imax]


def _UtDU_offmean(a: np.ndarray) -> float:
    """Off-diagonal mean of U^T diag(a) U without building it: the pairs k != l with
    max(k, l) = m (0-based) number 2m."""
    L = len(a)
    n = np.arange(1.0, L + 1)
    s = suffix(a / n**2, 0)
    return float(np.sum(2.0 * np.arange(L) * s) / (L * (L - 1)))


def _key_pair_weights(L: int) -> np.ndarray:
    """M_ii' = 1 - 1/min(n_i, n_i'): the key path's pair-of-rows weight.  Through its logit,
    key j of row i moves the row's output by A_ij (V_j - O_i) (O_i the row's output); two rows
    i, i' >= j with correlated gradients pair these, and with (nearly) uniform weights the
    token-specific part of E[(V_j - O_i) . (V_j - O_i')] is (1 - 1/min(n_i, n_i')) of that of
    V_j alone (the shorter row's average shares the most with V_j; a one-key row, n = 1, has
    V_j - O_i = 0: row 0 pairs with nothing through the keys).  The value path's pairs carry
    weight 1 (U^T C' U).  (Read-only: ExactPositions.kpw.)"""
    return exact_positions(L).kpw


def _pair_scales(r: dict, kf_diag: float, kk_diag: float) -> tuple[float, float]:
    """(kv, kk): the scales of the pair-of-rows kernels diag(U^T C' U) and
    diag(U^T (C' o M) U) (M = :func:`_key_pair_weights`) in a key's gradient variance.

    Two rows i != i' attending to key j contribute E[A_ij A_i'j] C'_ii' through the value path.
    With uniform weights E[A_ij A_i'j] = 1/(n_i n_i'); the softmax's fluctuations add the
    covariance of the two rows' weights on the shared key, which to first order in the row
    logit variance v is 1/(n_i n_i') times rho v (1 - 1/min(n_i, n_i')) (rho the two rows'
    logit correlation on one key; P_ij ~ (1 + s_ij - mean_k s_ik)/n_i, and the rows' means share
    min(n_i, n_i') keys): zero for a pair with the one-key row 0, largest between long rows,
    the key path's pair weight M again.  So the value path's pair term splits into its
    uniform-weight part (the rule's ``cross_u``, distributed as U^T C' U) and the rest
    (``cross`` - ``cross_k`` - ``cross_u``, distributed like the key path's, with M); each
    normalised so that a flat covariance gives back the rule's own (pair-averaged) value.
    A single weight for every pair put the rule's average (the long rows') on the pairs of
    short rows, which carry the upstream covariance of a deep causal stack."""
    cross_v = float(r["cross"]) - float(r["cross_k"])
    if not kk_diag:
        # (no pairs of rows share a key path at L = 2: row 0 has one key; then nothing to scale)
        return cross_v / kf_diag, 0.0
    cu = float(r["cross_u"])
    return cu / kf_diag, (float(r["cross_k"]) + cross_v - cu) / kk_diag


_KAP = memo.Kind("profile.offset_kernel", 64, "the rotary offset kernel per (base, d_head, L, grid)")


def _offset_kernel(params: dict, grid=None, L: int | None = None) -> np.ndarray | None:
    """Rotary positions: kappa(j - j') / kbar(L) over the pairs of positions (or of a grid's
    nodes), ``sigprop.rules.attention.rope_offset_ratio``; None without them (memoised)."""
    if not attention_rule._rope_on(params.get("rope", 0.0)):
        return None
    L = int(params["L"]) if L is None else L

    def compute():
        x = np.asarray(grid.x, float) if grid is not None else np.arange(float(L))
        K = attention_rule.rope_offset_ratio({**params, "L": L}, np.abs(np.subtract.outer(x, x)))
        K.setflags(write=False)
        return K

    return _KAP.get((attention_rule._rope_key(params["rope"]), float(params["d_head"]), L, None if grid is None else grid.signature()),
                    compute)


def _key_split(r: dict, d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The key path's part of the one-row covariance term ``a`` (:func:`_terms`)."""
    return np.where(n > 1, d * np.asarray(r["same_k"], float) * n / np.maximum(n - 1, 1), 0.0)


def _one_row_off(r: dict, a: np.ndarray, d: np.ndarray, kap, UtDU, n: np.ndarray) -> np.ndarray:
    """U^T diag(a) U, the one-row covariance of keys j != j'; with rotary positions
    (``kap``: :func:`_offset_kernel`) its key-path part times kappa(j - j') / kbar(L)."""
    if kap is None:
        return UtDU(a)
    ak = _key_split(r, d, n)
    out = UtDU(ak)
    out *= kap
    out += UtDU(a - ak)
    return out


def _pair_terms(r: dict, d: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The one-row covariance term ``a`` of :func:`_diag_terms` alone."""
    return np.where(n > 1, d * np.asarray(r["same_c"], float) * n / np.maximum(n - 1, 1), 0.0)


def _diag_terms(r: dict, d: np.ndarray, pos):
    """(the one-row variance per key, the one-row covariance term ``a``) for the gradient
    variances ``d`` over the positions (or nodes) of ``pos`` (an ExactPositions or a grid)."""
    spread, local = (np.asarray(r[k], float) for k in ("spread", "local"))
    diag = pos.suffix_h(d * spread) + d * local
    return diag, _pair_terms(r, d, pos.n)


_PAIR_FLAT = memo.Kind("profile.pair_flat", 256, "the pair weights' flat-covariance references per (W, K) "
                       "pair (identity) and grid")


def _pair_flat_means(vw, pos) -> tuple[float, float, float]:
    """The flat-covariance references of the pair weights ``vw`` = (W, K) (read-only arrays of
    :func:`sigprop.model.pair_rows.pair_weights`, the same objects for every layer of one
    (v, rho) key): the means of diag(U^T W' U) and diag(U^T K' U) and the off-diagonal mean
    of U^T K' U (' : the diagonal set to 0), over the positions or nodes of ``pos`` (an
    ExactPositions or a grid); memoised on the arrays' identity (and pos's)."""
    def compute():
        Wo, Ko = _offdiag(vw[0]), _offdiag(vw[1])
        Kk = pos.UtXU(Ko)
        return float(pos.mean(pos.UtXU_diag(Wo))), float(pos.mean(np.diag(Kk))), float(pos.mean_off(Kk))

    return _PAIR_FLAT.for_object(vw, compute, pos)


def _attention_cov(r: dict, C: np.ndarray, kw=None, kap=None, vw=None, grid=None) -> np.ndarray:
    """The gradient covariance over positions at the attention input for covariance C at
    its output (see the module docstring; ``kw``: per-key weights, :func:`key_weights`;
    ``kap``: rotary positions' offset kernel, :func:`_offset_kernel`; ``vw``: the value
    and key paths' pair-of-rows weights, :func:`sigprop.model.pair_rows.pair_weights`
    (None: the first-order 1 - 1/min of :func:`_pair_scales`)), over every position, or on
    a position ``grid`` (sums over positions as the grid's quadratures,
    sigprop.model.positions; then C, ``kw``, ``kap`` and ``vw`` over the grid's nodes)."""
    pos = _positions(len(C), grid)
    # the query path's deviation factor per row, where the weights came from the sampled logit
    # law (sigprop.model.logit_law): its variance times qf_i, its covariance of two rows times
    # sqrt(qf_i qf_i')
    qf = getattr(kw, "query", None)
    Co = _offdiag(C)
    Mk = Co * pos.key_pair_weights()
    K = pos.UtXU(Co)
    dK, dM = np.diag(K).copy(), pos.UtXU_diag(Mk)
    d = np.diag(C).copy()
    if kw is None:
        diag, a = _diag_terms(r, d, pos)
    else:
        a = _pair_terms(r, d, pos.n)
        # (on a grid, the diagonal of U^T (Co + Mk) U as the sum of the two kernels' diagonals)
        f, rho, wsum = _weighted(r, C, kw, grid, None if grid is None else (Co, Mk, dK + dM))
        local = np.asarray(r["local"], float)
        diag = wsum + d * (local if qf is None else local * qf)
    kf_diag, kf_off, kk_diag = pos.flat_kernel_means
    # pair-of-rows variance: the value path's uniform-weight part as U^T C' U, its softmax part
    # and the key path's with the pair weights M (_pair_scales), normalised to the rule's flat
    # value.  (Co's diagonal is never read: the kernels take the pairs of distinct positions
    # only, and the output's diagonal is set below)
    if vw is None:
        kv, kk = _pair_scales(r, kf_diag, kk_diag)
        pairs = kv * dK + kk * dM
        K *= float(r["cross_c"]) / kf_off
    else:
        w_flat, m_flat, kk_off = _pair_flat_means(vw, pos)
        Kk = pos.UtXU(Co * vw[1])
        pairs = pair_rows.pair_terms(r, dK, kf_diag, pos.UtXU_diag(Co * vw[0]), w_flat,
                                     np.diag(Kk).copy(), m_flat)
        K = pair_rows.pair_cov_kernel(r, K, kf_off, Kk, kk_off, pos.L)
    Co *= float(r["qry_c"])
    if kap is not None:
        Co *= kap
    if qf is not None:
        Co *= np.sqrt(np.outer(qf, qf))
    out = _one_row_off(r, a, d, kap, pos.UtDU, pos.n)
    if kw is not None:
        pairs = pairs * rho * rho
        K *= np.outer(rho, rho)
        out *= np.sqrt(np.outer(f, f))
    out += K
    out += Co
    set_diag(out, diag + pairs)
    return out


def _flat_stats(r: dict, pos, rg: float, kap=None) -> tuple[float, float]:
    """(diagonal mean, off-diagonal mean) of :func:`_attention_cov` for the flat covariance
    (diagonal 1, off-diagonal rg), in O(L) (O(L^2) with rotary positions' ``kap``), over the
    positions or nodes of ``pos`` (an ExactPositions or a grid): the kernels of a flat
    covariance are the memoised flat ones times rg."""
    d = np.ones(pos.size)
    diag, a = _diag_terms(r, d, pos)
    qry = float(r["qry_c"]) * (1.0 if kap is None else pos.mean_off(kap))
    return (pos.mean(diag) + rg * float(r["cross"]),
            (pos.UtDU_offmean(a) if kap is None else pos.mean_off(_one_row_off(r, a, d, kap, pos.UtDU, pos.n)))
            + rg * (float(r["cross_c"]) + qry))


def mean_off(C: np.ndarray, grid=None) -> float:
    """Mean of the off-diagonal entries of a square matrix (of the pairs of distinct
    positions, on a position ``grid``)."""
    if grid is not None:
        return grid.mean_off(C)
    L = len(C)
    return float((C.sum() - np.trace(C)) / (L * (L - 1)))


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 and np.isfinite(a / b) else 1.0


def key_logit_scales(S: np.ndarray, r: float, grid=None, pre=None) -> tuple[np.ndarray, np.ndarray]:
    """(rel, counts) for :func:`sigprop.rules.attention.key_weights`: per causal row i (a
    position, or a node of ``grid``) and key j, the variance of key j's token-varying logit
    in row i relative to the row logit variance, rel_ij = 1 + (mu_i - 2 m_ij) / (1 - r), for a
    stream of mean token correlation r and deviation S (zero diagonal): m_ij the mean of
    S_jk over the row's keys k != j, mu_i the mean of S over the row's pairs of keys; and how
    many keys each entry stands for (1 on and below the diagonal, 0 above; on a grid, row i's
    quadrature weights over the nodes for the sum over its keys 0..x_i, whose stencils may
    reach nodes above x_i: there rel is held at its value at x_i; the grid's own read-only
    array; ``pre``: its prefix sums of S, NodeGrid.prefix_sums, where the caller has them).
    Row 0 (one key) is 1."""
    one_minus_r = max(1.0 - float(r), 1e-12)
    if grid is None:
        L = len(S)
        n = np.arange(1.0, L + 1)
        P = np.cumsum(S, axis=1)                  # P[j, i] = sum_{k <= i} S_jk (S_jj = 0)
        counts = np.tril(np.ones((L, L)))
        m = P.T / np.maximum(n - 1.0, 1.0)[:, None]          # m[i, j], valid for j <= i
        mu = (m * counts).sum(axis=1) / n
    else:
        n = grid.n
        nb = grid.size
        low = grid.lower
        # P[j, l] = sum_{k <= x_l, k != x_j} S_jk: the kinked prefix sums (the j = k term is
        # taken at row j's diagonal limit D_j where x_j <= x_l: removed again)
        P, D = grid.prefix_sums(S) if pre is None else pre
        # (row i of m is column i of P; above the diagonal, j > i, m is replaced below, so
        # D is subtracted everywhere)
        m = P.T - D[None, :]
        m /= np.maximum(n - 1.0, 1.0)[:, None]
        m = np.where(low, m, np.diagonal(m)[:, None])       # held at x_i beyond the diagonal
        counts = grid.Pf
        mu = np.einsum("ij,ij->i", counts, m) / n
    rel = 1.0 + (mu[:, None] - 2.0 * m) / one_minus_r
    rel[0] = 1.0
    if grid is None:
        rel = np.where(counts > 0, rel, 1.0)
    return rel, counts


@memo.memoised(memo.Kind("profile.stored_series_coefs", 4096,
                         "the per-key weights' series coefficients per (node, row lengths), from the store"))
def _stored_series_coefs(k: int, nkey: bytes) -> np.ndarray:
    """The per-key weights' series coefficients at log-variance node k for the row lengths
    packed in ``nkey`` (sigprop.rules.attention._series_coefs_at) through the on-disk table
    store: computed once (~10 ms a node: smoothing tables by FFT and finite differences of
    the independent-row moments), then loaded, the same float64 numbers.  Memoised per
    process; read-only."""
    from sigprop.rules import attention
    rows = len(nkey) // 8
    skey = store.key("keyseries", k, nkey)
    arr = store.load(skey)
    if arr is not None and arr.size == 14 * rows:
        out = arr.reshape(2, 7, rows)
    else:
        out = np.array(attention._series_coefs_at(k, nkey))
        store.save(skey, out.ravel())
    out.flags.writeable = False
    return out


class KeyWeights(tuple):
    """The pair (w1, w2) of :func:`key_weights`, with ``offset``: the largest per-key logit
    offset v max|rel - 1| of the layer (logit-variance units;
    :func:`sigprop.rules.attention.key_weights_and_offset`), which sets how far the per-key
    weights' additive fit is from the exchangeable keys the rule takes; and ``query``: the
    query path's factor per row where the weights came from the sampled logit law
    (sigprop.model.logit_law; None otherwise)."""

    def __new__(cls, w1, w2, offset: float, query=None):
        out = super().__new__(cls, (w1, w2))
        out.offset = float(offset)
        out.query = query
        return out


def key_weights(params: dict, x: Forward, S: np.ndarray, grid=None, pre=None, stream: int = 0) -> KeyWeights:
    """The causal attention's mean and second-moment key weights (w1, w2), each (rows, keys)
    over the positions (or the nodes of ``grid``), for an attention input of mean-field state
    ``x`` whose token correlations deviate from their mean by S (see
    :func:`key_logit_scales` and :func:`sigprop.rules.attention.key_weights`); 1 everywhere
    for S = 0; with the layer's largest per-key logit offset (:class:`KeyWeights`).  Above
    logit_law.LAW_OFFSET (and at most logit_law.LAW_MAX positions) the weights, and a query
    factor per row, come from the rows' sampled logit law instead (``stream``: the layer's
    index, part of its seed); between logit_law.LAW_LO and LAW_OFFSET the law's and the
    fit's, weighted by logit_law.law_share.  ``pre``: the grid's prefix sums of S
    (NodeGrid.prefix_sums), if at hand."""
    rel, counts = key_logit_scales(S, float(x.corr), grid, pre)
    v_tok, v_common = attention_rule.key_logit_vars(params, x)
    offset = attention_rule.key_offset(v_tok, rel) if v_tok > 0 else 0.0
    query = None
    t = logit_law.law_share(offset, len(S) if grid is None else grid.L)
    if t < 1.0:
        # both weights as one (2, rows, keys) array (the series returns them so)
        w = attention_rule.key_weights_and_offset(params, x, rel, counts, _stored_series_coefs, (v_tok, v_common))[0]
    if t > 0.0:
        # keys far apart: the row's logit law in full, sampled (sigprop.model.logit_law),
        # weighted with the fit's below LAW_OFFSET (the query factor with the fit's 1)
        p = float(params.get("p", 0.0))
        law = logit_law.law_weights(S, float(x.corr), v_tok, p / (1.0 - p), grid, v_common, stream)
        if t == 1.0:
            w, query = np.asarray(law[:2]), law[2]
        else:
            w = (1.0 - t) * np.asarray(w) + t * np.asarray(law[:2])
            query = (1.0 - t) + t * law[2]
    w = np.asarray(w)
    if grid is None:
        w = np.where(counts > 0, w, 0.0)
    else:
        # beyond the diagonal (rows shorter than the key), for the grid's stencils: the
        # value at the key's own row
        w = np.where(grid.lower, w, np.diagonal(w, axis1=1, axis2=2)[:, None, :])
    return KeyWeights(w[0], w[1], offset, query)


def _weighted(r: dict, C: np.ndarray, kw, grid=None, off=None):
    """The per-key weights' factors on the attention's gradient kernels (see
    :func:`_attention_cov`): per key j, (f_j, rho_j, diag_j): f the factor on the one-row
    (value and key path) sum over the rows i >= j, rho that on the pair-of-rows sums, and the
    weighted one-row sum itself.  ``off``: on a grid, (C off the diagonal, the same times the
    key pair weights, the diagonal of U^T (their sum) U) where the caller has them."""
    w1, w2 = kw
    d = np.diag(C).copy()
    spread = np.asarray(r["spread"], float)
    Co = _offdiag(C) if off is None else off[0]
    if grid is None:
        L = len(C)
        n = np.arange(1.0, L + 1)
        y = d * spread / n
        plain = suffix(y, 0)
        wsum = (w2 * y[:, None]).sum(axis=0)
        A = w1 / n[:, None]
        U = np.tril(np.ones((L, L))) / n[:, None]
        X = Co * (1.0 + _key_pair_weights(L))
        pw = np.einsum("ij,ik,kj->j", A, X, A)
        pu = np.einsum("ij,ik,kj->j", U, X, U)
    else:
        y = d * spread
        plain = grid.suffix_h(y)
        wsum = np.einsum("jl,lj->j", grid.Sh, w2 * y[:, None])
        Mk = Co * grid.key_pair_weights() if off is None else off[1]
        X = Co + Mk
        pu = grid.UtXU_diag(X) if off is None else off[2]
        pw = grid.UtXU_diag_weighted(X, w1)
    # (a key no pair of rows attends to, the last one, has pu = 0 up to rounding: factor 1)
    ok_f = np.abs(plain) > 1e-12 * np.max(np.abs(plain), initial=0.0)
    ok_p = np.abs(pu) > 1e-12 * np.max(np.abs(pu), initial=0.0)
    f = np.where(ok_f, wsum / np.where(ok_f, plain, 1.0), 1.0)
    rho2 = np.where(ok_p, pw / np.where(ok_p, pu, 1.0), 1.0)
    return f, np.sqrt(np.clip(rho2, 0.0, 1e4)), wsum


def attention_backward(params: dict, x: Forward, g: Backward, C: np.ndarray,
                       table=None, grid=None, var_range=None, kw=None) -> tuple[float, float, np.ndarray]:
    """(variance and covariance factors over the flat-profile rule values, normalised
    covariance at the attention input) for an upstream gradient covariance over positions C
    (mean diagonal 1; attention parameters and input state; g: the gradient state reaching
    the attention op, whose correlation defines the flat reference).  ``kw``: the per-key
    weights (w1, w2) of :func:`key_weights` (None: exchangeable keys), which weight the one-row
    and pair-of-rows sums over the rows attending to each key; the flat reference keeps
    exchangeable keys, so the factors carry what the weights change."""
    kap = _offset_kernel(params, grid, len(C) if grid is None else None)
    pos = _positions(len(C), grid)
    r = rows(params, x, table, grid, var_range)
    vw = pair_rows.pair_weights(params, x, pos.n) if params.get("causal") else None
    o = _attention_cov(r, C, kw, kap, vw, grid)
    t = pos.mean_diag(o)
    t1, off1 = _flat_stats(r, pos, float(g.corr), kap)
    if not (t > 0 and t1 > 0):
        return 1.0, 1.0, C
    return float(t / t1), _ratio(pos.mean_off(o), off1), o / t


def positionwise(C: np.ndarray, var_gain: float, cov_gain: float) -> np.ndarray:
    """A position-wise map (same weights at every position): the diagonal scales by the
    variance gain, the off-diagonal by the covariance gain (returned relative to the former;
    ``C`` itself where the two gains are equal: the caller does not change it in place)."""
    if not var_gain > 0 or cov_gain == var_gain:
        return C
    out = C * (cov_gain / var_gain)
    set_diag(out, C.diagonal())
    return out


def layernorm_input(v1: np.ndarray, tok1: tuple, v2: np.ndarray, tok2: tuple, d: int,
                    grid=None) -> np.ndarray:
    """Per-position gain profile of a LayerNorm whose input is the sum of two independent
    signals with per-position variance contributions v1, v2 (arrays over positions, any common
    unit) and per-token statistics tok1, tok2 = (centred, kappa): the LayerNorm divides the
    gradient at position t by E[1/s_t^2]^-1 = harmonic_token_var at that position's own
    variance *and* per-token statistics (combine_token_stats with that position's weights),
    returned relative to the rule's value at the mean weights, for :func:`layernorm_backward`.

    Why per position: a causal attention row 0 copies its own value (branch variance
    gv v_x at every depth) while long rows average n values (~ gv (r + (1-r)/n)), so in the
    first layers of a Post-LN stack (r 0.2-0.8) position 0's branch share is up to ~4x the
    mean; its per-token variance then disperses more (kappa: the cross term 2 a b x.F/d) and
    is less centred (c), an O(1/d) raise of E[1/s_0^2] beyond 1/E[s_0^2] (+0.7..1.4e-3 in
    layers 2-20 of Post-LN torch-default, d 256) -- and the gradient of a deep causal stack
    sits almost entirely at the first positions.  The mean-only statistics gave the positions
    the mean's dispersion and centring (MC, 96 layers, per-token dispersion at the gradient's
    positions, attention layers 1-24 / 25-48: +0.74 / +0.32 e-3 above that, SE 0.08).

    Approximations: first order in delta (as the rule); the branch output Gaussian per token
    (centred 0, kappa 1) as in the mean-field mixing; eps neglected against the variance
    (a ratio of two values each ~1e-5 off)."""
    mean = np.mean if grid is None else grid.mean
    v = v1 + v2
    if not np.all(v > 0):
        return v / mean(v) if mean(v) > 0 else np.ones_like(v)
    c, k = combine_token_stats(v1, tok1[0], tok1[1], v2, tok2[0], tok2[1])
    c0, k0 = combine_token_stats(float(mean(v1)), tok1[0], tok1[1], float(mean(v2)), tok2[0], tok2[1])
    return harmonic_token_var(v, d, c, k) / harmonic_token_var(float(mean(v)), d, c0, k0)


def branch_norm_eps(q: np.ndarray, eps_rel: float, jac: np.ndarray | None = None,
                    grid=None) -> tuple[float, np.ndarray, np.ndarray]:
    """A norm on a branch output (placements peri, output) whose input has the variance
    profile ``q`` over positions (mean 1) and the mean-field (harmonic) mean square Q, with
    ``eps_rel`` = eps / Q (the norm's floor in units of Q; the norm rule's output variance is
    1/(1 + eps_rel) and its gradient gain goes with 1/(Q + eps)).  Per position t the norm
    divides by sqrt(Q q_t + eps), so its output has variance o_t = q_t / (q_t + eps_rel) and its
    backward gain is 1/(Q q_t + eps): where the branch output is comparable to eps (the
    first layers of a stream that starts from a small embedding: olmo2's layer-1 attention
    output ~1e-6 against eps 1e-6) the output is not flat over positions, and a causal row
    whose output is larger (row 0 copies one value, long rows average many) keeps more of it.
    ``jac``: the branch's own backward gain per position relative to its mean-field value
    (a position-wise branch whose input profile is not flat, see
    ``Predictor._chain_log_slopes``), folded into the divisor.

    Returns (the mean output variance over the rule's value 1/(1 + eps_rel), the output
    profile o / mean(o), the per-position divisor f_t = (q_t + eps_rel) / ((1 + eps_rel) jac_t)
    for :func:`layernorm_backward`, which divides the gradient's variance at position t by f_t
    and takes the mean over positions relative to the flat profile).  eps_rel = 0 and jac = 1
    give (1, q / q = flat, q) up to rounding.  Approximations: the per-token fluctuation of
    the mean square within a position is the rule's (its harmonic mean Q at every position);
    eps/Q first order in the norm's finite-d terms, as the rule."""
    mean = np.mean if grid is None else grid.mean
    o = q / (q + eps_rel)
    mo = float(mean(o))
    f = (q + eps_rel) / (1.0 + eps_rel)
    if jac is not None:
        f = f / jac
    return mo * (1.0 + eps_rel), o / mo, f


def layernorm_backward(C: np.ndarray, f: np.ndarray, var_gain: float = 1.0,
                       cov_gain: float = 1.0, grid=None) -> tuple[float, float, np.ndarray]:
    """(variance and covariance factors over a flat profile, normalised covariance) of the gradient through a LayerNorm whose input
    has variance profile f: position i is divided by its standard deviation."""
    s = 1 / np.sqrt(f)
    ref_off = (cov_gain / var_gain if var_gain > 0 else 1.0) * mean_off(C, grid)
    u = C * s[:, None]
    u *= s[None, :]
    if var_gain > 0:
        d = u.diagonal().copy()
        u *= cov_gain / var_gain
        set_diag(u, d)
    k = float(np.trace(u) / len(u)) if grid is None else grid.mean_diag(u)
    m = mean_off(u, grid)
    u /= k
    return k, _ratio(m, ref_off), u


# -- forward: the stream's token correlation over positions ---------------------------------
#
# The mean-field state carries one token correlation, the mean over pairs of positions.  In a
# causal model the pairs differ: row i of the attention averages the values of keys 0..i, so
# the first positions mix with few others (row 0 copies its own value) and, over layers, stay
# less correlated with the rest (at 96 Post-LN layers position 0 correlates ~0.5 with the last
# positions where the mean is ~0.8).  The next layer's causal attention weights exactly those
# positions most (row i gives each of its keys 1/n_i), and a LayerNorm divides every position
# by its own standard deviation, so the mean correlation of the outputs is not the map of the
# mean correlation: the mean-field equilibrium of a deep causal Post-LN stack came out ~0.025
# above the Monte Carlo's.  Beside the mean-field state the predictor therefore carries the
# deviation S of the stream's normalised covariance from its mean (off the diagonal; the
# diagonal is the variance profile above), and corrects the mean-field mean by what S and the
# profile add:
#
# * attention, value path with uniform causal weights U (U_ij = 1/n_i, j <= i): the output
#   covariance gets g U S U^T (g = d v_std^2 H d_head o_std^2 times the input variance, the
#   value path's gain per unit input covariance; its diagonal also goes through the hidden
#   dropout), and the flat input's own structure off the diagonal,
#   g (1 - r) (U U^T - its off-diagonal mean), (U U^T)_ik = 1/n_max(i,k) (two rows share the
#   shorter row's keys); the level (the mean) is the rule's;
# * position-wise branches (FFN): to first order in S, F(r + S_ij) = F(r) + F'(r) S_ij with F
#   the chain's output covariance as a function of its input correlation;
# * a LayerNorm: K_ij / sqrt(K_ii K_jj) per pair, against mean-off(K) / mean-diag(K) in the
#   mean-field rule; the difference of the means is added to the rule's correlation.
#
# Assumptions: attention weights uniform over the row's keys for the deviation (the softmax's
# fluctuations enter only through the rule's mean and profile), F linear over the spread of the
# pair correlations, widths large for the deviation (the rules' finite-d factors act on the
# mean only).


def UXUt(X: np.ndarray) -> np.ndarray:
    """U X U^T for the uniform causal attention matrix U, in O(L^2) (prefix sums)."""
    n = np.arange(1.0, len(X) + 1)
    c = cumsum_inplace(X.copy(), 0)
    c /= n[:, None]
    np.cumsum(c, axis=1, out=c)
    c /= n[None, :]
    return c


def _inv_nmax(L: int) -> tuple[np.ndarray, float]:
    """(U U^T with a zero diagonal, its off-diagonal mean): (U U^T)_ik = 1/n_max(i,k)
    (ExactPositions.inv_nmax, read-only)."""
    ex = exact_positions(L)
    return ex.inv_nmax, ex.inv_nmax_mean


def attention_deviation(S: np.ndarray, r: float, g: float, keep: float, grid=None, pre=None) -> np.ndarray:
    """Deviation of the attention branch's output covariance over positions from the flat
    mean-field one (absolute units): input correlation r + S (S zero-mean off the diagonal,
    zero diagonal, unit input variance profile), value gain g, hidden-dropout keep
    probability ``keep`` (applies to the diagonal).  ``pre``: the ``grid``'s prefix sums of S
    (NodeGrid.prefix_sums), where the caller has them."""
    if grid is None:
        M, m = _inv_nmax(len(S))
        D = g * UXUt(S)
    else:
        M = grid.inv_nmax()
        m = grid.mean_off(M)
        D = g * (grid.UXUt(S) if pre is None else grid.UXUt(S, pre))
    diag = D.diagonal() / keep
    D += g * (1.0 - r) * (M - m)
    set_diag(D, diag)
    return D


def normalise(K: np.ndarray) -> np.ndarray:
    """Correlation matrix of a covariance matrix (per position, divided by its std)."""
    s = 1.0 / np.sqrt(K.diagonal())
    out = K * s[:, None]
    out *= s[None, :]
    return out


def deviation(K: np.ndarray, grid=None, inplace: bool = False) -> tuple[float, np.ndarray]:
    """(off-diagonal mean, off-diagonal deviation with a zero diagonal) of a matrix;
    ``inplace``: the deviation written over K (which the caller no longer needs)."""
    c = mean_off(K, grid)
    if inplace:
        K -= c
        S = K
    else:
        S = K - c
    set_diag(S, 0.0)
    return c, S


def normalised_deviation(K: np.ndarray, grid=None) -> tuple[float, np.ndarray]:
    """``deviation(normalise(K), grid)``, the same numbers with one matrix fewer: the
    correlation matrix's off-diagonal mean and its deviation from it (zero diagonal)."""
    return deviation(normalise(K), grid, inplace=True)
