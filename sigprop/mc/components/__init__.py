"""Monte Carlo components, one module each (forward and hand-written backward side by side),
each with the published sweep grid for its rule."""

from __future__ import annotations

import importlib

from sigprop.errors import DomainError

# module name per component; each module defines COMPONENT and SWEEP
_MODULES = ["linear", "dropout", "residual", "relu", "gelu", "layernorm", "embedding",
            "softmax", "attention"]


def _load():
    comps, sweeps = {}, {}
    for mod in _MODULES:
        m = importlib.import_module(f"sigprop.mc.components.{mod}")
        comps[m.COMPONENT.name] = m.COMPONENT
        sweeps[m.COMPONENT.name] = m.SWEEP
    return comps, sweeps


COMPONENTS, SWEEPS = _load()


def get(name: str):
    try:
        return COMPONENTS[name]
    except KeyError:
        raise DomainError(f"unknown component {name!r}; known: {', '.join(sorted(COMPONENTS))}") from None
