"""Architecture and initialisation presets: options -> a fully resolved
:class:`sigprop.model.spec.Model` (docs/presets.md lists every formula and source).

``resolve(arch="preln", init=None, n_layers=N, **options)``.  The defaults are the
DeepScaleLM paper's figure model ([TGS] Kedia et al. 2024, arXiv:2403.09635): width 1024,
16 heads of 64, FFN 4096 with ReLU, 256 tokens, dropout 0.1 on the attention probabilities
and the branch outputs (none inside the FFN), input token correlation r0 (1 - p) with the
measured BERT/Wikipedia embedding correlation r0 = 0.221.

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

Initialisations (std of every weight matrix and bias, per layer): ``normal``, ``xavier``,
``torch-default``, ``scaled``, ``dslm``, ``deepnorm``; see :data:`INITS` and docs/presets.md.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from sigprop.errors import DomainError
from sigprop.model.deepnorm import deepnorm_constants
from sigprop.model.spec import MAX_LAYERS, WEIGHTS, Dropout, Model, Sublayers
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
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                raise DomainError(f"{label} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise DomainError(f"{label} must be finite, got {value!r}")
        bad_lo = self.lo is not None and (value <= self.lo if self.open_lo else value < self.lo)
        bad_hi = self.hi is not None and (value >= self.hi if self.open_hi else value > self.hi)
        if bad_lo or bad_hi:
            raise DomainError(f"{label} must be {self.describe()}, got {value if self.type is int else format(value, 'g')}")
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

ARCH_NAMES = ("preln", "postln", "dslm", "dslm-post", "deepnorm", "lns", "mixln")
INIT_NAMES = ("normal", "xavier", "torch-default", "scaled", "dslm", "deepnorm")

OPTIONS: dict[str, Option] = _opts(
    Option("arch", str, "preln", "architecture preset", choices=ARCH_NAMES),
    Option("init", str, None, "initialisation scheme (default: the architecture's own)", choices=INIT_NAMES),
    Option("n_layers", int, None, "number of layers N, each an attention and an FFN sublayer",
           lo=1, hi=MAX_LAYERS, cli="layers"),
    Option("d_model", int, 1024, "model width d", lo=1),
    Option("n_heads", int, 16, "attention heads", lo=1, cli="heads"),
    Option("d_head", int, None, "head width (default: model width / heads, which must divide it)", lo=1),
    Option("d_ff", int, None, "FFN width (default 4 d_model)", lo=1),
    Option("seq_len", int, 256, "sequence length L", lo=1),
    Option("dropout", float, None, "sets the attention, hidden and FFN-inner dropout (not given: "
           "0.1, 0.1 and 0, the DSLM figure model)", **_PROB),
    Option("attn_dropout", float, None, "dropout on the attention probabilities", **_PROB),
    Option("hidden_dropout", float, None, "dropout on every branch output", **_PROB),
    Option("ffn_dropout", float, None, "dropout after the FFN activation (default 0)", **_PROB),
    Option("activation", str, "relu", "FFN activation", choices=("relu", "gelu")),
    Option("causal", bool, False, "causal (decoder) attention"),
    Option("input_mean", float, 0.0, "mean of the stream entering layer 1"),
    Option("input_var", float, 1.0, "variance of the stream entering layer 1", lo=0.0, open_lo=True),
    Option("input_corr", float, None, "token correlation of the stream entering layer 1 "
           "(default: r0 (1 - hidden dropout), r0 = 0.221)", lo=0.0, hi=1.0),
    Option("grad_var", float, 1.0, "variance of dLoss/dx at the top", lo=0.0),
    Option("grad_corr", float, 0.0, "token correlation of dLoss/dx at the top", lo=-1.0, hi=1.0),
    Option("skip_scale", float, None, "override the skip scale a of every sublayer"),
    Option("branch_scale", float, None, "override the branch scale b of every sublayer"),
    Option("mixln_alpha", float, 0.25, "Mix-LN: fraction of Post-LN layers", lo=0.0, hi=1.0),
    Option("init_std", float, 0.02, "std of the normal and scaled inits", lo=0.0),
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
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_ff: int

    @property
    def width(self) -> int:
        """n_heads * d_head: output width of Q, K, V and input width of O."""
        return self.n_heads * self.d_head

    def fans(self, kind: str, name: str) -> tuple[int, int]:
        d, w, f = self.d_model, self.width, self.d_ff
        return {"q": (d, w), "k": (d, w), "v": (d, w), "o": (w, d), "in": (d, f), "out": (f, d)}[name]


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
    if arch == "postln":
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
    elif arch != "preln":  # pragma: no cover - names are checked before
        raise DomainError(f"unknown arch {arch!r}")
    if opts["skip_scale"] is not None:
        skip = np.full(n, opts["skip_scale"])
    if opts["branch_scale"] is not None:
        branch = np.full(n, opts["branch_scale"])
    return Scales(post, skip, branch, norm)


class ArchInfo(NamedTuple):
    name: str
    title: str
    default_init: str
    formula: str
    source: str


ARCHS: dict[str, ArchInfo] = {a.name: a for a in (
    ArchInfo("preln", "Pre-LN", "normal", "x' = x + F(LN x)", "GPT-2; Xiong et al. 2020"),
    ArchInfo("postln", "Post-LN", "normal", "x' = LN(x + F(x))", "Vaswani et al. 2017; BERT"),
    ArchInfo("dslm", "Pre-LN DeepScaleLM", "dslm",
             "x' = lambda x + beta F(LN x), beta^2 = k/N, lambda^2 = 1 - beta^2", "[TGS] section 4"),
    ArchInfo("dslm-post", "Post-LN DeepScaleLM", "dslm",
             "x' = LN(lambda x + beta F(x)), beta^2 = k/N, lambda^2 = 1 - beta^2", "[TGS] section 4"),
    ArchInfo("deepnorm", "DeepNorm", "deepnorm", "x' = LN(alpha x + F(x)), alpha = (2N)^(1/4)",
             "[DeepNet] Wang et al. 2022, Table 1"),
    ArchInfo("lns", "LayerNorm Scaling", "normal", "x' = x + F(LN(x) / sqrt(l))",
             "[CoD] Sun et al. 2025"),
    ArchInfo("mixln", "Mix-LN", "normal",
             "layers 1..floor(alpha N) Post-LN, the rest Pre-LN (alpha = mixln_alpha)",
             "[MixLN] Li, Yin, Liu 2024"),
)}


# ---------------------------------------------------------------------------------------
# initialisations
# ---------------------------------------------------------------------------------------

class InitResult(NamedTuple):
    #: kind -> weight name -> std (scalar or (n_layers,) column)
    std: dict
    bias_std: dict
    notes: dict


def _zeros_bias() -> dict:
    return {kind: {w: 0.0 for w in names} for kind, names in WEIGHTS.items()}


def _xavier_std(fan_in: int, fan_out: int, gain: float = 1.0) -> float:
    return gain * math.sqrt(2.0 / (fan_in + fan_out))


def init_normal(g: Geometry, ctx) -> InitResult:
    """Every matrix N(0, init_std^2), biases 0 (BERT, GPT-2, Hugging Face default)."""
    s = ctx.opts["init_std"]
    return InitResult({kind: {w: s for w in names} for kind, names in WEIGHTS.items()}, _zeros_bias(), {})


def init_xavier(g: Geometry, ctx) -> InitResult:
    """Xavier as in [TGS]'s baselines: Q, K, V per head d -> d_head, std sqrt(2/(d + d_head));
    O std sqrt(2/(n_heads d_head + d)) (= sqrt(1/d) when n_heads d_head = d); FFN
    sqrt(2/(d + d_ff)) both ways (sqrt(2/(5d)) at d_ff = 4d); biases 0."""
    d, dk = g.d_model, g.d_head
    qkv = _xavier_std(d, dk)
    std = {"attention": {"q": qkv, "k": qkv, "v": qkv, "o": _xavier_std(*g.fans("attention", "o"))},
           "ffn": {"in": _xavier_std(*g.fans("ffn", "in")), "out": _xavier_std(*g.fans("ffn", "out"))}}
    return InitResult(std, _zeros_bias(), {})


def init_torch_default(g: Geometry, ctx) -> InitResult:
    """torch.nn.TransformerEncoderLayer out of the box: in-projection (Q, K, V stacked,
    3 n_heads d_head x d) Xavier-uniform, variance 2/(d + 3 n_heads d_head) (= 1/(2d)),
    bias 0; out-projection kaiming-uniform(a = sqrt 5), variance 1/(3 fan_in), bias 0;
    linear1/linear2 variance 1/(3 fan_in) with biases uniform of variance 1/(3 fan_in)."""
    d, w, f = g.d_model, g.width, g.d_ff
    qkv = math.sqrt(2.0 / (d + 3 * w))
    std = {"attention": {"q": qkv, "k": qkv, "v": qkv, "o": math.sqrt(1 / (3 * w))},
           "ffn": {"in": math.sqrt(1 / (3 * d)), "out": math.sqrt(1 / (3 * f))}}
    bias = _zeros_bias()
    bias["ffn"] = {"in": math.sqrt(1 / (3 * d)), "out": math.sqrt(1 / (3 * f))}
    return InitResult(std, bias, {})


def init_scaled(g: Geometry, ctx) -> InitResult:
    """GPT-2 / Megatron-LM scaled init: attention O and FFN out std init_std / sqrt(2N), every
    other matrix init_std; biases 0."""
    s = ctx.opts["init_std"]
    r = s / math.sqrt(2 * g.n_layers)
    std = {"attention": {"q": s, "k": s, "v": s, "o": r}, "ffn": {"in": s, "out": r}}
    return InitResult(std, _zeros_bias(), {})


def init_deepnorm(g: Geometry, ctx) -> InitResult:
    """DeepNet: Xavier-normal (full projection matrices) with gain beta = (8N)^(-1/4) on V, O,
    FFN in and out, gain 1 on Q and K; biases 0."""
    beta = deepnorm_constants(g.n_layers).beta
    std = {kind: {w: _xavier_std(*g.fans(kind, w), 1.0 if w in ("q", "k") else beta) for w in names}
           for kind, names in WEIGHTS.items()}
    return InitResult(std, _zeros_bias(), {"deepnorm_beta": beta})


def init_dslm(g: Geometry, ctx, ffn_block: Callable | None = None, method: str = "newton") -> InitResult:
    """DeepScaleLM ([TGS] section 4 and [TGS-code]), generalised to any geometry, dropout and
    activation and to the model's own placement and scales; biases 0.

    * Q, K: std sqrt(1/d): logit variance 1 for a LayerNorm'd input.
    * FFN in and out: one common std s chosen so that the FFN block (W_in, activation,
      ffn dropout, W_out, hidden dropout) maps a unit-variance input to a unit-variance output;
      for ReLU s^2 = sqrt(2 (1-p_hid)(1-p_ffn) / (d d_ff)) = (1/d) sqrt((1-p)/2) at d_ff = 4d,
      p_ffn = 0 (the published value).  Solved numerically through the rules, so GeLU works too.
    * V, O of layer l: std^4 = (1 - p_hid) / (r_l d n_heads d_head), i.e. variance
      (1/d) sqrt((1-p)/r_l) at n_heads d_head = d (published), with r_l the token correlation
      of the stream entering layer l from :func:`dslm_stream`: in the small-logit, large-L
      limit the attention output is the token average of V, of variance r_l times the value
      variance, so this gives the attention block unit output variance.
    """
    if ffn_block is None:
        ffn_block = ffn_block_from_rules(g.d_model, g.d_ff, ctx.activation, ctx.dropout.ffn_inner,
                                         ctx.dropout.hidden)
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
    std = {"attention": {"q": s_qk, "k": s_qk, "v": s_vo, "o": s_vo}, "ffn": {"in": s_ffn, "out": s_ffn}}
    notes = {"dslm_stream_corr": _readonly(st.corr), "dslm_stream_var": _readonly(st.var),
             "dslm_ffn_std": s_ffn}
    return InitResult(std, _zeros_bias(), notes)


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
    """What an init function may read besides the geometry."""

    opts: dict
    scales: Scales
    dropout: Dropout
    activation: str
    input: Forward


# ---------------------------------------------------------------------------------------
# resolve
# ---------------------------------------------------------------------------------------

def defaults() -> dict:
    """Every option's default (None where derived or required)."""
    return {k: o.default for k, o in OPTIONS.items()}


def resolve(arch: str = "preln", init: str | None = None, **options) -> Model:
    """Resolve an architecture preset, an init scheme and options into a Model.

    Options (see :data:`OPTIONS`): n_layers (required), d_model=1024, n_heads=16,
    d_head=None (d_model/n_heads), d_ff=None (4 d_model), seq_len=256, dropout (given: sets
    all three dropouts unless the specific ones are given; not given: attention and hidden
    0.1, FFN-inner 0, see :data:`DEFAULT_DROPOUT`), activation="relu", causal=False, input_mean=0,
    input_var=1, input_corr=None (r0 (1 - hidden_dropout), r0 = 0.221), grad_var=1,
    grad_corr=0, skip_scale/branch_scale=None (overrides for every sublayer),
    mixln_alpha=0.25, init_std=0.02, beta_k=1.  Unknown names or bad values raise DomainError.
    """
    given = check_options({"arch": arch, "init": init, **options})
    opts = defaults()
    opts.update({k: v for k, v in given.items() if v is not None})
    arch = opts["arch"]
    if opts["n_layers"] is None:
        raise DomainError("n_layers is required")
    n, d, h = opts["n_layers"], opts["d_model"], opts["n_heads"]
    d_head = opts["d_head"]
    if d_head is None:
        if d % h:
            raise DomainError(f"d_model {d} is not divisible by n_heads {h}: give d_head")
        d_head = d // h
    d_ff = opts["d_ff"] if opts["d_ff"] is not None else 4 * d
    geom = Geometry(n, d, h, d_head, d_ff)

    explicit = given.get("dropout") is not None
    p = opts["dropout"] if explicit else DEFAULT_DROPOUT
    p_att = opts["attn_dropout"] if opts["attn_dropout"] is not None else p
    p_hid = opts["hidden_dropout"] if opts["hidden_dropout"] is not None else p
    p_ffn = opts["ffn_dropout"] if opts["ffn_dropout"] is not None else (p if explicit else 0.0)
    dropout = Dropout(p_att, p_hid, p_ffn)
    corr = opts["input_corr"] if opts["input_corr"] is not None else R0_EMBEDDING * (1 - p_hid)
    inp = Forward(opts["input_mean"], opts["input_var"], corr)
    grad = Backward(opts["grad_var"], opts["grad_corr"])

    scales = _scales(arch, n, opts)
    init_name = opts["init"] or ARCHS[arch].default_init
    res = INITS[init_name].fn(geom, Context(opts, scales, dropout, opts["activation"], inp))

    cols = {kind: Sublayers(kind, scales.post, scales.skip, scales.branch, scales.norm,
                            res.std[kind], res.bias_std[kind]) for kind in WEIGHTS}
    notes = {"init": init_name, **res.notes}
    return Model(arch=arch, n_layers=n, d_model=d, n_heads=h, d_head=d_head, d_ff=d_ff,
                 seq_len=opts["seq_len"], activation=opts["activation"], norm="layernorm",
                 causal=opts["causal"], dropout=dropout, input=inp, grad=grad,
                 attention=cols["attention"], ffn=cols["ffn"], notes=notes)
