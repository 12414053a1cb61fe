"""The central map from rule/state names to mathematical symbols.

Everything symbolic (sympy expressions, LaTeX tables) takes its symbols from here, so a
name is typeset the same way everywhere and matches the papers' notation: sigma for
standard deviations, r for token correlation, p for dropout, d for widths, L for sequence
length.  This module is numeric-free but imports sympy lazily through :func:`symbol`.
"""

from __future__ import annotations

import re
from functools import lru_cache

# name -> (LaTeX, sympy assumptions).  State names are prefixed "x_" (forward input) and
# "g_" (gradient arriving at the component output).
SPEC: dict[str, tuple[str, dict]] = {
    # forward input state
    "x_mean": (r"\mu_{x}", {"real": True}),
    "x_std": (r"\sigma_{x}", {"positive": True}),
    "x_corr": (r"r_{x}", {"real": True}),
    # backward state arriving at the component output
    "g_std": (r"\sigma_{g}", {"positive": True}),
    "g_corr": (r"r_{g}", {"real": True}),
    # common parameters
    "w_std": (r"\sigma_{w}", {"positive": True}),
    "b_std": (r"\sigma_{b}", {"positive": True}),
    "d_in": (r"d_{\mathrm{in}}", {"positive": True, "integer": True}),
    "d_out": (r"d_{\mathrm{out}}", {"positive": True, "integer": True}),
    "d": (r"d", {"positive": True, "integer": True}),
    "p": (r"p", {"nonnegative": True}),
    "L": (r"L", {"positive": True, "integer": True}),
    "a": (r"a", {"real": True}),
    "b": (r"b", {"real": True}),
    # RMSNorm (sigprop.rules.rmsnorm): per-token statistics
    "kappa_rms": (r"\kappa_{\mathrm{RMS}}", {"nonnegative": True}),
    "g_generic_rms": (r"\gamma_{\mathrm{RMS}}", {"nonnegative": True}),
    # gated FFN (sigprop.rules.glu)
    "d_ff": (r"d_{\mathrm{ff}}", {"positive": True, "integer": True}),
    "gate_std": (r"\sigma_{\mathrm{gate}}", {"positive": True}),
    "up_std": (r"\sigma_{\mathrm{up}}", {"positive": True}),
    "gate_b_std": (r"\sigma_{b,\mathrm{gate}}", {"nonnegative": True}),
    "up_b_std": (r"\sigma_{b,\mathrm{up}}", {"nonnegative": True}),
}

# Names whose symbolic value is the square of another symbol (variances).
SQUARES = {"x_var": "x_std", "g_var": "g_std"}


def plain_name(name: str) -> str:
    """sympy's name of the symbol: the LaTeX without backslashes, braces and \\mathrm
    (``\\sigma_{x}`` -> ``sigma_x``), which sympy's pretty printer shows as Greek."""
    latex = SPEC[name][0] if name in SPEC else name
    return re.sub(r"\\mathrm|\\|[{}]", "", latex)


def latex_name(name: str) -> str:
    if name in SQUARES:
        return latex_name(SQUARES[name]) + "^{2}"
    return SPEC[name][0] if name in SPEC else name


def register(name: str, latex: str, **assumptions) -> None:
    """Rules register the extra symbols they need (at import time, no sympy involved)."""
    if name in SPEC and SPEC[name][0] != latex:
        raise ValueError(f"symbol {name!r} already registered as {SPEC[name][0]!r}")
    SPEC[name] = (latex, assumptions or {"real": True})


@lru_cache(maxsize=None)
def symbol(name: str):
    """The sympy object standing for ``name`` (``x_var`` is ``sigma_x**2`` and so on)."""
    import sympy as sp

    if name in SQUARES:
        return symbol(SQUARES[name]) ** 2
    _, assumptions = SPEC.get(name, (name, {"real": True}))
    return sp.Symbol(plain_name(name), **assumptions)


def latex_names() -> dict:
    """{sympy Symbol: LaTeX} for every registered symbol, for ``sympy.latex(symbol_names=)``."""
    return {symbol(n): SPEC[n][0] for n in SPEC}
