"""The block description: what a model's layers compute, as data.

A layer is a sequence of :class:`Residual` units, one per sublayer of the model's list
(``model.slots()``: attention then FFN for the ordinary layer), or for a parallel layer one
unit whose branches are summed.  A unit is

    x' = Post( a x + sum_i b_i * Out_i(Dropout_hidden(F_i(n_i * In(x)))) )

where ``In`` (``in_norm``), ``Out_i`` (``Branch.out_norm``) and ``Post`` (``post_norm``) are
the model's norm (LayerNorm or RMSNorm, gain 1) where the flag is set and the identity
elsewhere; ``n_i`` applies only after an input norm.  Every placement of the model object is
one setting of the three flags (:data:`PLACEMENT_NORMS`); a norm sublayer, x' = n N(x), is the
unit with skip scale 0, an input norm and a branch that is its norm scale alone.  A branch
``F_i`` is the chain of component rules its sublayer kind declares
(:mod:`sigprop.model.sublayers`, :func:`branch_chain`).

The predictor (:mod:`sigprop.model.predict`) interprets this description; nothing else in
the model layer names a placement or an order of sublayers.
"""

from __future__ import annotations

from typing import NamedTuple

from sigprop import registry
from sigprop.model import sublayers
from sigprop.model.spec import PLACEMENTS

#: placement -> (norm before the branch, norm on the branch output, norm after the sum)
PLACEMENT_NORMS = {
    "pre": (True, False, False),        # a x + b Dh(F(n N(x)))
    "post": (False, False, True),       # N(a x + b Dh(F(x)))
    "peri": (True, True, False),        # a x + b N(Dh(F(n N(x))))
    "output": (False, True, False),     # a x + b N(Dh(F(x)))
}
_BY_CODE = tuple(PLACEMENT_NORMS[p] for p in PLACEMENTS)



class Branch(NamedTuple):
    """One branch of a residual unit: sublayer ``kind`` of layer ``layer`` (0-based), its
    branch scale b, norm scale n (used after an input norm only) and output norm; ``slot``:
    its position in the layer's list of sublayers (``model.slots()``); ``tokens``: the
    per-token statistics of its output (None: a norm's where ``out_norm``, else Gaussian-like;
    a norm sublayer's output is its norm's); ``scale_only``: the branch is its norm scale alone
    (a norm sublayer), so the gradient reaching its input norm is the stream's own, with that
    gradient's shares along the directions the norm's Jacobian removes (otherwise a branch's
    Jacobian leaves it isotropic)."""

    kind: str
    layer: int
    scale: float
    norm_scale: float
    out_norm: bool
    slot: int = 0
    tokens: tuple | None = None
    scale_only: bool = False


class Residual(NamedTuple):
    """One residual unit: the trace point it ends in (``label``), skip scale a, the norm
    before its branches, the branches (summed), the norm after the sum."""

    label: str
    layer: int
    skip: float
    in_norm: bool
    branches: tuple
    post_norm: bool


def norm_flags(code: int) -> tuple[bool, bool, bool]:
    """(in, out, post) norm flags of a placement code (spec.PLACEMENTS order)."""
    return _BY_CODE[code]


def layer_units(model, l: int, cols: list | None = None) -> tuple:
    """The residual units of layer ``l`` (0-based), one per sublayer of the layer's list
    (``model.slots()``), or one for a parallel layer, whose branches are summed.  A norm
    sublayer, x' = n N(x), is the unit with skip scale 0, an input norm and a branch that is
    its norm scale alone.  ``cols``: the per-layer columns as Python lists (:func:`columns`),
    for speed in long loops."""
    cols = columns(model) if cols is None else cols
    if model.block == "parallel":
        a, n = cols[0]["skip"], cols[0]["norm"]
        branches = tuple(Branch(c["kind"], l, c["branch"][l], n[l], False, j) for j, c in enumerate(cols))
        return (Residual("block", l, a[l], True, branches, False),)
    out = []
    for j, c in enumerate(cols):
        kind = c["kind"]
        if kind == "norm":
            out.append(Residual(kind, l, 0.0, True, (Branch(kind, l, 1.0, c["norm"][l], False, j, NORM_TOKENS, True),),
                                False))
            continue
        pre, on, post = _BY_CODE[c["placement"][l]]
        out.append(Residual(kind, l, c["skip"][l], pre, (Branch(kind, l, c["branch"][l], c["norm"][l], on, j),),
                            post))
    return tuple(out)


def columns(model) -> list:
    """Per sublayer of a layer's list (``model.slots()``): its kind, and the placement codes
    and scales of every layer, as Python lists."""
    return [{"kind": s.kind, "placement": s.placement.tolist(), "skip": s.skip_scale.tolist(),
             "branch": s.branch_scale.tolist(), "norm": s.norm_scale.tolist()} for s in model.slots()]


def points_per_layer(model) -> int:
    """Trace points per layer: one per residual unit."""
    return 1 if model.block == "parallel" else len(model.slots())


def point_kinds(model) -> tuple:
    """The trace points' sublayer names within one layer, in order."""
    return ("block",) if model.block == "parallel" else tuple(s.kind for s in model.slots())


#: the FFN's rule chain for given weight stds (sigprop.model.sublayers.ffn_chain)
ffn_chain = sublayers.ffn_chain


def unit_chain(model, slot: int, l: int, in_norm: bool, n: float) -> list:
    """The whole rule chain of the branch of sublayer ``slot`` (its position in the layer's
    list) in layer ``l``: after an input norm the norm scale n first; then
    :func:`branch_chain`; then the hidden dropout on the branch output, where the sublayer
    kind has one (sigprop.model.sublayers)."""
    s = model.slots()[slot]
    ops = branch_chain(model, s.kind, l, s)
    if sublayers.get(s.kind).hidden_dropout:
        ops.append(("dropout", dict(p=model.dropout.hidden)))
    if in_norm:
        ops.insert(0, ("residual", dict(a=n, b=0.0)))     # norm scale n
    return ops


def branch_chain(model, kind: str, l: int, cols=None) -> list:
    """The rule chain of sublayer ``kind`` in layer ``l`` (0-based) without its norm scale and
    hidden dropout, as (rule name, parameter dict) pairs: its kind's chain
    (sigprop.model.sublayers).  ``cols``: the sublayer's columns (default: the layer's first
    sublayer of that kind)."""
    return sublayers.get(kind).chain(model, getattr(model, kind) if cols is None else cols, l)


def layout(model) -> str:
    """The model's block layout in one word: "pre", "post", "peri", "output" (every sublayer
    so placed, sequential blocks of attention then FFN), "parallel", or "mixed" (several
    placements, or a layer given as another list of sublayers)."""
    if model.block == "parallel":
        return "parallel"
    if model.sublayers is not None:
        return "mixed"
    used = model.attention.placements() | model.ffn.placements()
    return used.pop() if len(used) == 1 else "mixed"


def norm_params(model, tok: tuple[float, float], g_generic: float = 1.0) -> tuple[str, dict]:
    """The model's norm as (rule name, parameters) for an input whose per-token statistics
    are ``tok`` = (centred share, kappa) (sigprop.rules.layernorm) and an upstream gradient
    with share ``g_generic`` along the directions the norm's Jacobian removes."""
    kind = registry.norm(model.norm)
    return kind.rule, kind.params(model.d_model, model.norm_eps, tok, g_generic)


#: per-token statistics (centred share, kappa) of a norm's output and of a Gaussian-like
#: branch output
NORM_TOKENS = (1.0, 0.0)
GAUSSIAN_TOKENS = (0.0, 1.0)
