"""Compress a per-layer column of numbers into a formula in the layer index l (1-based)
when it follows one: constant, power law c l^e (e snapped to a simple fraction), linear
c0 + c1 l, or geometric c q^l.  A law is accepted only if it reproduces every value to a
relative 1e-7 (default); otherwise the column has no formula and is shown by its range."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import sympy as sp

l_sym = sp.Symbol("l", positive=True, integer=True)


@dataclass(frozen=True)
class Formula:
    law: str                 # "constant" | "power" | "linear" | "geometric" | "none"
    expr: object             # sympy expression in l (None for "none")
    text: str
    first: float
    last: float
    lo: float
    hi: float


def _ok(fit: np.ndarray, y: np.ndarray, rtol: float) -> bool:
    return bool(np.all(np.abs(fit - y) <= rtol * np.abs(y) + 1e-300))


def _num(v: float) -> sp.Float:
    return sp.Float(float(f"{v:.10g}"))


def compress(values, rtol: float = 1e-7) -> Formula:
    y = np.asarray(values, dtype=np.float64)
    n = y.size
    l = np.arange(1, n + 1, dtype=np.float64)
    first, last, lo, hi = float(y[0]), float(y[-1]), float(y.min()), float(y.max())

    def out(law, expr, text):
        return Formula(law, expr, text, first, last, lo, hi)

    if n == 0:
        return out("none", None, "-")
    if _ok(np.full(n, y[0]), y, rtol):
        return out("constant", _num(y[0]), f"{y[0]:.6g}")
    if n >= 3 and np.all(y > 0):
        # power law: log y = log c + e log l, e snapped to a fraction with a small denominator
        e, logc = np.polyfit(np.log(l), np.log(y), 1)
        frac = Fraction(e).limit_denominator(12)
        for ee in (float(frac), e):
            c = float(np.exp(np.mean(np.log(y) - ee * np.log(l))))
            if _ok(c * l ** ee, y, rtol):
                ex = sp.Rational(frac.numerator, frac.denominator) if ee == float(frac) else _num(ee)
                return out("power", _num(c) * l_sym ** ex, f"{c:.6g} * l^({ex})")
        # geometric: log y = log c + l log q
        lq, logc = np.polyfit(l, np.log(y), 1)
        c, q = float(np.exp(logc)), float(np.exp(lq))
        if _ok(c * q ** l, y, rtol):
            return out("geometric", _num(c) * _num(q) ** l_sym, f"{c:.6g} * {q:.10g}^l")
    if n >= 3:
        c1, c0 = np.polyfit(l, y, 1)
        if _ok(c0 + c1 * l, y, rtol):
            return out("linear", _num(c0) + _num(c1) * l_sym, f"{c0:.6g} + {c1:.6g} l")
    return out("none", None, f"{first:.6g} (l=1) .. {last:.6g} (l={n})")
