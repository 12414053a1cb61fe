"""Component moment rules.  Importing this package registers every rule in
:data:`REGISTRY` (name -> Rule); it never imports sympy."""

from sigprop.rules.base import REGISTRY, Rule  # noqa: F401
import importlib

_MODULES = ["linear", "dropout", "residual", "activation", "layernorm", "embedding", "softmax",
            "attention"]
for _mod in _MODULES:
    importlib.import_module(f"sigprop.rules.{_mod}")


def get(name: str) -> Rule:
    from sigprop.errors import DomainError

    try:
        return REGISTRY[name]
    except KeyError:
        raise DomainError(f"unknown component {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
