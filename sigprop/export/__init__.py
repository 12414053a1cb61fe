"""Exports of formulas and derivations.  Pure: every function returns a string.

* :func:`components_latex`: the component table (one row per moment rule);
* :func:`model_latex`: a model's per-sublayer update maps and closed forms in N;
* :func:`solve_latex`: the solve-init derivation (the steps of :func:`sigprop.solve.steps`).

Every formula is printed by sympy from the rule definitions (or from the derivations built
on them), with the symbol names of :mod:`sigprop.symbols`; see :mod:`sigprop.export.typeset`
for how long expressions are kept inside the page.
"""

from sigprop.export.components import components_latex
from sigprop.export.model import model_latex
from sigprop.export.solve import MESSAGE as SOLVE_UNAVAILABLE, ExportUnavailable, solve_available, solve_latex

KINDS = ("components", "model", "solve")

__all__ = ["KINDS", "components_latex", "model_latex", "solve_latex", "solve_available", "ExportUnavailable",
           "SOLVE_UNAVAILABLE"]
