"""The component table: one row per moment rule, forward mean, variance and token correlation
and backward variance and token correlation (the layout of the DeepScaleLM component
table), followed by each rule's parameters, assumptions and auxiliary definitions."""

from __future__ import annotations

import re

from sigprop import printing, symbols
from sigprop.export.document import COLUMNSEP_EM, Page, equation_list, fragment, itemize, standalone
from sigprop.export.typeset import Block, Layout, Printer, escape_text

PAGE = Page(landscape=True, margin_mm=12)
COLUMNS = ("x_mean", "x_var", "x_corr", "g_var", "g_corr")
#: share of the table width (after the column gaps) per column
FRACTIONS = {"name": 0.11, "x_mean": 0.09, "x_var": 0.19, "x_corr": 0.23, "g_var": 0.17, "g_corr": 0.21}
_TABCOLSEP_EM = 0.6            # LaTeX's default \tabcolsep, 6 pt
_GAPS = 2 * (len(FRACTIONS) - 1)


def _column_em(key: str) -> float:
    return FRACTIONS[key] * (PAGE.textwidth_em - _GAPS * _TABCOLSEP_EM)


def _colspec() -> str:
    cols = []
    for key in FRACTIONS:
        width = rf"\dimexpr {FRACTIONS[key]:g}\dimexpr\linewidth-{_GAPS}\tabcolsep\relax\relax"
        cols.append(rf">{{\raggedright\arraybackslash}}p{{{width}}}")
    return "@{}" + "".join(cols) + "@{}"


def _texttt(name: str) -> str:
    return r"\texttt{" + escape_text(name).replace("-", r"-\allowbreak{}") + "}"


def _fitted_words(text: str, font: str) -> str:
    """Text that breaks at spaces and after hyphens only, each piece scaled down should it be
    wider than the column (a fragment may be set in a narrow page)."""
    words = []
    for word in text.split():
        parts = re.split(r"(?<=-)", word)
        words.append(r"\allowbreak".join(rf"\sigpropfittext{{{font}{escape_text(p)}}}" for p in parts if p))
    return r"\hspace{0pt}" + " ".join(words)


def rule_block(rule, printer: Printer | None = None):
    """(cells: {moment: Equation}, definitions: [Equation]) for one rule, laid out for the
    table's columns and the two-column definition lists."""
    printer = printer or Printer()
    def_width = (PAGE.textwidth_em - COLUMNSEP_EM) / 2
    block = Block(printer, Layout(output_width=_column_em("x_var"), def_width=def_width))
    for key, expr in rule.symbolic().items():
        block.add(key, printing.MOMENT_LABELS[key][1], expr, width=_column_em(key) - 0.2)
    return block.build()


def _notation() -> str:
    sym = symbols.latex_name
    ins = (rf"${sym('x_mean')}$, ${sym('x_var')}$, ${sym('x_corr')}$: mean, variance and token "
           rf"correlation of the component's input; ${sym('g_var')}$, ${sym('g_corr')}$: variance and "
           r"token correlation of the gradient arriving at its output. ")
    outs = ", ".join(rf"${printing.MOMENT_LABELS[k][1]}$ ({printing.MOMENT_LABELS[k][0]})" for k in COLUMNS)
    return (r"\noindent Inputs: " + ins + "Outputs: " + outs + ". "
            r"Names $t_k$ (subexpressions), $I_k$ (integrals) and $S_k$ (sums) are defined per rule in "
            r"the section after the table; every formula is printed by sympy from the rule definitions.")


def _table(rows: list[tuple]) -> str:
    head = " & ".join([r"\sigpropfittext{Component}"] + [rf"${printing.MOMENT_LABELS[k][1]}$" for k in COLUMNS])
    lines = [
        r"{\setlength\LTleft{0pt}\setlength\LTright{0pt plus 1fill}",
        rf"\begin{{longtable}}{{{_colspec()}}}",
        r"\toprule",
        r" & \multicolumn{3}{c}{Forward} & \multicolumn{2}{c}{Backward} \\",
        r"\cmidrule(lr){2-4}\cmidrule(l){5-6}",
        head + r" \\",
        r"\midrule",
        r"\endhead",
        r"\bottomrule",
        r"\endfoot",
    ]
    for i, (rule, cells) in enumerate(rows):
        name = (_fitted_words(rule.name, r"\footnotesize\ttfamily ") + r"\newline"
                + _fitted_words(rule.title, r"\footnotesize "))
        row = [name] + [rf"\sigpropfit{{{cells[k].body()}}}" for k in COLUMNS]
        lines.append(" & ".join(row) + r" \\" + (r"\addlinespace" if i < len(rows) - 1 else ""))
    lines += [r"\end{longtable}}"]
    return "\n".join(lines)


def _param_line(rule) -> str:
    out = []
    for q in rule.params:
        out.append(rf"${symbols.latex_name(q.name)}$ {escape_text(q.describe())}: {escape_text(q.doc)}")
    return "; ".join(out)


def _rule_section(rule, defs) -> str:
    parts = [rf"\subsection*{{{_texttt(rule.name)}: {escape_text(rule.title)}}}"]
    if rule.params:
        parts.append(r"\noindent\textbf{Parameters.} " + _param_line(rule) + r"\par")
    if rule.assumptions:
        parts.append(r"\noindent\textbf{Assumptions.}")
        parts.append(itemize([escape_text(a) for a in rule.assumptions]))
    if rule.references:
        parts.append(r"\noindent\textbf{References.} " + escape_text("; ".join(rule.references)) + r"\par")
    if defs:
        parts.append(rf"\noindent\textbf{{Definitions}} ({len(defs)}):\par")
        parts.append(equation_list(defs, columns=2))
    return "\n".join(parts)


def components_latex(rules=None, fragment_only: bool = False) -> str:
    """The component table (and per-rule details) as LaTeX.

    ``rules``: rule objects (default: every registered rule, in registry order).
    ``fragment_only``: the table and the sections without a preamble, for ``\\input``.
    """
    from sigprop.rules import REGISTRY

    rules = list(REGISTRY.values()) if rules is None else list(rules)
    printer = Printer()
    rows, sections = [], []
    for rule in rules:
        cells, defs = rule_block(rule, printer)
        rows.append((rule, cells))
        sections.append(_rule_section(rule, defs))
    body = "\n\n".join([
        r"\section*{Moment rules}",
        _notation(),
        _table(rows),
        r"\section*{The rules: parameters, assumptions, definitions}",
        *sections,
    ])
    if fragment_only:
        return fragment(body, "components")
    return standalone(body, PAGE, "sigprop moment rules")
