"""NumPy implementation of the rule namespace (no sympy here, by design)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

NAME = "numeric"
SYMBOLIC = False

pi = np.pi
exp = np.exp
log = np.log
sqrt = np.sqrt
acos = np.arccos
asin = np.arcsin
atan = np.arctan
log1p = np.log1p
expm1 = np.expm1
tanh = np.tanh
Abs = np.abs
oo = np.inf


def Rational(p, q):  # noqa: N802  (mirrors sympy's name)
    return p / q


def maximum(a, b):
    return np.maximum(a, b)


# --- erf -------------------------------------------------------------------------------
# numpy has no erf and scipy is not a dependency.  Rational Chebyshev approximation of
# W. J. Cody (1969) style is overkill here; we use the classic erfc with a Chebyshev
# fit from Numerical Recipes (section 6.2, "erfcc"): fractional error < 1.2e-7
# everywhere, enough for float32 Monte Carlo and for rule evaluation.
_ERFC_C = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
           0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def erfc(x):
    x = np.asarray(x)
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = _ERFC_C[-1]
    for c in _ERFC_C[-2::-1]:
        poly = poly * t + c
    ans = t * np.exp(-z * z + poly)
    return np.where(x >= 0, ans, 2.0 - ans)


def erf(x):
    return 1.0 - erfc(x)


def Phi(x):  # noqa: N802
    """Standard normal CDF."""
    return 0.5 * erfc(-np.asarray(x) / np.sqrt(2.0))


# --- quadrature ------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _hermite(n: int):
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / np.sqrt(2.0 * np.pi)


def expect_normal(f, var, mean=0.0, n: int = 64):
    """E[f(X)], X ~ N(mean, var), by n-point Gauss-Hermite quadrature.

    ``f`` receives an array whose first axis is the quadrature axis.  Exact for polynomials
    of degree < 2n; for smooth f with Gaussian-like decay it converges geometrically.
    """
    x, w = _hermite(n)
    var = np.asarray(var, dtype=float)
    mean = np.asarray(mean, dtype=float)
    shape = np.broadcast_shapes(var.shape, mean.shape)
    xs = x.reshape((-1,) + (1,) * len(shape)) * np.sqrt(var) + mean
    vals = f(xs)
    vals = np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), xs.shape))
    return np.tensordot(w, vals, axes=(0, 0))
