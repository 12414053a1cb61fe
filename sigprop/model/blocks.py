"""The block description: what a model's layers compute, as data.

A layer is a sequence of :class:`Residual` units (sequential blocks: one per sublayer; a
parallel block: one unit whose branches are summed).  A unit is

    x' = Post( a x + sum_i b_i * Out_i(Dropout_hidden(F_i(n_i * In(x)))) )

where ``In`` (``in_norm``), ``Out_i`` (``Branch.out_norm``) and ``Post`` (``post_norm``) are
the model's norm (LayerNorm or RMSNorm, gain 1) where the flag is set and the identity
elsewhere; ``n_i`` applies only after an input norm.  Every placement of the model object is
one setting of the three flags (:data:`PLACEMENT_NORMS`), and a branch ``F_i`` is a chain of
component rules (:func:`branch_chain`): a new norm, activation or FFN kind is a rule plus a
line here, a new block layout a new way of filling these records.

The predictor (:mod:`sigprop.model.predict`) interprets this description; nothing else in
the model layer names a placement or an order of sublayers.
"""

from __future__ import annotations

from typing import NamedTuple

from sigprop import registry
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
    branch scale b, norm scale n (used after an input norm only) and output norm."""

    kind: str
    layer: int
    scale: float
    norm_scale: float
    out_norm: bool


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


def layer_units(model, l: int, cols: dict | None = None) -> tuple:
    """The residual units of layer ``l`` (0-based).  ``cols``: the per-layer columns as
    Python lists (:func:`columns`), for speed in long loops."""
    cols = columns(model) if cols is None else cols
    if model.block == "parallel":
        place, a, _, n = (cols["attention"][k] for k in ("placement", "skip", "branch", "norm"))
        branches = tuple(Branch(kind, l, cols[kind]["branch"][l], n[l], False) for kind in ("attention", "ffn"))
        return (Residual("block", l, a[l], True, branches, False),)
    out = []
    for kind in ("attention", "ffn"):
        c = cols[kind]
        pre, on, post = _BY_CODE[c["placement"][l]]
        out.append(Residual(kind, l, c["skip"][l], pre, (Branch(kind, l, c["branch"][l], c["norm"][l], on),), post))
    return tuple(out)


def columns(model) -> dict:
    """kind -> the placement codes and scales of every layer, as Python lists."""
    out = {}
    for kind in ("attention", "ffn"):
        s = getattr(model, kind)
        out[kind] = {"placement": s.placement.tolist(), "skip": s.skip_scale.tolist(),
                     "branch": s.branch_scale.tolist(), "norm": s.norm_scale.tolist()}
    return out


def points_per_layer(model) -> int:
    """Trace points per layer: one per residual unit."""
    return 1 if model.block == "parallel" else 2


def ffn_chain(model, std: dict, bias_std: dict, d=None, d_ff=None, p_inner=None) -> list:
    """The FFN's rule chain for weight stds ``std`` and bias stds ``bias_std`` (by weight
    name; numbers or sympy symbols), the model's widths and inner dropout unless given:
    linear, activation, inner dropout, linear; a gated FFN: the GLU rule of its activation,
    inner dropout, the down projection."""
    m = model
    d = m.d_model if d is None else d
    d_ff = m.d_ff if d_ff is None else d_ff
    p_inner = m.dropout.ffn_inner if p_inner is None else p_inner
    if m.ffn_kind == "glu":
        return [(registry.activation(m.activation).glu, dict(d_in=d, d_ff=d_ff, gate_std=std["gate"], up_std=std["up"],
                                               gate_b_std=bias_std["gate"], up_b_std=bias_std["up"])),
                ("dropout", dict(p=p_inner)),
                ("linear", dict(d_in=d_ff, d_out=d, w_std=std["down"], b_std=bias_std["down"]))]
    return [("linear", dict(d_in=d, d_out=d_ff, w_std=std["in"], b_std=bias_std["in"])),
            (m.activation, {}),
            ("dropout", dict(p=p_inner)),
            ("linear", dict(d_in=d_ff, d_out=d, w_std=std["out"], b_std=bias_std["out"]))]


def branch_chain(model, kind: str, l: int) -> list:
    """The rule chain of sublayer ``kind`` in layer ``l`` (0-based) without its norm scale and
    hidden dropout, as (rule name, parameter dict) pairs: the attention rule, or
    :func:`ffn_chain`."""
    m = model
    s = getattr(m, kind)

    def w(name):
        return float(s.std[name][l]), float(s.bias_std[name][l])

    if kind == "attention":
        params = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len,
                      p=m.dropout.attention, causal=int(bool(m.causal)))
        for name in ("q", "k", "v", "o"):
            params[f"{name}_std"], params[f"{name}_bias_std"] = w(name)
        # the modern attention features, only where used (a plain model's parameters, and so
        # its tables' keys, stay as they were)
        if m.n_kv_heads != m.n_heads:
            params["kv_heads"] = m.n_kv_heads
        if m.qk_norm is not None:
            params["qk_norm"] = registry.norm(m.qk_norm).qk_code
            params["qk_eps"] = m.norm_eps
        if m.rope is not None:
            params["rope"] = m.rope
        if m.attn_softcap is not None:
            params["softcap"] = m.attn_softcap
        return [("attention", params)]
    return ffn_chain(m, {n: float(s.std[n][l]) for n in s.names}, {n: float(s.bias_std[n][l]) for n in s.names})


def layout(model) -> str:
    """The model's block layout in one word: "pre", "post", "peri", "output" (every sublayer
    so placed, sequential blocks), "parallel", or "mixed"."""
    if model.block == "parallel":
        return "parallel"
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
