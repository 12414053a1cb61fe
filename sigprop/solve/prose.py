"""The prose of the solve-init derivation, written once for the terminal and for LaTeX.

A sentence marks its mathematics with dollar signs in a small ASCII notation that reads well
as it is: ``"residual scales: $lambda^2 + beta^2 = 1$ with $beta^2 = k/N$"``.

* :func:`plain` drops the dollar signs (terminal, JSON);
* :func:`tex` typesets the marked parts as LaTeX math (Greek names as Greek letters,
  ``V-hat`` as a hat, multi-letter subscripts upright, ``sqrt(..)`` as a root, ``<=`` as
  \\le) and the rest as LaTeX text, with command-line options such as ``--grad-corr`` in
  typewriter type (``\\texttt{-{}-grad-corr}``, so that LaTeX does not join the dashes).
"""

from __future__ import annotations

import re

_GREEK = ("alpha", "beta", "gamma", "delta", "epsilon", "kappa", "lambda", "mu", "rho", "sigma", "tau",
          "theta", "pi", "Gamma", "Lambda", "Sigma", "Delta")
_FUNCS = ("exp", "log", "ln", "arcsin", "arccos", "max", "min")
_NAME = re.compile(r"(?<![A-Za-z\\])(" + "|".join(_GREEK + _FUNCS) + r"|ell)(?![A-Za-z])")
_WORD = re.compile(r"(?<![\\A-Za-z{])([A-Za-z]{2,})(?![A-Za-z])")
_SUB_WORD = re.compile(r"_([A-Za-z][A-Za-z]+)")
_OPTION = re.compile(r"--([a-z][a-z0-9-]*)")
_SEGMENTS = re.compile(r"\$([^$]*)\$")


def plain(text: str) -> str:
    """The sentence for a terminal: the math marks removed."""
    return text.replace("$", "")


def _balanced(s: str, opener: str, left: str, right: str) -> str:
    """Every ``opener(..)`` (balanced parentheses, nested ones too) -> ``left..right``."""
    out, i = [], 0
    while True:
        j = s.find(opener + "(", i)
        if j < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:j])
        depth, k = 0, j + len(opener)
        while k < len(s):
            if s[k] == "(":
                depth += 1
            elif s[k] == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        out.append(left + _balanced(s[j + len(opener) + 1:k], opener, left, right) + right)
        i = k + 1


def _sqrt(s: str) -> str:
    """``sqrt(..)`` -> ``\\sqrt{..}``."""
    return _balanced(s, "sqrt", r"\sqrt{", "}")


def _sup(s: str) -> str:
    """``^(..)`` -> ``^{..}`` (balanced parentheses)."""
    return _balanced(s, "^", "^{", "}")


def math(s: str) -> str:
    """One marked formula as LaTeX math (without the dollar signs)."""
    s = s.replace("V-hat", r"\hat{V}").replace("Gamma-hat", r"\hat{\Gamma}")
    s = _sqrt(s)
    s = _sup(s)
    s = _SUB_WORD.sub(lambda m: r"_{\mathrm{" + m.group(1) + "}}", s)

    def name(m):
        w = m.group(1)
        if w == "ell":
            return r"\ell "
        return "\\" + w + " "

    s = _NAME.sub(name, s)
    # remaining words (LN, Dropout, var, mean, gelu) upright, as operator names
    s = _WORD.sub(lambda m: r"\mathrm{" + m.group(1) + "}", s)
    for a, b in (("<=", r"\le "), (">=", r"\ge "), ("+-", r"\pm "), ("...", r"\ldots "), ("..", r"\ldots "),
                 ("~", r"\sim "), ("*", r"\,"), ("%", r"\%")):
        s = s.replace(a, b)
    s = re.sub(r"(?<=[A-Za-z])\.(?=[A-Za-z])", r" \\cdot ", s)
    return s


def tex(text: str) -> str:
    """The sentence as LaTeX: marked formulas in math mode, the rest as text."""
    from sigprop.export.typeset import escape_text

    parts = []
    pos = 0
    for m in _SEGMENTS.finditer(text):
        parts.append(_text(text[pos:m.start()], escape_text))
        parts.append("$" + math(m.group(1)) + "$")
        pos = m.end()
    parts.append(_text(text[pos:], escape_text))
    return "".join(parts)


def _text(s: str, escape) -> str:
    out, pos = [], 0
    for m in _OPTION.finditer(s):
        out.append(escape(s[pos:m.start()]))
        out.append(r"\texttt{-{}-" + m.group(1) + "}")
        pos = m.end()
    out.append(escape(s[pos:]))
    return "".join(out)
