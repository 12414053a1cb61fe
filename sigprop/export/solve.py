"""The solve-init derivation as LaTeX: the steps of :func:`sigprop.solve.steps` (a sentence
and a sympy expression or equation each), typeset in order, with the solved model's settings.

The sentences are the solver's own, in the prose markup of :mod:`sigprop.solve.prose` (their
formulas typeset as LaTeX math, options in typewriter type); every displayed formula is printed by sympy from the solver's sympy
objects (equations it derived from the rules), with the central symbol names plus the names
of :mod:`sigprop.solve.equations`."""

from __future__ import annotations

import re

import sympy as sp

from sigprop.errors import SigpropError
from sigprop.export.document import Page, equation_list, fragment, standalone
from sigprop.export.typeset import Block, Equation, Layout, Printer, escape_text, tex_width

PAGE = Page(landscape=False, margin_mm=20)

#: sympy names used by sigprop.solve.equations that sympy's own conventions print badly
NAMES = {
    "hat{V}": r"\hat{V}", "hat{Gamma}": r"\hat{\Gamma}", "V_req": r"V_{\mathrm{req}}", "ell": r"\ell",
    "d_ff": r"d_{\mathrm{ff}}", "sigma_in": r"\sigma_{\mathrm{in}}", "sigma_out": r"\sigma_{\mathrm{out}}",
    "p_f": r"p_{\mathrm{ffn}}", "p_h": r"p_{\mathrm{h}}", "sigma_s^2": r"\sigma_{s}^{2}",
    "sigma_gate": r"\sigma_{\mathrm{gate}}", "sigma_up": r"\sigma_{\mathrm{up}}",
    "sigma_down": r"\sigma_{\mathrm{down}}",
}
#: names with LaTeX-style braces (sigma_{s+1}^2, sigma_v^{(3)}, r_{B,s}), which sympy's own
#: name parser leaves as they are
_BRACED = re.compile(r"^(?P<base>[A-Za-z]+)(?:_(?P<sub>\{[^{}]*\}|[A-Za-z0-9]+))?(?:\^(?P<sup>\{[^{}]*\}|[A-Za-z0-9]+))?$")

MESSAGE = "solve-init derivation export not available yet"


class ExportUnavailable(SigpropError):
    """An export whose source does not exist (exit code 2)."""


class SolvePrinter(Printer):
    def _print_Symbol(self, expr, style="plain"):
        m = _BRACED.match(expr.name)
        if "{" in expr.name and expr.name not in self._names and m:
            from sympy.printing.latex import translate

            tex = translate(m.group("base"))
            for key, mark in (("sub", "_"), ("sup", "^")):
                if m.group(key):
                    tex += "%s{%s}" % (mark, m.group(key).strip("{}"))
            return tex
        return super()._print_Symbol(expr, style)


def solve_available() -> bool:
    """Whether :mod:`sigprop.solve` exposes its derivation steps."""
    import importlib

    try:
        return callable(getattr(importlib.import_module("sigprop.solve"), "steps", None))
    except ImportError:
        return False


def _step_equations(expr, P, width) -> list[Equation]:
    if isinstance(expr, sp.Eq):
        lhs_tex = P.doprint(expr.lhs)
        block = Block(P, Layout(output_width=width, def_width=width))
        block.add("eq", lhs_tex, expr.rhs, width=width - 1.5 - tex_width(lhs_tex))
        outs, defs = block.build()
        return defs + [outs["eq"]]
    if isinstance(expr, sp.Basic):
        tex = P.doprint(expr)
        return [Equation(tex, [], "expr")]
    return [Equation(escape_text(str(expr)), [], "expr")]


def _equations(eqs: list[Equation]) -> str:
    rows = [e for e in eqs if e.lines]
    out = [equation_list(rows)] if rows else []
    out += [rf"\sigpropeq{{{e.lhs}}}" for e in eqs if not e.lines]
    return "\n".join(out)


def solve_latex(solution, fragment_only: bool = False) -> str:
    """The derivation of ``solution`` (from :func:`sigprop.solve.solve`) as LaTeX."""
    from sigprop.export.model import _settings_table
    from sigprop.solve import steps
    from sigprop.solve.explain import verdict
    from sigprop.solve.prose import tex

    P = SolvePrinter(NAMES)
    width = PAGE.textwidth_em * 0.95
    model = getattr(solution, "model", None)
    n = getattr(model, "n_layers", None)
    title = escape_text(f"solve-init, target {solution.target}: the {solution.arch} model")
    title += f", $N = {n}$ layers" if n else ""
    parts = [rf"\section*{{{title}}}"]
    parts.append(r"\noindent\textbf{Result:} " + tex(verdict(solution)) + r"\par")
    if getattr(solution, "note", None):
        parts.append(r"\noindent\textbf{Note:} " + tex(solution.note) + r"\par")
    parts.append(r"\subsection*{Derivation}")
    for i, st in enumerate(steps(solution), 1):
        parts.append(rf"\noindent\textbf{{{i}.}} " + tex(st.text) + r"\par")
        if st.expr is not None:
            parts.append(_equations(_step_equations(st.expr, P, width)))
    if model is not None:
        parts.append(r"\subsection*{The solved model}" if solution.feasible else r"\subsection*{The model}")
        parts.append(_settings_table(model))
    body = "\n\n".join(p for p in parts if p)
    if fragment_only:
        return fragment(body, f"solve-init {solution.target}")
    return standalone(body, PAGE, f"sigprop solve-init derivation: {solution.target}")
