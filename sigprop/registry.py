"""One registry of the components a model names by kind: norms and activations.

An entry maps a name (the value of the model object's ``"norm"`` / ``"activation"``, of
``--norm`` / ``--activation``) to everything sigprop knows about that component: its moment
rule (``sigprop.rules``), its Monte Carlo component (``sigprop.mc.components``), its names in
text, its PyTorch module or function, its Hugging Face names, and the component-specific
terms the whole-model predictor asks of it (a norm's parameters for a given input, its Post-LN
gradient shares, the statistics of a normalised branch output; an activation's gated rule and
its Post-LN Euler term).  No other module keeps such a map: they ask this one.

Each component registers itself here from its own rule module (``register(Norm(...))`` next
to the rule's ``register``), so a new component is its module plus that one registration.
Looking an entry up imports :mod:`sigprop.rules` first (which registers the built-in ones);
importing this module imports nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, NamedTuple


class Norm(NamedTuple):
    """A norm kind (applied over d_model, gain 1 and bias 0 at initialisation)."""

    name: str                      #: the model object's value ("layernorm")
    title: str                     #: in text ("LayerNorm")
    short: str                     #: in formulas and short labels ("LN")
    tag: str                       #: the LaTeX export's subscript ("LN", "RMS")
    rule: str                      #: its moment rule
    component: str                 #: its Monte Carlo component
    torch: str                     #: its ``torch.nn`` class name
    qk_code: int | None            #: the attention rule's ``qk_norm`` code when used as QK-norm (None: not one)
    #: (d, eps, per-token statistics (centred share, kappa), gradient share) -> the rule's params
    params: Callable
    #: the rule's parameter for the upstream gradient's share along what its Jacobian removes
    #: (None: its Jacobian removes no direction, a pointwise norm's diag(f'(x)))
    generic_key: str | None
    #: (share along 1, share along the stream's direction) -> that share
    generic_share: Callable
    #: the gradient's shares (along 1, along the stream's direction) below it, relative to isotropic
    shares_below: tuple
    #: the rule's parameter for the per-token gradient slope (rules.layernorm.token_slope_below;
    #: None: the norm does not divide by the token's scale)
    slope_key: str | None
    #: (hidden-layer token moments, width, d, input, its kappa, input norm) -> (kappa of a
    #: normalised branch output, factor on the branch's gradient variance)
    branch_output_stats: Callable
    #: a digest of its code where it is not sigprop's own (Activation.digest)
    digest: str = ""
    #: a pointwise function applied entry by entry (sigprop.extend.elementwise): not
    #: scale-invariant, no per-position normalisation
    pointwise: bool = False
    #: a pointwise norm's f(0) (the value of an entry the dropout before it zeroes)
    f_zero: float = 0.0


class Activation(NamedTuple):
    """A pointwise FFN activation (and, on the gate, a gated FFN core)."""

    name: str                      #: the model object's value ("relu")
    title: str                     #: in text ("ReLU")
    rule: str                      #: its moment rule
    component: str                 #: its Monte Carlo component
    torch: str | None              #: its ``torch.nn.functional`` name (None: none)
    glu: str                       #: the gated FFN core with it on the gate: rule and component ("reglu")
    glu_title: str                 #: in text ("ReGLU")
    #: the Post-LN Euler term of a plain FFN branch with it (rules.activation.relu_ffn_euler_var's
    #: signature), or None where the branch is taken as homogeneous
    ffn_euler_var: Callable | None = None
    #: a digest of its code where it is not sigprop's own (sigprop.extend): part of the keys of
    #: the tables stored on disk, so that editing a plugin never reuses a table of the old code
    digest: str = ""


_NORMS: dict[str, Norm] = {}
_ACTIVATIONS: dict[str, Activation] = {}
_LOADED = {"rules": False}


def register(entry: Norm | Activation) -> Norm | Activation:
    """Add ``entry`` (a name registered twice is an error: no entry is silently replaced)."""
    table = _NORMS if isinstance(entry, Norm) else _ACTIVATIONS
    if entry.name in table:
        raise ValueError(f"{type(entry).__name__.lower()} {entry.name!r} is registered already")
    table[entry.name] = entry
    return entry


def _load() -> None:
    if not _LOADED["rules"]:
        _LOADED["rules"] = True
        import sigprop.rules  # noqa: F401  (registers the built-in components)


def norms() -> tuple[str, ...]:
    """The registered norm kinds' names, in registration order."""
    _load()
    return tuple(_NORMS)


def activations() -> tuple[str, ...]:
    """The registered activations' names, in registration order."""
    _load()
    return tuple(_ACTIVATIONS)


def _entry(table: dict, kind: str, name: str):
    """The entry ``name`` of ``table``; DomainError naming the registered ones otherwise."""
    _load()
    try:
        return table[name]
    except KeyError:
        from sigprop.errors import DomainError

        raise DomainError(f"{kind} must be one of {', '.join(table)}, got {name!r}") from None


def norm(name: str) -> Norm:
    return _entry(_NORMS, "norm", name)


def activation(name: str) -> Activation:
    return _entry(_ACTIVATIONS, "activation", name)


def activation_rules() -> frozenset:
    """The moment rules of the registered activations."""
    _load()
    return frozenset(a.rule for a in _ACTIVATIONS.values())


def digest() -> str:
    """The registered components' code digests that sigprop's sources do not cover ("" when
    every component is built in)."""
    return ";".join(f"{e.name}:{e.digest}" for e in (*_NORMS.values(), *_ACTIVATIONS.values()) if e.digest)


class Names(Sequence):
    """The registered names of one kind, read when used (a live sequence: a component
    registered later, by a plugin, is among them)."""

    def __init__(self, kind: str):
        self._kind = kind

    def _names(self) -> tuple:
        return norms() if self._kind == "norm" else activations()

    def __iter__(self):
        return iter(self._names())

    def __len__(self):
        return len(self._names())

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __getitem__(self, i):
        return self._names()[i]

    def __repr__(self) -> str:
        return repr(self._names())


def norm_by_qk_code(code: int) -> Norm:
    """The norm kind whose QK-norm code is ``code``."""
    _load()
    for n in _NORMS.values():
        if n.qk_code == int(code):
            return n
    raise KeyError(code)


def gated(glu: str) -> Activation:
    """The activation whose gated FFN core is ``glu`` ("swiglu" -> silu's entry)."""
    _load()
    for a in _ACTIVATIONS.values():
        if a.glu == glu:
            return a
    raise KeyError(glu)
