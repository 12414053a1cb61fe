"""The whole-model specification: the model object (docs/formats.md, "The model
object"), held column-wise.

A :class:`Model` is fully resolved: every number needed to build the same network elsewhere,
nothing that depends on a preset name (``arch`` is informational).  Per-layer settings are
stored as one NumPy column per field and sublayer kind (:class:`Sublayers`), never as
per-layer Python objects, so that a 100,000-layer model is cheap to build, to compare and to
vectorise over.  Columns are read-only.

JSON: :meth:`Model.to_json` writes exactly the documented layout ("layers": one dict per
layer); :meth:`Model.from_json` validates every field (types, ranges, known keys, lengths)
and raises :class:`sigprop.errors.DomainError` with the JSON path of the first bad value,
e.g. ``model.layers[3].attention.init.q.std must be >= 0, got -1``.  The round trip is
exact (floats are written with Python's shortest repr).
"""

from __future__ import annotations

import math
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from sigprop import registry
from sigprop.errors import DomainError
from sigprop.rope import RopeFreqs, rope_from_json
from sigprop.state import Backward, Forward

#: weight names per sublayer kind, in the documented order
#: the deepest model sigprop resolves and predicts: the prediction keeps every sublayer's
#: state (about 5 KB of memory per layer, ~0.4 KB of trace JSON), so 10^6 layers need ~5 GB
MAX_LAYERS = 1_000_000
#: the longest sequence a model may have (2^53: position counts exact in float64; the
#: predictions turned to NaN by 2^62, and at 2^53 a 2-layer Pre-LN trace sits within 5e-5 of its
#: large-L limit)
MAX_SEQ_LEN = 2 ** 53
#: the longest causal sequence: the position grid (sigprop.model.positions.NodeGrid) sums its
#: panels' moments over every position once, ~50 s at 10^9 positions (memory does not grow
#: with it)
MAX_CAUSAL_SEQ_LEN = 2 ** 30

WEIGHTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "attention": ("q", "k", "v", "o"),
    "ffn": ("in", "out"),
})
#: the weight names of a gated FFN (ffn_kind "glu")
GLU_WEIGHTS = ("gate", "up", "down")
#: ffn_kind -> the FFN sublayer's weight names
#: a mixture-of-experts FFN's weights (ffn_kind "moe"): the router and every routed expert's
#: gate, up and down; with a shared expert its three, with a shared-expert gate its vector
MOE_WEIGHTS = ("router", "gate", "up", "down")
MOE_SHARED_WEIGHTS = ("shared_gate", "shared_up", "shared_down")
MOE_MIX_WEIGHTS = ("shared_mix",)
FFN_WEIGHTS: Mapping[str, tuple[str, ...]] = MappingProxyType({"mlp": WEIGHTS["ffn"], "glu": GLU_WEIGHTS,
                                                               "moe": MOE_WEIGHTS})
#: every weight-name set an FFN sublayer may have
_FFN_NAME_SETS = (WEIGHTS["ffn"], GLU_WEIGHTS, MOE_WEIGHTS, MOE_WEIGHTS + MOE_SHARED_WEIGHTS,
                  MOE_WEIGHTS + MOE_SHARED_WEIGHTS + MOE_MIX_WEIGHTS)
KINDS = tuple(WEIGHTS)
#: the registered activations and norm kinds (sigprop.registry), read when used
ACTIVATIONS = registry.Names("activation")
NORMS = registry.Names("norm")
#: sublayer placements, in the order of their codes in ``Sublayers.placement``
PLACEMENTS = ("pre", "post", "peri", "output")
BLOCKS = ("sequential", "parallel")
FFN_KINDS = ("mlp", "glu", "moe")
#: the mixture-of-experts routers (MoE.router)
MOE_ROUTERS = ("softmax", "sigmoid")
#: the optional model fields (the modern blocks) and their defaults: absent = default, and a
#: model object written by to_json carries a field only where it differs from its default
DEFAULT_NORM_EPS = 1e-5
OPTIONAL_DEFAULTS: Mapping[str, object] = MappingProxyType({
    "norm_eps": DEFAULT_NORM_EPS, "block": "sequential", "ffn_kind": "mlp", "n_kv_heads": None,
    "rope": None, "qk_norm": None, "final_norm": False, "attn_softcap": None, "window": None, "local_rope": None,
    "moe": None})


def weight_names(kind: str, ffn_kind="mlp") -> tuple[str, ...]:
    """The weight names of a sublayer of ``kind`` (attention and cross_attention: q, k, v, o;
    ffn: in, out, or for a gated FFN gate, up, down; ``ffn_kind`` may be the FFN's names
    themselves, a tuple: a mixture of experts', :meth:`MoE.weight_names`)."""
    if kind == "cross_attention":
        return WEIGHTS["attention"]
    if kind == "ffn":
        return ffn_kind if isinstance(ffn_kind, tuple) else FFN_WEIGHTS[ffn_kind]
    return WEIGHTS[kind]

_MODEL_KEYS = ("arch", "n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len", "activation",
               "norm", "causal", "dropout", "input", "grad", "layers")
_DROPOUT_KEYS = ("attention", "hidden", "ffn_inner")
_INPUT_KEYS = ("mean", "var", "corr")
_GRAD_KEYS = ("var", "corr")
_SUBLAYER_KEYS = ("placement", "skip_scale", "branch_scale", "norm_scale", "init")
_INIT_KEYS = ("std", "bias_std")
_SCALES = ("skip_scale", "branch_scale", "norm_scale")


class _Frozen:
    """Attributes set once in ``__init__`` (through :meth:`_set`) and read-only afterwards: a
    frozen dataclass's behaviour without its cost at import (a dataclass is built with
    ``exec``; the predictor's start-up paid ~10 ms for its dataclasses).  ``FIELDS`` names the
    constructor's fields in order."""

    __slots__ = ()
    FIELDS: tuple = ()

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r} ({type(self).__name__} is frozen)")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r} ({type(self).__name__} is frozen)")

    def __setstate__(self, state):
        """copy and pickle restore the fields through here (not through __setattr__)."""
        for name, value in state[1].items():
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple:
        return tuple(getattr(self, name) for name in self.FIELDS)


# ---------------------------------------------------------------------------------------
# columns of one sublayer kind
# ---------------------------------------------------------------------------------------

def _column(value, n: int, dtype, what: str) -> np.ndarray:
    """A read-only (n,) column from a scalar or a length-n sequence."""
    try:
        a = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError):
        raise DomainError(f"{what} must be a number or an array of {n} numbers") from None
    if a.ndim == 0:
        a = np.full(n, a, dtype=dtype)
    elif a.shape != (n,):
        raise DomainError(f"{what} must have shape ({n},), got {a.shape}")
    else:
        a = np.array(a, dtype=dtype, copy=True)
    a.flags.writeable = False
    return a


def _first_bad(bad: np.ndarray) -> int | None:
    if bad.any():
        return int(np.argmax(bad))
    return None


def placement_codes(value) -> np.ndarray:
    """Placement codes (indices into PLACEMENTS) from names, codes or booleans (False: pre,
    True: post), as a scalar or a sequence."""
    a = np.asarray(value)
    if a.dtype == bool:
        return a.astype(np.int8)
    if a.dtype.kind in "US":
        flat = [str(v) for v in a.ravel()]
        bad = [v for v in flat if v not in PLACEMENTS]
        if bad:
            raise DomainError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, got {bad[0]!r}")
        return np.array([PLACEMENTS.index(v) for v in flat], dtype=np.int8).reshape(a.shape)
    if a.dtype.kind in "iu" and np.isin(a, range(len(PLACEMENTS))).all():
        return a.astype(np.int8)
    raise DomainError("placement must be given as names ('pre', 'post', 'peri', 'output') or booleans (post)")


class Sublayers(_Frozen):
    """All sublayers of one kind ("attention" or "ffn"), one entry per layer (0-based).

    Columns, shape (n_layers,): ``placement`` (int8 codes into :data:`PLACEMENTS`; accepted
    as names, codes or booleans meaning "post"), ``skip_scale`` (a), ``branch_scale`` (b),
    ``norm_scale`` (n); ``std[name]`` and ``bias_std[name]`` per weight (attention: q, k, v,
    o; ffn: in, out, or gate, up, down for a gated FFN).  Scalars and sequences are accepted
    and broadcast; the stored columns are float64 (int8 for ``placement``) and read-only.
    ``post`` is the boolean column "placement is post".
    """

    FIELDS = ("kind", "placement", "skip_scale", "branch_scale", "norm_scale", "std", "bias_std")
    __slots__ = FIELDS

    def __init__(self, kind: str, placement, skip_scale, branch_scale, norm_scale, std: Mapping,
                 bias_std: Mapping):
        for name, value in zip(self.FIELDS, (kind, placement, skip_scale, branch_scale, norm_scale, std, bias_std),
                               strict=True):
            self._set(name, value)
        if self.kind not in WEIGHTS and self.kind != "cross_attention":
            raise DomainError(f"sublayer kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        wts = WEIGHTS["attention"] if self.kind == "cross_attention" else None
        post = placement_codes(self.placement)
        n = post.shape[0] if post.ndim == 1 else None
        if n is None:
            for name in _SCALES:
                v = np.asarray(getattr(self, name))
                if v.ndim == 1:
                    n = v.shape[0]
                    break
        if n is None:
            for v in (*self.std.values(), *self.bias_std.values()):
                if np.ndim(v) == 1:
                    n = np.shape(v)[0]
                    break
        if n is None:
            raise DomainError(f"{self.kind}: at least one column must be an array (the number of layers)")
        where = self.kind
        self._set("placement", _column(post, n, np.int8, f"{where}.placement"))
        for name in _SCALES:
            col = _column(getattr(self, name), n, np.float64, f"{where}.{name}")
            i = _first_bad(~np.isfinite(col))
            if i is not None:
                raise DomainError(f"{where}.{name}[{i}] must be finite, got {col[i]:g}")
            self._set(name, col)
        given = set(self.std)
        names = wts or next((ns for ns in (_FFN_NAME_SETS if self.kind == "ffn" else (WEIGHTS[self.kind],))
                             if set(ns) == given), WEIGHTS[self.kind])
        for attr in ("std", "bias_std"):
            given = dict(getattr(self, attr))
            if set(given) != set(names):
                raise DomainError(f"{where}.{attr} needs exactly the weights {', '.join(names)}, "
                                  f"got {', '.join(map(str, given)) or 'none'}")
            cols = {}
            for w in names:
                col = _column(given[w], n, np.float64, f"{where}.{attr}[{w!r}]")
                i = _first_bad(~(np.isfinite(col) & (col >= 0)))
                if i is not None:
                    raise DomainError(f"{where}.{attr}[{w!r}][{i}] must be finite and >= 0, got {col[i]:g}")
                cols[w] = col
            self._set(attr, MappingProxyType(cols))

    # -- conveniences -------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return int(self.placement.shape[0])

    @property
    def names(self) -> tuple[str, ...]:
        """The weight names, in the documented order."""
        return tuple(self.std)

    @property
    def post(self) -> np.ndarray:
        """Boolean column: placement "post"."""
        return self.placement == 1

    def placement_of(self, layer: int) -> str:
        """The placement name of layer ``layer`` (0-based)."""
        return PLACEMENTS[int(self.placement[layer])]

    def placements(self) -> set:
        """The placement names used."""
        return {PLACEMENTS[c] for c in set(self.placement.tolist())}

    def __repr__(self) -> str:
        return f"Sublayers({self.kind!r}, n_layers={self.n_layers})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sublayers):
            return NotImplemented
        return (self.kind == other.kind and self.names == other.names
                and all(np.array_equal(getattr(self, c), getattr(other, c)) for c in ("placement", *_SCALES))
                and all(np.array_equal(self.std[w], other.std[w]) and
                        np.array_equal(self.bias_std[w], other.bias_std[w]) for w in self.names))

    __hash__ = None  # type: ignore[assignment]

    def _json_columns(self, rows=None) -> list:
        """Per-layer sublayer dicts in the documented layout, built column-wise (``rows``: only
        those layers, 0-based indices)."""
        names = self.names

        def col(c):
            return (c if rows is None else c[rows]).tolist()

        place = [PLACEMENTS[p] for p in col(self.placement)]
        std = [col(self.std[w]) for w in names]
        bstd = [col(self.bias_std[w]) for w in names]
        if len(names) == 4:
            inits = [{names[0]: {"std": s0, "bias_std": b0}, names[1]: {"std": s1, "bias_std": b1},
                      names[2]: {"std": s2, "bias_std": b2}, names[3]: {"std": s3, "bias_std": b3}}
                     for s0, s1, s2, s3, b0, b1, b2, b3 in zip(*std, *bstd)]
        else:
            inits = [{w: {"std": s, "bias_std": b} for w, s, b in zip(names, ss, bs)}
                     for ss, bs in zip(zip(*std), zip(*bstd))]
        return [{"placement": p, "skip_scale": a, "branch_scale": b, "norm_scale": n, "init": i}
                for p, a, b, n, i in zip(place, col(self.skip_scale), col(self.branch_scale),
                                         col(self.norm_scale), inits)]

    def _bits(self) -> np.ndarray:
        """Every column side by side as raw 64-bit patterns, shape (n_layers, k): equal rows
        give equal JSON objects (bit patterns, so 0.0 and -0.0 differ as their texts do)."""
        cols = [self.placement.astype(np.float64), self.skip_scale, self.branch_scale, self.norm_scale]
        cols += [self.std[w] for w in self.names] + [self.bias_std[w] for w in self.names]
        return np.ascontiguousarray(np.column_stack(cols)).view(np.int64)


class StreamNorms(_Frozen):
    """The norm sublayers of one position in a layer's sublayer list ("kind": "norm"), one
    entry per layer: x' = n * N(x), a norm of the stream itself, no residual and no init.

    It has the columns a residual :class:`Sublayers` has, so that code reading a sublayer's
    parameters reads these the same way: ``norm_scale`` (n), ``placement`` ("pre": the norm
    reads the stream), ``skip_scale`` 0 and ``branch_scale`` 1 (x' = 0 x + 1 (n N(x))), and no
    weights."""

    FIELDS = ("kind", "norm_scale")
    __slots__ = FIELDS + ("placement", "skip_scale", "branch_scale", "std", "bias_std")

    def __init__(self, norm_scale):
        self._set("kind", "norm")
        n = np.asarray(norm_scale).shape[0] if np.ndim(norm_scale) == 1 else None
        if n is None:
            raise DomainError("norm: norm_scale must be an array (the number of layers)")
        col = _column(norm_scale, n, np.float64, "norm.norm_scale")
        i = _first_bad(~np.isfinite(col))
        if i is not None:
            raise DomainError(f"norm.norm_scale[{i}] must be finite, got {col[i]:g}")
        self._set("norm_scale", col)
        self._set("placement", _column(0, n, np.int8, "norm.placement"))
        self._set("skip_scale", _column(0.0, n, np.float64, "norm.skip_scale"))
        self._set("branch_scale", _column(1.0, n, np.float64, "norm.branch_scale"))
        self._set("std", MappingProxyType({}))
        self._set("bias_std", MappingProxyType({}))

    n_layers = Sublayers.n_layers
    names = Sublayers.names
    placements = Sublayers.placements

    def __repr__(self) -> str:
        return f"StreamNorms(n_layers={self.n_layers})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, StreamNorms):
            return NotImplemented
        return np.array_equal(self.norm_scale, other.norm_scale)

    __hash__ = None  # type: ignore[assignment]

    def _json_columns(self, rows=None) -> list:
        return [{"norm_scale": n} for n in (self.norm_scale if rows is None else self.norm_scale[rows]).tolist()]

    def _bits(self) -> np.ndarray:
        return np.ascontiguousarray(self.norm_scale[:, None]).view(np.int64)


class Dropout(_Frozen):
    """Dropout probabilities: on the attention probabilities, on every branch output
    ("hidden") and after the FFN activation ("ffn_inner"); each in [0, 1)."""

    FIELDS = _DROPOUT_KEYS
    __slots__ = FIELDS

    def __init__(self, attention: float = 0.0, hidden: float = 0.0, ffn_inner: float = 0.0):
        for k, v in zip(_DROPOUT_KEYS, (attention, hidden, ffn_inner), strict=True):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0.0 <= v < 1.0):
                raise DomainError(f"dropout.{k} must lie in [0, 1), got {v!r}")
            self._set(k, float(v))

    def __eq__(self, other) -> bool:
        if not isinstance(other, Dropout):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Dropout(" + ", ".join(f"{k}={v!r}" for k, v in zip(self.FIELDS, self._fields())) + ")"


class MoE(_Frozen):
    """A mixture-of-experts FFN's routing and widths (the model's ``moe``, with ffn_kind
    "moe"; docs/formats.md): ``n_experts`` routed experts of hidden width ``d_ff_expert``, of
    which the router picks ``top_k`` per token (``router`` "softmax" or "sigmoid" scores;
    ``norm_topk_prob``: the chosen weights renormalised; ``route_scale`` on every routed
    weight; group-limited routing over ``n_group`` groups keeping ``topk_group``), and a shared
    expert of width ``d_ff_shared`` (0: none), gated by sigmoid(h w_mix) where ``shared_mix``."""

    FIELDS = ("n_experts", "top_k", "router", "norm_topk_prob", "route_scale", "d_ff_expert", "n_group",
              "topk_group", "d_ff_shared", "shared_mix")
    DEFAULTS = MappingProxyType({"router": "softmax", "norm_topk_prob": False, "route_scale": 1.0, "n_group": 1,
                                 "topk_group": 1, "d_ff_shared": 0, "shared_mix": False})
    __slots__ = FIELDS

    def __init__(self, n_experts: int, top_k: int, d_ff_expert: int, router: str = "softmax",
                 norm_topk_prob: bool = False, route_scale: float = 1.0, n_group: int = 1, topk_group: int = 1,
                 d_ff_shared: int = 0, shared_mix: bool = False):
        for k, v in (("n_experts", n_experts), ("top_k", top_k), ("d_ff_expert", d_ff_expert), ("n_group", n_group),
                     ("topk_group", topk_group)):
            if not _is_int(v) or v < 1:
                raise DomainError(f"moe.{k} must be a positive integer, got {v!r}")
            self._set(k, int(v))
        if not _is_int(d_ff_shared) or d_ff_shared < 0:
            raise DomainError(f"moe.d_ff_shared must be an integer >= 0 (0: no shared expert), got {d_ff_shared!r}")
        self._set("d_ff_shared", int(d_ff_shared))
        if router not in MOE_ROUTERS:
            raise DomainError(f"moe.router must be one of {', '.join(map(repr, MOE_ROUTERS))}, got {router!r}")
        self._set("router", router)
        for k, v in (("norm_topk_prob", norm_topk_prob), ("shared_mix", shared_mix)):
            if not isinstance(v, (bool, np.bool_)):
                raise DomainError(f"moe.{k} must be true or false, got {v!r}")
            self._set(k, bool(v))
        if not _is_number(route_scale) or not (math.isfinite(float(route_scale)) and float(route_scale) > 0):
            raise DomainError(f"moe.route_scale must be a finite number > 0, got {route_scale!r}")
        self._set("route_scale", float(route_scale))
        E, k, G, kg = self.n_experts, self.top_k, self.n_group, self.topk_group
        if k > E:
            raise DomainError(f"moe.top_k {k} exceeds moe.n_experts {E}")
        if E % G:
            raise DomainError(f"moe.n_group {G} must divide moe.n_experts {E}")
        if kg > G:
            raise DomainError(f"moe.topk_group {kg} exceeds moe.n_group {G}")
        if k > kg * (E // G):
            raise DomainError(f"moe.top_k {k} exceeds the {kg * (E // G)} experts of the {kg} kept groups")
        if self.shared_mix and not self.d_ff_shared:
            raise DomainError("moe.shared_mix gates the shared expert: the model has none (moe.d_ff_shared 0)")

    def weight_names(self) -> tuple[str, ...]:
        return MOE_WEIGHTS + (MOE_SHARED_WEIGHTS if self.d_ff_shared else ()) + (MOE_MIX_WEIGHTS if self.shared_mix else ())

    def to_json(self) -> dict:
        out = {"n_experts": self.n_experts, "top_k": self.top_k, "d_ff_expert": self.d_ff_expert}
        for k, default in self.DEFAULTS.items():
            if getattr(self, k) != default:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_json(cls, obj, where: str = "moe") -> "MoE":
        if not isinstance(obj, dict):
            raise DomainError(f"{where} must be an object, got {_type_name(obj)}")
        known = set(cls.FIELDS)
        unknown = sorted(set(obj) - known)
        if unknown:
            raise DomainError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(cls.FIELDS)})")
        for k in ("n_experts", "top_k", "d_ff_expert"):
            if k not in obj:
                raise DomainError(f"{where}.{k} is required")
        try:
            return cls(**obj)
        except DomainError as e:
            raise DomainError(str(e).replace("moe.", f"{where}.", 1)) from None
        except TypeError as e:
            raise DomainError(f"{where}: {e}") from None

    def __eq__(self, other) -> bool:
        if not isinstance(other, MoE):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "MoE(" + ", ".join(f"{k}={v!r}" for k, v in zip(self.FIELDS, self._fields())) + ")"


# ---------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------


#: why a sequence needs at least two tokens (said by every refusal of a shorter one)
TWO_TOKENS = "a token correlation needs two tokens"


def require_two_tokens(seq_len: int, where: str = "") -> None:
    """Refuse (DomainError) a sequence of fewer than two tokens, whose token correlation is
    undefined; ``where``: the field's prefix in the message."""
    if seq_len < 2:
        raise DomainError(f"{where}seq_len must be >= 2 ({TWO_TOKENS}), got {seq_len}")


class Model(_Frozen):
    """A fully resolved model (docs/formats.md, "The model object").

    ``input`` is the stream entering layer 1 (a :class:`sigprop.state.Forward`: mean, var,
    corr); ``grad`` is dLoss/dx at the output of the last sublayer (a
    :class:`sigprop.state.Backward`: var, corr).  ``attention`` and ``ffn`` hold the per-layer
    columns (:class:`Sublayers`); layer ``l`` (0-based here, 1-based in traces) is the
    attention sublayer ``l`` followed by the FFN sublayer ``l``.
    """

    FIELDS = ("arch", "n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len", "activation", "norm",
              "causal", "dropout", "input", "grad", "attention", "ffn", "notes", *OPTIONAL_DEFAULTS, "sublayers")
    __slots__ = FIELDS

    def __init__(self, arch: str, n_layers: int, d_model: int, n_heads: int, d_head: int, d_ff: int,
                 seq_len: int, activation: str, norm: str, causal: bool, dropout: Dropout, input: Forward,
                 grad: Backward, attention: Sublayers, ffn: Sublayers, notes: Mapping | None = None, *,
                 norm_eps: float = DEFAULT_NORM_EPS, block: str = "sequential", ffn_kind: str = "mlp",
                 n_kv_heads: int | None = None, rope: float | RopeFreqs | None = None, qk_norm: str | None = None,
                 final_norm: bool = False, attn_softcap: float | None = None, window=None,
                 local_rope: float | RopeFreqs | None = None, moe: "MoE | None" = None,
                 sublayers: tuple | None = None):
        # ``notes``: extra information (not part of the model object, not written by
        # to_json, not compared).  The keyword-only fields are the modern blocks' (docs/formats.md):
        # ``rope`` is the rotary base or a sigprop.rope.RopeFreqs (None: no rotation); ``n_kv_heads`` None means n_heads;
        # ``attn_softcap`` the attention logits' soft cap c (s -> c tanh(s / c); None: none).
        # ``window``: sliding-window attention, one window per layer (a tuple of n_layers ints,
        # 0 = global; an int: every layer; None: none); ``local_rope`` the rotary base (or
        # RopeFreqs) of the layers with a window (None: they use ``rope``).
        for name, value in zip(self.FIELDS, (arch, n_layers, d_model, n_heads, d_head, d_ff, seq_len, activation,
                                             norm, causal, dropout, input, grad, attention, ffn,
                                             {} if notes is None else notes, norm_eps, block, ffn_kind,
                                             n_kv_heads, rope, qk_norm, final_norm, attn_softcap, window, local_rope,
                                             moe, sublayers), strict=True):
            self._set(name, value)
        if not isinstance(self.arch, str):
            raise DomainError(f"arch must be a string, got {self.arch!r}")
        for k in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise DomainError(f"{k} must be a positive integer, got {v!r}")
            self._set(k, int(v))
        require_two_tokens(self.seq_len)
        if self.seq_len > MAX_SEQ_LEN:
            raise DomainError(f"seq_len must be at most 2^53 = {MAX_SEQ_LEN:,} (positions counted exactly in "
                              f"float64), got {self.seq_len:,}")
        if self.activation not in registry.activations():
            raise DomainError(f"activation must be one of {', '.join(registry.activations())}, got {self.activation!r}")
        if self.norm not in registry.norms():
            raise DomainError(f"norm must be one of {', '.join(registry.norms())}, got {self.norm!r}")
        if not isinstance(self.causal, (bool, np.bool_)):
            raise DomainError(f"causal must be true or false, got {self.causal!r}")
        self._set("causal", bool(self.causal))
        if self.causal and self.seq_len > MAX_CAUSAL_SEQ_LEN:
            raise DomainError(f"seq_len {self.seq_len:,} is beyond the {MAX_CAUSAL_SEQ_LEN:,} positions (2^30) of a "
                              "causal model (its position grid sums over every position once: ~1 minute at 2^30)")
        if not isinstance(self.dropout, Dropout):
            raise DomainError("dropout must be a sigprop.model.spec.Dropout")
        x, g = self.input, self.grad
        _check_state("input", x.mean, x.var, x.corr)
        _check_state("grad", None, g.var, g.corr)
        self._set("input", Forward(float(x.mean), float(x.var), float(x.corr)))
        self._set("grad", Backward(float(g.var), float(g.corr)))
        for kind in KINDS:
            s = getattr(self, kind)
            if not isinstance(s, Sublayers) or s.kind != kind:
                raise DomainError(f"{kind} must be a Sublayers of kind {kind!r}")
            if s.n_layers != self.n_layers:
                raise DomainError(f"{kind} has {s.n_layers} layers, the model {self.n_layers}")
        self._set("notes", MappingProxyType(dict(self.notes)))
        self._check_sublayers()
        self._check_modern()

    def _check_sublayers(self) -> None:
        """A layer given as a list of sublayers (``sublayers``: one :class:`Sublayers` or
        :class:`StreamNorms` per position in the list, every layer the same list of kinds):
        ``attention`` and ``ffn`` are its first sublayers of those kinds.  The list
        [attention, ffn] is the ordinary layer and is kept as ``sublayers`` None."""
        subs = self.sublayers
        if subs is None:
            return
        subs = tuple(subs)
        for j, s in enumerate(subs):
            if not isinstance(s, (Sublayers, StreamNorms)):
                raise DomainError(f"sublayers[{j}] must be a Sublayers or a StreamNorms")
            if s.n_layers != self.n_layers:
                raise DomainError(f"sublayers[{j}] has {s.n_layers} layers, the model {self.n_layers}")
        kinds = [s.kind for s in subs]
        for kind in KINDS:
            if kind not in kinds:
                raise DomainError(f"a layer without an {kind} sublayer is not implemented (yet): "
                                  f"the sublayers are {', '.join(kinds)}")
            first = subs[kinds.index(kind)]
            if first != getattr(self, kind):
                raise DomainError(f"{kind} must be the layer's first {kind} sublayer")
            self._set(kind, first)
        self._set("sublayers", None if kinds == list(KINDS) else subs)

    def _check_modern(self) -> None:
        """The modern blocks' fields, and the constraints between fields they add."""
        if not _is_number(self.norm_eps) or not (math.isfinite(float(self.norm_eps)) and float(self.norm_eps) >= 0):
            raise DomainError(f"norm_eps must be a finite number >= 0, got {self.norm_eps!r}")
        self._set("norm_eps", float(self.norm_eps))
        if self.block not in BLOCKS:
            raise DomainError(f"block must be one of {', '.join(map(repr, BLOCKS))}, got {self.block!r}")
        if self.ffn_kind not in FFN_KINDS:
            raise DomainError(f"ffn_kind must be one of {', '.join(map(repr, FFN_KINDS))}, got {self.ffn_kind!r}")
        want = self.ffn_weight_names()
        for s in self.slots():
            if s.kind == "ffn" and s.names != want:
                raise DomainError(f"an ffn_kind {self.ffn_kind!r} FFN{self._moe_says()} has the weights "
                                  f"{', '.join(want)}, got {', '.join(s.names)}")
        self._check_moe()
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if isinstance(kv, bool) or not isinstance(kv, (int, np.integer)) or kv < 1:
            raise DomainError(f"n_kv_heads must be a positive integer, got {kv!r}")
        if self.n_heads % kv:
            raise DomainError(f"n_kv_heads {kv} must divide n_heads {self.n_heads}")
        self._set("n_kv_heads", int(kv))
        if isinstance(self.rope, RopeFreqs):
            if self.d_head != 2 * self.rope.n_planes:
                raise DomainError(f"rope.inv_freq has {self.rope.n_planes} entries; d_head {self.d_head} needs "
                                  f"{self.d_head / 2:g} (one per rotation plane)")
        elif self.rope is not None:
            if not _is_number(self.rope) or not (math.isfinite(float(self.rope)) and float(self.rope) > 1):
                raise DomainError(f"rope.base must be a finite number > 1, got {self.rope!r}")
            if self.d_head % 2:
                raise DomainError(f"rope needs an even d_head, got {self.d_head}")
            self._set("rope", float(self.rope))
        if self.qk_norm is not None and self.qk_norm not in registry.norms():
            raise DomainError(f"qk_norm must be null or one of {', '.join(map(repr, registry.norms()))}, "
                              f"got {self.qk_norm!r}")
        if self.qk_norm is not None and registry.norm(self.qk_norm).pointwise:
            raise DomainError(f"qk_norm {self.qk_norm!r} is a pointwise function, not a norm of the queries and keys: "
                              f"a QK-norm is one of {', '.join(n for n in registry.norms() if not registry.norm(n).pointwise)}")
        if not isinstance(self.final_norm, (bool, np.bool_)):
            raise DomainError(f"final_norm must be true or false, got {self.final_norm!r}")
        self._set("final_norm", bool(self.final_norm))
        if self.attn_softcap is not None:
            c = self.attn_softcap
            if not _is_number(c) or not (math.isfinite(float(c)) and float(c) > 0):
                raise DomainError(f"attn_softcap must be null or a finite number > 0, got {c!r}")
            self._set("attn_softcap", float(c))
        if self.window is not None:
            w = self.window
            w = [w] * self.n_layers if _is_int(w) else list(w) if isinstance(w, (list, tuple, np.ndarray)) else w
            if not isinstance(w, list) or len(w) != self.n_layers or not all(_is_int(v) and v >= 0 for v in w):
                raise DomainError(f"window must be null, an integer >= 0 or a list of n_layers ({self.n_layers}) "
                                  f"integers >= 0 (0 = global attention), got {self.window!r}")
            w = tuple(int(v) for v in w)
            self._set("window", w if any(w) else None)
        if self.local_rope is not None:
            r = self.local_rope
            if isinstance(r, RopeFreqs):
                if self.d_head != 2 * r.n_planes:
                    raise DomainError(f"local_rope.inv_freq has {r.n_planes} entries; d_head {self.d_head} needs "
                                      f"{self.d_head // 2}")
            else:
                if not _is_number(r) or not (math.isfinite(float(r)) and float(r) > 1):
                    raise DomainError(f"local_rope.base must be a finite number > 1, got {r!r}")
                if self.d_head % 2:
                    raise DomainError(f"local_rope needs an even d_head, got {self.d_head}")
                self._set("local_rope", float(r))
            if self.window is None:
                raise DomainError("local_rope is the rotary base of the layers with a sliding window: the model "
                                  "has none (window)")
        if self.block == "parallel":
            slots = self.slots()
            if any(s.kind == "norm" for s in slots):
                raise DomainError("a parallel layer sums residual branches: a norm sublayer has no place in it")
            first = slots[0]
            if any((s.placement != 0).any() for s in slots):
                raise DomainError("a parallel block needs every sublayer of every layer 'pre' "
                                  f"(got {', '.join(sorted(set().union(*(s.placements() for s in slots))))})")
            for s in slots[1:]:
                if not np.array_equal(first.norm_scale, s.norm_scale):
                    i = int(np.argmax(first.norm_scale != s.norm_scale))
                    raise DomainError(f"a parallel block's sublayers share one norm: layers[{i}] has norm_scale "
                                      f"{first.norm_scale[i]:g} ({first.kind}) and {s.norm_scale[i]:g} ({s.kind})")
                if (s.skip_scale != 1).any():
                    i = int(np.argmax(s.skip_scale != 1))
                    raise DomainError(f"a parallel block has one skip path, the first sublayer's: layers[{i}]"
                                      f".{s.kind}.skip_scale must be 1, got {s.skip_scale[i]:g}")

    def ffn_weight_names(self) -> tuple[str, ...]:
        """The FFN sublayers' weight names (ffn_kind "moe": the router and experts', and the
        shared expert's where the model's ``moe`` has one)."""
        if self.ffn_kind != "moe" or self.moe is None:
            return FFN_WEIGHTS[self.ffn_kind]
        return self.moe.weight_names()

    def _moe_says(self) -> str:
        if self.ffn_kind != "moe" or self.moe is None:
            return ""
        return f" (moe.d_ff_shared {self.moe.d_ff_shared}, moe.shared_mix {str(self.moe.shared_mix).lower()})"

    def _check_moe(self) -> None:
        """ffn_kind "moe" and the ``moe`` object go together; the mixture's experts are gated
        FFNs without biases or inner dropout, on a pre or post placement."""
        if self.moe is not None and not isinstance(self.moe, MoE):
            raise DomainError("moe must be a sigprop.model.spec.MoE")
        if (self.ffn_kind == "moe") != (self.moe is not None):
            raise DomainError('ffn_kind "moe" and the moe object (the mixture\'s routing and widths) go together: '
                              + ("the model has no moe object" if self.moe is None else
                                 f"the model has a moe object but ffn_kind {self.ffn_kind!r}"))
        if self.moe is None:
            return
        if self.dropout.ffn_inner:
            raise DomainError(f"a mixture of experts has no inner dropout (dropout.ffn_inner must be 0, got "
                              f"{self.dropout.ffn_inner:g})")
        if self.block != "sequential":
            raise DomainError("a mixture-of-experts FFN in a parallel block is not implemented (yet)")
        for s in self.slots():
            if s.kind != "ffn":
                continue
            bad = sorted(s.placements() - {"pre", "post"})
            if bad:
                raise DomainError(f"a mixture-of-experts FFN with placement {bad[0]!r} (a norm on its output) is not "
                                  "implemented: the rule gives the mean over tokens of the routed weights, not their "
                                  "per-token spread")
            for w, col in s.bias_std.items():
                if (col != 0).any():
                    raise DomainError(f"a mixture-of-experts FFN has no biases: ffn.init.{w}.bias_std must be 0, got "
                                      f"{col[int(np.argmax(col != 0))]:g}")

    def features(self) -> list[str]:
        """The modern-block features this model uses, as "field value" names (e.g.
        "norm rmsnorm", "placement peri", "block parallel", "rope"): what a consumer that does
        not implement every feature checks with :func:`require`."""
        out = []
        if self.norm != "layernorm":
            out.append(f"norm {self.norm}")
        if self.activation == "silu":
            out.append("activation silu")
        if self.sublayers is not None:
            out.append("sublayers")
            if any(s.kind == "cross_attention" for s in self.sublayers):
                out.append("cross_attention")
        for p in sorted(set().union(*(s.placements() for s in self.slots() if s.kind != "norm"))):
            if p not in ("pre", "post"):
                out.append(f"placement {p}")
        if self.block != "sequential":
            out.append(f"block {self.block}")
        if self.ffn_kind != "mlp":
            out.append(f"ffn_kind {self.ffn_kind}")
        if self.n_kv_heads != self.n_heads:
            out.append("n_kv_heads")
        for name in ("rope", "qk_norm"):
            if getattr(self, name) is not None:
                out.append(name)
        if self.final_norm:
            out.append("final_norm")
        if self.attn_softcap is not None:
            out.append("attn_softcap")
        if self.window is not None:
            out.append("window")
        if self.local_rope is not None:
            out.append("local_rope")
        return out

    def window_of(self, layer: int) -> int:
        """Layer ``layer``'s (0-based) sliding window, 0 for global attention."""
        return 0 if self.window is None else self.window[layer]

    def rope_of(self, layer: int):
        """The rotary positions of layer ``layer`` (0-based): ``local_rope`` for a layer with a
        window where the model has one, else ``rope``."""
        if self.local_rope is not None and self.window_of(layer):
            return self.local_rope
        return self.rope

    def replace(self, **changes) -> "Model":
        """A copy with some fields changed (validated like a new model)."""
        fields = {k: getattr(self, k) for k in self.FIELDS}
        fields.update(changes)
        opt = {k: fields.pop(k) for k in (*OPTIONAL_DEFAULTS, "sublayers")}
        if opt["sublayers"] is not None and "sublayers" not in changes:
            # a changed attention or ffn replaces the layer's first sublayer of that kind
            subs = list(opt["sublayers"])
            for kind in KINDS:
                if kind in changes:
                    subs[[s.kind for s in subs].index(kind)] = changes[kind]
            opt["sublayers"] = tuple(subs)
        return Model(**fields, **opt)

    # -- conveniences -------------------------------------------------------------------
    def slots(self) -> tuple:
        """The sublayers of a layer in order, one column object per position in the layer's
        list (:class:`Sublayers`, :class:`StreamNorms`): (attention, ffn) for the ordinary
        layer."""
        return (self.attention, self.ffn) if self.sublayers is None else self.sublayers

    def sublayer_columns(self, kind: str) -> Sublayers:
        """The first sublayer of ``kind`` ("attention" or "ffn") of every layer."""
        if kind not in WEIGHTS:
            raise DomainError(f"sublayer kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return getattr(self, kind)

    def fans(self, kind: str, name: str) -> tuple[int, int]:
        """(fan_in, fan_out) of weight ``name`` of sublayer ``kind``: q maps d_model ->
        n_heads * d_head, k and v d_model -> n_kv_heads * d_head, o maps n_heads * d_head
        back; ffn in (gate, up) maps d_model -> d_ff, out (down) back."""
        d, w, f = self.d_model, self.n_heads * self.d_head, self.d_ff
        kv = self.n_kv_heads * self.d_head
        table = {("attention", "q"): (d, w), ("attention", "k"): (d, kv), ("attention", "v"): (d, kv),
                 ("attention", "o"): (w, d), ("ffn", "in"): (d, f), ("ffn", "out"): (f, d),
                 ("ffn", "gate"): (d, f), ("ffn", "up"): (d, f), ("ffn", "down"): (f, d)}
        if self.moe is not None and kind == "ffn":
            e, fe, fs = self.moe.n_experts, self.moe.d_ff_expert, self.moe.d_ff_shared
            table.update({("ffn", "router"): (d, e), ("ffn", "gate"): (d, fe), ("ffn", "up"): (d, fe),
                          ("ffn", "down"): (fe, d), ("ffn", "shared_gate"): (d, fs), ("ffn", "shared_up"): (d, fs),
                          ("ffn", "shared_down"): (fs, d), ("ffn", "shared_mix"): (d, 1)})
        try:
            return table[(kind, name)]
        except KeyError:
            raise DomainError(f"no weight {name!r} in a {kind} sublayer") from None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Model):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in (*_MODEL_KEYS[:-1], *OPTIONAL_DEFAULTS)) and \
            self.attention == other.attention and self.ffn == other.ffn and \
            (self.sublayers is None) == (other.sublayers is None) and \
            (self.sublayers is None or (len(self.sublayers) == len(other.sublayers)
                                        and all(a == b for a, b in zip(self.sublayers, other.sublayers))))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Model(arch={self.arch!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"n_heads={self.n_heads}, d_head={self.d_head}, d_ff={self.d_ff}, seq_len={self.seq_len}, "
                f"activation={self.activation!r}, causal={self.causal}, dropout={self.dropout}, "
                f"input={self.input}, grad={self.grad})")

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The model object (plain dicts, lists, floats; ``json.dumps``-ready)."""
        return self._to_json()

    def _to_json(self) -> dict:
        return {**self.json_head(), "layers": self.layers_json()}

    def layers_json(self, rows=None) -> list:
        """The model object's per-layer objects (``rows``: only those layers, 0-based)."""
        if self.sublayers is not None:
            # a layer as a list of sublayers: each entry its columns' object plus its kind
            cols = [[{"kind": s.kind, **d} for d in s._json_columns(rows)] for s in self.sublayers]
            par = {"parallel": True} if self.block == "parallel" else {}
            return [{"sublayers": list(subs), **par} for subs in zip(*cols)]
        att = self.attention._json_columns(rows)
        ffn = self.ffn._json_columns(rows)
        return [{"attention": a, "ffn": f} for a, f in zip(att, ffn)]

    def layer_runs(self) -> list:
        """First layer (0-based) of every run of consecutive layers with identical parameters,
        then n_layers: a uniform stack is [0, n_layers]."""
        bits = np.concatenate([s._bits() for s in self.slots()], axis=1)
        change = np.flatnonzero(np.any(bits[1:] != bits[:-1], axis=1)) + 1
        return [0, *change.tolist(), self.n_layers]

    def json_head(self) -> dict:
        """The model object without "layers" (the key order of :meth:`to_json`)."""
        return {
            "arch": self.arch,
            "n_layers": self.n_layers, "d_model": self.d_model, "n_heads": self.n_heads,
            "d_head": self.d_head, "d_ff": self.d_ff, "seq_len": self.seq_len,
            "activation": self.activation,
            "norm": self.norm,
            "causal": self.causal,
            "dropout": {"attention": self.dropout.attention, "hidden": self.dropout.hidden,
                        "ffn_inner": self.dropout.ffn_inner},
            "input": {"mean": self.input.mean, "var": self.input.var, "corr": self.input.corr},
            "grad": {"var": self.grad.var, "corr": self.grad.corr},
            **self.modern_json(),
        }

    def modern_json(self) -> dict:
        """The optional (modern-block) fields that differ from their defaults, as JSON."""
        out = {}
        for k, default in OPTIONAL_DEFAULTS.items():
            v = getattr(self, k)
            if k == "n_kv_heads":
                default = self.n_heads
            if k == "block" and self.sublayers is not None:
                continue            # a list of sublayers says "parallel" in every layer
            if v != default:
                if k in ("rope", "local_rope"):
                    v = v.to_json() if isinstance(v, RopeFreqs) else {"base": v}
                elif k == "window":
                    v = v[0] if len(set(v)) == 1 else list(v)
                elif k == "moe":
                    v = v.to_json()
                out[k] = v
        return out

    @classmethod
    def from_json(cls, obj, where: str = "model") -> "Model":
        """Validate a model object and build the Model (DomainError with the JSON
        path of the first bad value otherwise)."""
        return _parse_model(obj, where)

    def truncated(self, n_layers: int) -> "Model":
        """The model's first ``n_layers`` layers (1 <= n_layers <= self.n_layers), the same
        input and upstream gradient (now given at the output of layer ``n_layers``): the model
        a prediction that stops early (a saturated softmax) describes."""
        if not 1 <= n_layers <= self.n_layers:
            raise DomainError(f"n_layers must lie in [1, {self.n_layers}], got {n_layers}")
        obj = self.to_json()
        obj["n_layers"], obj["layers"] = n_layers, obj["layers"][:n_layers]
        if isinstance(obj.get("window"), list):
            obj["window"] = obj["window"][:n_layers]
            if not any(obj["window"]):
                obj.pop("window")
                obj.pop("local_rope", None)
        return Model.from_json(obj)

    @classmethod
    def load(cls, path, encdec: bool = False) -> "Model":
        """Read a JSON file holding either the model object or an object with key "model"
        (a trace or check output).  An encoder-decoder model ({"encoder": ..., "decoder": ...},
        sigprop.model.encdec) is returned as an :class:`sigprop.model.encdec.EncoderDecoder`
        with ``encdec``, and refused in one line otherwise (the caller does not take one)."""
        from sigprop.files import MAX_MODEL_BYTES, check_path, read_json

        path = Path(check_path(path, "model file"))
        obj = read_json(path, "model file", MAX_MODEL_BYTES, " (model values must be finite numbers)")
        if isinstance(obj, dict) and "model" in obj and "layers" not in obj:
            obj = obj["model"]
        if isinstance(obj, dict) and ("encoder" in obj or "decoder" in obj) and "layers" not in obj:
            from sigprop.model import encdec as _ed

            if not encdec:
                raise DomainError(f"{path.name}: {_ed.REFUSED}")
            try:
                return _ed.EncoderDecoder.from_json(obj, "model")
            except DomainError as e:
                raise DomainError(f"{path.name}: {e}") from None
        try:
            return cls.from_json(obj, "model")
        except DomainError as e:
            raise DomainError(f"{path.name}: {e}") from None


def _check_state(where: str, mean, var, corr) -> None:
    """Input state (mean given): var > 0, corr in [0, 1]; gradient (mean None): var > 0,
    corr in [-1, 1].  A zero variance is refused for both: a stream of variance 0 (it has no
    token correlation) and a zero upstream gradient (nothing propagates back)."""
    vals = {"mean": mean, "var": var, "corr": corr}
    for k, v in vals.items():
        if v is None:
            continue
        if not _is_number(v):
            raise DomainError(f"{where}.{k} must be a number, got {v!r}")
        if not math.isfinite(float(v)):
            raise DomainError(f"{where}.{k} must be finite, got {v!r}")
    if mean is not None:
        if not var > 0:
            raise DomainError(f"{where}.var must be > 0, got {_fmt(var)}")
        if not 0 <= corr <= 1:
            raise DomainError(f"{where}.corr must lie in [0, 1], got {_fmt(corr)}")
    else:
        if not var > 0:
            raise DomainError(f"{where}.var must be > 0, got {_fmt(var)}")
        if not -1 <= corr <= 1:
            raise DomainError(f"{where}.corr must lie in [-1, 1], got {_fmt(corr)}")


# ---------------------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------------------

def _is_int(v) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer))


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    return repr(v) if not isinstance(v, float) else f"{v:g}"


def _type_name(v) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _keys(obj, keys: tuple, where: str) -> None:
    if not isinstance(obj, dict):
        raise DomainError(f"{where} must be an object, got {_type_name(obj)}")
    if obj.keys() != set(keys):
        unknown = [k for k in obj if k not in keys]
        if unknown:
            raise DomainError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(keys)}")
        missing = [k for k in keys if k not in obj]
        raise DomainError(f"{where}: missing key {missing[0]!r}")


def _int(obj, key: str, where: str) -> int:
    v = obj[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):      # 4.0 too
        raise DomainError(f"{where}.{key} must be an integer, got {_type_name(v)} {v!r}")
    if v < 1:
        raise DomainError(f"{where}.{key} must be a positive integer, got {v}")
    return int(v)


def _num(obj, key: str, where: str) -> float:
    v = obj[key]
    if not _is_number(v):
        raise DomainError(f"{where}.{key} must be a number, got {_type_name(v)} {v!r}")
    v = float(v)
    if not math.isfinite(v):
        raise DomainError(f"{where}.{key} must be finite, got {v!r}")
    return v


def _choice(obj, key: str, choices: tuple, where: str) -> str:
    v = obj[key]
    if not isinstance(v, str) or v not in choices:
        raise DomainError(f"{where}.{key} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def _parse_model(obj, where: str, cross: bool = False) -> Model:
    """``cross``: the layers may hold cross_attention sublayers (an encoder-decoder model's
    decoder stack)."""
    if isinstance(obj, dict):
        core = {k: v for k, v in obj.items() if k not in OPTIONAL_DEFAULTS}
        modern = _parse_modern(obj, where)
    else:
        core, modern = obj, {}
    _keys(core, _MODEL_KEYS, where)
    arch = obj["arch"]
    if not isinstance(arch, str):
        raise DomainError(f"{where}.arch must be a string, got {_type_name(arch)}")
    ints = {k: _int(obj, k, where) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len")}
    require_two_tokens(ints["seq_len"], f"{where}.")
    activation = _choice(obj, "activation", registry.activations(), where)
    norm = _choice(obj, "norm", registry.norms(), where)
    causal = obj["causal"]
    if not isinstance(causal, bool):
        raise DomainError(f"{where}.causal must be true or false, got {causal!r}")

    w = f"{where}.dropout"
    _keys(obj["dropout"], _DROPOUT_KEYS, w)
    drop = {}
    for k in _DROPOUT_KEYS:
        v = _num(obj["dropout"], k, w)
        if not 0 <= v < 1:
            raise DomainError(f"{w}.{k} must lie in [0, 1), got {_fmt(v)}")
        drop[k] = v

    w = f"{where}.input"
    _keys(obj["input"], _INPUT_KEYS, w)
    mean, var, corr = (_num(obj["input"], k, w) for k in _INPUT_KEYS)
    _check_state(w, mean, var, corr)
    w = f"{where}.grad"
    _keys(obj["grad"], _GRAD_KEYS, w)
    gvar, gcorr = (_num(obj["grad"], k, w) for k in _GRAD_KEYS)
    if not gvar > 0:
        raise DomainError(f"{w}.var must be > 0, got {_fmt(gvar)}")
    if not -1 <= gcorr <= 1:
        raise DomainError(f"{w}.corr must lie in [-1, 1], got {_fmt(gcorr)}")

    layers = obj["layers"]
    n = ints["n_layers"]
    if not isinstance(layers, list):
        raise DomainError(f"{where}.layers must be an array, got {_type_name(layers)}")
    if len(layers) != n:
        raise DomainError(f"{where}.layers has {len(layers)} entries, n_layers is {n}")
    ffn_kind = modern.get("ffn_kind", "mlp")
    if ffn_kind == "moe" and modern.get("moe") is not None:
        ffn_kind = modern["moe"].weight_names()         # (the FFN's names: the mixture's)
    if any(type(layer) is dict and "sublayers" in layer for layer in layers):
        slots, parallel = _parse_sublayer_lists(layers, f"{where}.layers", ffn_kind)
        if parallel:
            if modern.get("block", "parallel") != "parallel":
                raise DomainError(f"{where}.block is {modern['block']!r}, but its layers say \"parallel\": true")
            modern["block"] = "parallel"
        elif modern.get("block", "sequential") != "sequential":
            raise DomainError(f"{where}.block is {modern['block']!r}, but its layers do not say \"parallel\": true")
        kinds = [s.kind for s in slots]
        if "cross_attention" in kinds and not cross:
            raise DomainError(f"{where}.layers: a cross_attention sublayer reads an encoder's output: it belongs in "
                              "the decoder of an encoder-decoder model ({\"arch\", \"encoder\", \"decoder\"})")
        for kind in KINDS:
            if kind not in kinds:
                raise DomainError(f"{where}.layers: a layer without an {kind} sublayer is not implemented (yet)")
        cols = {kind: slots[kinds.index(kind)] for kind in KINDS}
        modern["sublayers"] = tuple(slots)
    else:
        cols = {kind: _parse_sublayers(layers, kind, f"{where}.layers", ffn_kind)
                for kind in KINDS}
    try:
        return Model(arch=arch, **ints, activation=activation, norm=norm, causal=causal,
                     dropout=Dropout(**drop), input=Forward(mean, var, corr), grad=Backward(gvar, gcorr),
                     attention=cols["attention"], ffn=cols["ffn"], **modern)
    except DomainError as e:
        raise DomainError(f"{where}: {e}") from None


def _parse_modern(obj: dict, where: str) -> dict:
    """The optional modern-block fields present in a model object, checked for type (the
    Model checks ranges and the constraints between fields)."""
    out = {}
    if "norm_eps" in obj:
        out["norm_eps"] = _num(obj, "norm_eps", where)
        if out["norm_eps"] < 0:
            raise DomainError(f"{where}.norm_eps must be >= 0, got {_fmt(out['norm_eps'])}")
    if "block" in obj:
        out["block"] = _choice(obj, "block", BLOCKS, where)
    if "ffn_kind" in obj:
        out["ffn_kind"] = _choice(obj, "ffn_kind", FFN_KINDS, where)
    if "n_kv_heads" in obj:
        out["n_kv_heads"] = _int(obj, "n_kv_heads", where)
    if obj.get("rope") is not None:
        r = obj["rope"]
        freqs = rope_from_json(r, where)          # {"inv_freq": [...], "attention_factor": s}
        if freqs is not None:
            out["rope"] = freqs
        else:
            _keys(r, ("base",), f"{where}.rope")
            out["rope"] = _num(r, "base", f"{where}.rope")
            if not out["rope"] > 1:
                raise DomainError(f"{where}.rope.base must be > 1, got {_fmt(out['rope'])}")
    for key in ("rope", "local_rope"):
        if key == "rope" or obj.get(key) is None:
            continue
        r = obj[key]
        freqs = rope_from_json(r, where)
        if freqs is not None:
            out[key] = freqs
        else:
            _keys(r, ("base",), f"{where}.{key}")
            out[key] = _num(r, "base", f"{where}.{key}")
            if not out[key] > 1:
                raise DomainError(f"{where}.{key}.base must be > 1, got {_fmt(out[key])}")
    if obj.get("window") is not None:
        w = obj["window"]
        vals = w if isinstance(w, list) else [w]
        for i, v in enumerate(vals):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                at = f"{where}.window" + (f"[{i}]" if isinstance(w, list) else "")
                raise DomainError(f"{at} must be an integer >= 0 (keys a row attends to; 0 = global), got {v!r}")
        out["window"] = w
    if obj.get("qk_norm") is not None:
        out["qk_norm"] = _choice(obj, "qk_norm", registry.norms(), where)
    if obj.get("attn_softcap") is not None:
        out["attn_softcap"] = _num(obj, "attn_softcap", where)
        if not out["attn_softcap"] > 0:
            raise DomainError(f"{where}.attn_softcap must be > 0, got {_fmt(out['attn_softcap'])}")
    if obj.get("moe") is not None:
        out["moe"] = MoE.from_json(obj["moe"], f"{where}.moe")
    if "final_norm" in obj:
        if not isinstance(obj["final_norm"], bool):
            raise DomainError(f"{where}.final_norm must be true or false, got {obj['final_norm']!r}")
        out["final_norm"] = obj["final_norm"]
    return out


_LAYER_KEYS = frozenset(KINDS)


#: the sublayer kinds a layer's list may hold, and those sigprop does not implement yet
#: (cross_attention: only in the decoder of an encoder-decoder model, sigprop.model.encdec)
SUBLAYER_KINDS = (*KINDS, "norm", "cross_attention")
#: the most sublayers a layer's list may hold, and in the whole model (the prediction keeps
#: every sublayer's state: as many as the ordinary layer's MAX_LAYERS layers have)
MAX_SUBLAYERS = 64
MAX_MODEL_SUBLAYERS = 2 * MAX_LAYERS
_PLANNED_KINDS = ()
_LIST_KEYS = ("sublayers", "parallel")


def _parse_sublayer_lists(layers: list, where: str, ffn_kind: str) -> tuple[list, bool]:
    """Layers given as lists of sublayers ({"sublayers": [SUB, ...], "parallel": bool}; the
    ordinary form {"attention": A, "ffn": F} is the list [attention, ffn]): the column objects,
    one per position in the list, and whether the layers are parallel.  Every layer must have
    the same list of kinds and the same "parallel"."""
    lists, flags = [], []
    for i, layer in enumerate(layers):
        w = f"{where}[{i}]"
        if type(layer) is dict and "sublayers" not in layer and layer.keys() == _LAYER_KEYS:
            subs = [{"kind": k, **layer[k]} if type(layer[k]) is dict else layer[k] for k in KINDS]
            par = False
        else:
            if type(layer) is not dict or not layer.keys() <= set(_LIST_KEYS) or "sublayers" not in layer:
                _keys(layer, _LIST_KEYS, w)
            subs, par = layer["sublayers"], layer.get("parallel", False)
            if type(par) is not bool:
                raise DomainError(f"{w}.parallel must be true or false, got {_type_name(par)} {par!r}")
            if type(subs) is not list or not subs:
                raise DomainError(f"{w}.sublayers must be a non-empty array, got {_type_name(subs)}")
            if len(subs) > MAX_SUBLAYERS or len(subs) * len(layers) > MAX_MODEL_SUBLAYERS:
                raise DomainError(f"{w}.sublayers has {len(subs):,} entries: sigprop takes at most {MAX_SUBLAYERS} "
                                  f"per layer and {MAX_MODEL_SUBLAYERS:,} in the whole model")
        for j, sub in enumerate(subs):
            if type(sub) is not dict or "kind" not in sub:
                raise DomainError(f"{w}.sublayers[{j}] must be an object with a \"kind\"")
            k = sub["kind"]
            if k in _PLANNED_KINDS:
                raise DomainError(f"{w}.sublayers[{j}].kind {k!r} is not implemented (yet)")
            if k not in SUBLAYER_KINDS:
                raise DomainError(f"{w}.sublayers[{j}].kind must be one of "
                                  f"{', '.join(map(repr, SUBLAYER_KINDS))}, got {k!r}")
        lists.append(subs)
        flags.append(par)
    kinds = [s["kind"] for s in lists[0]]
    for i, subs in enumerate(lists):
        if [s["kind"] for s in subs] != kinds or flags[i] != flags[0]:
            raise DomainError(f"{where}[{i}] has the sublayers [{', '.join(s['kind'] for s in subs)}]"
                              f"{' in parallel' if flags[i] else ''} and {where}[0] [{', '.join(kinds)}]"
                              f"{' in parallel' if flags[0] else ''}: every layer must have the same list "
                              "of sublayer kinds (yet)")
    slots = []
    for j, kind in enumerate(kinds):
        subs = [layer[j] for layer in lists]
        path = f"{where}[{{i}}].sublayers[{j}]"
        if kind == "norm":
            for i, s in enumerate(subs):
                if not s.keys() <= {"kind", "norm_scale"}:
                    _keys(s, ("kind", "norm_scale"), path.format(i=i))
            scales = _numbers([s.get("norm_scale", 1.0) for s in subs],
                              lambda i, tail: f"{path.format(i=i)}.{tail}", "norm_scale", False)
            slots.append(StreamNorms(scales))
        else:
            subs = [{k: v for k, v in s.items() if k != "kind"} for s in subs]
            slots.append(_columns_of(subs, kind, lambda i, tail: f"{path.format(i=i)}.{tail}", ffn_kind))
    return slots, flags[0]


def _numbers(values: list, path, tail: str, nonneg: bool) -> np.ndarray:
    """A column of numbers from JSON values (``path(i, tail)``: the i-th value's JSON path),
    each a finite number (and >= 0 with ``nonneg``)."""
    types = {type(v) for v in values}
    if not types <= {int, float} and not all(_is_number(v) for v in values):
        i = next(i for i, v in enumerate(values) if not _is_number(v))
        raise DomainError(f"{path(i, tail)} must be a number, got {_type_name(values[i])} {values[i]!r}")
    try:
        a = np.array(values, dtype=np.float64)
    except OverflowError:  # an int beyond float range
        i = next(i for i, v in enumerate(values) if not _fits(v))
        raise DomainError(f"{path(i, tail)} must be finite, got an integer beyond the float range") from None
    i = _first_bad(~np.isfinite(a))
    if i is not None:
        raise DomainError(f"{path(i, tail)} must be finite, got {values[i]!r}")
    if nonneg:
        i = _first_bad(a < 0)
        if i is not None:
            raise DomainError(f"{path(i, tail)} must be >= 0, got {_fmt(values[i])}")
    return a


def _parse_sublayers(layers: list, kind: str, where: str, ffn_kind: str = "mlp") -> Sublayers:
    """Column-wise parse of one sublayer kind over all layers: a structural pass (keys), then
    type and range checks on whole columns; the first failure is located and reported with
    its path."""
    subs = []
    for i, layer in enumerate(layers):
        if type(layer) is not dict or layer.keys() != _LAYER_KEYS:
            _keys(layer, KINDS, f"{where}[{i}]")
        subs.append(layer[kind])
    return _columns_of(subs, kind, lambda i, tail: f"{where}[{i}].{kind}.{tail}", ffn_kind)


def _columns_of(subs: list, kind: str, path, ffn_kind: str = "mlp") -> Sublayers:
    """The :class:`Sublayers` of the sublayer objects ``subs`` (one per layer; ``path(i,
    tail)``: the JSON path of field ``tail`` of the i-th)."""
    names = weight_names(kind, ffn_kind)
    sub_keys, init_keys, w_keys = set(_SUBLAYER_KEYS), set(names), set(_INIT_KEYS)
    for i, s in enumerate(subs):
        if type(s) is not dict or s.keys() != sub_keys:
            _keys(s, _SUBLAYER_KEYS, path(i, "")[:-1])
        init = s["init"]
        if type(init) is not dict or init.keys() != init_keys:
            _keys(init, names, path(i, "init"))
        for w in names:
            e = init[w]
            if type(e) is not dict or e.keys() != w_keys:
                _keys(e, _INIT_KEYS, path(i, f"init.{w}"))

    place = [s["placement"] for s in subs]
    codes = {p: i for i, p in enumerate(PLACEMENTS)}
    if not all(type(p) is str and p in codes for p in place):
        i = next(i for i, p in enumerate(place) if not (type(p) is str and p in codes))
        raise DomainError(f"{path(i, 'placement')} must be one of {', '.join(map(repr, PLACEMENTS))}, "
                          f"got {place[i]!r}")
    post = np.array([codes[p] for p in place], dtype=np.int8)

    def numbers(values: list, tail: str, nonneg: bool) -> np.ndarray:
        return _numbers(values, path, tail, nonneg)

    scales = {k: numbers([s[k] for s in subs], k, False) for k in _SCALES}
    std = {w: numbers([s["init"][w]["std"] for s in subs], f"init.{w}.std", True) for w in names}
    bstd = {w: numbers([s["init"][w]["bias_std"] for s in subs], f"init.{w}.bias_std", True) for w in names}
    return Sublayers(kind, post, scales["skip_scale"], scales["branch_scale"], scales["norm_scale"], std, bstd)


def _fits(v) -> bool:
    try:
        float(v)
        return True
    except OverflowError:
        return False


def require_ordinary_layers(model: Model, who: str) -> None:
    """Refuse (DomainError) a model whose layers are given as lists of sublayers other than
    [attention, ffn] (``who`` implements only the ordinary layer)."""
    if model.sublayers is not None:
        kinds = ", ".join(s.kind for s in model.sublayers)
        raise DomainError(f"{who} does not implement layers given as lists of sublayers ([{kinds}]) (yet)")


def pointwise_norm(model: Model) -> frozenset:
    """The feature "norm NAME" of a model whose norm is a pointwise function
    (sigprop.extend.elementwise), as a set to add to a consumer's supported features; empty
    otherwise."""
    return frozenset({f"norm {model.norm}"}) if registry.norm(model.norm).pointwise else frozenset()


def require(model: Model, supported, who: str) -> None:
    """Refuse (DomainError) a model using a modern-block feature (:meth:`Model.features`) that
    ``who`` does not implement: a consumer never ignores a field it does not implement."""
    missing = [f for f in model.features() if f not in supported]
    if missing:
        raise DomainError(f"{who} does not implement {', '.join(missing)} (yet)")
