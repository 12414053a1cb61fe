"""Interpolation tables for expensive rules (attention) in the layer-by-layer prediction.

In a transformer the branch input of a sublayer is (n times) a LayerNorm output: its mean and
variance are the same at every layer up to O(eps / var), and only its token correlation drifts
from layer to layer.  So for one rule with fixed parameters we evaluate the rule once,
vectorised, on Chebyshev nodes in the correlation, and interpolate:

* forward: barycentric Chebyshev interpolation in corr, plus a first-order Taylor term in the
  variance (used only within 1e-3 relative of the table's reference variance; a new table is
  built otherwise);
* backward: every backward rule is linear in the gradient's second moments, var_out = g2 (A +
  B rg) and cov_out = g2 (C + D rg), so A..D are tabulated the same way.

Each table is verified when built: at the midpoints between nodes the interpolant must match
direct evaluation to 1e-8 relative (doubling the nodes up to 257), and linearity in the
gradient is checked at rg = 1/2; otherwise the predictor falls back to direct evaluation.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop.rules import get
from sigprop.state import Backward, Forward

TOL = 1e-8
VAR_WINDOW = 1e-3


def _cheb(n: int, lo: float, hi: float) -> np.ndarray:
    k = np.arange(n)
    return lo + (hi - lo) * (1 - np.cos(np.pi * k / (n - 1))) / 2


def _bary_weights(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1::2] = -1
    w[0] *= 0.5
    w[-1] *= 0.5
    return w


def _interp(x: float, nodes: np.ndarray, w: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Barycentric interpolation of each row of ``values`` (shape (k, n)) at x."""
    diff = x - nodes
    hit = np.nonzero(diff == 0)[0]
    if hit.size:
        return values[:, hit[0]]
    c = w / diff
    return values @ c / c.sum()


class Table:
    def __init__(self, rule_name: str, params: dict, mean: float, var: float, lo: float = 0.0):
        self.rule = get(rule_name)
        self.params, self.mean, self.var, self.lo = params, mean, var, lo
        self.ok = False
        for n in (33, 65, 129, 257):
            nodes = _cheb(n, lo, 1.0)
            vals = self._values(nodes, var)
            mids = (nodes[1:] + nodes[:-1]) / 2
            direct = self._values(mids, var)
            w = _bary_weights(n)
            approx = np.stack([_interp(x, nodes, w, vals) for x in mids], axis=1)
            scale = np.maximum(np.abs(direct), 1e-300)
            if np.all(np.isfinite(vals)) and np.max(np.abs(approx - direct) / scale) < TOL:
                self.nodes, self.w, self.vals = nodes, w, vals
                h = 1e-4
                self.dvals = (self._values(nodes, var * (1 + h)) - self._values(nodes, var * (1 - h))) / (2 * h * var)
                self.ok = self._linear_in_gradient(mids[len(mids) // 2])
                break

    def _evaluate(self, corr, var, g):
        c = np.asarray(corr, dtype=float)
        x = Forward(np.full_like(c, self.mean), np.full_like(c, var), c)
        return self.rule.evaluate(x, g, **self.params)

    def _values(self, corr: np.ndarray, var: float) -> np.ndarray:
        """Rows: mean, var, cov | A, B, C, D of the backward linear map."""
        y, g0 = self._evaluate(corr, var, Backward(np.ones_like(corr), np.zeros_like(corr)))
        _, g1 = self._evaluate(corr, var, Backward(np.ones_like(corr), np.ones_like(corr)))
        A, C = g0.var, g0.var * g0.corr
        return np.stack([y.mean, y.var, y.var * y.corr, A, g1.var - A, C, g1.var * g1.corr - C])

    def _linear_in_gradient(self, corr: float) -> bool:
        _, g = self._evaluate(np.array([corr]), self.var, Backward(np.array([2.0]), np.array([0.5])))
        row = self._row(corr, self.var)
        var = 2.0 * (row[3] + 0.5 * row[4])
        cov = 2.0 * (row[5] + 0.5 * row[6])
        return math.isclose(var, float(g.var[0]), rel_tol=1e-7) and math.isclose(
            cov, float(g.var[0] * g.corr[0]), rel_tol=1e-7, abs_tol=1e-12 * abs(var))

    def covers(self, x: Forward) -> bool:
        return (self.ok and x.mean == self.mean and abs(x.var / self.var - 1) <= VAR_WINDOW
                and self.lo <= x.corr <= 1.0)

    def _row(self, corr: float, var: float) -> np.ndarray:
        return _interp(corr, self.nodes, self.w, self.vals) + (var - self.var) * _interp(corr, self.nodes, self.w, self.dvals)

    def forward(self, x: Forward) -> Forward:
        r = self._row(float(x.corr), float(x.var))
        return Forward(float(r[0]), float(r[1]), float(r[2] / r[1]) if r[1] > 0 else 0.0)

    def backward(self, x: Forward, g: Backward) -> Backward:
        r = self._row(float(x.corr), float(x.var))
        var = g.var * (r[3] + r[4] * g.corr)
        cov = g.var * (r[5] + r[6] * g.corr)
        return Backward(float(var), float(cov / var) if var > 0 else 0.0)


class TableCache:
    """Tables per (rule, parameters, mean, variance window)."""

    # empty until the attention rule is smooth in the correlation (see docs/design.md)
    EXPENSIVE: set = set()

    def __init__(self):
        self.tables: dict = {}

    def get(self, rule: str, params: dict, x: Forward) -> Table | None:
        if rule not in self.EXPENSIVE:
            return None
        key = (rule, tuple(sorted(params.items())), float(x.mean))
        for t in self.tables.get(key, []):
            if t.covers(x):
                return t
        lo = min(0.0, float(x.corr))
        t = Table(rule, params, float(x.mean), float(x.var), lo)
        self.tables.setdefault(key, []).append(t)
        return t if t.covers(x) else None
