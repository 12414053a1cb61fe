"""Architecture and initialisation presets: options -> a fully resolved
:class:`sigprop.model.spec.Model` (docs/presets.md lists every formula and source).

``resolve(arch="preln", init=None, n_layers=N, **options)``.  The defaults are the
DeepScaleLM paper's figure model ([TGS] Kedia et al. 2024, arXiv:2403.09635): width 1024,
16 heads of 64, FFN 4096 with ReLU, 256 tokens, dropout 0.1 on the attention probabilities
and the branch outputs (none inside the FFN), input token correlation r0 (1 - p) with the
measured BERT/Wikipedia embedding correlation r0 = 0.221.  The model presets (``llama``,
``gpt2``, ``bert``, ``olmo2``) bring their own sizes, blocks and dropout (:data:`ARCHS`,
``defaults``), and their stream entering layer 1 is what their token embedding produces
(:func:`embedding_input`).

Architectures (placement and the scales a, b, n of every sublayer; N = n_layers, layer l is
1-based in the formulas):

* ``preln``: x' = x + F(LN x).                         default init ``normal``
* ``postln``: x' = LN(x + F(x)).                       default init ``normal``
* ``dslm``: Pre-LN DSLM, x' = lambda x + beta F(LN x), beta^2 = k/N, lambda^2 = 1 - beta^2.
  default init ``dslm``
* ``dslm-post``: Post-LN DSLM, x' = LN(lambda x + beta F(x)).   default init ``dslm``
* ``deepnorm``: x' = LN(alpha x + F(x)), alpha = (2N)^(1/4) ([DeepNet]).  default ``deepnorm``
* ``lns``: Pre-LN with the norm output of layer l scaled by 1/sqrt(l) ([CoD]).  ``normal``
* ``mixln``: layers 1 .. floor(alpha_mix N) Post-LN, the rest Pre-LN ([MixLN]).  ``normal``
* ``llama``, ``gpt2``, ``bert``, ``olmo2``, ``peri``: a = b = n = 1 with the preset's
  placement (pre, pre, post, output, peri) and blocks.

Every sublayer's placement can be set (``placement``) where the architecture leaves it free;
the block layout (``block``), the norm kind, the FFN kind, grouped-query attention, RoPE,
QK-norm, the final norm and the biases likewise (:data:`OPTIONS`).

Initialisations (std of every weight matrix and bias, per layer): ``normal``, ``xavier``,
``torch-default``, ``scaled``, ``dslm``, ``deepnorm``; see :data:`INITS` and docs/presets.md.
A gated FFN's gate and up projections take what an init gives an MLP's input projection, its
down projection what it gives the output projection.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Callable, Mapping, NamedTuple

import numpy as np

from sigprop import registry
from sigprop.errors import DomainError
from sigprop.model.deepnorm import deepnorm_constants
from sigprop.model.spec import (ACTIVATIONS, BLOCKS, KINDS, MAX_LAYERS, MAX_SEQ_LEN, NORMS, PLACEMENTS, Dropout, Model,
                                Sublayers, TWO_TOKENS, require_two_tokens, weight_names)
from sigprop.state import Backward, Forward

#: measured BERT/Wikipedia embedding token correlation before embedding dropout, hard-coded
#: in the DSLM authors' verification code ([TGS-code], "Embedding")
R0_EMBEDDING = 0.221

#: The default model (no ``dropout`` given) is the DSLM figure model: attention and hidden
#: dropout 0.1 and, like BERT and Megatron-LM, no dropout inside the FFN (the published DSLM
#: stream-correlation constants, limit 0.8347, hold only without it).  A ``dropout`` the user
#: gives explicitly sets all three (the CLI's documented ``--dropout`` semantics);
#: ``ffn_dropout`` etc. override it.
DEFAULT_DROPOUT = 0.1


# ---------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------

class Option(NamedTuple):
    """One resolve() option: its type, default (None: derived or "not given"), and range."""

    name: str
    type: type
    default: object
    doc: str
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False
    choices: tuple | None = None
    cli: str | None = None     # the command-line and config-file name, where it differs
    why: str | None = None     # the reason for its lower bound, said where a value is below it

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--layers`` for ``n_layers``, ``--d-model``."""
        return "--" + (self.cli or self.name).replace("_", "-")

    def check(self, value, label: str = "", prefix: str = ""):
        """The validated, normalised value; otherwise DomainError "{prefix}{label} must ..."
        (``label`` defaults to the option name; ``prefix`` names e.g. a config file)."""
        label = f"{prefix}{label or self.name}"
        if value is None:
            return None
        if self.type is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise DomainError(f"{label} must be true or false, got {value!r}")
            return bool(value)
        if self.type is str:
            if not isinstance(value, str):
                raise DomainError(f"{label} must be a string, got {value!r}")
            if self.choices and value not in self.choices:
                raise DomainError(f"{prefix}unknown {label[len(prefix):]} {value!r}; known: {', '.join(self.choices)}")
            return value
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            kind = "an integer" if self.type is int else "a number"
            raise DomainError(f"{label} must be {kind}, got {value!r}")
        if self.type is int:
            # (4.0 too, as the flags, a TOML file and transformers' configs refuse it)
            if isinstance(value, (float, np.floating)):
                raise DomainError(f"{label} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise DomainError(f"{label} must be finite, got {value!r}")
        bad_lo = self.lo is not None and (value <= self.lo if self.open_lo else value < self.lo)
        bad_hi = self.hi is not None and (value >= self.hi if self.open_hi else value > self.hi)
        if bad_lo or bad_hi:
            why = f" ({self.why})" if self.why and bad_lo else ""
            raise DomainError(f"{label} must be {self.describe()}{why}, "
                              f"got {value if self.type is int else format(value, 'g')}")
        return value

    def describe(self) -> str:
        if self.type is int and self.lo == 1 and self.hi is None:
            return "a positive integer"
        if self.type is int and self.lo is not None and self.hi is not None:
            return f"an integer in [{self.lo:.0f}, {self.hi:.0f}]"
        if self.hi is None:
            return f"{'>' if self.open_lo else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.open_hi else '<='} {self.hi:g}"
        return f"in {'(' if self.open_lo else '['}{self.lo:g}, {self.hi:g}{')' if self.open_hi else ']'}"


def _opts(*options: Option) -> dict[str, Option]:
    return {o.name: o for o in options}


_PROB = dict(lo=0.0, hi=1.0, open_hi=True)

ARCH_NAMES = ("preln", "postln", "dslm", "dslm-post", "deepnorm", "lns", "mixln",
              "llama", "gpt2", "bert", "olmo2", "peri")
INIT_NAMES = ("normal", "xavier", "torch-default", "scaled", "dslm", "deepnorm")
#: the ``ffn`` option: name -> (the model's ffn_kind, the activation it fixes; None: mlp, which
#: takes the ``activation`` option); the gated cores from the registry (read when used, so a
#: plugin's activation brings its own), newest activation first
class _FFNs(Mapping):
    def _table(self) -> dict:
        return {"mlp": ("mlp", None), **{registry.activation(a).glu: ("glu", a) for a in reversed(registry.activations())}}

    def __getitem__(self, key):
        return self._table()[key]

    def __iter__(self):
        return iter(self._table())

    def __len__(self):
        return len(self._table())


FFNS = _FFNs()
#: RoPE's base when rope is on and no base is given (LLaMA, Hugging Face's default)
DEFAULT_ROPE_BASE = 10000.0

#: the options of an encoder-decoder model (sigprop.model.encdec.from_options), which resolve
#: itself refuses
ENCDEC_OPTIONS = ("encoder_layers", "decoder_layers", "encoder_seq_len", "deepnorm_variant")

OPTIONS: dict[str, Option] = _opts(
    Option("arch", str, "preln", "architecture preset", choices=ARCH_NAMES),
    Option("init", str, None, "initialisation scheme (default: the architecture's own)", choices=INIT_NAMES),
    Option("n_layers", int, None, "number of layers N, each an attention and an FFN sublayer",
           lo=1, hi=MAX_LAYERS, cli="layers"),
    Option("encoder_layers", int, None, "an encoder-decoder model: its encoder's layers N (with --decoder-layers; "
           "predict, check, compare, plot)", lo=1, hi=MAX_LAYERS),
    Option("decoder_layers", int, None, "an encoder-decoder model: its decoder's layers M, each self-attention, "
           "cross-attention, FFN (with --encoder-layers)", lo=1, hi=MAX_LAYERS),
    Option("encoder_seq_len", int, None, "an encoder-decoder model: the encoder's sequence length (default "
           "--seq-len)", lo=2, hi=MAX_SEQ_LEN, why=TWO_TOKENS),
    Option("deepnorm_variant", str, None, "an encoder-decoder model with --arch deepnorm: the encoder's constants "
           "of the paper (beta 0.87 (N^4 M)^(-1/16), the default) or of the torchscale code (beta 1.15 "
           "(N^4 M)^(-1/16))", choices=("paper", "torchscale")),
    Option("d_model", int, 1024, "model width d", lo=1),
    Option("n_heads", int, 16, "attention heads", lo=1, cli="heads"),
    Option("n_kv_heads", int, None, "key/value heads, grouped-query attention (default: heads; must divide "
           "them; 1 = multi-query)", lo=1, cli="kv_heads"),
    Option("d_head", int, None, "head width (default: model width / heads, which must divide it)", lo=1),
    Option("d_ff", int, None, "FFN width (default 4 d_model, or the preset's)", lo=1),
    Option("seq_len", int, 256, "sequence length L", lo=2, hi=MAX_SEQ_LEN, why=TWO_TOKENS),
    Option("dropout", float, None, "sets the attention, hidden and FFN-inner dropout (not given: "
           "0.1, 0.1 and 0, the DSLM figure model, or the preset's)", **_PROB),
    Option("attn_dropout", float, None, "dropout on the attention probabilities", **_PROB),
    Option("hidden_dropout", float, None, "dropout on every branch output", **_PROB),
    Option("ffn_dropout", float, None, "dropout after the FFN activation (default 0)", **_PROB),
    Option("ffn", str, "mlp", "FFN kind (mlp: W_in, activation, W_out; swiglu, geglu, reglu: the gated FFN "
           "down(act(gate x) * up x) with silu, gelu, relu)", choices=FFNS),
    Option("activation", str, "relu", "FFN activation (a gated --ffn fixes it)", choices=ACTIVATIONS),
    Option("norm", str, "layernorm", "norm kind of every sublayer, of QK-norm and of the final norm",
           choices=NORMS),
    Option("norm_eps", float, 1e-5, "epsilon of every norm", lo=0.0),
    Option("placement", str, None, "where the norm of every sublayer sits (pre: before the branch; post: "
           "after the residual sum; peri: before and after the branch; output: on the branch output) "
           "(default: the architecture's)", choices=PLACEMENTS),
    Option("block", str, "sequential", "layer layout (sequential: attention, then FFN; parallel: both on one "
           "normalised input, summed)", choices=BLOCKS),
    Option("rope", bool, False, "rotary position embedding on every query and key (--rope-base sets its base)"),
    Option("rope_base", float, None, f"RoPE base (default {DEFAULT_ROPE_BASE:g}, or the preset's); implies --rope",
           lo=1.0, open_lo=True),
    Option("qk_norm", bool, False, "norm every query and key per head, before RoPE (the model's norm kind)"),
    Option("final_norm", bool, False, "a norm after the last sublayer"),
    Option("bias", bool, True, "biases: the init's bias stds (--no-bias: none, every bias std 0)"),
    Option("causal", bool, False, "causal (decoder) attention"),
    Option("input_mean", float, 0.0, "mean of the stream entering layer 1"),
    Option("input_var", float, None, "variance of the stream entering layer 1 (default 1, or what the "
           "preset's token embedding gives)", lo=0.0, open_lo=True),
    Option("input_corr", float, None, "token correlation of the stream entering layer 1 "
           "(default: r0 (1 - hidden dropout), r0 = 0.221, or what the preset's token embedding gives)",
           lo=0.0, hi=1.0),
    Option("grad_var", float, 1.0, "variance of dLoss/dx at the top", lo=0.0, open_lo=True),
    Option("grad_corr", float, 0.0, "token correlation of dLoss/dx at the top", lo=-1.0, hi=1.0),
    Option("skip_scale", float, None, "override the skip scale a of every sublayer"),
    Option("branch_scale", float, None, "override the branch scale b of every sublayer"),
    Option("mixln_alpha", float, 0.25, "Mix-LN: fraction of Post-LN layers", lo=0.0, hi=1.0),
    Option("init_std", float, 0.02, "std of the normal and scaled inits (and of the presets' embedding tables)",
           lo=0.0),
    Option("beta_k", float, 1.0, "DSLM: beta^2 = k / N", lo=0.0, open_lo=True),
)

#: other accepted spellings: the command line's names (``layers`` for ``n_layers``)
ALIASES = {o.cli: o.name for o in OPTIONS.values() if o.cli}


def canonical_name(name: str) -> str | None:
    """The option name for ``name`` (dashes or underscores, a leading ``--`` as on the command
    line; aliases), or None if unknown."""
    key = name.removeprefix("--").replace("-", "_")
    key = ALIASES.get(key, key)
    return key if key in OPTIONS else None


def check_options(values: dict, where: str = "") -> dict:
    """Validate option names and values; returns them under canonical names.  ``where``
    prefixes error messages (e.g. a config file name)."""
    out: dict = {}
    pre = f"{where}: " if where else ""
    for name, value in values.items():
        key = canonical_name(name)
        if key is None:
            raise DomainError(f"{pre}unknown option {name!r}; known: {', '.join(OPTIONS)}")
        if key in out:
            raise DomainError(f"{pre}option {key!r} given twice (as {name!r})")
        out[key] = OPTIONS[key].check(value, name, pre)
    return out


# ---------------------------------------------------------------------------------------
# architectures
# ---------------------------------------------------------------------------------------

class Geometry(NamedTuple):
    """Sizes, the attention's key/value heads and the FFN kind: what an init reads to give
    every weight of a sublayer its std."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_ff: int
    n_kv_heads: int | None = None      # None: n_heads
    ffn_kind: str = "mlp"

    @property
    def width(self) -> int:
        """n_heads * d_head: output width of Q and input width of O."""
        return self.n_heads * self.d_head

    @property
    def kv_width(self) -> int:
        """n_kv_heads * d_head: output width of K and V."""
        return (self.n_heads if self.n_kv_heads is None else self.n_kv_heads) * self.d_head

    def names(self, kind: str) -> tuple[str, ...]:
        """The weight names of sublayer ``kind`` (attention q, k, v, o; ffn in, out or gate, up, down)."""
        return weight_names(kind, self.ffn_kind)

    def fans(self, kind: str, name: str) -> tuple[int, int]:
        """(fan_in, fan_out) of weight ``name`` (as :meth:`sigprop.model.spec.Model.fans`)."""
        d, w, kv, f = self.d_model, self.width, self.kv_width, self.d_ff
        return {"q": (d, w), "k": (d, kv), "v": (d, kv), "o": (w, d), "in": (d, f), "out": (f, d),
                "gate": (d, f), "up": (d, f), "down": (f, d)}[name]


#: the weights that map a branch back to the stream (an init's "output projections")
OUTPUT_WEIGHTS = frozenset(("o", "out", "down"))


class Scales(NamedTuple):
    """Per-layer columns (n_layers,), the same for the attention and the FFN sublayer."""

    post: np.ndarray
    skip: np.ndarray
    branch: np.ndarray
    norm: np.ndarray


def _dslm_beta2(n: int, k: float) -> float:
    beta2 = k / n
    if beta2 > 1:
        raise DomainError(f"dslm: beta^2 = beta_k / n_layers = {k:g}/{n} = {beta2:g} must be <= 1")
    return beta2


def _scales(arch: str, n: int, opts: dict) -> Scales:
    ones = np.ones(n)
    post = np.zeros(n, dtype=bool)
    skip, branch, norm = ones, ones, ones
    if arch in ("postln", "bert"):
        post = ~post
    elif arch in ("dslm", "dslm-post"):
        beta2 = _dslm_beta2(n, opts["beta_k"])
        skip, branch = np.full(n, math.sqrt(1 - beta2)), np.full(n, math.sqrt(beta2))
        post = np.full(n, arch == "dslm-post")
        a, b = opts["skip_scale"], opts["branch_scale"]
        if (a is None) != (b is None):  # one given: keep lambda^2 + beta^2 = 1
            given, name = (a, "skip_scale") if a is not None else (b, "branch_scale")
            if abs(given) > 1:
                raise DomainError(f"{arch}: {name} {given:g} > 1 leaves no room for lambda^2 + beta^2 = 1; "
                                  "give both skip_scale and branch_scale")
            other = np.full(n, math.sqrt(1 - given * given))
            skip, branch = (np.full(n, given), other) if a is not None else (other, np.full(n, given))
    elif arch == "deepnorm":
        post = ~post
        skip = np.full(n, deepnorm_constants(n).alpha)
    elif arch == "lns":
        norm = 1 / np.sqrt(np.arange(1, n + 1, dtype=np.float64))
    elif arch == "mixln":
        n_post = math.floor(round(opts["mixln_alpha"] * n, 9))
        post = np.arange(n) < n_post
    elif arch not in ("preln", "llama", "gpt2", "olmo2", "peri"):  # pragma: no cover - names are checked before
        raise DomainError(f"unknown arch {arch!r}")
    if opts["skip_scale"] is not None:
        skip = np.full(n, opts["skip_scale"])
    if opts["branch_scale"] is not None:
        branch = np.full(n, opts["branch_scale"])
    return Scales(post, skip, branch, norm)


class Embedding(NamedTuple):
    """A preset's token embedding, which makes the stream entering layer 1: iid N(0, std^2)
    tables with stds in units of ``init_std`` (word; learned absolute positions; segment,
    with every token in one segment), summed; then, if ``norm``, the model's norm (BERT);
    then the hidden dropout.  ``source`` names the model it follows."""

    word: float
    position: float = 0.0
    segment: float = 0.0
    norm: bool = False
    source: str = ""


class ArchInfo(NamedTuple):
    """An architecture preset.  ``placement``: its placement of every sublayer when not from
    its scales (peri, output); ``placements``: the ``placement`` option's values it combines
    with (``refuse``: why the others are not defined for it); ``defaults``: the options it
    sets unless given; ``dropout``: (attention, hidden, ffn-inner) when no dropout option is
    given; ``embedding``: where its input stream comes from (None: the ``input_*`` options'
    defaults)."""

    name: str
    title: str
    default_init: str
    formula: str
    source: str
    placement: str | None = None
    placements: tuple = PLACEMENTS
    refuse: str = ""
    defaults: Mapping = MappingProxyType({})
    dropout: tuple = (DEFAULT_DROPOUT, DEFAULT_DROPOUT, 0.0)
    embedding: Embedding | None = None


#: the LLaMA blocks of [CoD]'s experiments (and of LLaMA, Mistral): pre-RMSNorm, SwiGLU, RoPE,
#: no biases, a final norm, no dropout, causal
_LLAMA_BLOCKS = dict(causal=True, norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", activation="silu", rope=True,
                     final_norm=True, bias=False)

ARCHS: dict[str, ArchInfo] = {a.name: a for a in (
    ArchInfo("preln", "Pre-LN", "normal", "x' = x + F(LN x)", "GPT-2; Xiong et al. 2020"),
    ArchInfo("postln", "Post-LN", "normal", "x' = LN(x + F(x))", "Vaswani et al. 2017; BERT"),
    ArchInfo("dslm", "Pre-LN DeepScaleLM", "dslm",
             "x' = lambda x + beta F(LN x), beta^2 = k/N, lambda^2 = 1 - beta^2", "[TGS] section 4"),
    ArchInfo("dslm-post", "Post-LN DeepScaleLM", "dslm",
             "x' = LN(lambda x + beta F(x)), beta^2 = k/N, lambda^2 = 1 - beta^2", "[TGS] section 4"),
    ArchInfo("deepnorm", "DeepNorm", "deepnorm", "x' = LN(alpha x + F(x)), alpha = (2N)^(1/4)",
             "[DeepNet] Wang et al. 2022, Table 1", placements=("post",),
             refuse="DeepNorm is a Post-LN scheme, x' = LN(alpha x + F(x)): placement {p} is not defined for it"),
    ArchInfo("lns", "LayerNorm Scaling", "normal", "x' = x + F(LN(x) / sqrt(l))",
             "[CoD] Sun et al. 2025", placements=("pre", "peri"),
             refuse="LayerNorm Scaling scales the norm before each branch, which placement {p} does not have"),
    ArchInfo("mixln", "Mix-LN", "normal",
             "layers 1..floor(alpha N) Post-LN, the rest Pre-LN (alpha = mixln_alpha)",
             "[MixLN] Li, Yin, Liu 2024", placements=(),
             refuse="Mix-LN sets its own placements (Post-LN, then Pre-LN layers): placement {p} does not apply"),
    ArchInfo("llama", "LLaMA", "normal", "x' = x + F(RMSNorm x); SwiGLU, RoPE, final RMSNorm",
             "[CoD] Sun et al. 2025 (its LLaMA 130M); Touvron et al. 2023",
             defaults=dict(n_layers=12, d_model=768, n_heads=12, d_ff=2048, **_LLAMA_BLOCKS),
             dropout=(0.0, 0.0, 0.0), embedding=Embedding(1.0, source="LLaMA")),
    ArchInfo("gpt2", "GPT-2", "scaled", "x' = x + F(LN x); GeLU MLP, final LN",
             "[GPT-2] Radford et al. 2019 (GPT-2 small)",
             defaults=dict(n_layers=12, d_model=768, n_heads=12, d_ff=3072, causal=True, activation="gelu",
                           final_norm=True),
             embedding=Embedding(1.0, position=0.5, source="GPT-2")),
    ArchInfo("bert", "BERT", "normal", "x' = LN(x + F(x)); GeLU MLP",
             "Devlin et al. 2019 (BERT-base)",
             defaults=dict(n_layers=12, d_model=768, n_heads=12, d_ff=3072, activation="gelu", norm_eps=1e-12),
             embedding=Embedding(1.0, position=1.0, segment=1.0, norm=True, source="BERT")),
    ArchInfo("olmo2", "OLMo 2", "normal", "x' = x + RMSNorm(F(x)); QK-norm, SwiGLU, RoPE, final RMSNorm",
             "Team OLMo 2024, 2 OLMo 2 Furious, arXiv:2501.00656 (OLMo 2 7B)", placement="output",
             defaults=dict(n_layers=32, d_model=4096, n_heads=32, d_ff=11008, **_LLAMA_BLOCKS,
                           rope_base=500000.0, qk_norm=True),
             dropout=(0.0, 0.0, 0.0), embedding=Embedding(1.0, source="OLMo 2")),
    ArchInfo("peri", "Peri-LN", "normal", "x' = x + LN(F(LN x))",
             "Kim et al. 2025 (Peri-LN); Gemma 2, Gemma 3", placement="peri"),
)}
#: the options some preset sets (their help says "or the preset's")
PRESET_OPTIONS = frozenset(k for a in ARCHS.values() for k in a.defaults)


# ---------------------------------------------------------------------------------------
# initialisations
# ---------------------------------------------------------------------------------------

class InitResult(NamedTuple):
    #: kind -> weight name -> std (scalar or (n_layers,) column)
    std: dict
    bias_std: dict
    notes: dict


def _zeros_bias(g: Geometry) -> dict:
    return {kind: {w: 0.0 for w in g.names(kind)} for kind in KINDS}


def _xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def init_normal(g: Geometry, ctx) -> InitResult:
    """Every matrix N(0, init_std^2), biases 0 (BERT, GPT-2, LLaMA, Hugging Face default)."""
    s = ctx.opts["init_std"]
    return InitResult({kind: {w: s for w in g.names(kind)} for kind in KINDS}, _zeros_bias(g), {})


def init_xavier(g: Geometry, ctx) -> InitResult:
    """Xavier as in [TGS]'s baselines: Q, K, V per head d -> d_head, std sqrt(2/(d + d_head));
    O std sqrt(2/(n_heads d_head + d)) (= sqrt(1/d) when n_heads d_head = d); every FFN matrix
    sqrt(2/(fan_in + fan_out)) (sqrt(2/(d + d_ff)) for each); biases 0."""
    d, dk = g.d_model, g.d_head
    qkv = _xavier_std(d, dk)
    std = {"attention": {"q": qkv, "k": qkv, "v": qkv, "o": _xavier_std(*g.fans("attention", "o"))},
           "ffn": {w: _xavier_std(*g.fans("ffn", w)) for w in g.names("ffn")}}
    return InitResult(std, _zeros_bias(g), {})


def init_torch_default(g: Geometry, ctx) -> InitResult:
    """torch.nn.TransformerEncoderLayer out of the box: in-projection (Q, K, V stacked,
    (n_heads + 2 n_kv_heads) d_head x d) Xavier-uniform, variance 2/(d + w_q + 2 w_kv)
    (= 1/(2d) for full attention at n_heads d_head = d), bias 0; out-projection
    kaiming-uniform(a = sqrt 5), variance 1/(3 fan_in), bias 0; every FFN matrix a plain
    nn.Linear (linear1/linear2; a gated FFN's gate, up, down): weight variance 1/(3 fan_in),
    bias uniform of variance 1/(3 fan_in)."""
    d, w = g.d_model, g.width
    qkv = math.sqrt(2.0 / (d + w + 2 * g.kv_width))
    ffn = {name: math.sqrt(1 / (3 * g.fans("ffn", name)[0])) for name in g.names("ffn")}
    std = {"attention": {"q": qkv, "k": qkv, "v": qkv, "o": math.sqrt(1 / (3 * w))}, "ffn": ffn}
    bias = _zeros_bias(g)
    bias["ffn"] = dict(ffn)
    return InitResult(std, bias, {})


def init_scaled(g: Geometry, ctx) -> InitResult:
    """GPT-2 / Megatron-LM scaled init: the output projections (attention O, FFN out or down)
    std init_std / sqrt(2N), every other matrix init_std; biases 0."""
    s = ctx.opts["init_std"]
    r = s / math.sqrt(2 * g.n_layers)
    std = {kind: {w: r if w in OUTPUT_WEIGHTS else s for w in g.names(kind)} for kind in KINDS}
    return InitResult(std, _zeros_bias(g), {})


def init_deepnorm(g: Geometry, ctx) -> InitResult:
    """DeepNet: Xavier-normal (full projection matrices) with gain beta = (8N)^(-1/4) on V, O,
    FFN in and out (a gated FFN's gate, up and down), gain 1 on Q and K; biases 0."""
    beta = deepnorm_constants(g.n_layers).beta
    std = {kind: {w: _xavier_std(*g.fans(kind, w), 1.0 if w in ("q", "k") else beta) for w in g.names(kind)}
           for kind in KINDS}
    return InitResult(std, _zeros_bias(g), {"deepnorm_beta": beta})


def init_dslm(g: Geometry, ctx, ffn_block: Callable | None = None, method: str = "newton") -> InitResult:
    """DeepScaleLM ([TGS] section 4 and [TGS-code]), generalised to any geometry, dropout and
    activation, to a gated FFN and to the model's own pre or post placements and scales;
    biases 0.

    * Q, K: std sqrt(1/d): logit variance 1 for a LayerNorm'd input.
    * FFN in and out (a gated FFN's gate, up and down): one common std s chosen so that the FFN
      block (W_in, activation, ffn dropout, W_out, hidden dropout; gated: the gate and up
      projections and their product, ffn dropout, W_down, hidden dropout) maps a
      unit-variance input to a unit-variance output; for a ReLU MLP
      s^2 = sqrt(2 (1-p_hid)(1-p_ffn) / (d d_ff)) = (1/d) sqrt((1-p)/2) at d_ff = 4d,
      p_ffn = 0 (the published value).  Solved numerically through the rules, so any
      activation works.
    * V, O of layer l: std^4 = (1 - p_hid) / (r_l d n_heads d_head), i.e. variance
      (1/d) sqrt((1-p)/r_l) at n_heads d_head = d (published), with r_l the token correlation
      of the stream entering layer l from :func:`dslm_stream`: in the small-logit, large-L
      limit the attention output is the token average of V, of variance r_l times the value
      variance, so this gives the attention block unit output variance.

    The recursion knows two placements (the branch input normalised, or the stream itself)
    and sequential blocks; the peri and output placements and parallel blocks are refused.
    RMSNorm is taken as LayerNorm: the same in the large-d limit for a zero-mean stream (a
    non-zero input mean is refused).
    """
    other = sorted({PLACEMENTS[int(c)] for c in np.unique(ctx.placement)} - {"pre", "post"})
    if other:
        raise DomainError(f"init 'dslm' is derived for the pre and post placements, not {', '.join(other)}")
    if ctx.block != "sequential":
        raise DomainError("init 'dslm' is derived for sequential blocks (two residual sublayers per layer), "
                          f"not {ctx.block}")
    if ctx.norm == "rmsnorm" and ctx.input.mean != 0:
        raise DomainError("init 'dslm' with RMSNorm assumes a zero-mean stream (RMSNorm keeps the mean); "
                          f"input_mean is {ctx.input.mean:g}")
    if ffn_block is None:
        make = ffn_block_from_rules if g.ffn_kind == "mlp" else glu_block_from_rules
        ffn_block = make(g.d_model, g.d_ff, ctx.activation, ctx.dropout.ffn_inner, ctx.dropout.hidden)
    s_ffn = dslm_ffn_std(ffn_block)
    st = dslm_stream(ctx.scales, ctx.dropout.hidden, ctx.input, ffn_block, s_ffn, method=method)
    r_att = st.corr[0:-1:2]                       # entering the attention sublayer of each layer
    bad = np.flatnonzero(~(r_att > 0))
    if bad.size:
        l = int(bad[0])
        raise DomainError(f"init 'dslm' needs a positive token correlation entering every layer (the "
                          f"V/O std grows like r^(-1/4)); layer {l + 1} has r = {r_att[l]:g}"
                          + ("; give input_corr > 0" if l == 0 else ""))
    p = ctx.dropout.hidden
    s_vo = ((1 - p) / (r_att * g.d_model * g.width)) ** 0.25
    s_qk = math.sqrt(1 / g.d_model)
    std = {"attention": {"q": s_qk, "k": s_qk, "v": s_vo, "o": s_vo}, "ffn": {w: s_ffn for w in g.names("ffn")}}
    notes = {"dslm_stream_corr": _readonly(st.corr), "dslm_stream_var": _readonly(st.var),
             "dslm_ffn_std": s_ffn}
    return InitResult(std, _zeros_bias(g), notes)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64)
    a.flags.writeable = False
    return a


# ---------------------------------------------------------------------------------------
# DSLM: block functions and the stream-correlation recursion
# ---------------------------------------------------------------------------------------

#: an FFN block function: (input variance v, input token correlation r, the common
#: W_in/W_out std s) -> (output variance, output token correlation); arrays that broadcast
#: (s is a float or an array).  The output variance must not depend on r (it cannot: it is a
#: single-token quantity).  init_dslm / dslm_stream take one, default ffn_block_from_rules.
FFNBlock = Callable[[np.ndarray, np.ndarray, float], tuple]


def ffn_block_from_rules(d_model: int, d_ff: int, activation: str, p_ffn: float, p_hid: float) -> FFNBlock:
    """The FFN block composed from the registered component rules: W_in (linear), the
    activation, ffn dropout, W_out (linear), hidden dropout; the block input is the
    LayerNorm'd stream (mean 0).  Nothing is retyped: for ReLU this is the (uncentred)
    arc-cosine correlation (1-p)(r + (sqrt(1-r^2) - r arccos r)/pi) ([TGS] section 3),
    obtained from the "relu" rule's centred moments through the linear rule."""
    from sigprop.rules import REGISTRY, get

    if activation not in REGISTRY:  # (sigprop/rules/activation.py registers relu and gelu)
        raise DomainError(f"init 'dslm' needs the {activation!r} rule, which is not registered "
                          "(sigprop/rules/activation.py)")
    lin, act, drop = get("linear"), get(activation), get("dropout")

    def block(v, r, s):
        v = np.asarray(v, dtype=np.float64)
        x = Forward(np.zeros_like(v), v, np.asarray(r, dtype=np.float64))
        h, _ = lin.evaluate(x, d_in=d_model, d_out=d_ff, w_std=s)
        y, _ = act.evaluate(h)
        y, _ = drop.evaluate(y, p=p_ffn)
        z, _ = lin.evaluate(y, d_in=d_ff, d_out=d_model, w_std=s)
        z, _ = drop.evaluate(z, p=p_hid)
        return np.asarray(z.var, dtype=np.float64), np.asarray(z.corr, dtype=np.float64)

    return block


def glu_block_from_rules(d_model: int, d_ff: int, activation: str, p_ffn: float, p_hid: float) -> FFNBlock:
    """The gated FFN block composed from the registered rules: the gated core (gate and up
    projections, both of std s, and their product: the ``reglu``/``geglu``/``swiglu`` rule),
    ffn dropout, W_down (linear, std s), hidden dropout; the block input is the normalised
    stream (mean 0)."""
    from sigprop.rules import REGISTRY, get

    name = registry.activation(activation).glu
    if name not in REGISTRY:  # (sigprop/rules/glu.py registers them)
        raise DomainError(f"init 'dslm' needs the {name!r} rule, which is not registered (sigprop/rules/glu.py)")
    core, lin, drop = get(name), get("linear"), get("dropout")

    def block(v, r, s):
        v = np.asarray(v, dtype=np.float64)
        x = Forward(np.zeros_like(v), v, np.asarray(r, dtype=np.float64))
        y, _ = core.evaluate(x, d_in=d_model, d_ff=d_ff, gate_std=s, up_std=s)
        y, _ = drop.evaluate(y, p=p_ffn)
        z, _ = lin.evaluate(y, d_in=d_ff, d_out=d_model, w_std=s)
        z, _ = drop.evaluate(z, p=p_hid)
        return np.asarray(z.var, dtype=np.float64), np.asarray(z.corr, dtype=np.float64)

    return block


def dslm_ffn_std(ffn_block: FFNBlock) -> float:
    """The common W_in/W_out std s with unit FFN block output variance for a unit-variance
    input: Newton's method on log(var) against log(s) (slope 4 for a homogeneous activation,
    close to 4 for GeLU)."""
    one = np.ones(2)
    t = math.log(0.02)
    for _ in range(100):
        var, _ = ffn_block(one, 0.5 * one, np.array([math.exp(t), math.exp(t + 1e-4)]))
        f0, f1 = math.log(var[0]), math.log(var[1])
        slope = (f1 - f0) / 1e-4
        if not (math.isfinite(f0) and slope > 0):
            break
        if abs(f0) < 1e-15:
            return math.exp(t)
        t -= f0 / slope
    var, _ = ffn_block(one[:1], 0.5 * one[:1], math.exp(t))
    if abs(math.log(var[0])) > 1e-12:
        raise DomainError("init 'dslm': no FFN weight std gives a unit-variance FFN block output")
    return math.exp(t)


class DSLMStream(NamedTuple):
    """Stream moments at every sublayer boundary: entry 2l is the stream entering layer l+1's
    attention sublayer, 2l+1 its FFN sublayer, entry 2N the model output."""

    corr: np.ndarray      # (2N + 1,)
    var: np.ndarray       # (2N + 1,)
    block_var_in: np.ndarray  # (2N,): variance of each branch input (n^2 pre, stream var post)


def affine_scan(A: np.ndarray, B: np.ndarray, x0: float) -> np.ndarray:
    """x_0 = x0, x_{i+1} = A_i x_i + B_i for all i at once (a parallel prefix over affine maps:
    log2(len) vectorised steps, no division, so A_i = 0 and underflow are harmless)."""
    A = np.array(A, dtype=np.float64)
    B = np.array(B, dtype=np.float64)
    off = 1
    while off < A.size:
        B[off:] = A[off:] * B[:-off] + B[off:]
        A[off:] = A[off:] * A[:-off]
        off *= 2
    return np.concatenate(([x0], A * x0 + B))


def dslm_stream(scales: Scales, p_hid: float, inp: Forward, ffn_block: FFNBlock, s_ffn: float,
                method: str = "newton") -> DSLMStream:
    """The DSLM stream-correlation recursion ([TGS] section 3-4),
    for any placement and scales (layer l's attention sublayer, then its FFN sublayer):

    * branch input: Pre-LN: variance n^2, the stream's correlation r (LayerNorm keeps the
      correlation: the large-d limit used by the published recursion); Post-LN: the stream.
    * branch output (by the DSLM init's design): variance = input variance times the block
      gain, which is 1 for attention (small-logit, large-L limit) and ffn_block's for the FFN
      (1 at unit input); correlation 1 - p_hid for attention (the output is the token average
      of V before the hidden dropout) and ffn_block's for the FFN.
    * residual mixture: r' = (a^2 r v + b^2 r_blk v_blk) / (a^2 v + b^2 v_blk), v the stream
      variance; Post-LN renormalises the variance to 1 and keeps the correlation.

    ``method="newton"`` solves the whole trajectory at once (Newton's method on the
    sequence, each step a vectorised affine scan; a few evaluations of the rules on arrays);
    ``method="sequential"`` steps layer by layer (the reference; slow for 10^5 layers).
    """
    post = np.repeat(scales.post, 2)
    a2 = np.repeat(scales.skip, 2) ** 2
    b2 = np.repeat(scales.branch, 2) ** 2
    n2 = np.repeat(scales.norm, 2) ** 2
    S = post.size
    is_ffn = (np.arange(S) % 2) == 1
    fi = np.flatnonzero(is_ffn)

    def gain_var(v):
        """Block output variance for block input variance v (exact: no r dependence), the
        FFN block evaluated once per distinct input variance."""
        out = np.array(v, dtype=np.float64)
        vals, inv = np.unique(out[fi], return_inverse=True)
        g = np.zeros_like(vals)
        ok = vals > 0
        if ok.any():
            g[ok] = ffn_block(vals[ok], np.full(int(ok.sum()), 0.5), s_ffn)[0]
        out[fi] = g[inv]
        return out

    with np.errstate(over="ignore", invalid="ignore"):
        g_pre = gain_var(n2)
        var = affine_scan(np.where(post, 0.0, a2), np.where(post, 1.0, b2 * g_pre), inp.var)
        v_in = np.where(post, var[:-1], n2)
        g_blk = gain_var(v_in)
        skip_part = a2 * var[:-1]
        den = skip_part + b2 * g_blk
        w = np.where(np.isinf(skip_part), 1.0, skip_part / den)
    bad = np.flatnonzero(~np.isfinite(w))
    if bad.size:
        s = int(bad[0])
        raise DomainError(f"init 'dslm': the stream vanishes at layer {s // 2 + 1} "
                          f"({'ffn' if s % 2 else 'attention'} sublayer: skip and branch both 0)")
    c_att = 1.0 - p_hid
    vf = v_in[fi]
    vf_ok = vf > 0

    def blk_corr(r_ffn_in, step):
        """FFN block output correlation at r and at r + step (one evaluation of the rules)."""
        c = np.full((2, fi.size), c_att)   # irrelevant where the FFN block input vanishes (weight 1)
        if vf_ok.any():
            k = int(vf_ok.sum())
            rr = np.concatenate((r_ffn_in[vf_ok], r_ffn_in[vf_ok] + step[vf_ok]))
            out = ffn_block(np.tile(vf[vf_ok], 2), np.clip(rr, -1.0, 1.0), s_ffn)[1]
            c[0, vf_ok], c[1, vf_ok] = out[:k], out[k:]
        return c

    r0 = inp.corr
    if method == "sequential":
        r = np.empty(S + 1)
        r[0] = r0
        for s in range(S):
            if is_ffn[s]:
                c = blk_corr_one(ffn_block, v_in[s], r[s], s_ffn, c_att)
            else:
                c = c_att
            r[s + 1] = w[s] * r[s] + (1 - w[s]) * c
        return DSLMStream(r, var, v_in)
    if method != "newton":
        raise DomainError(f"method must be 'newton' or 'sequential', got {method!r}")

    r = np.full(S + 1, float(r0))
    c = np.full(S, c_att)
    dc = np.zeros(S)
    h = 1e-7
    for _ in range(60):
        rf = r[:-1][fi]
        step = np.where(rf + h <= 1.0, h, -h)
        c0, c1 = blk_corr(rf, step)
        c[fi] = c0
        dc[fi] = (c1 - c0) / step
        e = w * r[:-1] + (1 - w) * c - r[1:]
        if np.max(np.abs(e)) <= 1e-14:
            return DSLMStream(r, var, v_in)
        delta = affine_scan(w + (1 - w) * dc, e, 0.0)
        r = np.clip(r + delta, -1.0, 1.0)
        r[0] = r0
    # not converged (should not happen): the sequential reference
    return dslm_stream(scales, p_hid, inp, ffn_block, s_ffn, method="sequential")


def blk_corr_one(ffn_block: FFNBlock, v: float, r: float, s: float, c_zero: float) -> float:
    if v <= 0:
        return c_zero
    return float(ffn_block(np.array([v]), np.array([min(max(r, -1.0), 1.0)]), s)[1][0])


class InitInfo(NamedTuple):
    name: str
    fn: Callable
    source: str


INITS: dict[str, InitInfo] = {i.name: i for i in (
    InitInfo("normal", init_normal, "BERT; GPT-2; Hugging Face default"),
    InitInfo("xavier", init_xavier, "Glorot & Bengio 2010, as in [TGS]'s baselines"),
    InitInfo("torch-default", init_torch_default, "PyTorch nn.TransformerEncoderLayer"),
    InitInfo("scaled", init_scaled, "[GPT-2]; Megatron-LM; nanoGPT"),
    InitInfo("dslm", init_dslm, "[TGS] section 4 and the authors' code"),
    InitInfo("deepnorm", init_deepnorm, "[DeepNet] Wang et al. 2022"),
)}


class Context(NamedTuple):
    """What an init function may read besides the geometry: the options, the residual
    scales (``scales.post``: the post placement), every layer's placement code (into
    :data:`sigprop.model.spec.PLACEMENTS`), the block layout and the norm kind."""

    opts: dict
    scales: Scales
    dropout: Dropout
    activation: str
    input: Forward
    placement: np.ndarray
    block: str = "sequential"
    norm: str = "layernorm"


# ---------------------------------------------------------------------------------------
# resolve
# ---------------------------------------------------------------------------------------

def defaults() -> dict:
    """Every option's default (None where derived or required), before a preset's own."""
    return {k: o.default for k, o in OPTIONS.items()}


def embedding_input(emb: Embedding, init_std: float, d_model: int, seq_len: int, norm: str, norm_eps: float,
                    p_hid: float) -> Forward:
    """The stream a preset's token embedding produces, from the component rules: the
    ``embedding`` rule (tables N(0, (k init_std)^2), two positions holding the same token with
    probability :data:`R0_EMBEDDING`, every token in one segment), then, if the embedding
    ends in a norm, the model's norm rule (width d_model, eps norm_eps), then the dropout rule
    (the hidden dropout, which the presets apply to the embedding too)."""
    from sigprop.rules import get

    require_two_tokens(seq_len)
    word = emb.word * init_std
    if not word * word > 0:             # (a std whose square underflows adds nothing either)
        raise DomainError(f"the {emb.source} token embedding has word-table std init_std = {init_std:g}: "
                          "it needs init_std > 0, with a square above float64's smallest number (or give the "
                          "input stream: input_var, input_corr)")
    x, _ = get("embedding").evaluate(Forward(0.0, 1.0, 0.0), word_std=word, pos_std=emb.position * init_std,
                                     seg_std=emb.segment * init_std, word_collision=R0_EMBEDDING,
                                     segment_collision=1.0, L=seq_len)
    if emb.norm:
        x, _ = get(norm).evaluate(x, d=d_model, eps=norm_eps)
    x, _ = get("dropout").evaluate(x, p=p_hid)
    return Forward(float(x.mean), float(x.var), float(x.corr))


def _embedding_note(emb: Embedding, init_std: float, norm: str, p_hid: float, given: list) -> str:
    """What the stream entering layer 1 was taken to be, in words."""
    tables = [f"word table N(0, {emb.word * init_std:g}^2)"]
    if emb.position:
        tables.append(f"position table N(0, {emb.position * init_std:g}^2)")
    if emb.segment:
        tables.append(f"segment table N(0, {emb.segment * init_std:g}^2) with one segment")
    after = ([registry.norm(norm).title] if emb.norm else []) + \
        ([f"dropout {p_hid:g}"] if p_hid else [])
    text = (f"the {emb.source} token embedding: {' + '.join(tables)}, two positions holding the same token "
            f"with probability {R0_EMBEDDING:g}" + (f", then {' and '.join(after)}" if after else ""))
    if given:
        text += f"; {', '.join(given)} as given"
    return text


def _placements(arch: str, info: ArchInfo, scales: Scales, placement: str | None) -> np.ndarray:
    """Every layer's placement code: the ``placement`` option where the architecture allows
    it, else the architecture's own."""
    if placement is not None:
        if placement not in info.placements:
            raise DomainError(info.refuse.format(p=placement))
        return np.full(scales.post.shape, PLACEMENTS.index(placement), dtype=np.int8)
    if info.placement is not None:
        return np.full(scales.post.shape, PLACEMENTS.index(info.placement), dtype=np.int8)
    return np.where(scales.post, PLACEMENTS.index("post"), PLACEMENTS.index("pre")).astype(np.int8)


def resolve(arch: str = "preln", init: str | None = None, **options) -> Model:
    """Resolve an architecture preset, an init scheme and options into a Model.

    Options (see :data:`OPTIONS`; a preset's ``defaults`` replace the generic defaults below
    where it sets them): n_layers (required unless the preset sets it), d_model=1024,
    n_heads=16, n_kv_heads=None (n_heads), d_head=None (d_model/n_heads), d_ff=None
    (4 d_model), seq_len=256, dropout (given: sets all three dropouts unless the specific
    ones are given; not given: the preset's, attention and hidden 0.1, FFN-inner 0 unless it
    says otherwise, see :data:`DEFAULT_DROPOUT`), ffn="mlp" (or swiglu, geglu, reglu, which
    fix the activation), activation="relu", norm="layernorm", norm_eps=1e-5,
    placement=None (the architecture's), block="sequential", rope=False, rope_base=None
    (10000; given: rope on), qk_norm=False, final_norm=False, bias=True (the init's bias
    stds; False: all 0), causal=False, input_mean=0, input_var=None (1), input_corr=None
    (r0 (1 - hidden_dropout), r0 = 0.221; the embedding presets: what their embedding
    gives), grad_var=1, grad_corr=0, skip_scale/branch_scale=None (overrides for every
    sublayer), mixln_alpha=0.25, init_std=0.02, beta_k=1.  Unknown names, bad values and
    combinations that are not defined raise DomainError.
    """
    given = {k: v for k, v in check_options({"arch": arch, "init": init, **options}).items() if v is not None}
    if any(k in given for k in ENCDEC_OPTIONS):
        raise DomainError("--encoder-layers, --decoder-layers and --encoder-seq-len describe an encoder-decoder "
                          "model: predict, check, compare and plot take one (yet); this command does not")
    info = ARCHS[given.get("arch", "preln")]
    arch = info.name
    opts = defaults()
    opts.update(info.defaults)
    opts.update(given)
    if opts["n_layers"] is None:
        raise DomainError("n_layers is required")
    n, d, h = opts["n_layers"], opts["d_model"], opts["n_heads"]
    d_head = opts["d_head"]
    if d_head is None:
        if d % h:
            raise DomainError(f"d_model {d} is not divisible by n_heads {h}: give d_head")
        d_head = d // h
    d_ff = opts["d_ff"] if opts["d_ff"] is not None else 4 * d
    kv = opts["n_kv_heads"] if opts["n_kv_heads"] is not None else h
    if h % kv:
        raise DomainError(f"n_kv_heads {kv} must divide n_heads {h}")

    # the FFN: a gated kind fixes the activation; the activation option changes a preset's
    ffn_kind, fixed = FFNS[opts["ffn"]]
    activation = opts["activation"]
    if fixed is not None:
        act = given.get("activation")
        if "ffn" in given and act is not None and act != fixed:
            other = next(k for k, v in FFNS.items() if v[1] == act)
            raise DomainError(f"ffn {opts['ffn']} is the gated FFN with {fixed}; activation {act} contradicts it "
                              f"(for a gated FFN with {act}: ffn {other})")
        if "activation" not in given:
            activation = fixed
    geom = Geometry(n, d, h, d_head, d_ff, kv, ffn_kind)

    # rotary positions: rope_base given turns them on
    rope = opts["rope"]
    if "rope_base" in given:
        if given.get("rope") is False:
            raise DomainError("rope_base is given but rope is off")
        rope = True
    rope_base = (opts["rope_base"] if opts["rope_base"] is not None else DEFAULT_ROPE_BASE) if rope else None

    pd = info.dropout
    explicit = "dropout" in given
    p_att = opts["attn_dropout"] if opts["attn_dropout"] is not None else (opts["dropout"] if explicit else pd[0])
    p_hid = opts["hidden_dropout"] if opts["hidden_dropout"] is not None else (opts["dropout"] if explicit else pd[1])
    p_ffn = opts["ffn_dropout"] if opts["ffn_dropout"] is not None else (opts["dropout"] if explicit else pd[2])
    dropout = Dropout(p_att, p_hid, p_ffn)

    notes = {}
    if info.embedding is not None:
        from_user = [k for k in ("input_mean", "input_var", "input_corr") if k in given]
        emb = None
        if len(from_user) < 3:
            emb = embedding_input(info.embedding, opts["init_std"], d, opts["seq_len"], opts["norm"],
                                  opts["norm_eps"], p_hid)
        mean, var, corr = (given[k] if k in given else getattr(emb, k.removeprefix("input_"))
                           for k in ("input_mean", "input_var", "input_corr"))
        inp = Forward(mean, var, corr)
        if emb is not None:
            notes["input"] = _embedding_note(info.embedding, opts["init_std"], opts["norm"], p_hid, from_user)
    else:
        corr = opts["input_corr"] if opts["input_corr"] is not None else R0_EMBEDDING * (1 - p_hid)
        inp = Forward(opts["input_mean"], opts["input_var"] if opts["input_var"] is not None else 1.0, corr)
    grad = Backward(opts["grad_var"], opts["grad_corr"])

    scales = _scales(arch, n, opts)
    placement = _placements(arch, info, scales, opts["placement"])
    skip_att = skip_ffn = scales.skip
    if opts["block"] == "parallel":
        if arch in ("dslm", "dslm-post", "deepnorm"):
            raise DomainError(f"{arch}'s residual scales are set for two sequential residual sublayers per layer; "
                              "a parallel block (one residual sum per layer) is not defined for it")
        if (placement != 0).any():
            used = ", ".join(sorted({PLACEMENTS[int(c)] for c in np.unique(placement)}))
            whose = f"placement {used} was given" if opts["placement"] else f"{arch} has placement {used}"
            raise DomainError(f"a parallel block normalises one input for both branches (placement pre); {whose}"
                              + ("" if opts["placement"] or "pre" not in info.placements else ": give placement pre"))
        skip_ffn = np.ones(n)                     # one skip path per layer: the attention sublayer's
    scales = scales._replace(post=placement == PLACEMENTS.index("post"))
    init_name = opts["init"] or info.default_init
    ctx = Context(opts, scales, dropout, activation, inp, placement, opts["block"], opts["norm"])
    res = INITS[init_name].fn(geom, ctx)
    bias_std = res.bias_std if opts["bias"] else {kind: {w: 0.0 for w in geom.names(kind)} for kind in KINDS}

    cols = {kind: Sublayers(kind, placement, skip, scales.branch, scales.norm, res.std[kind], bias_std[kind])
            for kind, skip in (("attention", skip_att), ("ffn", skip_ffn))}
    # ("bias": whether the linear maps have biases, parameters of an optimizer step even at std 0)
    notes = {"init": init_name, "bias": bool(opts["bias"]), **notes, **res.notes}
    return Model(arch=arch, n_layers=n, d_model=d, n_heads=h, d_head=d_head, d_ff=d_ff,
                 seq_len=opts["seq_len"], activation=activation, norm=opts["norm"],
                 causal=opts["causal"], dropout=dropout, input=inp, grad=grad,
                 attention=cols["attention"], ffn=cols["ffn"], notes=notes,
                 norm_eps=opts["norm_eps"], block=opts["block"], ffn_kind=ffn_kind, n_kv_heads=kv,
                 rope=rope_base, qk_norm=opts["norm"] if opts["qk_norm"] else None,
                 final_norm=opts["final_norm"])
