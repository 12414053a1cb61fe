"""Monte Carlo components, one module each (forward and hand-written backward side by side),
each with the published sweep grid for its rule."""

from __future__ import annotations

import importlib

from sigprop.errors import DomainError

# module name per component; each module defines COMPONENT and SWEEP (or, for several
# components, COMPONENTS and SWEEPS keyed by component name)
_MODULES = ["linear", "dropout", "residual", "relu", "gelu", "layernorm", "embedding",
            "softmax", "attention", "silu", "rmsnorm", "glu"]


def _load():
    comps, sweeps = {}, {}
    for mod in _MODULES:
        m = importlib.import_module(f"sigprop.mc.components.{mod}")
        if hasattr(m, "COMPONENTS"):        # several components in one module (glu)
            for c in m.COMPONENTS:
                comps[c.name] = c
                sweeps[c.name] = m.SWEEPS[c.name]
            continue
        comps[m.COMPONENT.name] = m.COMPONENT
        sweeps[m.COMPONENT.name] = m.SWEEP
    return comps, sweeps


COMPONENTS, SWEEPS = _load()


def get(name: str):
    try:
        return COMPONENTS[name]
    except KeyError:
        raise DomainError(f"unknown component {name!r}; known: {', '.join(sorted(COMPONENTS))}") from None
