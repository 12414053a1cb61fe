"""A reference implementation of the plain PyTorch layout (docs/torch.md), built from a sigprop
model object: what a user's own module in that layout looks like, and a model for
``sigprop measure --module``.

Layout: ``layers[i]`` (:class:`Block`) with ``attn.q``, ``attn.k``, ``attn.v``, ``attn.o`` and
``ffn.in``/``ffn.out`` (or ``ffn.gate``/``ffn.up``/``ffn.down``), all ``nn.Linear``; a ``mid``
``nn.Identity`` on the stream between the two sublayers; float attributes ``attn_skip``,
``attn_branch``, ``attn_norm``, ``ffn_skip``, ``ffn_branch``, ``ffn_norm``; ``norm`` the final
norm (``nn.Identity`` without one).  ``forward(x)`` takes the stream entering layer 1, (batch,
seq, d_model), and returns the top.  Semantics: the model object's (pre, post, peri and
output placements, parallel blocks, MLP or gated FFN, LayerNorm or RMSNorm with gain 1 and
bias 0, causal mask, soft-capped logits (``attn_softcap``), dropout in training mode).  Rotary
positions, QK-norm and grouped-query attention are not implemented here (refused).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sigprop import registry
from sigprop.errors import DomainError
from sigprop.model.spec import require_ordinary_layers
from sigprop.torch.init import apply_init, as_model

def _norm(kind: str, d: int, eps: float) -> nn.Module:
    """The norm kind's torch.nn module (sigprop.registry: its class name)."""
    return getattr(nn, registry.norm(kind).torch)(d, eps=eps)


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, H, dh = m.d_model, m.n_heads, m.d_head
        self.H, self.dh, self.causal, self.p = H, dh, m.causal, m.dropout.attention
        self.softcap = m.attn_softcap            # logits -> c tanh(logits / c) before the mask (None: none)
        self.q, self.k, self.v = (nn.Linear(d, H * dh) for _ in range(3))
        self.o = nn.Linear(H * dh, d)

    def forward(self, h):
        B, L, _ = h.shape
        q, k, v = (f(h).view(B, L, self.H, self.dh).transpose(1, 2) for f in (self.q, self.k, self.v))
        s = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
        if self.softcap is not None:
            s = self.softcap * torch.tanh(s / self.softcap)
        if self.causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool, device=h.device).triu(1), float("-inf"))
        a = nn.functional.dropout(torch.softmax(s, dim=-1), self.p, self.training)
        return self.o((a @ v).transpose(1, 2).reshape(B, L, self.H * self.dh))


class FFN(nn.ModuleDict):
    def __init__(self, m):
        d, f = m.d_model, m.d_ff
        names = {"mlp": (("in", d, f), ("out", f, d)),
                 "glu": (("gate", d, f), ("up", d, f), ("down", f, d))}[m.ffn_kind]
        super().__init__({name: nn.Linear(a, b) for name, a, b in names})
        self.kind, self.act, self.p = m.ffn_kind, getattr(nn.functional, registry.activation(m.activation).torch), m.dropout.ffn_inner

    def forward(self, h):
        if self.kind == "glu":
            u = self.act(self["gate"](h)) * self["up"](h)
            return self["down"](nn.functional.dropout(u, self.p, self.training))
        return self["out"](nn.functional.dropout(self.act(self["in"](h)), self.p, self.training))


class Block(nn.Module):
    def __init__(self, m, layer: int):
        super().__init__()
        d, eps = m.d_model, m.norm_eps
        self.attn, self.ffn, self.mid = Attention(m), FFN(m), nn.Identity()
        self.parallel, self.p = m.block == "parallel", m.dropout.hidden
        self.place = {k: m.sublayer_columns(k).placement_of(layer) for k in ("attention", "ffn")}
        self.norms = nn.ModuleDict({f"{k}_{w}": _norm(m.norm, d, eps) for k in ("attention", "ffn")
                                    for w in ("in", "out")})
        for short, kind in (("attn", "attention"), ("ffn", "ffn")):
            s = m.sublayer_columns(kind)
            setattr(self, f"{short}_skip", float(s.skip_scale[layer]))
            setattr(self, f"{short}_branch", float(s.branch_scale[layer]))
            setattr(self, f"{short}_norm", float(s.norm_scale[layer]))

    def _drop(self, y):
        return nn.functional.dropout(y, self.p, self.training)

    def _sublayer(self, kind, short, f, x):
        a, b, n = getattr(self, f"{short}_skip"), getattr(self, f"{short}_branch"), getattr(self, f"{short}_norm")
        place, nin, nout = self.place[kind], self.norms[f"{kind}_in"], self.norms[f"{kind}_out"]
        if place == "pre":
            return a * x + b * self._drop(f(n * nin(x)))
        if place == "post":
            return nout(a * x + b * self._drop(f(x)))
        if place == "peri":
            return a * x + b * nout(self._drop(f(n * nin(x))))
        return a * x + b * nout(self._drop(f(x)))          # output

    def forward(self, x):
        if self.parallel:
            h = self.attn_norm * self.norms["attention_in"](x)
            return (self.attn_skip * x + self.attn_branch * self._drop(self.attn(h))
                    + self.ffn_branch * self._drop(self.ffn(h)))
        x = self.mid(self._sublayer("attention", "attn", self.attn, x))
        return self._sublayer("ffn", "ffn", self.ffn, x)


class PlainTransformer(nn.Module):
    """The plain-layout model of the sigprop model ``spec`` (a Model, a model or solution
    object, or a JSON file), its weights drawn with :func:`sigprop.torch.apply_init` from
    ``spec``'s init (torch's global generator unless ``seed`` is given)."""

    def __init__(self, spec, seed: int | None = None):
        super().__init__()
        m = as_model(spec)
        require_ordinary_layers(m, "the plain reference model")
        for feature in ("rope", "qk_norm", "window", "moe"):
            if getattr(m, feature) is not None:
                raise DomainError(f"the plain reference model does not implement {feature}")
        if m.n_kv_heads != m.n_heads:
            raise DomainError("the plain reference model does not implement grouped-query attention")
        self.layers = nn.ModuleList(Block(m, i) for i in range(m.n_layers))
        self.norm = _norm(m.norm, m.d_model, m.norm_eps) if m.final_norm else nn.Identity()
        apply_init(self, m, layout="plain", seed=seed)

    def forward(self, x):
        for blk in self.layers:
            x = blk(x)
        return self.norm(x)
