"""sigprop: analytic signal propagation for deep transformers.

Every component of a transformer has a moment rule (forward mean/variance/token
correlation, backward gradient variance/correlation), written once against a small
math namespace (:mod:`sigprop.backend`) so the same definition evaluates as fast NumPy
code or as a sympy expression.  Importing this package never imports sympy.

The whole-model commands are functions here (docs/api.md; defined in :mod:`sigprop.api`
and imported on first use): :func:`predict`, :func:`check`, :func:`solve_init`,
:func:`compare`, :func:`build_model`, :func:`build_models` and :func:`load_spec`::

    import sigprop
    p = sigprop.predict(arch="preln", layers=48)
    p.summary["verdict"], p.to_json()

``sigprop.compare`` is the API function; the library module of the same name
(sigprop/compare.py) is reached with ``from sigprop.compare import ...``.
"""

import sys as _sys
import types as _types

from sigprop.errors import DomainError, SigpropError  # noqa: F401  (part of the API)

__version__ = "0.1.0"

#: names served by sigprop.api, imported when first used
_API = frozenset({"predict", "check", "solve_init", "compare", "build_model", "build_models", "load_spec",
                  "Prediction", "CheckResult", "StepResult", "SolveResult", "Comparison", "KEYWORDS",
                  "UnknownOption"})

__all__ = ["__version__", "SigpropError", "DomainError", *sorted(_API)]


def __getattr__(name: str):
    if name in _API:
        from sigprop import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sigprop' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _API)


class _Package(_types.ModuleType):
    """The package's module type: importing the submodule sigprop.compare does not bind it
    over the API function ``sigprop.compare`` (the import system sets a loaded submodule as
    an attribute of its package)."""

    def __setattr__(self, name, value):
        if name in _API and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
