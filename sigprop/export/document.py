"""LaTeX document scaffolding shared by the exports: preamble, the fitting macro, equation
lists.  Structure only; every formula comes from :mod:`sigprop.export.typeset`."""

from __future__ import annotations

from dataclasses import dataclass

from sigprop.export.typeset import Equation

#: packages every export needs (all in Debian's texlive-latex-base / -recommended)
PACKAGES = ("amsmath", "booktabs", "longtable", "array", "graphicx")

#: ``\sigpropfit{math}`` typesets ``math`` in display style and, should TeX find it wider
#: than the line after all (the layout works from width estimates), scales it down to the
#: line width and notes it in the log ("sigprop-fit: scaled ..."); a formula taller than
#: 85% of the page is scaled down to that height.  ``\sigpropeq`` is one equation of a list;
#: ``\sigpropfittext`` scales an unbreakable piece of text (a name in a narrow table column).
#: Guarded, so that several fragments can be \input into one document.
MACROS = r"""\ifdefined\sigpropfit\else
\newsavebox\sigpropbox
\newlength\sigpropht
\newcommand\sigpropfit[1]{%
  \sbox\sigpropbox{$\displaystyle #1$}%
  \setlength\sigpropht{\ht\sigpropbox}\addtolength\sigpropht{\dp\sigpropbox}%
  \ifdim\sigpropht>0.85\textheight
    \typeout{sigprop-fit: scaled height \the\sigpropht\space to 0.85 textheight}%
    \sbox\sigpropbox{\resizebox*{!}{0.85\textheight}{\usebox\sigpropbox}}%
  \fi
  \ifdim\wd\sigpropbox>\linewidth
    \typeout{sigprop-fit: scaled \the\wd\sigpropbox\space to \the\linewidth}%
    \resizebox{\linewidth}{!}{\usebox\sigpropbox}%
  \else
    \usebox\sigpropbox
  \fi}
\newcommand\sigpropeq[1]{\par\noindent\sigpropfit{#1}\par\smallskip}
\newcommand\sigpropfittext[1]{%
  \sbox\sigpropbox{#1}%
  \ifdim\wd\sigpropbox>\linewidth
    \resizebox{\linewidth}{!}{\usebox\sigpropbox}%
  \else
    \usebox\sigpropbox
  \fi}
\fi"""


@dataclass(frozen=True)
class Page:
    """The standalone page geometry (A4) and what it means in em at 10 pt."""

    landscape: bool
    margin_mm: float

    @property
    def textwidth_pt(self) -> float:
        return ((297.0 if self.landscape else 210.0) - 2 * self.margin_mm) * 72.27 / 25.4

    @property
    def textwidth_em(self) -> float:
        return self.textwidth_pt / 10.0

    def geometry(self) -> str:
        return f"a4paper,{'landscape,' if self.landscape else ''}margin={self.margin_mm:g}mm"


#: the gap between the two columns of a definition list (2 \tabcolsep)
COLUMNSEP_EM = 1.2


def _ragged(body: str) -> str:
    """Prose (assumptions, notes) ragged right: a long unbreakable token then shortens a line
    instead of running past the margin in a narrow text block."""
    return "\\begingroup\\raggedright\n" + body + "\n\\par\\endgroup"


def standalone(body: str, page: Page, title: str) -> str:
    pkgs = "\n".join(rf"\usepackage{{{p}}}" for p in PACKAGES)
    return "\n".join([
        r"\documentclass[10pt]{article}",
        rf"\usepackage[{page.geometry()}]{{geometry}}",
        pkgs,
        MACROS,
        r"\setlength\parindent{0pt}",
        r"\allowdisplaybreaks",
        f"% {title}",
        r"\begin{document}",
        _ragged(body),
        r"\end{document}",
        "",
    ])


def fragment(body: str, what: str) -> str:
    """For ``\\input``: the body with the macros it uses, and a note of the packages."""
    return "\n".join([
        "% sigprop export (" + what + ") for \\input; needs \\usepackage{" + ",".join(PACKAGES) + "}",
        MACROS,
        _ragged(body),
        "",
    ])


def equation_list(eqs: list[Equation], columns: int = 1) -> str:
    """Definitions, one per line, left aligned; with ``columns=2``, two per row of a
    longtable (reading order left to right), which breaks between rows at page ends (a
    multicols list cannot break a tall formula and overfills the page instead)."""
    if not eqs:
        return ""
    if columns <= 1 or len(eqs) <= 3:
        return "\n".join(rf"\sigpropeq{{{e.latex()}}}" for e in eqs)
    col = r">{\raggedright\arraybackslash}p{\dimexpr 0.5\linewidth-\tabcolsep\relax}"
    rows = []
    for k in range(0, len(eqs), 2):
        pair = [rf"\sigpropfit{{{e.latex()}}}" for e in eqs[k:k + 2]]
        rows.append(" & ".join(pair + [""] * (2 - len(pair))) + r" \\[3pt]")
    return ("{\\setlength\\LTleft{0pt}\\setlength\\LTright{0pt plus 1fill}\\setlength\\LTpre{2pt}\n"
            rf"\begin{{longtable}}{{@{{}}{col}{col}@{{}}}}" + "\n" + "\n".join(rows) + "\n\\end{longtable}}")


def itemize(items: list[str]) -> str:
    if not items:
        return ""
    # an explicit math bullet: the default label is a text-companion (TS1) glyph, which
    # TeX Live 2022 would render as a METAFONT bitmap
    return ("\\begin{itemize}\\setlength\\itemsep{1pt}\\setlength\\parskip{0pt}\n"
            + "\n".join(rf"\item[$\bullet$] {it}" for it in items) + "\n\\end{itemize}")
