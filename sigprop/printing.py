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


def formulas(rule: Rule) -> dict:
    return {k: tidy(v) for k, v in rule.symbolic().items()}


def to_latex(expr) -> str:
    return sp.latex(expr, symbol_names=symbols.latex_names())


def to_text(expr) -> str:
    return sp.pretty(expr, use_unicode=True, wrap_line=False)


def rule_latex(rule: Rule) -> str:
    """An amsmath ``align*`` block with the rule's five output moments."""
    lines = [f"% {rule.name}: {rule.title}", r"\begin{align*}"]
    f = formulas(rule)
    rows = [f"  {MOMENT_LABELS[k][1]} &= {to_latex(v)}" for k, v in f.items()]
    lines.append(" \\\\\n".join(rows))
    lines.append(r"\end{align*}")
    return "\n".join(lines)
