"""The sublayer kinds a layer's list holds (``"kind"`` of docs/formats.md): each one an entry that
owns what the whole-model interpreter needs of it, so that the interpreter
(:mod:`sigprop.model.predict`) asks the entry and never what kind it holds.

An entry (:class:`Sublayer`) declares:

* ``chain(model, cols, l)``: its branch as a chain of component rules, (rule name, parameter
  dict) pairs, for layer ``l`` (0-based) of its columns ``cols`` (a ``spec.Sublayers`` or
  ``spec.StreamNorms``), without the norm scale and the hidden dropout;
* ``hidden_dropout``: whether the hidden dropout follows its branch;
* ``mixes_tokens``: its branch mixes the tokens (attention), so a causal model's position
  profile goes through the rule op by op, and a token's own gradient slope is not carried
  into its input norm;
* ``slope_to_norm``: its input norm sees the per-token gradient slope
  (rules.layernorm.token_slope_below: a position-wise branch on a norm);
* ``logit_rule``: the rule of its chain whose logit variance the trace reports and whose
  softmax bounds the rule's domain (None: none);
* ``post_norm_rows``: under a norm after the residual sum, the softmax row statistics its
  Euler terms need (rules.attention.euler_terms);
* ``euler_var(model, cols, l, activation)``: under a norm after the sum, the per-element
  variance of its branch's departure from Euler's identity (None: the branch is taken as
  homogeneous; rules.activation.relu_ffn_euler_var).

A new kind is its entry here (and its rule and Monte Carlo component), registered with
:func:`register`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from sigprop import registry
from sigprop.rules import windows


class Sublayer(NamedTuple):
    """A sublayer kind: what the interpreter asks of it (module docstring)."""

    name: str
    chain: Callable
    hidden_dropout: bool = True
    mixes_tokens: bool = False
    slope_to_norm: bool = False
    logit_rule: str | None = None
    post_norm_rows: bool = False
    euler_var: Callable | None = None


_KINDS: dict[str, Sublayer] = {}


def register(entry: Sublayer) -> Sublayer:
    """Add a sublayer kind (a name registered twice is an error)."""
    if entry.name in _KINDS:
        raise ValueError(f"sublayer kind {entry.name!r} is registered already")
    _KINDS[entry.name] = entry
    return entry


def get(name: str) -> Sublayer:
    return _KINDS[name]


# -- attention ------------------------------------------------------------------------------

def attention_chain(model, cols, l: int) -> list:
    """The attention rule with layer ``l``'s weight stds (and the modern attention features,
    only where used: a plain model's parameters, and so its tables' keys, stay as they were)."""
    m = model
    params = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len,
                  p=m.dropout.attention, causal=int(bool(m.causal)))
    for name in ("q", "k", "v", "o"):
        params[f"{name}_std"], params[f"{name}_bias_std"] = float(cols.std[name][l]), float(cols.bias_std[name][l])
    if m.n_kv_heads != m.n_heads:
        params["kv_heads"] = m.n_kv_heads
    if m.qk_norm is not None:
        params["qk_norm"] = registry.norm(m.qk_norm).qk_code
        params["qk_eps"] = m.norm_eps
    rope = m.rope_of(l)
    if rope is not None:
        params["rope"] = rope
    if m.attn_softcap is not None:
        params["softcap"] = m.attn_softcap
    w = m.window_of(l)
    if windows.active(m.seq_len, w, bool(m.causal)):       # (a window that changes nothing is left out)
        params["window"] = w
    return [("attention", params)]


# -- FFN ------------------------------------------------------------------------------------

def ffn_chain(model, std: dict, bias_std: dict, d=None, d_ff=None, p_inner=None) -> list:
    """The FFN's rule chain for weight stds ``std`` and bias stds ``bias_std`` (by weight
    name; numbers or sympy symbols), the model's widths and inner dropout unless given:
    linear, activation, inner dropout, linear; a gated FFN: the GLU rule of its activation,
    inner dropout, the down projection; a mixture of experts: its rule (:func:`moe_rule`)."""
    m = model
    d = m.d_model if d is None else d
    d_ff = m.d_ff if d_ff is None else d_ff
    p_inner = m.dropout.ffn_inner if p_inner is None else p_inner
    if m.ffn_kind == "moe":
        return [moe_rule(m, std, d)]
    if m.ffn_kind == "glu":
        return [(registry.activation(m.activation).glu, dict(d_in=d, d_ff=d_ff, gate_std=std["gate"], up_std=std["up"],
                                                             gate_b_std=bias_std["gate"], up_b_std=bias_std["up"])),
                ("dropout", dict(p=p_inner)),
                ("linear", dict(d_in=d_ff, d_out=d, w_std=std["down"], b_std=bias_std["down"]))]
    return [("linear", dict(d_in=d, d_out=d_ff, w_std=std["in"], b_std=bias_std["in"])),
            (m.activation, {}),
            ("dropout", dict(p=p_inner)),
            ("linear", dict(d_in=d_ff, d_out=d, w_std=std["out"], b_std=bias_std["out"]))]


def moe_rule(model, std: dict, d=None) -> tuple:
    """A mixture-of-experts FFN (ffn_kind "moe", the model's ``moe``) as its rule
    (sigprop.rules.moe: the experts are the GLU of the model's activation) and parameters."""
    e, d = model.moe, model.d_model if d is None else d
    params = dict(d_in=d, d_ff=e.d_ff_expert, n_experts=e.n_experts, top_k=e.top_k,
                  router=("softmax", "sigmoid").index(e.router), norm_topk=int(e.norm_topk_prob),
                  route_scale=e.route_scale, n_group=e.n_group, topk_group=e.topk_group,
                  router_std=std["router"], gate_std=std["gate"], up_std=std["up"], down_std=std["down"],
                  shared_d_ff=0, shared_gate_std=0.0, shared_up_std=0.0, shared_down_std=0.0, shared_mix=0,
                  shared_mix_std=0.0)           # (every parameter: rules.compose takes them as given)
    if e.d_ff_shared:
        params.update(shared_d_ff=e.d_ff_shared, shared_gate_std=std["shared_gate"], shared_up_std=std["shared_up"],
                      shared_down_std=std["shared_down"])
    if e.shared_mix:
        params.update(shared_mix=1, shared_mix_std=std["shared_mix"])
    return ("moe_" + registry.activation(model.activation).glu, params)


def _ffn_layer_chain(model, cols, l: int) -> list:
    return ffn_chain(model, {n: float(cols.std[n][l]) for n in cols.names},
                     {n: float(cols.bias_std[n][l]) for n in cols.names})


def _ffn_euler_var(model, cols, l: int, activation) -> float | None:
    """A plain FFN's departure from Euler's identity, from its activation's term (None for a
    gated FFN, or an activation without one)."""
    if model.ffn_kind != "mlp" or activation.ffn_euler_var is None:
        return None
    return activation.ffn_euler_var(model.d_ff, float(cols.std["out"][l]), float(cols.bias_std["in"][l]),
                                    float(cols.bias_std["out"][l]), model.dropout.ffn_inner, model.dropout.hidden)


ATTENTION = register(Sublayer("attention", attention_chain, mixes_tokens=True, logit_rule="attention",
                              post_norm_rows=True))
FFN = register(Sublayer("ffn", _ffn_layer_chain, slope_to_norm=True, euler_var=_ffn_euler_var))
#: a norm of the stream, x' = n N(x): a unit whose branch is its norm scale alone
NORM = register(Sublayer("norm", lambda model, cols, l: [], hidden_dropout=False))


# -- cross-attention (the decoder of an encoder-decoder model, sigprop.model.encdec) --------

def cross_attention_chain(model, cols, l: int) -> list:
    """The cross-attention rule (sigprop.rules.cross_attention, query side) with layer ``l``'s
    weight stds; the encoder output's state and length come from the decoder's notes
    (``encoder_output``, ``encoder_seq_len``: set by sigprop.model.encdec).  No rotary positions;
    the stack's QK-norm on its queries and keys."""
    from sigprop.errors import DomainError

    m = model
    e, lk = m.notes.get("encoder_output"), m.notes.get("encoder_seq_len")
    if e is None or lk is None:
        raise DomainError("a cross_attention sublayer reads an encoder's output: predict the encoder-decoder model "
                          "(sigprop.model.encdec), not its decoder alone")
    params = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len, L_enc=int(lk),
                  p=m.dropout.attention, enc_mean=float(e.mean), enc_var=float(e.var), enc_corr=float(e.corr))
    for name in ("q", "k", "v", "o"):
        params[f"{name}_std"], params[f"{name}_bias_std"] = float(cols.std[name][l]), float(cols.bias_std[name][l])
    if m.qk_norm is not None:
        params["qk_norm"] = registry.norm(m.qk_norm).qk_code
        params["qk_eps"] = m.norm_eps
    return [("cross_attention", params)]


CROSS_ATTENTION = register(Sublayer("cross_attention", cross_attention_chain, logit_rule="cross_attention"))
