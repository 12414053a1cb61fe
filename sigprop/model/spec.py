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

import gc
import json
import math
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from sigprop.errors import DomainError
from sigprop.state import Backward, Forward

#: weight names per sublayer kind, in the documented order
#: the deepest model sigprop resolves and predicts: the prediction keeps every sublayer's
#: state (about 5 KB of memory per layer, ~0.4 KB of trace JSON), so 10^6 layers need ~5 GB
MAX_LAYERS = 1_000_000

WEIGHTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "attention": ("q", "k", "v", "o"),
    "ffn": ("in", "out"),
})
KINDS = tuple(WEIGHTS)
ACTIVATIONS = ("relu", "gelu")
NORMS = ("layernorm",)
PLACEMENTS = ("pre", "post")

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


@contextmanager
def _no_gc():
    """Pause the cyclic garbage collector while building or reading millions of small dicts
    (a 100,000-layer model is 1.1 million of them); it would otherwise rescan the growing heap
    again and again, for nothing: these containers hold no cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _first_bad(bad: np.ndarray) -> int | None:
    if bad.any():
        return int(np.argmax(bad))
    return None


class Sublayers(_Frozen):
    """All sublayers of one kind ("attention" or "ffn"), one entry per layer (0-based).

    Columns, shape (n_layers,): ``post`` (bool, placement "post"), ``skip_scale`` (a),
    ``branch_scale`` (b), ``norm_scale`` (n); ``std[name]`` and ``bias_std[name]`` per weight
    (attention: q, k, v, o; ffn: in, out).  Scalars and sequences are accepted and broadcast;
    the stored columns are float64 (bool for ``post``) and read-only.
    """

    FIELDS = ("kind", "post", "skip_scale", "branch_scale", "norm_scale", "std", "bias_std")
    __slots__ = FIELDS

    def __init__(self, kind: str, post, skip_scale, branch_scale, norm_scale, std: Mapping, bias_std: Mapping):
        for name, value in zip(self.FIELDS, (kind, post, skip_scale, branch_scale, norm_scale, std, bias_std),
                               strict=True):
            self._set(name, value)
        if self.kind not in WEIGHTS:
            raise DomainError(f"sublayer kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        post = np.asarray(self.post)
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
        if post.dtype != bool and not (post.ndim in (0, 1) and np.isin(post, (0, 1)).all()):
            raise DomainError(f"{where}.post must be boolean")
        self._set("post", _column(post.astype(bool), n, bool, f"{where}.post"))
        for name in _SCALES:
            col = _column(getattr(self, name), n, np.float64, f"{where}.{name}")
            i = _first_bad(~np.isfinite(col))
            if i is not None:
                raise DomainError(f"{where}.{name}[{i}] must be finite, got {col[i]:g}")
            self._set(name, col)
        names = WEIGHTS[self.kind]
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
        return int(self.post.shape[0])

    @property
    def names(self) -> tuple[str, ...]:
        return WEIGHTS[self.kind]

    def placement(self, layer: int) -> str:
        """"pre" or "post" for layer ``layer`` (0-based)."""
        return "post" if self.post[layer] else "pre"

    def __repr__(self) -> str:
        return f"Sublayers({self.kind!r}, n_layers={self.n_layers})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sublayers):
            return NotImplemented
        return (self.kind == other.kind
                and all(np.array_equal(getattr(self, c), getattr(other, c)) for c in ("post", *_SCALES))
                and all(np.array_equal(self.std[w], other.std[w]) and
                        np.array_equal(self.bias_std[w], other.bias_std[w]) for w in self.names))

    __hash__ = None  # type: ignore[assignment]

    def _json_columns(self, rows=None) -> list:
        """Per-layer sublayer dicts in the documented layout, built column-wise (``rows``: only
        those layers, 0-based indices)."""
        names = self.names

        def col(c):
            return (c if rows is None else c[rows]).tolist()

        place = ["post" if p else "pre" for p in col(self.post)]
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
        cols = [self.post.astype(np.float64), self.skip_scale, self.branch_scale, self.norm_scale]
        cols += [self.std[w] for w in self.names] + [self.bias_std[w] for w in self.names]
        return np.ascontiguousarray(np.column_stack(cols)).view(np.int64)


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


# ---------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------

class Model(_Frozen):
    """A fully resolved model (docs/formats.md, "The model object").

    ``input`` is the stream entering layer 1 (a :class:`sigprop.state.Forward`: mean, var,
    corr); ``grad`` is dLoss/dx at the output of the last sublayer (a
    :class:`sigprop.state.Backward`: var, corr).  ``attention`` and ``ffn`` hold the per-layer
    columns (:class:`Sublayers`); layer ``l`` (0-based here, 1-based in traces) is the
    attention sublayer ``l`` followed by the FFN sublayer ``l``.
    """

    FIELDS = ("arch", "n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len", "activation", "norm",
              "causal", "dropout", "input", "grad", "attention", "ffn", "notes")
    __slots__ = FIELDS

    def __init__(self, arch: str, n_layers: int, d_model: int, n_heads: int, d_head: int, d_ff: int,
                 seq_len: int, activation: str, norm: str, causal: bool, dropout: Dropout, input: Forward,
                 grad: Backward, attention: Sublayers, ffn: Sublayers, notes: Mapping | None = None):
        # ``notes``: extra information (not part of the model object, not written by
        # to_json, not compared)
        for name, value in zip(self.FIELDS, (arch, n_layers, d_model, n_heads, d_head, d_ff, seq_len, activation,
                                             norm, causal, dropout, input, grad, attention, ffn,
                                             {} if notes is None else notes), strict=True):
            self._set(name, value)
        if not isinstance(self.arch, str):
            raise DomainError(f"arch must be a string, got {self.arch!r}")
        for k in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise DomainError(f"{k} must be a positive integer, got {v!r}")
            self._set(k, int(v))
        if self.seq_len < 2:
            raise DomainError(f"seq_len must be >= 2 (a token correlation needs two tokens), got {self.seq_len}")
        if self.activation not in ACTIVATIONS:
            raise DomainError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")
        if self.norm not in NORMS:
            raise DomainError(f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if not isinstance(self.causal, (bool, np.bool_)):
            raise DomainError(f"causal must be true or false, got {self.causal!r}")
        self._set("causal", bool(self.causal))
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

    # -- conveniences -------------------------------------------------------------------
    def sublayers(self, kind: str) -> Sublayers:
        if kind not in WEIGHTS:
            raise DomainError(f"sublayer kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return getattr(self, kind)

    def fans(self, kind: str, name: str) -> tuple[int, int]:
        """(fan_in, fan_out) of weight ``name`` of sublayer ``kind``: q, k, v map
        d_model -> n_heads * d_head, o maps back; ffn in maps d_model -> d_ff, out back."""
        d, w, f = self.d_model, self.n_heads * self.d_head, self.d_ff
        table = {("attention", "q"): (d, w), ("attention", "k"): (d, w), ("attention", "v"): (d, w),
                 ("attention", "o"): (w, d), ("ffn", "in"): (d, f), ("ffn", "out"): (f, d)}
        try:
            return table[(kind, name)]
        except KeyError:
            raise DomainError(f"no weight {name!r} in a {kind} sublayer") from None

    def __eq__(self, other) -> bool:
        if not isinstance(other, Model):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in _MODEL_KEYS[:-1]) and \
            self.attention == other.attention and self.ffn == other.ffn

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Model(arch={self.arch!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"n_heads={self.n_heads}, d_head={self.d_head}, d_ff={self.d_ff}, seq_len={self.seq_len}, "
                f"activation={self.activation!r}, causal={self.causal}, dropout={self.dropout}, "
                f"input={self.input}, grad={self.grad})")

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The model object (plain dicts, lists, floats; ``json.dumps``-ready)."""
        with _no_gc():
            return self._to_json()

    def _to_json(self) -> dict:
        return {**self.json_head(), "layers": self.layers_json()}

    def layers_json(self, rows=None) -> list:
        """The model object's per-layer objects (``rows``: only those layers, 0-based)."""
        att = self.attention._json_columns(rows)
        ffn = self.ffn._json_columns(rows)
        return [{"attention": a, "ffn": f} for a, f in zip(att, ffn)]

    def layer_runs(self) -> list:
        """First layer (0-based) of every run of consecutive layers with identical parameters,
        then n_layers: a uniform stack is [0, n_layers]."""
        bits = np.concatenate([self.attention._bits(), self.ffn._bits()], axis=1)
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
        }

    @classmethod
    def from_json(cls, obj, where: str = "model") -> "Model":
        """Validate a model object and build the Model (DomainError with the JSON
        path of the first bad value otherwise)."""
        with _no_gc():
            return _parse_model(obj, where)

    def truncated(self, n_layers: int) -> "Model":
        """The model's first ``n_layers`` layers (1 <= n_layers <= self.n_layers), the same
        input and upstream gradient (now given at the output of layer ``n_layers``): the model
        a prediction that stops early (a saturated softmax) describes."""
        if not 1 <= n_layers <= self.n_layers:
            raise DomainError(f"n_layers must lie in [1, {self.n_layers}], got {n_layers}")
        obj = self.to_json()
        obj["n_layers"], obj["layers"] = n_layers, obj["layers"][:n_layers]
        return Model.from_json(obj)

    @classmethod
    def load(cls, path) -> "Model":
        """Read a JSON file holding either the model object or an object with key "model"
        (a trace or check output)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise DomainError(f"cannot read model file {str(path)!r}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise DomainError(f"model file {str(path)!r} is not UTF-8 text") from None
        try:
            with _no_gc():
                obj = json.loads(text, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise DomainError(f"model file {str(path)!r} is not valid JSON: {e.msg} "
                              f"(line {e.lineno}, column {e.colno})") from None
        except ValueError as e:
            raise DomainError(f"model file {str(path)!r}: {e}") from None
        if isinstance(obj, dict) and "model" in obj and "layers" not in obj:
            obj = obj["model"]
        try:
            return cls.from_json(obj, "model")
        except DomainError as e:
            raise DomainError(f"{path.name}: {e}") from None


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name} (model values must be finite numbers)")


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
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        v = int(v)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
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


def _parse_model(obj, where: str) -> Model:
    _keys(obj, _MODEL_KEYS, where)
    arch = obj["arch"]
    if not isinstance(arch, str):
        raise DomainError(f"{where}.arch must be a string, got {_type_name(arch)}")
    ints = {k: _int(obj, k, where) for k in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "seq_len")}
    if ints["seq_len"] < 2:
        raise DomainError(f"{where}.seq_len must be >= 2 (a token correlation needs two tokens), got {ints['seq_len']}")
    activation = _choice(obj, "activation", ACTIVATIONS, where)
    norm = _choice(obj, "norm", NORMS, where)
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
    cols = {kind: _parse_sublayers(layers, kind, f"{where}.layers") for kind in KINDS}
    return Model(arch=arch, **ints, activation=activation, norm=norm, causal=causal,
                 dropout=Dropout(**drop), input=Forward(mean, var, corr), grad=Backward(gvar, gcorr),
                 attention=cols["attention"], ffn=cols["ffn"])


_LAYER_KEYS = frozenset(KINDS)


def _parse_sublayers(layers: list, kind: str, where: str) -> Sublayers:
    """Column-wise parse of one sublayer kind over all layers: a structural pass (keys), then
    type and range checks on whole columns; the first failure is located and reported with
    its path."""
    names = WEIGHTS[kind]
    sub_keys, init_keys, w_keys = set(_SUBLAYER_KEYS), set(names), set(_INIT_KEYS)
    subs = []
    for i, layer in enumerate(layers):
        if type(layer) is not dict or layer.keys() != _LAYER_KEYS:
            _keys(layer, KINDS, f"{where}[{i}]")
        s = layer[kind]
        if type(s) is not dict or s.keys() != sub_keys:
            _keys(s, _SUBLAYER_KEYS, f"{where}[{i}].{kind}")
        init = s["init"]
        if type(init) is not dict or init.keys() != init_keys:
            _keys(init, names, f"{where}[{i}].{kind}.init")
        for w in names:
            e = init[w]
            if type(e) is not dict or e.keys() != w_keys:
                _keys(e, _INIT_KEYS, f"{where}[{i}].{kind}.init.{w}")
        subs.append(s)

    def path(i: int, tail: str) -> str:
        return f"{where}[{i}].{kind}.{tail}"

    place = [s["placement"] for s in subs]
    post = np.array([p == "post" for p in place], dtype=bool)
    if not all(p == "post" or p == "pre" for p in place):
        i = next(i for i, p in enumerate(place) if not (p == "post" or p == "pre"))
        raise DomainError(f"{path(i, 'placement')} must be 'pre' or 'post', got {place[i]!r}")

    def numbers(values: list, tail: str, nonneg: bool) -> np.ndarray:
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
