"""Numeric side of the solver: the residual branches composed from the registered rules.

A branch is what a sublayer adds to the stream: attention or FFN, then the hidden dropout
(docs/formats.md: ``b * Dropout_hidden(F(.))``).  At initialisation (zero biases) every branch is
homogeneous in its weight stds in a known way:

* attention: output variance and backward gain are both proportional to sigma_v^2 sigma_o^2
  (the value and output projections are linear maps applied after the softmax; the logits
  depend on sigma_q sigma_k only), and for a fixed logit variance they are proportional to
  the input variance;
* FFN with ReLU: proportional to sigma_in^2 sigma_out^2 and to the input variance;
* FFN with GeLU: proportional to sigma_out^2 only (GeLU is not homogeneous).

So, for a fixed logit variance, a branch's output variance, output token correlation and the
linear coefficients of its backward map depend on the input token correlation r alone.  They
are tabulated once per solve on Chebyshev-Lobatto nodes in r (one vectorised evaluation of
the rules; nested node sets, refined until the interpolant matches the rules at the new
nodes to 1e-7 relative) and interpolated along the depth recursion.  States the table was not built
for (a first layer whose input mean or variance differs) are evaluated directly.

Only the forward rows (output variance and covariance) are tabulated: the solved model's
gradient comes from the prediction engine.  For explanations, :func:`branch_rows` with
``backward=True`` also gives the backward map, which is linear in the upstream gradient's
second moments: for an upstream gradient of variance 1 and token correlation rg, the
gradient at the branch input has variance B0 + rg B1 and covariance C0 + rg C1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sigprop.model.tables import _bary_weights, _cheb
from sigprop.rules import get
from sigprop.state import Backward, Forward

#: rows of a branch table (forward only) and of a full evaluation (with the backward map)
ROWS = ("var", "cov")
ROWS_FULL = ("var", "cov", "B0", "B1", "C0", "C1")

#: tables cover t = sqrt(1 - r) >= T_MIN, i.e. r <= R_MAX
T_MIN = 1e-3
R_MAX = 1 - T_MIN**2


@dataclass(frozen=True)
class Geometry:
    d: int
    n_heads: int
    d_head: int
    d_ff: int
    L: int
    p_att: float
    p_hid: float
    p_ffn: float
    activation: str
    causal: bool

    @property
    def width(self) -> int:
        return self.n_heads * self.d_head


def geometry(model) -> Geometry:
    return Geometry(model.d_model, model.n_heads, model.d_head, model.d_ff, model.seq_len,
                    model.dropout.attention, model.dropout.hidden, model.dropout.ffn_inner,
                    model.activation, bool(model.causal))


def branch(kind: str, g: Geometry, x: Forward, grad: Backward, stds: dict):
    """Forward and backward of one branch (kind "attention" or "ffn", then the hidden
    dropout) through the registered rules; arrays broadcast.  ``stds``: attention q, k, v, o;
    ffn in, out.  Returns (Forward at the branch output, Backward at the branch input, or
    None when ``grad`` is None)."""
    ops = []
    if kind == "attention":
        ops.append(("attention", dict(d=g.d, n_heads=g.n_heads, d_head=g.d_head, L=g.L, p=g.p_att,
                                      causal=int(g.causal), q_std=stds["q"], k_std=stds["k"],
                                      v_std=stds["v"], o_std=stds["o"])))
    else:
        ops += [("linear", dict(d_in=g.d, d_out=g.d_ff, w_std=stds["in"])),
                (g.activation, {}),
                ("dropout", dict(p=g.p_ffn)),
                ("linear", dict(d_in=g.d_ff, d_out=g.d, w_std=stds["out"]))]
    ops.append(("dropout", dict(p=g.p_hid)))
    states = []
    h = x
    for name, prm in ops:
        states.append(h)
        h, _ = get(name).evaluate(h, None, **prm)
    if grad is None:
        return h, None
    gb = grad
    for (name, prm), xin in zip(reversed(ops), reversed(states)):
        _, gb = get(name).evaluate(xin, gb, **prm)
    return h, gb


def branch_rows(kind: str, g: Geometry, x: Forward, stds: dict, backward: bool = False) -> np.ndarray:
    """Rows of a branch at input state(s) ``x``: (var, cov) of its output, and with
    ``backward`` also (B0, B1, C0, C1).  The output covariance rather than the correlation,
    because cov is smooth in r where the correlation cov/var has a nearby pole (attention at
    r -> 0: var ~ r + 1/L)."""
    one = np.ones(np.broadcast(x.mean, x.var, x.corr).shape)
    if not backward:
        y, _ = branch(kind, g, x, None, stds)
        return np.array([y.var * one, y.var * y.corr * one], dtype=np.float64)
    y, g0 = branch(kind, g, x, Backward(one, 0 * one), stds)
    _, g1 = branch(kind, g, x, Backward(one, one), stds)
    c0, c1 = g0.var * g0.corr, g1.var * g1.corr
    return np.array([y.var * one, y.var * y.corr * one, g0.var * one, (g1.var - g0.var) * one,
                     c0 * one, (c1 - c0) * one], dtype=np.float64)


# ---------------------------------------------------------------------------------------
# Chebyshev tables in the token correlation
# ---------------------------------------------------------------------------------------

# Chebyshev-Lobatto nodes and their barycentric weights: the predictor's (model/tables.py)
_lobatto = _cheb
_weights = _bary_weights


def _interp(x, nodes, w, values):
    """Barycentric interpolation of each row of ``values`` (k, n) at scalar or array x."""
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    diff = x[:, None] - nodes[None, :]
    exact = diff == 0
    diff = np.where(exact, 1.0, diff)
    c = w[None, :] / diff
    out = (values @ c.T) / c.sum(axis=1)
    hit = exact.any(axis=1)
    if hit.any():
        out[:, hit] = values[:, np.argmax(exact[hit], axis=1)]
    return out


class CorrTable:
    """Rows of ``fn(r)`` (shape (k, len(r))) for r in [0, R_MAX], interpolated in
    t = sqrt(1 - r): the rules have square-root behaviour at r = 1 (the arc-cosine kernel's
    sqrt(1 - r^2), the attention logit variance proportional to 1 - r), which is smooth in t.
    r = 1 itself is excluded: the attention backward is discontinuous there (the query and
    key paths vanish with the logit variance); callers evaluate r > R_MAX directly."""

    def __init__(self, fn, tol: float = 1e-7, max_nodes: int = 257):
        def f(t):
            return fn(np.clip(1 - t * t, 0.0, 1.0))

        n = 9
        lo = T_MIN
        nodes = _lobatto(n, lo, 1.0)
        vals = np.asarray(f(nodes), dtype=np.float64)
        self.evaluations = n
        self.error = math.inf
        while True:
            m = 2 * n - 1
            fine = _lobatto(m, lo, 1.0)
            new = fine[1::2]
            new_vals = np.asarray(f(new), dtype=np.float64)
            self.evaluations += new.size
            pred = _interp(new, nodes, _weights(n), vals)
            scale = np.maximum(np.max(np.abs(vals), axis=1, keepdims=True), 1e-300)
            err = float(np.max(np.abs(pred - new_vals) / scale))
            merged = np.empty((vals.shape[0], m))
            merged[:, 0::2], merged[:, 1::2] = vals, new_vals
            nodes, vals, n = fine, merged, m
            self.error = err
            if err <= tol or m >= max_nodes:
                break
        self.nodes, self.values, self.w = nodes, vals, _weights(n)

    def __call__(self, r) -> np.ndarray:
        """Interpolated rows at r (scalar: shape (k,); array: (k, len))."""
        scalar = np.ndim(r) == 0
        t = np.sqrt(np.clip(1 - np.asarray(r, dtype=np.float64), T_MIN**2, 1.0))
        out = _interp(t, self.nodes, self.w, self.values)
        return out[:, 0] if scalar else out


class BranchTable:
    """One branch kind at reference stds and a reference input (mean 0, variance ``var``):
    rows per unit of the homogeneous scale, as functions of the input correlation."""

    def __init__(self, kind: str, g: Geometry, var: float, stds: dict):
        self.kind, self.g, self.var, self.stds = kind, g, var, dict(stds)
        self.table = CorrTable(lambda r: branch_rows(kind, g, Forward(0 * r, var + 0 * r, r), self.stds))

    def covers(self, x: Forward, stds: dict) -> bool:
        return (x.mean == 0 and abs(x.var / self.var - 1) <= 1e-12 and 0 <= x.corr <= R_MAX
                and all(abs(stds[k] - self.stds[k]) <= 1e-14 * max(abs(self.stds[k]), 1e-300) for k in self.stds))

    def rows(self, r: float) -> np.ndarray:
        return self.table(r)


def rows_at(table: BranchTable | None, kind: str, g: Geometry, x: Forward, stds: dict) -> np.ndarray:
    """Rows at one input state: from the table when it covers the state, else the rules."""
    if table is not None and table.covers(x, stds):
        return table.rows(float(x.corr))
    return branch_rows(kind, g, Forward(float(x.mean), float(x.var), float(x.corr)), stds)
