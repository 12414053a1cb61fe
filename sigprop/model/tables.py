"""Interpolation tables for expensive rules (attention) in the layer-by-layer prediction.

In a transformer the branch input of a sublayer is (n times) a LayerNorm output: its mean and
variance are the same at every layer up to O(eps / var), and only its token correlation drifts
from layer to layer.  So for one branch (a :class:`Chain` of rule applications) with fixed
parameters we evaluate it once, vectorised, on Chebyshev nodes in the correlation, and
interpolate:

* forward: barycentric Chebyshev interpolation in theta = arccos(corr) (the arc-cosine
  kernels of ReLU and GeLU have a square-root singularity at corr = 1 in corr, not in theta), plus a first-order Taylor term in the
  variance (used only within 1e-3 relative of the table's reference variance; a new table is
  built otherwise);
* backward: every backward rule is linear in the gradient's second moments, var_out = g2 (A +
  B rg) and cov_out = g2 (C + D rg), so A..D are tabulated the same way.

Each table is verified when built: at the midpoints between nodes the interpolant must match
direct evaluation to TOL relative (17, 33 or 65 nodes), and linearity in the gradient is
checked at rg = 1/2; otherwise the predictor falls back to direct evaluation.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop import progress
from sigprop.errors import DomainError
from sigprop.model import store
from sigprop.rules import get
from sigprop.state import Backward, Forward

#: interpolation error allowed at the verification points, relative.  The attention rule's
#: own quadrature error is ~1e-6..1e-5 relative at small logit variances (second differences
#: in r measured at 1e-5), so a table is held to the same order; where the rule's output is
#: rougher (large logit variances) the table fails verification and direct evaluation is used.
TOL = 3e-5
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
#: the tabulated rows (:func:`_rows`)
ROWS = ("mean", "var", "cov", "A", "B", "C", "D")


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


def _cheb(n: int, lo: float, hi: float) -> np.ndarray:
    k = np.arange(n)
    return lo + (hi - lo) * (1 - np.cos(np.pi * k / (n - 1))) / 2


def _bary_weights(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1::2] = -1
    w[0] *= 0.5
    w[-1] *= 0.5
    return w


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


def _rows(rule, params: dict, x: Forward) -> np.ndarray:
    """The tabulated rows at input states ``x`` (arrays): mean, var, cov | A, B, C, D of the
    backward map, which is linear in the gradient's moments: var_out = g2 (A + B rg),
    cov_out = g2 (C + D rg)."""
    ones, zeros = np.ones_like(x.corr), np.zeros_like(x.corr)
    y, g0 = rule.evaluate(x, Backward(ones, zeros), **params)
    _, g1 = rule.evaluate(x, Backward(ones, ones), **params)
    A, C = g0.var, g0.var * g0.corr
    return np.stack([y.mean, y.var, y.var * y.corr, A, g1.var - A, C, g1.var * g1.corr - C])


def _max_rel_err(approx: np.ndarray, direct: np.ndarray, vals: np.ndarray) -> float:
    """Largest error of ``approx`` against ``direct`` relative to each entry, floored at 1e-6
    of its row's largest value over the nodes ``vals`` (covariances cross 0)."""
    axes = tuple(range(1, vals.ndim))
    scale = np.maximum(np.abs(direct), 1e-6 * np.max(np.abs(vals), axis=axes, keepdims=True))
    return float(np.max(np.abs(approx - direct) / np.maximum(scale, 1e-300)))


def _linear_ok(row, g: Backward) -> bool:
    """Linearity in the gradient: the tabulated map (``row``) applied to the gradient (2, 1/2)
    against the rule's own backward ``g`` there."""
    var = 2.0 * (row[3] + 0.5 * row[4])
    cov = 2.0 * (row[5] + 0.5 * row[6])
    return math.isclose(var, float(g.var[0]), rel_tol=1e-7) and math.isclose(
        cov, float(g.var[0] * g.corr[0]), rel_tol=1e-7, abs_tol=1e-12 * abs(var))


def _interp(x: float, nodes: np.ndarray, w: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Barycentric interpolation of each row of ``values`` (shape (k, n)) at x."""
    diff = x - nodes
    hit = np.nonzero(diff == 0)[0]
    if hit.size:
        return values[:, hit[0]]
    c = w / diff
    return values @ c / c.sum()


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


class Table:
    def __init__(self, rule, params: dict, mean: float, var: float, lo: float = 0.0,
                 store_key: str | None = None):
        self.rule = get(rule) if isinstance(rule, str) else rule
        self.params, self.mean, self.var, self.lo = params, mean, var, lo
        self.ok = False
        self.store_key = store_key
        self.loaded = store_key is not None and self._load(store_key)
        if self.loaded:
            return
        self._build(lo, var)
        if store_key is not None:
            self.save()

    # -- the on-disk store (sigprop.model.store) ------------------------------------------
    # An entry is [n, 1, has_d, values at the n nodes (7 x n), direct evaluation at the n - 1
    # midpoints (the build's verification points), d(values)/d(var) if has_d], or [0, 0, 0] for
    # a table that failed its build (then the chain is evaluated directly).  Loading applies
    # the build's own acceptance test to the stored numbers; an entry that fails it, or has
    # any other shape, is rebuilt.
    def _load(self, key: str) -> bool:
        arr = store.load(key)
        if arr is None:
            return False
        n, ok, has_d = arr[0], arr[1], arr[2]
        if arr.size == 3 and n == 0 and ok == 0 and has_d == 0:
            self.ok = False                         # a stored failure: evaluate directly
            return True
        if n not in NODES or ok != 1 or has_d not in (0, 1):
            return False
        n, has_d = int(n), bool(has_d)
        k = len(ROWS)
        if arr.size != 3 + k * n + k * (n - 1) + (k * n if has_d else 0):
            return False
        vals = arr[3:3 + k * n].reshape(k, n)
        mid = arr[3 + k * n:3 + k * (2 * n - 1)].reshape(k, n - 1)
        th = _cheb(n, TH_MIN, math.acos(self.lo))
        if not self._accept(th, vals, mid):
            return False
        self.nodes, self.w, self.vals, self.mid, self.nodes_n = th, _bary_weights(n), vals, mid, n
        self.dvals = None
        try:
            self._set_coefficients()
        except AssertionError:
            return False
        if has_d:
            dvals = arr[3 + k * (2 * n - 1):].reshape(k, n)
            self.dvals, self.dcoef = dvals, self._coef_of(dvals)
            self._stacked = np.vstack([self.coef, self.dcoef])
        self.ok = True
        return True

    def save(self) -> None:
        if not self.ok:
            store.save(self.store_key, np.zeros(3))
            return
        has_d = self.dvals is not None
        parts = [np.array([self.nodes_n, 1.0, float(has_d)]), self.vals.ravel(), self.mid.ravel()]
        if has_d:
            parts.append(self.dvals.ravel())
        store.save(self.store_key, np.concatenate(parts))

    @staticmethod
    def _accept(th: np.ndarray, vals: np.ndarray, direct: np.ndarray) -> bool:
        """The build's acceptance test: finite values whose interpolant matches the direct
        evaluation at the midpoints between nodes to TOL (relative, :func:`_max_rel_err`)."""
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(direct))):
            return False
        w = _bary_weights(len(th))
        th_mid = (th[1:] + th[:-1]) / 2
        approx = np.stack([_interp(x, th, w, vals) for x in th_mid], axis=1)
        return _max_rel_err(approx, direct, vals) < TOL

    def _build(self, lo: float, var: float) -> None:
        # interpolation variable theta = arccos(corr): the arc-cosine kernels (ReLU, GeLU near
        # r = 1) have a square-root singularity at r = 1 in r but are analytic in theta
        th_hi = math.acos(lo)
        with progress.task("sigprop: building an interpolation table", total=len(NODES)) as bar:
            for n in NODES:
                th = _cheb(n, TH_MIN, th_hi)
                nodes = np.cos(th)
                th_mid = (th[1:] + th[:-1]) / 2
                try:
                    vals = self._values(nodes, var)
                    direct = self._values(np.cos(th_mid), var)
                except DomainError:
                    # part of the table's range lies outside a rule's domain (e.g. the attention
                    # rule's logit-variance range at low correlations): no table, the predictor
                    # evaluates the chain at the states it actually meets
                    return
                bar.advance()
                if self._accept(th, vals, direct):
                    self.nodes, self.w, self.vals, self.mid = th, _bary_weights(n), vals, direct
                    self.dvals = None
                    self.nodes_n = n
                    self._set_coefficients()
                    # linearity in the gradient, checked at a node (exact table values there)
                    self.ok = self._linear_in_gradient(float(np.cos(th[n // 2])))
                    break

    def _evaluate(self, corr, var, g):
        c = np.asarray(corr, dtype=float)
        x = Forward(np.full_like(c, self.mean), np.full_like(c, var), c)
        return self.rule.evaluate(x, g, **self.params)

    def _derivative(self):
        """d(row)/d(var) at the nodes (one-sided difference; built on first use)."""
        h = 1e-4
        self.dvals = (self._values(np.cos(self.nodes), self.var * (1 + h)) - self.vals) / (h * self.var)
        self.dcoef = self._coef_of(self.dvals)
        self._stacked = np.vstack([self.coef, self.dcoef])
        if self.store_key is not None:
            self.save()

    def _values(self, corr: np.ndarray, var: float) -> np.ndarray:
        """Rows (:func:`_rows`) at correlations ``corr`` and variance ``var``."""
        c = np.asarray(corr, dtype=float)
        return _rows(self.rule, self.params, Forward(np.full_like(c, self.mean), np.full_like(c, var), c))

    def _linear_in_gradient(self, corr: float) -> bool:
        _, g = self._evaluate(np.array([corr]), self.var, Backward(np.array([2.0]), np.array([0.5])))
        return _linear_ok(self._row(corr, self.var, th=float(self.nodes[len(self.nodes) // 2])), g)

    def covers(self, x: Forward) -> bool:
        return (self.ok and x.mean == self.mean and abs(x.var / self.var - 1) <= VAR_WINDOW
                and self.lo <= x.corr <= R_MAX)

    def _set_coefficients(self):
        """Chebyshev coefficients of the interpolant (the same polynomial as the barycentric
        form through the Lobatto nodes, evaluated as C @ cos(j phi): two NumPy calls instead
        of five).  Checked against the barycentric form at the verification points."""
        n = self.nodes_n
        basis = _cheb_basis(n)
        self._coef_of = lambda vals: _cheb_coef(vals, basis)
        self.coef = self._coef_of(self.vals)
        self.dcoef = None
        self._j = np.arange(n, dtype=float)
        self._th0, self._th_span = float(self.nodes[0]), float(self.nodes[-1] - self.nodes[0])
        th_mid = (self.nodes[1:] + self.nodes[:-1]) / 2
        bary = np.stack([_interp(t, self.nodes, self.w, self.vals) for t in th_mid], axis=1)
        cheb = np.stack([self.coef @ self._basis(t) for t in th_mid], axis=1)
        if not np.allclose(cheb, bary, rtol=1e-11, atol=1e-13 * np.max(np.abs(self.vals))):
            raise AssertionError("Chebyshev coefficients disagree with the barycentric form")

    def _basis(self, th: float) -> np.ndarray:
        return _cheb_at(self._j, th, self._th0, self._th_span)

    def _row(self, corr: float, var: float, th: float | None = None) -> np.ndarray:
        """:meth:`row` as an array (at ``th`` = arccos(corr) when given)."""
        if th is None:
            th = math.acos(min(1.0, max(-1.0, corr)))
        return np.array(self._row_at(th, var))

    def row(self, x: Forward) -> list:
        """Every tabulated quantity at input ``x`` as a list of floats: mean, var, cov | A, B,
        C, D (the predictor's per-sublayer path: one matrix product for the value and its
        variance derivative together, the combination in plain floats)."""
        corr = float(x.corr)
        return self._row_at(math.acos(1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr), float(x.var))

    def _row_at(self, th: float, var: float) -> list:
        basis = self._basis(th)
        if var == self.var:
            return (self.coef @ basis).tolist()
        if self.dvals is None:
            self._derivative()
        r = (self._stacked @ basis).tolist()
        dv = var - self.var
        k = len(r) // 2
        return [r[i] + dv * r[k + i] for i in range(k)]

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


class VarTable:
    """A chain's table over the token correlation *and* the input variance, for branches whose
    input variance changes from layer to layer (LayerNorm Scaling: the branch input is
    LN(x)/sqrt(l)).  A Chebyshev product interpolant in theta = arccos(corr) (as
    :class:`Table`) and u = log var over [v_lo, v_hi], built on a 17 x 17 grid (33 x 25 if that
    fails) and verified like a :class:`Table`: on the whole grid of midpoints between nodes it
    must match direct evaluation to TOL relative, and linearity in the gradient is checked at
    a node.  Outside [v_lo, v_hi] (and beyond R_MAX) it does not cover the state and the chain
    is evaluated directly."""

    def __init__(self, rule, mean: float, v_lo: float, v_hi: float, lo: float = 0.0,
                 store_key: str | None = None):
        self.rule = rule
        self.mean, self.v_lo, self.v_hi, self.lo = mean, v_lo, v_hi, lo
        self._u0, self._u_span = math.log(v_lo), math.log(v_hi) - math.log(v_lo)
        self.ok = False
        self.store_key = store_key
        self.loaded = store_key is not None and self._load(store_key)
        if self.loaded:
            return
        self._build()
        if store_key is not None:
            self.save()

    def _values(self, corr: np.ndarray, var: np.ndarray) -> np.ndarray:
        """Rows (:func:`_rows`) at the states (corr[i], var[i])."""
        return _rows(self.rule, {}, Forward(np.full_like(corr, self.mean), var, corr))

    def _grid_values(self, th: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Rows at every (theta, u) of the product grid, shape (7, len(th), len(u)), the
        forward rows in units of the input's: mean / sqrt(var), var / var, cov / var (the
        value path makes them ~ var; what is left varies slowly in u, so the interpolant needs
        far fewer nodes: measured 3e-4 against 9e-6 on a 17 x 9 vs 17 x 13 grid)."""
        T, U = np.meshgrid(th, u, indexing="ij")
        vals = self._values(np.cos(T).ravel(), np.exp(U).ravel()).reshape(7, len(th), len(u))
        w = np.exp(u)
        vals[0] /= np.sqrt(w)
        vals[1:3] /= w
        return vals

    GRIDS = ((17, 17), (33, 25))

    def _build(self) -> None:
        th_hi = math.acos(self.lo)
        u_hi = self._u0 + self._u_span
        with progress.task("sigprop: building an interpolation table (correlation x variance)",
                           total=len(self.GRIDS)) as bar:
            for nt, nu in self.GRIDS:
                th, u = _cheb(nt, TH_MIN, th_hi), _cheb(nu, self._u0, u_hi)
                try:
                    vals = self._grid_values(th, u)
                    direct = self._grid_values((th[1:] + th[:-1]) / 2, (u[1:] + u[:-1]) / 2)
                except DomainError:
                    return                    # part of the range outside a rule's domain: no table
                bar.advance()
                if self._accept(th, u, vals, direct):
                    self.mid = direct
                    self.ok = self._linear_in_gradient(th[nt // 2], u[nu // 2])
                    return

    def _accept(self, th: np.ndarray, u: np.ndarray, vals: np.ndarray, direct: np.ndarray) -> bool:
        """The build's acceptance test (sets the interpolant): finite values whose interpolant
        matches the direct evaluation on the grid of midpoints to TOL relative."""
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(direct))):
            return False
        self._set(th, u, vals)
        approx = np.array([[self._row_at(t, w) for w in (u[1:] + u[:-1]) / 2]
                           for t in (th[1:] + th[:-1]) / 2]).transpose(2, 0, 1)
        return _max_rel_err(approx, direct, vals) < TOL

    def _set(self, th: np.ndarray, u: np.ndarray, vals: np.ndarray) -> None:
        nt, nu = len(th), len(u)
        self.nodes, self.u_nodes, self.vals = th, u, vals
        # coefficients along u (last axis), then along theta
        c = _cheb_coef(vals, _cheb_basis(nu))                               # (7, nt, nu)
        c = _cheb_coef(c.transpose(0, 2, 1), _cheb_basis(nt))               # (7, nu, nt)
        self.coef = np.ascontiguousarray(c.transpose(0, 2, 1))              # (7, nt, nu)
        self._flat = self.coef.reshape(7 * nt, nu)
        self._jt, self._ju = np.arange(nt, dtype=float), np.arange(nu, dtype=float)
        self._th0, self._th_span = float(th[0]), float(th[-1] - th[0])

    def _row_at(self, th: float, u: float) -> np.ndarray:
        r = (self._flat @ _cheb_at(self._ju, u, self._u0, self._u_span)).reshape(7, -1)
        return r @ _cheb_at(self._jt, th, self._th0, self._th_span)

    def _linear_in_gradient(self, th: float, u: float) -> bool:
        x = Forward(np.array([self.mean]), np.array([math.exp(u)]), np.array([math.cos(th)]))
        _, g = self.rule.evaluate(x, Backward(np.array([2.0]), np.array([0.5])))
        return _linear_ok(self._row_at(th, u), g)

    def covers(self, x: Forward) -> bool:
        return (self.ok and x.mean == self.mean and self.v_lo <= x.var <= self.v_hi
                and self.lo <= x.corr <= R_MAX)

    def row(self, x: Forward) -> list:
        """Every tabulated quantity at input ``x`` (as :meth:`Table.row`)."""
        corr, var = float(x.corr), float(x.var)
        th = math.acos(1.0 if corr > 1.0 else -1.0 if corr < -1.0 else corr)
        r = self._row_at(th, math.log(var)).tolist()
        return [r[0] * math.sqrt(var), r[1] * var, r[2] * var, *r[3:]]

    forward_of = staticmethod(Table.forward_of)
    backward_of = staticmethod(Table.backward_of)

    # -- the on-disk store (as Table): [nt, nu, 1, values (7 x nt x nu), direct evaluation
    # on the grid of midpoints (7 x (nt-1) x (nu-1))], or [0, 0, 0] for a failed build -----
    def save(self) -> None:
        if not self.ok:
            store.save(self.store_key, np.zeros(3))
            return
        nt, nu = self.vals.shape[1:]
        store.save(self.store_key, np.concatenate([np.array([nt, nu, 1.0]), self.vals.ravel(), self.mid.ravel()]))

    def _load(self, key: str) -> bool:
        arr = store.load(key)
        if arr is None:
            return False
        if arr.size == 3 and not np.any(arr):
            self.ok = False                         # a stored failure: evaluate directly
            return True
        if (arr[0], arr[1]) not in self.GRIDS or arr[2] != 1:
            return False
        nt, nu = int(arr[0]), int(arr[1])
        if arr.size != 3 + 7 * nt * nu + 7 * (nt - 1) * (nu - 1):
            return False
        vals = arr[3:3 + 7 * nt * nu].reshape(7, nt, nu)
        mid = arr[3 + 7 * nt * nu:].reshape(7, nt - 1, nu - 1)
        th, u = _cheb(nt, TH_MIN, math.acos(self.lo)), _cheb(nu, self._u0, self._u0 + self._u_span)
        if not self._accept(th, u, vals, mid):
            return False
        self.mid, self.ok = mid, True
        return True


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

    forward_of = staticmethod(Table.forward_of)
    backward_of = staticmethod(Table.backward_of)


class ThetaTable:
    """A vector-valued function ``fn(theta)`` of the input correlation r = cos(theta), at one
    input mean and variance, interpolated in theta (barycentric form through Chebyshev-Lobatto
    nodes) for the predictor's per-layer attention statistics that are costly to evaluate
    (the per-row terms of a causal position profile, profile.RowsTable; the row statistics of
    Post-LN attention's gradient shares).  Built on 9 nodes (17 if that fails), verified at
    the midpoints nearest both ends: every entry's error below ``tol`` of max(|direct value|,
    ``size(vals)``), ``size`` giving each entry's scale from the node values (default: the
    largest of them all).  Kept in the table store under ``store_key`` ([n, 1, 0, values...],
    or [0, 0, 0] for a failure, which then evaluates directly)."""

    NODES = (9, 17)

    def __init__(self, fn, mean: float, var: float, lo: float, store_key: str, tol: float,
                 size=None, n_values: int | None = None):
        self.mean, self.var, self.lo, self.ok = mean, var, lo, False
        self.tol, self.size = tol, size
        hi = float(np.arccos(lo))
        arr = store.load(store_key)
        if arr is not None and self._unpack(arr, hi, n_values):
            return
        with progress.task("sigprop: building an attention statistics table", total=len(self.NODES)) as bar:
            for n in self.NODES:
                th = _cheb(n, TH_MIN, hi)
                vals = np.stack([fn(t) for t in th], axis=1)
                direct = np.stack([fn(t) for t in self._checks(th)], axis=1)
                bar.advance()
                if self._accept(th, vals, direct):
                    self.nodes, self.w, self.vals, self.direct, self.ok = th, _bary_weights(n), vals, direct, True
                    break
        store.save(store_key, np.concatenate([[len(self.nodes), 1.0, 0.0], self.vals.ravel(), self.direct.ravel()])
                   if self.ok else np.zeros(3))

    @staticmethod
    def _checks(th: np.ndarray) -> tuple:
        """The verification points: the midpoints nearest both ends."""
        return (th[0] + th[1]) / 2, (th[-2] + th[-1]) / 2

    def _accept(self, th: np.ndarray, vals: np.ndarray, direct: np.ndarray) -> bool:
        """The build's acceptance test: finite values, and at both verification points every
        entry's error below ``tol`` of max(|direct value|, its scale)."""
        if not (np.all(np.isfinite(vals)) and np.all(np.isfinite(direct))):
            return False
        w = _bary_weights(len(th))
        scale = np.max(np.abs(vals)) if self.size is None else self.size(vals)
        err = 0.0
        for j, t in enumerate(self._checks(th)):
            d = direct[:, j]
            err = max(err, float(np.max(np.abs(_interp(t, th, w, vals) - d) / np.maximum(np.abs(d), scale + 1e-300))))
        return err < self.tol

    def _unpack(self, arr: np.ndarray, hi: float, n_values: int | None) -> bool:
        """A stored entry ([n, 1, 0, values (k x n), values at the two verification points
        (k x 2)], or [0, 0, 0] for a failed build), accepted only if it passes the build's
        test."""
        if arr.size == 3 and not np.any(arr):
            return True                       # a stored failure: evaluate directly
        if arr[0] not in self.NODES or arr[1] != 1 or arr[2] != 0 or (arr.size - 3) % (int(arr[0]) + 2):
            return False
        n = int(arr[0])
        k = (arr.size - 3) // (n + 2)
        if k == 0 or (n_values is not None and k != n_values):
            return False
        vals, direct = arr[3:3 + k * n].reshape(k, n), arr[3 + k * n:].reshape(k, 2)
        th = _cheb(n, TH_MIN, hi)
        if not self._accept(th, vals, direct):
            return False
        self.nodes, self.w, self.vals, self.direct, self.ok = th, _bary_weights(n), vals, direct, True
        return True

    def covers(self, x: Forward) -> bool:
        return (self.ok and float(x.mean) == self.mean and abs(float(x.var) / self.var - 1) <= VAR_WINDOW
                and self.lo <= float(x.corr) <= R_MAX)

    def values(self, corr: float) -> np.ndarray:
        return _interp(float(np.arccos(min(1.0, max(-1.0, corr)))), self.nodes, self.w, self.vals)


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
        r = [v * s for v in self.table.row(x)]
        r[0] = r[0] / math.sqrt(s)               # the mean scales with sqrt(s)
        return r

    forward_of = staticmethod(Table.forward_of)
    backward_of = staticmethod(Table.backward_of)

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
        other = VarTable.__new__(VarTable)
        other.rule, other.mean = _doubled(ops), t.mean
        a, b = len(t.nodes) // 2, len(t.u_nodes) // 2
        return _times_four(t.vals[:, a, b], other._grid_values(t.nodes[a:a + 1], t.u_nodes[b:b + 1])[:, 0, 0])
    other = Table.__new__(Table)
    other.rule, other.params, other.mean = _doubled(ops), {}, t.mean
    th = float(t.nodes[len(t.nodes) // 2])
    return _times_four(t._row(math.cos(th), t.var, th=th), other._values(np.array([math.cos(th)]), t.var)[:, 0])


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


#: the most tables one key gets: each covers a range of correlations at one mean and variance
#: window, so a stream that wanders gets a few, and then is evaluated directly
PER_KEY = 4


class TableCache:
    """One prediction's interpolation tables (a new cache per prediction, so which table
    serves a layer never depends on what was predicted before in the process; built tables
    come back from the on-disk store bit for bit).

    * chain tables per (chain of ops, mean, variance window); a key's table is built at its
      BUILD_AFTER-th request (returns None before that, and where verification failed).
      Attention chains that differ only in their value/output weight scale share a table;
    * variance tables (:meth:`get_var`);
    * :class:`ThetaTable` families (:meth:`theta`): any function of the correlation at one
      mean and variance (the attention rule's row statistics, the causal profile's terms).

    Every family keeps at most PER_KEY tables per key."""

    def __init__(self):
        self.tables: dict = {}
        self.requests: dict = {}
        self.var_tables: dict = {}
        self._canon: dict = {}
        self._theta: dict = {}

    def theta(self, family: str, key, x: Forward, build):
        """The table of ``family`` and ``key`` that covers ``x`` (a :class:`ThetaTable` or
        anything with ``covers``), building one with ``build()`` while the key has fewer than
        PER_KEY; None when none covers ``x``."""
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
        fast_key = tuple((name, tuple(params.items())) for name, params in ops)
        hit = self._canon.get(fast_key)
        if hit is None:
            canon, scale = _canonical(ops)
            key = tuple((name, tuple(sorted(params.items()))) for name, params in canon)
            if len(self._canon) > 4096:
                self._canon.clear()
            hit = self._canon[fast_key] = _Handle(canon, scale, key, canonical=canon is not ops)
        return hit

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
        built it; a later request below that gets a table of its own (at most 4, as the 1-D
        tables)."""
        if handle is None:
            handle = self.handle(ops)
        mean = float(x.mean)
        tables = self.var_tables.setdefault((handle.key, mean, v_lo, v_hi), [])
        for t in tables:
            if t.covers(x):
                return _view(handle, t)
        if len(tables) >= 4 or any(t.lo <= x.corr for t in tables):
            return None                   # outside every variance range, or failed: evaluate directly
        lo = min(0.0, float(x.corr))
        skey = store.key("vartable", handle.key, mean, v_lo, v_hi, lo, TOL, TH_MIN)
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
        skey = store.key("table", chain_key, mean, float(x.var), lo, TOL, TH_MIN)
        t = Table(Chain(ops), {}, mean, float(x.var), lo, store_key=skey)
        if t.ok and not t.loaded and handle.canonical and not _homogeneous(t, ops):
            t.ok = False
            t.save()
        tables.append(t)
        return t if t.covers(x) else None
