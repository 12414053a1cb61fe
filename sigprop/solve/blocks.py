"""Numeric side of the solver: the model's branches, as its block description
(:mod:`sigprop.model.blocks`) gives them, evaluated through the registered rules with the
weight stds as parameters.

A branch is what a residual unit adds to the stream before its branch scale: the rule chain
of :func:`sigprop.model.blocks.branch_chain` (attention; an FFN, plain or gated), then the
hidden dropout (docs/formats.md).  :class:`Chains` finds, once per model, where each weight's
std sits in that chain (a copy of the model whose weights carry distinct marker stds), so
that the solver can evaluate the chain at any stds without knowing the chain's rules: every
other parameter of the chain (the attention's, whatever the rule takes) passes through as
the block description gives it.

At initialisation (zero biases) a branch's output variance is, for a fixed logit variance,
often homogeneous in its free weight stds (attention: sigma_v^2 sigma_o^2, the value and
output projections acting after the softmax; a ReLU FFN: sigma_in^2 sigma_out^2, a ReGLU FFN
sigma_gate^2 sigma_up^2 sigma_down^2); :func:`homogeneity` checks it on the rules.  So a
branch's output variance, output covariance and the linear coefficients of its backward map
depend on the input token correlation r alone (at fixed stds and input variance).  They are
tabulated once per solve on Chebyshev-Lobatto nodes in sqrt(1 - r) (:class:`BranchTable`, an
interpolation table of :mod:`sigprop.model.tables`: one vectorised evaluation of the rules per
node set; nested node sets, refined until the interpolant matches the rules at the new nodes
to the "solver" accuracy class, 1e-7 of each row's largest value) and interpolated along the
depth recursion.  States a table was not
built for (a first layer whose input mean or variance differs) are evaluated directly.

Only the forward rows (output variance and covariance) are tabulated: the solved model's
gradient comes from the prediction engine.  For explanations, :func:`branch_rows` with
``backward=True`` also gives the backward map, which is linear in the upstream gradient's
second moments: for an upstream gradient of variance 1 and token correlation rg, the
gradient at the branch input has variance B0 + rg B1 and covariance C0 + rg C1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sigprop.model import blocks as model_blocks
from sigprop.model import store
from sigprop.model.spec import KINDS, Sublayers
from sigprop.model.tables import InterpTable, tolerance
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
    """The numbers of a model the derivation prints (widths, dropouts, kinds)."""

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
    ffn_kind: str = "mlp"
    norm: str = "layernorm"

    @property
    def width(self) -> int:
        return self.n_heads * self.d_head


def geometry(model) -> Geometry:
    return Geometry(model.d_model, model.n_heads, model.d_head, model.d_ff, model.seq_len,
                    model.dropout.attention, model.dropout.hidden, model.dropout.ffn_inner,
                    model.activation, bool(model.causal), model.ffn_kind, model.norm)


def structure(model) -> tuple:
    """Everything of a model that shapes its branch chains and norms except the weight stds
    and the residual layout: equal for two models whose branches differ only in their stds."""
    return (geometry(model), model.norm_eps, model.n_kv_heads, model.rope, model.qk_norm)


#: the free weights of a branch, solved for one common std s (the symmetric choice); the
#: attention's q and k are fixed by the logit variance instead
FREE = {"attention": ("v", "o")}


def free_weights(model, kind: str) -> tuple[str, ...]:
    return FREE.get(kind, model.sublayer_columns(kind).names)


def _is_weight_std(key: str) -> bool:
    return key.endswith("_std") and not (key == "b_std" or key.endswith("_b_std") or key.endswith("_bias_std"))


class Chains:
    """The branch chains of ``model`` (:func:`sigprop.model.blocks.branch_chain`, then the
    hidden dropout) with the weight stds as parameters and zero biases.

    The slot of each weight's std in a chain is found on a one-layer copy of the model whose
    weights carry distinct marker stds (1 + i/64): a parameter named ``*_std`` (not a bias)
    holding a marker is that weight's.  Every weight must be found exactly once.  Assumes
    that a branch's parameters other than its weight stds and biases (widths, dropouts, the
    attention's settings) are the model's, the same in every layer, as the block
    description gives them; ``l`` is kept for the callers' bookkeeping."""

    def __init__(self, model):
        self.model = model
        self.names = {kind: model.sublayer_columns(kind).names for kind in KINDS}
        self.markers = {kind: {w: 1.0 + (i + 1) / 64 for i, w in enumerate(self.names[kind])} for kind in KINDS}
        one = model.truncated(1)
        subl = {}
        for kind in KINDS:
            s = one.sublayer_columns(kind)
            subl[kind] = Sublayers(kind, s.placement, s.skip_scale, s.branch_scale, s.norm_scale,
                                   self.markers[kind], {w: 0.0 for w in self.names[kind]})
        self._probe = one.replace(**subl)
        self.p_hid = float(model.dropout.hidden)
        self._templates: dict = {}

    def template(self, kind: str, l: int) -> tuple[list, list]:
        """(chain with the marker stds, [(op index, key, weight)]) of layer ``l`` (the same
        for every layer: see the class doc)."""
        hit = self._templates.get(kind)
        if hit is None:
            chain = model_blocks.branch_chain(self._probe, kind, 0)
            by_value = {v: w for w, v in self.markers[kind].items()}
            slots = [(i, k, by_value[v]) for i, (_, prm) in enumerate(chain) for k, v in prm.items()
                     if _is_weight_std(k) and isinstance(v, float) and v in by_value]
            found = sorted(w for _, _, w in slots)
            if found != sorted(self.names[kind]):
                raise RuntimeError(f"the {kind} chain's weight std parameters {found} do not match its weights "
                                   f"{sorted(self.names[kind])}")
            hit = self._templates[kind] = (chain, slots)
        return hit

    def key(self, kind: str, stds: dict) -> tuple:
        """A hashable key of the ``kind`` chain at ``stds`` (to 15 decimals: stds computed
        from input variances equal to rounding share a key)."""
        return (kind, tuple(sorted((w, round(v, 15)) for w, v in stds.items())))

    def chain(self, kind: str, l: int, stds: dict) -> tuple:
        """Layer ``l``'s ``kind`` branch at weight stds ``stds`` (every weight of the kind),
        zero biases, then the hidden dropout: a tuple of (rule, params)."""
        chain, slots = self.template(kind, l)
        out = [(rule, dict(prm)) for rule, prm in chain]
        for i, k, w in slots:
            out[i][1][k] = stds[w]
        out.append(("dropout", dict(p=self.p_hid)))
        return tuple(out)

    def symbolic(self, kind: str, l: int, stds: dict, dims: dict, p_inner, p_hidden) -> tuple:
        """The chain with sympy symbols: the weight stds from ``stds`` (weight -> symbol),
        integer widths equal to d_model or d_ff from ``dims`` ({d_model value: symbol,
        d_ff value: symbol}; d_model first where they are equal), the branch's own dropout
        probabilities ``p_inner`` and the hidden dropout ``p_hidden``."""
        chain, slots = self.template(kind, l)
        out = [(rule, dict(prm)) for rule, prm in chain]
        for i, k, w in slots:
            out[i][1][k] = stds[w]
        for rule, prm in out:
            for k, v in prm.items():
                if isinstance(v, int) and not isinstance(v, bool) and k.startswith("d_") and v in dims:
                    prm[k] = dims[v]
            if rule == "dropout":
                prm["p"] = p_inner
        out.append(("dropout", dict(p=p_hidden)))
        return tuple(out)


def branch(chain, x: Forward, grad: Backward | None):
    """Forward and backward of one branch chain through the registered rules; arrays
    broadcast.  Returns (Forward at the branch output, Backward at the branch input, or None
    when ``grad`` is None)."""
    states = []
    h = x
    for name, prm in chain:
        states.append(h)
        h, _ = get(name).evaluate(h, None, **prm)
    if grad is None:
        return h, None
    gb = grad
    for (name, prm), xin in zip(reversed(chain), reversed(states)):
        _, gb = get(name).evaluate(xin, gb, **prm)
    return h, gb


def branch_rows(chain, x: Forward, backward: bool = False) -> np.ndarray:
    """Rows of a branch chain at input state(s) ``x``: (var, cov) of its output, and with
    ``backward`` also (B0, B1, C0, C1).  The output covariance rather than the correlation,
    because cov is smooth in r where the correlation cov/var has a nearby pole (attention at
    r -> 0: var ~ r + 1/L)."""
    one = np.ones(np.broadcast(x.mean, x.var, x.corr).shape)
    if not backward:
        y, _ = branch(chain, x, None)
        return np.array([y.var * one, y.var * y.corr * one], dtype=np.float64)
    y, g0 = branch(chain, x, Backward(one, 0 * one))
    _, g1 = branch(chain, x, Backward(one, one))
    c0, c1 = g0.var * g0.corr, g1.var * g1.corr
    return np.array([y.var * one, y.var * y.corr * one, g0.var * one, (g1.var - g0.var) * one,
                     c0 * one, (c1 - c0) * one], dtype=np.float64)


def homogeneity(chains: Chains, kind: str, l: int, x: Forward, stds: dict, free=None) -> tuple[bool, float]:
    """Whether the branch's output variance is homogeneous of degree 2 k in the ``free``
    weight stds (k of them) at input ``x``, checked on the rules: doubling them multiplies
    the variance by 4^k to 1e-9.  Returns (homogeneous, the measured ratio)."""
    free = free_weights(chains.model, kind) if free is None else free
    y1, _ = branch(chains.chain(kind, l, stds), x, None)
    y2, _ = branch(chains.chain(kind, l, {**stds, **{w: 2 * stds[w] for w in free}}), x, None)
    ratio = float(y2.var) / float(y1.var)
    return abs(ratio / 4.0 ** len(free) - 1) <= 1e-9, ratio


# ---------------------------------------------------------------------------------------
# Chebyshev tables in the token correlation
# ---------------------------------------------------------------------------------------

class BranchTable(InterpTable):
    """One branch chain (fixed stds) at a reference input (mean 0, variance ``var``): its
    forward rows (:data:`ROWS`) as functions of the input correlation r in [0, R_MAX], a
    :class:`sigprop.model.tables.InterpTable` in t = sqrt(1 - r) (the rules have square-root
    behaviour at r = 1, smooth in t) over [T_MIN, 1], built nested from 9 Lobatto nodes
    (9 -> 17 -> 33 ..., each refinement checked at the nodes it adds, up to 257 nodes) in the
    "solver" accuracy class, each row's floor its largest value.  r = 1 itself is excluded:
    the attention backward is discontinuous there (the query and key paths vanish with the
    logit variance); :func:`rows_at` evaluates r > R_MAX directly, and :meth:`rows` does
    wherever the build failed (a DomainError in the table's range, or no grid passing).
    Kept in the on-disk store (sigprop.model.store), keyed by the chain and ``var``."""

    VARIABLE = "sqrt(1-r)"
    ACCURACY = "solver"
    GRIDS = ((9,), (17,), (33,), (65,), (129,))
    CHECKS = ("lobatto",)
    NESTED = True
    LABEL = "sigprop: building a branch table of the solver"
    k = len(ROWS)

    def __init__(self, chain, var: float, key=None):
        self.chain, self.var, self.key = tuple(chain), var, key
        skey = store.key("branch", self.chain, float(var), tolerance(self.ACCURACY), T_MIN, self.GRIDS)
        self._setup([(T_MIN, 1.0)], skey)

    def _compute(self, t: np.ndarray) -> np.ndarray:
        r = self.corr_of(t)
        return branch_rows(self.chain, Forward(0 * r, self.var + 0 * r, r))

    def _floor(self, vals: np.ndarray) -> np.ndarray:
        return np.max(np.abs(vals), axis=1)

    def covers(self, x: Forward, key) -> bool:
        """Whether the table serves input ``x`` of the chain with key ``key`` (Chains.key)."""
        return (x.mean == 0 and abs(x.var / self.var - 1) <= 1e-12 and 0 <= x.corr <= R_MAX
                and key == self.key)

    def rows(self, r: float) -> np.ndarray:
        """The rows at input correlation ``r`` (interpolated; evaluated where the build failed)."""
        if not self.ok:
            return branch_rows(self.chain, Forward(0.0, self.var, float(r)))
        return self.interp(self.x_of(r))


def rows_at(table: BranchTable | None, chain, x: Forward, key=None) -> np.ndarray:
    """Rows at one input state: from the table when it covers the state (``key``: the
    chain's, Chains.key), else the rules."""
    if table is not None and table.covers(x, key):
        return table.rows(float(x.corr))
    return branch_rows(chain, Forward(float(x.mean), float(x.var), float(x.corr)))
