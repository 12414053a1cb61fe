"""sympy implementation of the rule namespace."""

from __future__ import annotations

import itertools

import sympy as sp

NAME = "symbolic"
SYMBOLIC = True

pi = sp.pi
exp = sp.exp
log = sp.log
sqrt = sp.sqrt
acos = sp.acos
asin = sp.asin
atan = sp.atan
tanh = sp.tanh
erf = sp.erf
erfc = sp.erfc
Abs = sp.Abs
oo = sp.oo
Rational = sp.Rational


def log1p(x):
    return sp.log(1 + x)


def expm1(x):
    return sp.exp(x) - 1


def maximum(a, b):
    return sp.Max(a, b)


def Phi(x):  # noqa: N802
    return (1 + sp.erf(x / sp.sqrt(2))) / 2


_counter = itertools.count()


def _dummy(name):
    return sp.Symbol(f"{name}_{{{next(_counter)}}}", real=True)


def expect_normal(f, var, mean=0, n: int = 64):  # noqa: ARG001  (n is numeric-only)
    """E[f(X)], X ~ N(mean, var), as an unevaluated sympy Integral."""
    x = _dummy("x")
    density = sp.exp(-((x - mean) ** 2) / (2 * var)) / sp.sqrt(2 * sp.pi * var)
    return sp.Integral(f(x) * density, (x, -sp.oo, sp.oo))
