"""Rendering of rule formulas (text and LaTeX), kept apart from the rules themselves.

Everything here imports sympy, so only commands that print formulas pay for it.
"""

from __future__ import annotations

import sympy as sp

from sigprop import symbols
from sigprop.rules.base import Rule

MOMENT_LABELS = {
    "x_mean": ("forward mean", r"\mu_{\mathrm{out}}"),
    "x_var": ("forward variance", r"\sigma^{2}_{\mathrm{out}}"),
    "x_corr": ("forward token correlation", r"r_{\mathrm{out}}"),
    "g_var": ("gradient variance", r"\sigma^{2}_{g,\mathrm{in}}"),
    "g_corr": ("gradient token correlation", r"r_{g,\mathrm{in}}"),
}


def tidy(expr):
    """Rules are written in a readable order already; display them as written (a global
    simplify can be slow, flips signs such as 1/(1-p) -> -1/(p-1), and its output changes
    between sympy versions)."""
    return sp.sympify(expr)


#: above this many operations in total, a rule's outputs are printed through
#: common-subexpression elimination (definitions x0, x1, ... then the five outputs)
CSE_THRESHOLD = 600


def formulas(rule: Rule) -> dict:
    return {k: tidy(v) for k, v in rule.symbolic().items()}


def structured(rule: Rule) -> tuple[list, dict]:
    """(definitions, outputs).  Definitions: first the named quantities the outputs use
    (:func:`sigprop.backend.symbolic.where`, each defined once, in define-before-use order),
    then, for a large rule, sympy's CSE of the outputs (x0, x1, ...); [] for a small rule
    without named quantities."""
    import sigprop.backend.symbolic as sm

    f = formulas(rule)
    named = sm.where(f.values())
    if sum(sp.count_ops(e) for e in f.values()) <= CSE_THRESHOLD:
        return named, f
    repl, reduced = sp.cse(list(f.values()), optimizations=None)
    return named + list(repl), dict(zip(f, reduced))


def to_latex(expr) -> str:
    return sp.latex(expr, symbol_names=symbols.latex_names())


def to_text(expr) -> str:
    return sp.pretty(expr, use_unicode=True, wrap_line=False)


def rule_latex(rule: Rule) -> str:
    """An amsmath ``align*`` block with the rule's five output moments (preceded by the
    named quantities' definitions and, for large rules, the common subexpressions)."""
    lines = [f"% {rule.name}: {rule.title}", r"\begin{align*}"]
    defs, f = structured(rule)
    rows = [f"  {to_latex(a)} &= {to_latex(b)}" for a, b in defs]
    rows += [f"  {MOMENT_LABELS[k][1]} &= {to_latex(v)}" for k, v in f.items()]
    lines.append(" \\\\\n".join(rows))
    lines.append(r"\end{align*}")
    return "\n".join(lines)
