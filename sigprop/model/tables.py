"""Interpolation tables for the costly quantities of the layer-by-layer prediction and of the
solver.

In a transformer the branch input of a sublayer is (n times) a LayerNorm output: its mean and
variance are the same at every layer up to O(eps / var), and only its token correlation drifts
from layer to layer.  So a quantity that depends on the branch input (a whole branch chain's
forward and backward map, the attention rule's per-row statistics, a solver branch's output
moments) is evaluated once, vectorised, on Chebyshev-Lobatto nodes and interpolated.  Every
table is an :class:`InterpTable`, which holds the one implementation of

* the abscissae: a variable of the correlation that makes the rules' square-root behaviour
  at corr = 1 smooth (the arc-cosine kernels of ReLU and GeLU, the attention logit variance
  ~ 1 - corr), :data:`VARIABLES`: theta = arccos(corr) over [TH_MIN, arccos(lo)] (the
  predictor's tables) or t = sqrt(1 - corr) (the solver's, sigprop.solve.blocks); and, for
  tables over the input variance too, u = log var over [log v_lo, log v_hi];
* the interpolant: the Chebyshev series through the Lobatto nodes of each axis (one or two
  axes, a product grid), evaluated as coefficients times cos(j phi);
* the build: node grids tried in order (the first whose interpolant passes wins), or nested
  grids (n -> 2n - 1 nodes, each refinement checked at the nodes it adds, every evaluation
  reused);
* the acceptance policy, :func:`verify`: at check points between the nodes every entry's
  interpolation error must be below the tolerance of the table's accuracy class
  (:data:`TOLERANCES`) of max(|direct value|, the entry's floor), where the floor is what a
  table's consumer can neglect (a chain table: 1e-6 of its row's largest value, since
  covariances cross 0; a statistics or solver table: its quantity's largest value);
* the on-disk store (sigprop.model.store): one entry layout, and loading re-applies the
  build's own acceptance test to the stored numbers.

The subclasses only say what is tabulated: :class:`Table` (a chain over theta at one
variance, plus a first-order Taylor term in the variance), :class:`VarTable` (a chain over
theta and u), :class:`ThetaTable` (any vector function of theta; the causal position profile's
``profile.RowsTable`` and ``profile.RowsVarTable`` are subclasses too), and the solver's
``sigprop.solve.blocks.BranchTable`` (a branch's output moments over t).  For a chain the
backward map is linear in the gradient's second moments, var_out = g2 (A + B rg) and cov_out =
g2 (C + D rg), so A..D are tabulated like the forward rows, and that linearity is checked when
the table is built.

:class:`TableCache` holds one prediction's tables and its memoised direct evaluations; a new
one is made per prediction, so nothing a prediction looked up can serve another.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop import memo, progress
from sigprop.errors import DomainError
from sigprop.model import store
from sigprop.rules import get
from sigprop.state import Backward, Forward

#: The verification policy: every table class declares an accuracy class by name
#: (``InterpTable.ACCURACY``), and :func:`verify`, the only acceptance rule, holds each entry of
#: its interpolant at the check points to the class's tolerance relative to max(|direct value|,
#: the entry's floor).  A table that fails is not used: its quantity is evaluated directly.
#: Each tolerance, what the tabulated quantity feeds, and why it is far below what a Monte
#: Carlo check resolves (``check``'s default tolerance is 5% on variances, 0.03 on
#: correlations):
TOLERANCES = {
    # a branch chain's forward and backward rows: the table *is* the sublayer's mean-field map
    # in predict/check/solve-init's verification, compounded over up to thousands of layers.
    # The attention rule's own quadrature error is ~1e-6..1e-5 relative at small logit
    # variances (second differences in r measured at 1e-5), so the table is held to the same
    # order; where the rule is rougher (large logit variances) the table fails and the chain is
    # evaluated directly.  3e-5 per sublayer is 3 orders below the Monte Carlo's 5%.
    "chain": 3e-5,
    # attention statistics (the causal position profile's per-row terms, the Post-LN
    # gradient shares' row moments): they enter the prediction as corrections of a few per
    # cent, so 1e-4 of them moves a prediction by ~1e-6, far below the Monte Carlo's
    # resolution; their builds cost ~0.25 s per node at L 256, so a tighter tolerance would
    # add nodes and slow causal predictions for no visible change.
    "statistics": 1e-4,
    # the solver's branch rows (output variance and covariance as functions of the input
    # correlation): solve-init turns them into weight stds in closed form, so 1e-7 keeps the
    # solved stds within ~1e-7 of a rule-by-rule solve, below the solver's own refinement
    # target (1e-5 on the predicted variance) and 5 orders below the Monte Carlo's; each
    # build is one vectorised evaluation of the branch's rules, cheap enough to afford it.
    "solver": 1e-7,
}
#: the tolerances of the chain and statistics classes by value (part of the store keys)
TOL = TOLERANCES["chain"]
STATS_TOL = TOLERANCES["statistics"]
#: the chain floor: covariances cross 0, so an entry's error is taken relative to at least
#: this fraction of its row's largest value over the nodes
CHAIN_FLOOR = 1e-6
VAR_WINDOW = 1e-3
#: a table is built for a (chain, mean) key at its BUILD_AFTER-th request: parameters used
#: by only a few sublayers (per-layer init scales) are evaluated directly
BUILD_AFTER = 3
#: the table stops short of corr = 1 (identical tokens), where rules take degenerate limits
#: (the attention rule's tau -> 0 floor is not continuous there); corr above cos(TH_MIN)
#: = 1 - 5e-9 is evaluated directly
TH_MIN = 1e-4
R_MAX = math.cos(TH_MIN)
#: node counts a Table tries, in order (the first whose interpolant passes verification)
NODES = (17, 33, 65)
#: the tabulated rows of a chain (:func:`_rows`)
ROWS = ("mean", "var", "cov", "A", "B", "C", "D")
#: the most tables one key gets: each covers a range of correlations at one mean and variance
#: window, so a stream that wanders gets a few, and then is evaluated directly
PER_KEY = 4


#: building a table costs tens of evaluations of its chain (17 nodes and 16 midpoints; 33 and
#: 32 more where that fails, and 33 for the variance derivative), against one per sublayer
#: evaluated directly, and the attention rule's cost grows with the row logit variance (its
#: quadrature grids widen with the logit scale).  Where the mean row logit variance exceeds
#: COSTLY_LOGIT_VAR somewhere in the table's correlation range, builds also fail their first
#: node count (docs/benchmarks.md, "Constants chosen by measurement"), so such a chain is
#: tabulated only where at
#: least COSTLY_USES sublayers share it; ordinary inits (logit variance ~0.1-1) from
#: BUILD_AFTER uses (:func:`worth_tabulating`).
COSTLY_LOGIT_VAR = 2.0
COSTLY_USES = 96


#: how many states a per-prediction memo of a causal model's per-row terms keeps (a layer's
#: forward and backward ask for the same state, the backward after the whole forward pass;
#: ~3 KB an entry at 66 nodes)
MEMO_SIZE = 4096


def table_logit_var(ops, x: Forward) -> float:
    """The largest mean row logit variance an attention op of chain ``ops`` meets over a table
    at input ``x``'s mean and variance (its correlation range starts at min(0, corr); the
    variance falls as the correlation rises); 0 for chains without attention."""
    if all(name != "attention" for name, _ in ops):
        return 0.0
    x = Forward(float(x.mean), float(x.var), min(0.0, float(x.corr)))
    for name, params in ops:
        if name == "attention":
            from sigprop.rules.attention import mean_row_logit_var

            return mean_row_logit_var(params, x)
        try:
            y, _ = get(name).evaluate(Forward(np.array([x.mean]), np.array([x.var]), np.array([x.corr])), None, **params)
        except DomainError:
            return math.inf
        x = Forward(float(y.mean[0]), float(y.var[0]), float(y.corr[0]))
    return 0.0


def worth_tabulating(ops, x: Forward, uses: int) -> bool:
    """Whether chain ``ops`` at input ``x``, shared by ``uses`` sublayers, gets a table: at
    least BUILD_AFTER uses, and COSTLY_USES where its attention is costly to evaluate (see
    COSTLY_LOGIT_VAR).  A function of the model alone, never of the store."""
    if uses < BUILD_AFTER:
        return False
    return uses >= COSTLY_USES or table_logit_var(ops, x) <= COSTLY_LOGIT_VAR


# -- Chebyshev-Lobatto interpolation ------------------------------------------------------

def _cheb(n: int, lo: float, hi: float) -> np.ndarray:
    """n Chebyshev-Lobatto nodes over [lo, hi], ascending."""
    k = np.arange(n)
    return lo + (hi - lo) * (1 - np.cos(np.pi * k / (n - 1))) / 2


def _END_HALF(n: int) -> np.ndarray:
    """Halved first and last Chebyshev coefficients (Lobatto interpolation)."""
    f = np.ones(n)
    f[0] = f[-1] = 0.5
    return f


def _cheb_basis(n: int) -> np.ndarray:
    """T_j(s_k) at the Lobatto nodes s_k = cos(phi_k), phi_k = pi (n-1-k)/(n-1) (node k of
    :func:`_cheb`), rows j, end columns halved: the discrete Chebyshev transform."""
    k = np.arange(n)
    phi = np.pi * (n - 1 - k) / (n - 1)
    basis = np.cos(np.outer(k, phi))
    basis[:, 0] *= 0.5
    basis[:, -1] *= 0.5
    return basis


def _cheb_coef(vals: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients (last axis) of the interpolant through values at the nodes."""
    n = basis.shape[0]
    return (2.0 / (n - 1)) * (vals @ basis.T) * _END_HALF(n)


def _cheb_at(j: np.ndarray, x: float, x0: float, span: float) -> np.ndarray:
    """T_j(s) for s = 2 (x - x0)/span - 1 (clipped into [-1, 1])."""
    s = 2.0 * (x - x0) / span - 1.0
    return np.cos(j * math.acos(1.0 if s > 1.0 else -1.0 if s < -1.0 else s))


def _theta(corr: float) -> float:
    """theta = arccos(corr), corr clipped into [-1, 1]."""
    return math.acos(1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr)


def _root(corr: float) -> float:
    """t = sqrt(1 - corr), corr clipped into [0, 1]."""
    return math.sqrt(1.0 - corr if corr < 1.0 else 0.0) if corr >= 0.0 else 1.0


def _corr_of_root(t: np.ndarray) -> np.ndarray:
    return np.clip(1 - t * t, 0.0, 1.0)


#: the variables a table's first axis can take for the input correlation r, as (x of a float
#: r, r of an array of x): both are smooth where the rules have square-root behaviour at r = 1
#: (the arc-cosine kernels' sqrt(1 - r^2), the attention logit variance ~ 1 - r)
VARIABLES = {
    "arccos": (_theta, np.cos),                   # theta = arccos r: the predictor's tables
    "sqrt(1-r)": (_root, _corr_of_root),          # t = sqrt(1 - r), r in [0, 1]: the solver's
}


def tolerance(accuracy) -> float:
    """The tolerance of accuracy class ``accuracy``: a name of :data:`TOLERANCES`, or (for
    tables that state it as a number) one of its tolerance values; anything else is an error."""
    if isinstance(accuracy, str):
        try:
            return TOLERANCES[accuracy]
        except KeyError:
            raise ValueError(f"unknown accuracy class {accuracy!r}; known: {', '.join(TOLERANCES)}") from None
    for tol in TOLERANCES.values():
        if accuracy == tol:
            return tol
    raise ValueError(f"tolerance {accuracy!r} is not that of an accuracy class ({TOLERANCES})")


def verify(approx: np.ndarray, direct: np.ndarray, floor, accuracy) -> bool:
    """The acceptance policy of every table: finite values, and every entry's interpolation
    error ``approx - direct`` below the tolerance of accuracy class ``accuracy``
    (:func:`tolerance`) of max(|direct|, floor); ``floor`` is a scalar or one value per
    tabulated entry (the first axis)."""
    tol = tolerance(accuracy)
    if not (np.all(np.isfinite(approx)) and np.all(np.isfinite(direct))):
        return False
    floor = np.asarray(floor, dtype=float)
    if floor.ndim:
        floor = floor.reshape(floor.shape + (1,) * (direct.ndim - floor.ndim))
    scale = np.maximum(np.maximum(np.abs(direct), floor), 1e-300)
    return float(np.max(np.abs(approx - direct) / scale)) < tol


#: which points between the nodes an axis is checked at: all midpoints, the two nearest the
#: ends, or those and the middle one; "lobatto": the nodes that the Lobatto grid of 2n - 1
#: nodes adds (the midpoints in the Chebyshev angle; the check of a nested build)
_CHECKS = {
    "all": lambda x, ax: (x[1:] + x[:-1]) / 2,
    "ends": lambda x, ax: np.array([(x[0] + x[1]) / 2, (x[-2] + x[-1]) / 2]),
    "ends+middle": lambda x, ax: np.array([(x[0] + x[1]) / 2, (x[len(x) // 2 - 1] + x[len(x) // 2]) / 2,
                                           (x[-2] + x[-1]) / 2]),
    "lobatto": lambda x, ax: _cheb(2 * len(x) - 1, ax[0], ax[1])[1::2],
}


class InterpTable:
    """A vector of ``k`` quantities tabulated on a product grid of Chebyshev-Lobatto nodes
    over one or two axes and interpolated by its Chebyshev series (see the module docstring).

    A subclass sets ``ACCURACY`` (its accuracy class, a name of :data:`TOLERANCES`),
    ``GRIDS`` (node counts per axis, tried in order), ``CHECKS`` (per axis, a key of
    ``_CHECKS``), ``VARIABLE`` (the first axis's correlation variable, a key of
    :data:`VARIABLES`; :meth:`x_of` and :meth:`corr_of` convert), ``NESTED`` (see below),
    ``LABEL`` (the progress line) and ``DOMAIN_FAILS`` (a DomainError during the build means
    "no table", else it propagates to the caller), and defines :meth:`_compute` (the
    quantities on a product grid, shape (k, n_1[, n_2])), :meth:`_floor` (the verification
    floor) and optionally :meth:`_checked` (a test of the accepted interpolant beyond
    :func:`verify`).  The constructor takes the axes as (lo, hi[, span]) pairs: nodes over
    [lo, hi], evaluated with s = 2 (x - lo)/span - 1 (span: hi - lo as the nodes give it
    unless stated).

    ``NESTED`` (one axis, ``CHECKS`` "lobatto", GRIDS n, 2n - 1, 4n - 3, ..): each grid is the
    previous grid and its check points, so a refinement evaluates only the check points, and
    an accepted interpolant is refitted through the nodes and the check points together (the
    2n - 1 node interpolant: it reproduces every evaluated point, and for a function the n
    nodes already resolve, its error is smaller than the one that passed).

    Store entry: [ndim, n_1..n_ndim, k, n_extra, node values (k x n_1 x ..), direct values at
    the check points, n_extra blocks of k x n_1 x .. further node values], or [0, 0, 0] for a
    build that failed (then the quantities are evaluated directly)."""

    GRIDS: tuple = ()
    CHECKS: tuple = ()
    LABEL = "sigprop: building an interpolation table"
    DOMAIN_FAILS = True
    VARIABLE = "arccos"
    NESTED = False
    #: the accuracy class (a name of :data:`TOLERANCES`): every subclass declares one
    ACCURACY: str | None = None
    #: a subclass may state its class's tolerance as a number instead (it must be one of
    #: :data:`TOLERANCES`' values)
    tol: float | None = None
    #: the number of tabulated quantities when it is known in advance (a stored entry with
    #: another count is rejected)
    k: int | None = None

    def _setup(self, axes, store_key: str | None) -> None:
        """Load the table from the store or build (and store) it."""
        self.axes = tuple(axes)
        self.ok, self.loaded, self.store_key = False, False, store_key
        self.extra: list = []
        if store_key is not None:
            arr = store.load(store_key)
            self.loaded = arr is not None and self._unpack(arr)
            if self.loaded:
                return
        self._build()
        if store_key is not None:
            self.save()

    @property
    def accuracy(self):
        """The accuracy class :func:`verify` holds this table to."""
        return self.ACCURACY if self.tol is None else self.tol

    # -- subclass hooks ---------------------------------------------------------------------
    def _compute(self, *grid: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _floor(self, vals: np.ndarray):
        raise NotImplementedError

    def _checked(self) -> bool:
        return True

    # -- the correlation variable -----------------------------------------------------------
    def x_of(self, corr: float) -> float:
        """The first axis's abscissa of input correlation ``corr``."""
        return VARIABLES[self.VARIABLE][0](float(corr))

    def corr_of(self, x: np.ndarray) -> np.ndarray:
        """The input correlations at first-axis abscissae ``x``."""
        return VARIABLES[self.VARIABLE][1](x)

    # -- grid, interpolant, verification ------------------------------------------------------
    def _nodes(self, counts) -> list[np.ndarray]:
        return [_cheb(n, ax[0], ax[1]) for n, ax in zip(counts, self.axes)]

    def _checks(self, nodes) -> list[np.ndarray]:
        return [_CHECKS[c](x, ax) for c, x, ax in zip(self.CHECKS, nodes, self.axes)]

    def _fit(self, nodes, vals: np.ndarray) -> None:
        """Set the interpolant through ``vals`` (k, n_1[, n_2]) at ``nodes``."""
        self.nodes_per_axis, self.vals = nodes, vals
        self.counts = tuple(len(x) for x in nodes)
        self._j = [np.arange(n, dtype=float) for n in self.counts]
        self._x0 = [float(x[0]) for x in nodes]
        self._span = [float(ax[2]) if len(ax) > 2 else float(x[-1] - x[0]) for ax, x in zip(self.axes, nodes)]
        self.coef = self._coef_of(vals)
        if len(nodes) == 2:
            self._flat = self.coef.reshape(-1, self.counts[1])

    def _coef_of(self, vals: np.ndarray) -> np.ndarray:
        """Chebyshev coefficients of node values on this table's grid (along the last axis
        first)."""
        if vals.ndim == 2:
            return _cheb_coef(vals, _cheb_basis(vals.shape[1]))
        c = _cheb_coef(vals, _cheb_basis(vals.shape[2]))                     # (k, n1, n2)
        c = _cheb_coef(c.transpose(0, 2, 1), _cheb_basis(vals.shape[1]))      # (k, n2, n1)
        return np.ascontiguousarray(c.transpose(0, 2, 1))                     # (k, n1, n2)

    def _basis(self, axis: int, x: float) -> np.ndarray:
        return _cheb_at(self._j[axis], x, self._x0[axis], self._span[axis])

    def interp(self, *x: float) -> np.ndarray:
        """The interpolant at abscissae ``x`` (one per axis): the k quantities."""
        if len(x) == 1:
            return self.coef @ self._basis(0, x[0])
        r = (self._flat @ self._basis(1, x[1])).reshape(-1, self.counts[0])
        return r @ self._basis(0, x[0])

    def _merged(self, vals: np.ndarray, direct: np.ndarray) -> np.ndarray:
        """A nested build's values on the next grid: the nodes' and the check points'."""
        out = np.empty((vals.shape[0], vals.shape[1] + direct.shape[1]))
        out[:, 0::2], out[:, 1::2] = vals, direct
        return out

    def _accept(self, nodes, vals: np.ndarray, direct: np.ndarray) -> bool:
        """The build's acceptance test (sets the interpolant): :func:`verify` at the check
        points between the nodes, to the table's accuracy class."""
        if self.k is not None and vals.shape[0] != self.k:
            return False
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(direct))):
            return False
        self._fit(nodes, vals)
        self.grid_counts, self.grid_vals = self.counts, vals       # what the store keeps
        checks = self._checks(nodes)
        if len(checks) == 1:
            approx = np.stack([self.interp(t) for t in checks[0]], axis=1)
        else:
            approx = np.array([[self.interp(t, w) for w in checks[1]] for t in checks[0]]).transpose(2, 0, 1)
        if not verify(approx, direct, self._floor(vals), self.accuracy):
            return False
        if self.NESTED:
            self._fit(self._nodes((2 * self.counts[0] - 1,)), self._merged(vals, direct))
        return True

    def _build(self) -> None:
        with progress.task(self.LABEL, total=len(self.GRIDS)) as bar:
            known = None        # a nested build's values on the next grid
            for counts in self.GRIDS:
                nodes = self._nodes(counts)
                try:
                    vals = known if known is not None and known.shape[1:] == counts else self._compute(*nodes)
                    direct = self._compute(*self._checks(nodes))
                except DomainError:
                    if not self.DOMAIN_FAILS:
                        raise
                    # part of the table's range lies outside a rule's domain (e.g. the attention
                    # rule's logit-variance range at low correlations): no table, the caller
                    # evaluates at the states it actually meets
                    return
                bar.advance()
                if self._accept(nodes, vals, direct):
                    self.direct = direct
                    self.ok = self._checked()
                    return
                if self.NESTED:
                    known = self._merged(vals, direct)

    # -- the on-disk store (sigprop.model.store) ----------------------------------------------
    def save(self) -> None:
        if not self.ok:
            store.save(self.store_key, np.zeros(3))
            return
        vals = self.grid_vals
        head = [len(self.grid_counts), *self.grid_counts, vals.shape[0], len(self.extra)]
        store.save(self.store_key, np.concatenate([np.asarray(head, dtype=float), vals.ravel(),
                                                   self.direct.ravel(), *(e.ravel() for e in self.extra)]))

    def _unpack(self, arr: np.ndarray) -> bool:
        """Take a stored entry if it has this table's layout and passes the build's own
        acceptance test (a stored failure loads as "evaluate directly")."""
        if arr.size == 3 and not np.any(arr):
            self.ok = False
            return True
        nd = len(self.GRIDS[0])
        if arr.size < nd + 3 or arr[0] != nd:
            return False
        counts = tuple(int(c) for c in arr[1:1 + nd])
        if counts not in self.GRIDS or tuple(arr[1:1 + nd]) != counts:
            return False
        k, n_extra = arr[1 + nd], arr[2 + nd]
        if k != int(k) or k < 1 or n_extra not in (0, 1, 2):
            return False
        k, n_extra = int(k), int(n_extra)
        nodes = self._nodes(counts)
        checks = self._checks(nodes)
        nv, nc = k * math.prod(counts), k * math.prod(len(c) for c in checks)
        p = nd + 3
        if arr.size != p + nv + nc + n_extra * nv:
            return False
        vals = arr[p:p + nv].reshape(k, *counts)
        direct = arr[p + nv:p + nv + nc].reshape(k, *(len(c) for c in checks))
        if not self._accept(nodes, vals, direct):
            return False
        self.direct, self.ok = direct, True
        self.extra = [arr[p + nv + nc + i * nv:p + nv + nc + (i + 1) * nv].reshape(k, *counts)
                      for i in range(n_extra)]
        return True


# -- chains -------------------------------------------------------------------------------

class Chain:
    """A sequence of rule applications (a sublayer's branch) evaluated as one rule: forward
    through every op, backward through them in reverse with the recorded forward states."""

    def __init__(self, ops):
        self.ops = [(get(name), params) for name, params in ops]

    def evaluate(self, x: Forward, g: Backward | None = None):
        states = []
        for rule, params in self.ops:
            states.append(x)
            x, _ = rule.evaluate(x, None, **params)
        if g is None:
            return x, None
        for (rule, params), xin in zip(reversed(self.ops), reversed(states)):
            _, g = rule.evaluate(xin, g, **params)
        return x, g


def _rows(rule, params: dict, x: Forward) -> np.ndarray:
    """The tabulated rows at input states ``x`` (arrays): mean, var, cov | A, B, C, D of the
    backward map, which is linear in the gradient's moments: var_out = g2 (A + B rg),
    cov_out = g2 (C + D rg)."""
    ones, zeros = np.ones_like(x.corr), np.zeros_like(x.corr)
    y, g0 = rule.evaluate(x, Backward(ones, zeros), **params)
    _, g1 = rule.evaluate(x, Backward(ones, ones), **params)
    A, C = g0.var, g0.var * g0.corr
    return np.stack([y.mean, y.var, y.var * y.corr, A, g1.var - A, C, g1.var * g1.corr - C])


def _linear_ok(row, g: Backward) -> bool:
    """Linearity in the gradient: the tabulated map (``row``) applied to the gradient (2, 1/2)
    against the rule's own backward ``g`` there."""
    var = 2.0 * (row[3] + 0.5 * row[4])
    cov = 2.0 * (row[5] + 0.5 * row[6])
    return math.isclose(var, float(g.var[0]), rel_tol=1e-7) and math.isclose(
        cov, float(g.var[0] * g.corr[0]), rel_tol=1e-7, abs_tol=1e-12 * abs(var))


class _ChainTable(InterpTable):
    """What the two chain tables share: the rows (:func:`_rows`), the chain floor, the
    linearity check and the conversions of a row to states."""

    ACCURACY = "chain"
    k = len(ROWS)

    def _floor(self, vals: np.ndarray) -> np.ndarray:
        return CHAIN_FLOOR * np.max(np.abs(vals.reshape(len(vals), -1)), axis=1)

    def _linear_at(self, corr: float, var: float, row) -> bool:
        x = Forward(np.array([self.mean]), np.array([var]), np.array([corr]))
        _, g = self.rule.evaluate(x, Backward(np.array([2.0]), np.array([0.5])), **self.params)
        return _linear_ok(row, g)

    @staticmethod
    def forward_of(r) -> Forward:
        return Forward(float(r[0]), float(r[1]), float(r[2] / r[1]) if r[1] > 0 else 0.0)

    @staticmethod
    def backward_of(r, g: Backward) -> Backward:
        var = g.var * (r[3] + r[4] * g.corr)
        cov = g.var * (r[5] + r[6] * g.corr)
        return Backward(float(var), float(cov / var) if var > 0 else 0.0)

    def forward(self, x: Forward) -> Forward:
        return self.forward_of(self.row(x))

    def backward(self, x: Forward, g: Backward) -> Backward:
        return self.backward_of(self.row(x), g)


class Table(_ChainTable):
    """A chain (or rule) over theta at one input mean and variance ``var``, on 17, 33 or 65
    nodes, checked at every midpoint between nodes; within VAR_WINDOW of ``var`` a first-order
    Taylor term in the variance (its node values by a one-sided difference, built at the first
    lookup away from ``var`` and stored with the table) extends it."""

    GRIDS = tuple((n,) for n in NODES)
    CHECKS = ("all",)

    def __init__(self, rule, params: dict, mean: float, var: float, lo: float = 0.0,
                 store_key: str | None = None):
        self.rule = get(rule) if isinstance(rule, str) else rule
        self.params, self.mean, self.var, self.lo = params, mean, var, lo
        self.dvals = None
        self._setup([(TH_MIN, math.acos(lo))], store_key)
        if self.ok and self.extra:
            self._set_derivative(self.extra[0])

    @property
    def nodes(self) -> np.ndarray:
        return self.nodes_per_axis[0]

    def _compute(self, th: np.ndarray) -> np.ndarray:
        return self._values(self.corr_of(th), self.var)

    def _values(self, corr: np.ndarray, var: float) -> np.ndarray:
        """Rows (:func:`_rows`) at correlations ``corr`` and variance ``var``."""
        c = np.asarray(corr, dtype=float)
        return _rows(self.rule, self.params, Forward(np.full_like(c, self.mean), np.full_like(c, var), c))

    def _checked(self) -> bool:
        """Linearity in the gradient, at a node (exact table values there)."""
        th = float(self.nodes[len(self.nodes) // 2])
        return self._linear_at(float(self.corr_of(th)), self.var, self.interp(th))

    def _set_derivative(self, dvals: np.ndarray) -> None:
        self.dvals, self.dcoef = dvals, self._coef_of(dvals)
        self._stacked = np.vstack([self.coef, self.dcoef])
        self.extra = [dvals]

    def _derivative(self):
        """d(row)/d(var) at the nodes (one-sided difference; built on first use)."""
        h = 1e-4
        self._set_derivative((self._values(self.corr_of(self.nodes), self.var * (1 + h)) - self.vals) / (h * self.var))
        if self.store_key is not None:
            self.save()

    def covers(self, x: Forward) -> bool:
        return (self.ok and x.mean == self.mean and abs(x.var / self.var - 1) <= VAR_WINDOW
                and self.lo <= x.corr <= R_MAX)

    def row(self, x: Forward) -> list:
        """Every tabulated quantity at input ``x`` as a list of floats: mean, var, cov | A, B,
        C, D (the predictor's per-sublayer path: one matrix product for the value and its
        variance derivative together, the combination in plain floats)."""
        return self._row_at(self.x_of(x.corr), float(x.var))

    def rows_at(self, corrs, var: float, mean: float = 0.0) -> np.ndarray:
        """:meth:`row` at several input correlations ``corrs`` (one variance ``var``; the mean
        is the table's own, as in :meth:`row`) at once: an array (k, len(corrs)), column c the
        row at corrs[c] (one matrix product for all of them; the same numbers up to its
        rounding)."""
        x0, span = self._x0[0], self._span[0]
        phi = []
        for c in corrs:
            s = 2.0 * (self.x_of(c) - x0) / span - 1.0
            phi.append(math.acos(1.0 if s > 1.0 else -1.0 if s < -1.0 else s))
        basis = np.cos(np.multiply.outer(self._j[0], phi))
        var = float(var)
        if var == self.var:
            return self.coef @ basis
        if self.dvals is None:
            self._derivative()
        r = self._stacked @ basis
        k = len(r) // 2
        return r[:k] + (var - self.var) * r[k:]

    def _row_at(self, th: float, var: float) -> list:
        basis = self._basis(0, th)
        if var == self.var:
            return (self.coef @ basis).tolist()
        if self.dvals is None:
            self._derivative()
        r = (self._stacked @ basis).tolist()
        dv = var - self.var
        k = len(r) // 2
        return [r[i] + dv * r[k + i] for i in range(k)]


class VarTable(_ChainTable):
    """A chain's table over the token correlation *and* the input variance, for branches whose
    input variance changes from layer to layer (LayerNorm Scaling: the branch input is
    LN(x)/sqrt(l)): theta = arccos(corr) and u = log var over [v_lo, v_hi], on a 17 x 17 grid
    (33 x 25 if that fails), checked on the whole grid of midpoints between nodes.  Outside
    [v_lo, v_hi] (and beyond R_MAX) it does not cover the state and the chain is evaluated
    directly."""

    GRIDS = ((17, 17), (33, 25))
    CHECKS = ("all", "all")
    LABEL = "sigprop: building an interpolation table (correlation x variance)"

    def __init__(self, rule, mean: float, v_lo: float, v_hi: float, lo: float = 0.0,
                 store_key: str | None = None):
        self.rule, self.params = rule, {}
        self.mean, self.v_lo, self.v_hi, self.lo = mean, v_lo, v_hi, lo
        u0, u_span = math.log(v_lo), math.log(v_hi) - math.log(v_lo)
        self._setup([(TH_MIN, math.acos(lo)), (u0, u0 + u_span, u_span)], store_key)

    @property
    def nodes(self) -> np.ndarray:
        return self.nodes_per_axis[0]

    @property
    def u_nodes(self) -> np.ndarray:
        return self.nodes_per_axis[1]

    def _compute(self, th: np.ndarray, u: np.ndarray) -> np.ndarray:
        return self._grid_values(self.rule, th, u)

    def _grid_values(self, rule, th: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Rows of chain ``rule`` at every (theta, u) of the product grid, shape (7, len(th),
        len(u)), the forward rows in units of the input's: mean / sqrt(var), var / var,
        cov / var (the value path makes them ~ var; what is left varies slowly in u, so the
        interpolant needs far fewer nodes: measured 3e-4 against 9e-6 on a 17 x 9 vs 17 x 13
        grid)."""
        T, U = np.meshgrid(th, u, indexing="ij")
        c = self.corr_of(T).ravel()
        vals = _rows(rule, {}, Forward(np.full_like(c, self.mean), np.exp(U).ravel(), c)).reshape(7, len(th), len(u))
        w = np.exp(u)
        vals[0] /= np.sqrt(w)
        vals[1:3] /= w
        return vals

    def _checked(self) -> bool:
        """Linearity in the gradient, at a node."""
        th, u = self.nodes[len(self.nodes) // 2], self.u_nodes[len(self.u_nodes) // 2]
        return self._linear_at(float(self.corr_of(th)), math.exp(u), self.interp(th, u))

    def covers(self, x: Forward) -> bool:
        return (self.ok and x.mean == self.mean and self.v_lo <= x.var <= self.v_hi
                and self.lo <= x.corr <= R_MAX)

    def row(self, x: Forward) -> list:
        """Every tabulated quantity at input ``x`` (as :meth:`Table.row`)."""
        corr, var = float(x.corr), float(x.var)
        r = self.interp(self.x_of(corr), math.log(var)).tolist()
        return [r[0] * math.sqrt(var), r[1] * var, r[2] * var, *r[3:]]

    def rows_at(self, corrs, var: float, mean: float = 0.0) -> np.ndarray:
        """:meth:`row` at several input correlations ``corrs`` (one variance ``var``) at once,
        as :meth:`Table.rows_at`: (k, len(corrs)); the variance axis is contracted once for
        all of them."""
        var = float(var)
        basis = np.stack([self._basis(0, self.x_of(c)) for c in corrs], axis=1)
        r = (self._flat @ self._basis(1, math.log(var))).reshape(-1, self.counts[0]) @ basis
        r[0] *= math.sqrt(var)
        r[1:3] *= var
        return r


class _Prescaled:
    """A table of a chain *without* its first op, used for the whole chain: the first op (the
    norm scale n, a residual op with a = n, b = 0) is applied to the state by its rule, the
    table looked up there, and its backward coefficients multiplied by that op's backward
    variance gain (n^2; the op leaves the correlation alone)."""

    def __init__(self, table, first: tuple):
        self.table = table
        rule, params = first
        self._first = (get(rule), params)
        self._gain = float(self._first[0].fast(Forward(0.0, 1.0, 0.0), Backward(1.0, 0.0), params,
                                               need_forward=False)[1].var)

    def inner(self, x: Forward) -> Forward:
        rule, params = self._first
        return rule.fast(x, None, params)[0]

    def row(self, x: Forward) -> list:
        r = self.table.row(self.inner(x))
        k = self._gain
        return r[:3] + [v * k for v in r[3:]]

    def rows_at(self, corrs, var: float, mean: float = 0.0) -> np.ndarray | None:
        """:meth:`row` at several input correlations at once (the inner table's ``rows_at``
        at the first op's output), or None where that table has none or the first op's
        output variance depends on the correlation."""
        fn = getattr(self.table, "rows_at", None)
        inner = [self.inner(Forward(mean, var, c)) for c in corrs]
        if fn is None or any(x.var != inner[0].var or x.mean != inner[0].mean for x in inner):
            return None
        r = fn([x.corr for x in inner], inner[0].var)
        r[3:] *= self._gain
        return r

    forward_of = staticmethod(_ChainTable.forward_of)
    backward_of = staticmethod(_ChainTable.backward_of)


class ThetaTable(InterpTable):
    """A vector-valued function ``fn(theta)`` of the input correlation r = cos(theta), at one
    input mean and variance, for the predictor's per-layer attention statistics that are
    costly to evaluate (the per-row terms of a causal position profile, profile.RowsTable; the
    row statistics of Post-LN attention's gradient shares).  Built on 9 nodes (17 if that
    fails), checked at the midpoints nearest both ends to the tolerance of ``accuracy`` (an
    accuracy class, :data:`TOLERANCES`; default "statistics", or that class's tolerance as a
    number) of max(|direct value|, ``size(vals)``), ``size`` giving each entry's floor from the
    node values (default: the largest of them all).  A DomainError while building propagates
    (the predictor ends the pass there, as for the states it meets)."""

    GRIDS = ((9,), (17,))
    CHECKS = ("ends",)
    LABEL = "sigprop: building an attention statistics table"
    DOMAIN_FAILS = False
    ACCURACY = "statistics"

    def __init__(self, fn, mean: float, var: float, lo: float, store_key: str, accuracy="statistics",
                 size=None, n_values: int | None = None):
        self.fn, self.mean, self.var, self.lo = fn, mean, var, lo
        self.size, self.k = size, n_values
        tolerance(accuracy)                                  # a known class, or refused here
        if isinstance(accuracy, str):
            self.ACCURACY = accuracy
        else:
            self.tol = accuracy
        self._setup([(TH_MIN, float(np.arccos(lo)))], store_key)

    @property
    def nodes(self) -> np.ndarray:
        return self.nodes_per_axis[0]

    def _compute(self, th: np.ndarray) -> np.ndarray:
        return np.stack([self.fn(t) for t in th], axis=1)

    def _floor(self, vals: np.ndarray):
        return np.max(np.abs(vals)) if self.size is None else self.size(vals)

    def covers(self, x: Forward) -> bool:
        return (self.ok and float(x.mean) == self.mean and abs(float(x.var) / self.var - 1) <= VAR_WINDOW
                and self.lo <= float(x.corr) <= R_MAX)

    def values(self, corr: float) -> np.ndarray:
        return self.interp(self.x_of(corr))


class _Scaled:
    """A table of a chain whose attention value/output weights were normalised: its outputs
    scale with s = (v_std o_std)^2 / reference (forward variance and covariance, every backward
    coefficient); the mean (0 without value/output biases) with sqrt(s)."""

    def __init__(self, table: Table, s: float):
        self.table, self.s = table, s

    def covers(self, x: Forward) -> bool:
        return self.table.covers(x)

    def row(self, x: Forward) -> list:
        s = self.s
        row = self.table.row(x)
        r = [v * s for v in row]
        # the mean scales with sqrt(s) (taken directly: s may underflow to 0, weights ~1e-300)
        r[0] = row[0] * math.sqrt(s)
        return r

    forward_of = staticmethod(_ChainTable.forward_of)
    backward_of = staticmethod(_ChainTable.backward_of)

    def forward(self, x: Forward) -> Forward:
        return self.forward_of(self.row(x))

    def backward(self, x: Forward, g: Backward) -> Backward:
        return self.backward_of(self.row(x), g)


def _canonical(ops: list) -> tuple[list, float]:
    """Chains with one attention op without value/output biases: the attention rule is
    homogeneous of degree 2 in v_std o_std (forward variance, covariance and every backward
    path carry sv2 so2), so such chains share one table at reference stds (verified when the
    table is built).  Returns (ops to tabulate, scale)."""
    idx = [i for i, (name, _) in enumerate(ops) if name == "attention"]
    if len(idx) != 1:
        return ops, 1.0
    i = idx[0]
    p = ops[i][1]
    if p.get("v_bias_std", 0.0) != 0.0 or p.get("o_bias_std", 0.0) != 0.0 or not (p["v_std"] > 0 and p["o_std"] > 0):
        return ops, 1.0
    v_ref, o_ref = 1.0 / math.sqrt(p["d"]), 1.0 / math.sqrt(p["n_heads"] * p["d_head"])
    scale = (p["v_std"] * p["o_std"] / (v_ref * o_ref)) ** 2
    ops = list(ops)
    ops[i] = ("attention", {**p, "v_std": v_ref, "o_std": o_ref})
    return ops, scale


def _doubled(ops: list) -> Chain:
    """The chain with the attention op's v_std doubled."""
    i = next(k for k, (name, _) in enumerate(ops) if name == "attention")
    doubled = list(ops)
    doubled[i] = ("attention", {**ops[i][1], "v_std": 2 * ops[i][1]["v_std"]})
    return Chain(doubled)


def _times_four(want: np.ndarray, got: np.ndarray) -> bool:
    return bool(np.all(np.abs(got - 4.0 * want) <= 1e-9 * np.maximum(np.abs(4.0 * want), 1e-300) + 1e-300))


def _homogeneous(t, ops: list) -> bool:
    """Check the degree-2 homogeneity the scaling relies on, at one node of table ``t`` (a
    :class:`Table` or :class:`VarTable`): doubling v_std must multiply the forward variance
    and every backward coefficient by 4."""
    if isinstance(t, VarTable):
        a, b = len(t.nodes) // 2, len(t.u_nodes) // 2
        got = t._grid_values(_doubled(ops), t.nodes[a:a + 1], t.u_nodes[b:b + 1])[:, 0, 0]
        return _times_four(t.vals[:, a, b], got)
    th = float(t.nodes[len(t.nodes) // 2])
    c = np.array([math.cos(th)])
    got = _rows(_doubled(ops), {}, Forward(np.full_like(c, t.mean), np.full_like(c, t.var), c))[:, 0]
    return _times_four(t.interp(th), got)


class _Handle:
    """A chain's canonical form, scale and key, resolved once (:meth:`TableCache.handle`):
    the per-sublayer lookup then hashes a float, not the chain's nested parameter tuple."""

    __slots__ = ("canon", "scale", "key", "canonical", "by_mean", "scaled")

    def __init__(self, canon, scale, key, canonical: bool):
        self.canon, self.scale, self.key = canon, scale, key
        self.canonical = canonical    # the attention op was normalised to reference v/o stds
        self.by_mean: dict = {}       # mean -> the cache's table list of (key, mean)
        self.scaled: dict = {}        # id(table) -> its _Scaled view (tables are never freed)


def _view(handle: _Handle, t):
    """``t`` as the handle's chain sees it: scaled by the v/o weight scale (memoised)."""
    if handle.scale == 1.0:
        return t
    view = handle.scaled.get(id(t))
    if view is None:
        view = handle.scaled[id(t)] = _Scaled(t, handle.scale)
    return view


class TableCache:
    """One prediction's interpolation tables (a new cache per prediction, so which table
    serves a layer never depends on what was predicted before in the process; built tables
    come back from the on-disk store bit for bit).

    * chain tables per (chain of ops, mean, variance window); a key's table is built at its
      BUILD_AFTER-th request (returns None before that, and where verification failed).
      Attention chains that differ only in their value/output weight scale share a table;
    * variance tables (:meth:`get_var`);
    * statistics table families (:meth:`theta`): any :class:`InterpTable` of the attention
      statistics at one mean (and variance, or variance range);
    * direct evaluations shared within the prediction (:meth:`remember`: a layer's forward and
      backward ask for the same per-row terms of a causal position profile).

    Every family keeps at most PER_KEY tables per key.  :attr:`untabulated` is the same cache
    seen by a quantity that is not to be tabulated (its parameters do not repeat): it builds
    no table and shares the memoised direct evaluations."""

    def __init__(self, memos: memo.Memos | None = None):
        self.tables: dict = {}
        self.requests: dict = {}
        self.var_tables: dict = {}
        self._canon = memo.Bounded(4096)
        self._theta: dict = {}
        self._memo = memo.Bounded(MEMO_SIZE)
        #: the memos of pure functions the prediction runs under (sigprop.memo; default the
        #: process's): ``TableCache(memos=memo.Memos())`` isolates a prediction from every
        #: value computed before it
        self.memos = memo.process() if memos is None else memos
        self.untabulated = _Untabulated(self)

    def remember(self, key, compute):
        """``compute()`` memoised under ``key`` for this prediction (at MEMO_SIZE entries the
        oldest half is dropped: the backward pass, top layer first, finds the most recent)."""
        return self._memo.get(key, compute)

    def theta(self, family: str, key, x: Forward, build):
        """The table of ``family`` and ``key`` that covers ``x`` (anything with ``covers``:
        a :class:`ThetaTable`, a profile.RowsVarTable), building one with ``build()`` while
        the key has fewer than PER_KEY; None when none covers ``x``."""
        tabs = self._theta.setdefault((family, key), [])
        for t in tabs:
            if t.covers(x):
                return t
        if len(tabs) < PER_KEY:
            t = build()
            tabs.append(t)
            if t.covers(x):
                return t
        return None

    def handle(self, ops) -> _Handle:
        """The canonical chain of ``ops`` and its key, memoised on the parameter values as
        given (the predictor builds the same parameter dicts, in the same order, for every
        layer); pass it to :meth:`get`."""
        def make():
            canon, scale = _canonical(ops)
            key = tuple((name, tuple(sorted(params.items()))) for name, params in canon)
            return _Handle(canon, scale, key, canonical=canon is not ops)

        return self._canon.get(tuple((name, tuple(params.items())) for name, params in ops), make)

    def get(self, ops: list, x: Forward, eager: bool = False, handle: _Handle | None = None,
            uses: int = 0):
        """The table for chain ``ops`` (or its ``handle``) at input ``x`` (None: evaluate
        directly).  ``eager``: build it at the first request rather than the BUILD_AFTER-th;
        ``uses``: the number of sublayers known to share the chain (the requests so far count
        too; a costly chain needs COSTLY_USES of them, :func:`worth_tabulating`)."""
        if handle is None:
            handle = self.handle(ops)
        tables = handle.by_mean.get(x.mean)
        if tables and tables[0].covers(x):          # the common case, as _get would find it
            t = tables[0]
        else:
            t = self._get(handle, x, eager, uses)
        return None if t is None else _view(handle, t)

    def get_var(self, ops: list, x: Forward, v_lo: float, v_hi: float, handle: _Handle | None = None):
        """A :class:`VarTable` of chain ``ops`` over input variances [v_lo, v_hi] at the mean of
        ``x``, built (or loaded) at the first request; None where it does not cover ``x`` or
        failed verification.  Its correlation range starts at min(0, corr) of the request that
        built it; a later request below that gets a table of its own (at most PER_KEY)."""
        if handle is None:
            handle = self.handle(ops)
        mean = float(x.mean)
        tables = self.var_tables.setdefault((handle.key, mean, v_lo, v_hi), [])
        for t in tables:
            if t.covers(x):
                return _view(handle, t)
        if len(tables) >= PER_KEY or any(t.lo <= x.corr for t in tables):
            return None                   # outside every variance range, or failed: evaluate directly
        lo = min(0.0, float(x.corr))
        skey = store.key("vartable", handle.key, mean, v_lo, v_hi, lo, tolerance(VarTable.ACCURACY), TH_MIN)
        t = VarTable(Chain(handle.canon), mean, v_lo, v_hi, lo, store_key=skey)
        if t.ok and not t.loaded and handle.canonical and not _homogeneous(t, handle.canon):
            t.ok = False
            t.save()
        tables.append(t)
        return _view(handle, t) if t.covers(x) else None

    def _get(self, handle: _Handle, x: Forward, eager: bool, uses: int = 0) -> Table | None:
        mean = float(x.mean)
        tables = handle.by_mean.get(mean)
        if tables is None:
            tables = handle.by_mean[mean] = self.tables.setdefault((handle.key, mean), [])
        for t in tables:
            if t.covers(x):
                return t
        key = (handle.key, mean)
        n = self.requests.get(key, 0) + 1
        self.requests[key] = n
        if (n < BUILD_AFTER and not eager) or len(tables) >= PER_KEY:
            return None
        ops, chain_key = handle.canon, handle.key
        if not worth_tabulating(ops, x, max(n, uses, BUILD_AFTER if eager else 0)):
            return None
        lo = min(0.0, float(x.corr))
        skey = store.key("table", chain_key, mean, float(x.var), lo, tolerance(Table.ACCURACY), TH_MIN)
        t = Table(Chain(ops), {}, mean, float(x.var), lo, store_key=skey)
        if t.ok and not t.loaded and handle.canonical and not _homogeneous(t, ops):
            t.ok = False
            t.save()
        tables.append(t)
        return t if t.covers(x) else None


class _Untabulated:
    """A :class:`TableCache` for quantities that are evaluated directly: no tables, the
    cache's memoised direct evaluations."""

    __slots__ = ("remember",)

    def __init__(self, cache: TableCache):
        self.remember = cache.remember

    @staticmethod
    def theta(family, key, x, build):
        return None
