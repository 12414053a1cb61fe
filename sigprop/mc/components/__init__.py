"""Monte Carlo components, one module each (forward and hand-written backward side by side),
each with the published sweep grid for its rule."""

from __future__ import annotations

import importlib

from sigprop.errors import DomainError

# module name per component; each module defines COMPONENT and SWEEP (or, for several
# components, COMPONENTS and SWEEPS keyed by component name)
_MODULES = ["linear", "dropout", "residual", "relu", "gelu", "layernorm", "embedding",
            "softmax", "attention", "silu", "rmsnorm", "glu", "cross_attention", "moe"]


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


def register(component, sweep=None) -> None:
    """Add a component (and its sweep grid, if it has one) that is not one of the modules
    above: a plugin's (sigprop.extend); a name registered twice is an error."""
    if component.name in COMPONENTS:
        raise DomainError(f"Monte Carlo component {component.name!r} is registered already")
    COMPONENTS[component.name] = component
    if sweep is not None:
        SWEEPS[component.name] = sweep


def glu_component(name: str, activation: str):
    """The gated FFN core ``name`` with the registered activation ``activation`` on its gate."""
    from sigprop.mc.components.glu import GLUMC

    return GLUMC(name, activation)


def get(name: str):
    """The Monte Carlo component ``name``; DomainError naming the known ones otherwise (a rule
    without a component of its own, e.g. an alternative softmax rule, is named as such)."""
    try:
        return COMPONENTS[name]
    except KeyError:
        pass
    from sigprop.rules import REGISTRY

    known = ", ".join(sorted(COMPONENTS))
    if name in REGISTRY:
        raise DomainError(f"{name!r} is a rule without a Monte Carlo component of its own (`sigprop rules "
                          f"{name}` shows it); components: {known}")
    raise DomainError(f"unknown component {name!r}; known: {known}")
