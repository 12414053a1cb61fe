"""Where sigprop's weights and trace points live in PyTorch models: pure data (no torch import).

A :class:`Layout` names, relative to one block (``layers.{i}``, ``h.{i}``, ...), the module
that holds each of sigprop's weight matrices (attention q, k, v, o; FFN in, out or gate, up,
down), how a fused matrix is split, and which tensors are the residual stream after each
sublayer (the trace points).  :func:`layout` returns the layout of a Hugging Face family
("hf:llama", ...) or of the plain PyTorch layout ("plain", documented in docs/torch.md).

Module paths are matched against ``model.named_modules()``: the block ``layers.0`` is found
at any prefix (``model.layers.0`` in a ``LlamaForCausalLM``, ``layers.0`` in a
``LlamaModel``), so the same layout serves the bare model and the one with a head.

Fused matrices (``Weight.split``):

* ``("cols", k, n)``: the k-th of n equal column blocks of the stored weight (GPT-2's
  ``Conv1D`` stores (in, out); ``c_attn`` holds q, k, v as its column blocks 0, 1, 2);
* ``("rows", k, n)``: the k-th of n equal row blocks of an ``nn.Linear`` weight (Phi-3's
  ``gate_up_proj``: gate, then up);
* ``("qkv", k, 3)``: q, k, v stacked by rows, q with the query heads, k and v with the
  key/value heads (Phi-3's ``qkv_proj``: rows [0, H dh) q, the next Hkv dh k, the last v);
* ``("heads", k, n)``: rows interleaved per head (GPT-NeoX's ``query_key_value``, an
  ``nn.Linear`` (3 d, d) whose output is viewed as (heads, 3 d_head): for head h rows
  ``h*3*dh + k*dh .. h*3*dh + (k+1)*dh`` hold q (k = 0), k (1), v (2)).

Trace points (``Layout.points``): for every sublayer kind ("attention", "ffn" or "block") the
module and whether the residual stream is its input (``"in"``: the first positional argument
or the ``hidden_states`` keyword) or its output (``"out"``: the tensor, or the first element
of a tuple).  The stream entering layer 1 is the input of block 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sigprop.errors import DomainError
from sigprop.model.spec import PLACEMENTS

_PRE, _POST = PLACEMENTS.index("pre"), PLACEMENTS.index("post")
#: the weights that produce a branch's output (a branch scale folds into them)
OUTPUT_WEIGHTS = frozenset({"o", "out", "down"})


@dataclass(frozen=True)
class Weight:
    path: str                              # module path under the block
    split: tuple | None = None             # None, ("cols", k, n) or ("heads", k, n)


@dataclass(frozen=True)
class Layout:
    name: str                              # "hf:llama", "plain", ...
    block: str                             # the block's path with {} for the layer index
    weights: dict                          # sublayer kind -> {sigprop weight name: Weight}
    points: dict                           # "attention"/"ffn"/"block" -> (module under the block, "in"|"out")
    #: what a norm's weight holds at gain 1: 1.0 (x_hat * w) or 0.0 (Gemma: x_hat * (1 + w))
    norm_gain_weight: float = 1.0
    #: the block's attention module (its q/k are read for the logit variance)
    attention: str | None = None
    notes: tuple = field(default_factory=tuple)
    #: sublayer kind -> {"skip_scale"|"branch_scale"|"norm_scale": block attribute} (plain
    #: layout: the block multiplies by these floats); None: the scales must be folded or 1
    scales: dict | None = None
    #: why a sigprop init cannot be written into this family's modules (None: it can)
    init_refused: str | None = None

    def weight_paths(self, kind: str) -> dict:
        return self.weights[kind]


def _w(path, split=None) -> Weight:
    return Weight(path, split)


_LLAMA_ATT = {"q": _w("self_attn.q_proj"), "k": _w("self_attn.k_proj"), "v": _w("self_attn.v_proj"),
              "o": _w("self_attn.o_proj")}
_LLAMA_GLU = {"gate": _w("mlp.gate_proj"), "up": _w("mlp.up_proj"), "down": _w("mlp.down_proj")}

#: Hugging Face families (model_type) -> layout; module names from transformers' modeling code
HF: dict[str, Layout] = {
    "gpt2": Layout(
        "hf:gpt2", "h.{}",
        {"attention": {"q": _w("attn.c_attn", ("cols", 0, 3)), "k": _w("attn.c_attn", ("cols", 1, 3)),
                       "v": _w("attn.c_attn", ("cols", 2, 3)), "o": _w("attn.c_proj")},
         "ffn": {"in": _w("mlp.c_fc"), "out": _w("mlp.c_proj")}},
        {"attention": ("ln_2", "in"), "ffn": ("", "out")}, attention="attn",
        notes=("GPT-2's Conv1D stores its weight as (in, out): q, k, v are the column blocks of attn.c_attn",)),
    "bert": Layout(
        "hf:bert", "encoder.layer.{}",
        {"attention": {"q": _w("attention.self.query"), "k": _w("attention.self.key"),
                       "v": _w("attention.self.value"), "o": _w("attention.output.dense")},
         "ffn": {"in": _w("intermediate.dense"), "out": _w("output.dense")}},
        {"attention": ("attention.output", "out"), "ffn": ("", "out")}, attention="attention.self"),
    "llama": Layout("hf:llama", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                    {"attention": ("post_attention_layernorm", "in"), "ffn": ("", "out")}, attention="self_attn"),
    "gpt_neox": Layout(
        "hf:gpt_neox", "layers.{}",
        {"attention": {"q": _w("attention.query_key_value", ("heads", 0, 3)),
                       "k": _w("attention.query_key_value", ("heads", 1, 3)),
                       "v": _w("attention.query_key_value", ("heads", 2, 3)), "o": _w("attention.dense")},
         "ffn": {"in": _w("mlp.dense_h_to_4h"), "out": _w("mlp.dense_4h_to_h")}},
        {"attention": ("post_attention_layernorm", "in"), "ffn": ("", "out"), "block": ("", "out")},
        attention="attention",
        notes=("GPT-NeoX's query_key_value output is viewed as (heads, 3 d_head): q, k, v interleave per head",)),
    "gptj": Layout(
        "hf:gptj", "h.{}",
        {"attention": {"q": _w("attn.q_proj"), "k": _w("attn.k_proj"), "v": _w("attn.v_proj"),
                       "o": _w("attn.out_proj")},
         "ffn": {"in": _w("mlp.fc_in"), "out": _w("mlp.fc_out")}},
        {"block": ("", "out")}, attention="attn"),
    "olmo2": Layout("hf:olmo2", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                    {"attention": ("mlp", "in"), "ffn": ("", "out")}, attention="self_attn"),
    "gemma2": Layout("hf:gemma2", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                     {"attention": ("pre_feedforward_layernorm", "in"), "ffn": ("", "out")},
                     norm_gain_weight=0.0, attention="self_attn"),
}
for _fam in ("mistral", "qwen2"):
    HF[_fam] = Layout(f"hf:{_fam}", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                      HF["llama"].points, attention="self_attn")
HF["gemma3_text"] = Layout("hf:gemma3_text", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                           HF["gemma2"].points, norm_gain_weight=0.0, attention="self_attn")

# -- the later families ----------------------------------------------------------
for _fam in ("qwen3", "smollm3"):
    HF[_fam] = Layout(f"hf:{_fam}", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                      HF["llama"].points, attention="self_attn")
HF["gemma"] = Layout("hf:gemma", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU}, HF["llama"].points,
                     norm_gain_weight=0.0, attention="self_attn")
HF["olmo3"] = Layout("hf:olmo3", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU}, HF["olmo2"].points,
                     attention="self_attn")
HF["roberta"] = Layout("hf:roberta", HF["bert"].block, HF["bert"].weights, HF["bert"].points,
                       attention="attention.self")
HF["distilbert"] = Layout(
    "hf:distilbert", "transformer.layer.{}",
    {"attention": {"q": _w("attention.q_lin"), "k": _w("attention.k_lin"), "v": _w("attention.v_lin"),
                   "o": _w("attention.out_lin")},
     "ffn": {"in": _w("ffn.lin1"), "out": _w("ffn.lin2")}},
    {"attention": ("sa_layer_norm", "out"), "ffn": ("", "out")}, attention="attention")
HF["starcoder2"] = Layout("hf:starcoder2", "layers.{}",
                          {"attention": _LLAMA_ATT, "ffn": {"in": _w("mlp.c_fc"), "out": _w("mlp.c_proj")}},
                          HF["llama"].points, attention="self_attn")
HF["phi3"] = Layout(
    "hf:phi3", "layers.{}",
    {"attention": {"q": _w("self_attn.qkv_proj", ("qkv", 0, 3)), "k": _w("self_attn.qkv_proj", ("qkv", 1, 3)),
                   "v": _w("self_attn.qkv_proj", ("qkv", 2, 3)), "o": _w("self_attn.o_proj")},
     "ffn": {"gate": _w("mlp.gate_up_proj", ("rows", 0, 2)), "up": _w("mlp.gate_up_proj", ("rows", 1, 2)),
             "down": _w("mlp.down_proj")}},
    HF["llama"].points, attention="self_attn",
    notes=("Phi-3's qkv_proj stacks the rows of q (heads x head_dim), k and v (kv heads x head_dim each); "
           "gate_up_proj the rows of gate, then up",))
HF["cohere"] = Layout("hf:cohere", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                      {"block": ("", "out")}, attention="self_attn")
HF["stablelm"] = Layout("hf:stablelm", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU},
                        {"attention": ("post_attention_layernorm", "in"), "ffn": ("", "out"), "block": ("", "out")},
                        attention="self_attn")
HF["phi"] = Layout("hf:phi", "layers.{}",
                   {"attention": {"q": _w("self_attn.q_proj"), "k": _w("self_attn.k_proj"),
                                  "v": _w("self_attn.v_proj"), "o": _w("self_attn.dense")},
                    "ffn": {"in": _w("mlp.fc1"), "out": _w("mlp.fc2")}},
                   {"block": ("", "out")}, attention="self_attn")
HF["granite"] = Layout(
    "hf:granite", "layers.{}", {"attention": _LLAMA_ATT, "ffn": _LLAMA_GLU}, HF["llama"].points,
    attention="self_attn",
    init_refused=("Granite multiplies its branches by residual_multiplier and its logits by attention_multiplier "
                  "in the forward pass; sigprop's model of it holds them as the branch scale and W_q's std, so its "
                  "stds are not the module weights' (writing a sigprop init into Granite is not supported)"))
HF["falcon"] = Layout(
    "hf:falcon", "h.{}",
    {"attention": {"o": _w("self_attention.dense")},
     "ffn": {"in": _w("mlp.dense_h_to_4h"), "out": _w("mlp.dense_4h_to_h")}},
    {"attention": ("post_attention_layernorm", "in"), "ffn": ("", "out"), "block": ("", "out")},
    attention=None,
    notes=("Falcon computes its attention logits inline (no eager_attention_forward to probe): the measured "
           "logit variance is not read; its query_key_value fuses q, k and v in a layout that depends on the "
           "config (multi_query, new_decoder_architecture)",),
    init_refused=("Falcon's query_key_value holds q, k and v in a layout that depends on multi_query and "
                  "new_decoder_architecture; writing a sigprop init into Falcon is not supported"))

#: the plain PyTorch layout (docs/torch.md): blocks ``layers.{i}`` with ``attn.{q,k,v,o}``,
#: ``ffn.{in,out}`` or ``ffn.{gate,up,down}`` (nn.Linear, weight (out, in)), a ``mid``
#: module (nn.Identity) applied to the stream between the two sublayers, float attributes
#: ``attn_skip``, ``attn_branch``, ``attn_norm``, ``ffn_skip``, ``ffn_branch``, ``ffn_norm``
#: (the residual and norm scales; a block without them has scales 1), an optional final
#: norm; the model's forward takes the stream entering layer 1, (batch, seq, d_model)
PLAIN = Layout(
    "plain", "layers.{}",
    {"attention": {w: _w(f"attn.{w}") for w in ("q", "k", "v", "o")},
     "ffn": {w: _w(f"ffn.{w}") for w in ("in", "out", "gate", "up", "down")}},
    {"attention": ("mid", "out"), "ffn": ("", "out"), "block": ("", "out")}, attention="attn",
    scales={kind: {f"{what}_scale": f"{short}_{what}" for what in ("skip", "branch", "norm")}
            for kind, short in (("attention", "attn"), ("ffn", "ffn"))})

FAMILIES = tuple(sorted(HF))


def layout(name: str) -> Layout:
    """The layout named ``plain`` or ``hf:FAMILY`` (FAMILY: a Hugging Face model_type in
    :data:`FAMILIES`; the bare family name is accepted too)."""
    if name == "plain":
        return PLAIN
    fam = name[3:] if name.startswith("hf:") else name
    if fam in HF:
        return HF[fam]
    raise DomainError(f"unknown layout {name!r}: plain or hf:FAMILY with FAMILY one of {', '.join(FAMILIES)}")


def require_init(lay: Layout) -> None:
    """DomainError when a sigprop init cannot be written into the layout's modules."""
    if lay.init_refused:
        raise DomainError(f"layout {lay.name}: {lay.init_refused}")


def stream_points(lay: Layout, parallel: bool) -> list[tuple[str, str, str]]:
    """(sublayer kind, module under the block, "in"|"out") of the trace points of one block, in
    order: attention then ffn, or the one "block" point of a parallel block."""
    kinds = ("block",) if parallel else ("attention", "ffn")
    out = []
    for k in kinds:
        if k not in lay.points:
            raise DomainError(f"layout {lay.name} has no trace point for a {k!r} sublayer")
        out.append((k, *lay.points[k]))
    return out


def init_plan(model: Model, scales: bool = False) -> list[dict]:
    """Per layer and sublayer weight: {"layer", "kind", "name", "std", "bias_std"}.

    ``scales`` False (a layout without scale attributes): a branch scale is folded into the
    branch's output weight (exact for the pre and post placements and parallel blocks: b
    multiplies that linear map), and what module weights cannot express is refused
    (DomainError): a skip scale or a norm scale other than 1, a branch scale other than 1 on a
    peri or output placement.  ``scales`` True (the plain layout, whose blocks carry the
    scales as attributes, :func:`scale_plan`): the stds as they are."""
    import numpy as np

    from sigprop.model.spec import require_ordinary_layers

    require_ordinary_layers(model, "the torch init")
    plan = []
    for kind in ("attention", "ffn"):
        s = model.sublayer_columns(kind)
        if not scales:
            for what, col in (("skip_scale", s.skip_scale), ("norm_scale", s.norm_scale)):
                bad = np.flatnonzero(np.asarray(col) != 1.0)
                if bad.size:
                    i = int(bad[0])
                    raise DomainError(f"layer {i + 1} {kind}: {what} {float(col[i]):g} is not a weight of the "
                                      "module (only 1 can be applied; the plain layout carries scales)")
        for i in range(model.n_layers):
            b = float(s.branch_scale[i])
            place = int(s.placement[i])
            if not scales and b != 1.0 and place not in (_PRE, _POST):
                raise DomainError(f"layer {i + 1} {kind}: branch_scale {b:g} on a {PLACEMENTS[place]} placement "
                                  "multiplies a norm's output, not a weight (only 1 can be applied)")
            for name in s.names:
                # |b|: a negative scale flips a zero-mean Gaussian, the same law
                f = abs(b) if (name in OUTPUT_WEIGHTS and not scales) else 1.0
                plan.append({"layer": i, "kind": kind, "name": name, "std": float(s.std[name][i]) * f,
                             "bias_std": float(s.bias_std[name][i]) * f})
    return plan


def scale_plan(model: Model, lay: Layout) -> dict:
    """Block attribute -> per-layer values (floats) of the layout's scale attributes
    (``Layout.scales``; empty where the layout has none)."""
    out = {}
    for kind, attrs in (lay.scales or {}).items():
        s = model.sublayer_columns(kind)
        for what, attr in attrs.items():
            out[attr] = [float(v) for v in getattr(s, what)]
    return out
