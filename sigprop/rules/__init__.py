"""Component moment rules.  Importing this package registers every rule in
:data:`REGISTRY` (name -> Rule); it never imports sympy."""

from sigprop.errors import DomainError
from sigprop.rules.base import REGISTRY, Rule  # noqa: F401
import importlib

_MODULES = ["linear", "dropout", "residual", "activation", "layernorm", "embedding", "softmax",
            "attention", "rmsnorm", "glu", "cross_attention", "moe"]
for _mod in _MODULES:
    importlib.import_module(f"sigprop.rules.{_mod}")


def get(name: str) -> Rule:
    try:
        return REGISTRY[name]
    except KeyError:
        raise DomainError(f"unknown component {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def compose(chain, x, g, m):
    """Rules applied in sequence, written against the math namespace ``m`` (numeric or
    symbolic): ``chain`` is a list of (rule name, params dict); forward through every rule,
    then the gradient ``g`` back through them with the recorded forward states.  Returns
    (output Forward, input Backward).  Parameters are used as given (no domain checks: for
    derivations and internal composition)."""
    from types import SimpleNamespace

    states = []
    for name, prm in chain:
        states.append(x)
        x = get(name).forward(m, x, SimpleNamespace(**prm))
    for (name, prm), xin in zip(reversed(chain), reversed(states)):
        g = get(name).backward(m, xin, g, SimpleNamespace(**prm))
    return x, g
