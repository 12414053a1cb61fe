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


def integrate_smoothed(outer, inner, var, args=(), window=None):  # noqa: ARG001 (numeric-only)
    """Integral over the real line of ``outer(u, S, *args)`` with
    ``S[i] = E[e**b_i f_i(u + e)]``, e ~ N(0, var), as unevaluated sympy Integrals (a tuple
    of them where ``outer`` returns a tuple; see the numeric twin; ``sympy.lambdify(expr, modules='mpmath')`` evaluates it to any precision)."""
    u = _dummy("u")
    S = []
    for f, b in inner:
        e = _dummy("e")
        density = sp.exp(-(e**2) / (2 * var)) / sp.sqrt(2 * sp.pi * var)
        S.append(sp.Integral(e**b * f(u + e) * density, (e, -sp.oo, sp.oo)))
    out = outer(u, S, *args)
    if isinstance(out, tuple):
        return tuple(sp.Integral(o, (u, -sp.oo, sp.oo)) for o in out)
    return sp.Integral(out, (u, -sp.oo, sp.oo))


# --- primitives of the attention rule (sigprop.rules.attention) ------------------------
def expect_gamma(f, mean, relvar, n: int = 6):  # noqa: ARG001  (n is numeric-only)
    """E[f(X)], X ~ Gamma(shape 1/relvar, mean ``mean``), as an unevaluated sympy Integral."""
    x = _dummy("s")
    k = 1 / relvar
    theta = mean * relvar
    density = x ** (k - 1) * sp.exp(-x / theta) / (sp.gamma(k) * theta**k)
    return sp.Integral(f(x) * density, (x, 0, sp.oo))


def sum_over_lengths(f, L):
    """sum_{n=1}^{L} f(n) as an unevaluated sympy Sum."""
    n = sp.Symbol(f"n_{{{next(_counter)}}}", integer=True, positive=True)
    return sp.Sum(f(n), (n, 1, L))


def pair_length_sum(log_phi2, log_phi1, L, k):
    """sum_{n=1}^{L-1} (n)_k exp((n-k) log_phi2) sum_{m=1}^{L-n} exp(m log_phi1), with the
    inner geometric sum in closed form (see the numeric twin)."""
    if not isinstance(k, int):
        return tuple(pair_length_sum(log_phi2, log_phi1, L, kk) for kk in k)
    n = sp.Symbol(f"n_{{{next(_counter)}}}", integer=True, positive=True)
    x = sp.exp(log_phi1)
    geo = x * (1 - x ** (L - n)) / (1 - x)
    return sp.Sum(sp.ff(n, k) * sp.exp((n - k) * log_phi2) * geo, (n, 1, L - 1))


def choose(flag, if0, if1):
    """``if0()`` where flag == 0, ``if1()`` where flag == 1 (a sympy Piecewise)."""
    a, b = if0(), if1()
    if isinstance(a, tuple):
        return tuple(sp.Piecewise((x, sp.Eq(flag, 0)), (y, True)) for x, y in zip(a, b))
    return sp.Piecewise((a, sp.Eq(flag, 0)), (b, True))


def integrate_smoothed2(outer, inner, var, rho, args=(), window=None):  # noqa: ARG001
    """Double integral over (u, w) of ``outer(u, w, S, *args)`` with
    ``S[i] = E[f_i(u + e) g_i(w + e')]``, (e, e') bivariate normal (variances ``var``,
    correlation ``rho``): unevaluated sympy Integrals (see the numeric twin)."""
    u, w = _dummy("u"), _dummy("w")
    S = []
    for f, g in inner:
        e, e2 = _dummy("e"), _dummy("e")
        if f is not None and g is not None:
            dens = sp.exp(-(e**2 - 2 * rho * e * e2 + e2**2) / (2 * var * (1 - rho**2))) / (
                2 * sp.pi * var * sp.sqrt(1 - rho**2))
            S.append(sp.Integral(f(u + e) * g(w + e2) * dens, (e, -sp.oo, sp.oo), (e2, -sp.oo, sp.oo)))
        elif f is not None or g is not None:
            h, x = (f, u) if f is not None else (g, w)
            dens = sp.exp(-(e**2) / (2 * var)) / sp.sqrt(2 * sp.pi * var)
            S.append(sp.Integral(h(x + e) * dens, (e, -sp.oo, sp.oo)))
        else:
            S.append(sp.Integer(1))
    out = outer(u, w, S, *args)
    if isinstance(out, tuple):
        return tuple(sp.Integral(o, (u, -sp.oo, sp.oo), (w, -sp.oo, sp.oo)) for o in out)
    return sp.Integral(out, (u, -sp.oo, sp.oo), (w, -sp.oo, sp.oo))


def expect_normal_strip(f, var, mean=0, strip=None, max_nodes=None):  # noqa: ARG001 (numeric-only)
    """E[f(X)], X ~ N(mean, var), as an unevaluated sympy Integral (the numeric twin picks
    a quadrature suited to f with poles near the real axis; the integral is the same)."""
    return expect_normal(f, var, mean)
