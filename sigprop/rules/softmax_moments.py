"""Exact moments of softmax outputs over a row of Gaussian logits.

Setting.  A row of ``L`` logits z_j, each N(mu, s2), pairwise correlation r, is (in law) a
part shared by the whole row plus iid parts e_j ~ N(0, v), v = (1 - r) s2 (for any
r >= -1/(L-1): see :mod:`sigprop.rules.softmax`).  Softmax ignores the shared part, so
P_j = X_j / S with X_j = exp(e_j) and S = sum_k X_k.

Identity.  For n >= 1, 1/S**n = (1/Gamma(n)) int_0^oo t**(n-1) exp(-t S) dt, and exp(-t S)
factorises over the tokens.  Hence, for a set J of *distinct* token indices with integer
powers a_j >= 0 (n = sum a_j >= 1) and b_j >= 0,

    E[ prod_{j in J} P_j**a_j e_j**b_j ]
      = (1/Gamma(n)) int_0^oo t**(n-1) prod_j E[e**b_j exp(a_j e - t exp(e))]
                                  * phi(t)**(L - |J|) dt,
    phi(t) = E[exp(-t exp(e))]         (Laplace transform of a lognormal), e ~ N(0, v).

With t = exp(u) the powers of t are absorbed into the factors:

    = (1/Gamma(n)) int_R prod_j chi_{a_j, b_j}(u) * chi_{0,0}(u)**(L - |J|) du,
    chi_{a,b}(u) = E[e**b G_a(u + e)],   G_a(w) = exp(a w - exp(w)),   phi(e^u) = chi_{0,0}(u).

Every chi is a Gaussian smoothing of one fixed bounded function of w = u + e, so the whole
moment is one integral over u of Gaussian expectations: exact for every L and v, and
evaluated by :func:`m.integrate_smoothed` (numeric: trapezoid/Gauss-Hermite quadrature,
vectorised over configurations; symbolic: the unevaluated sympy Integral, which
``sympy.lambdify(..., 'mpmath')`` evaluates to any precision).

Check: L = 1 gives (1/Gamma(n)) int exp(n w - e^w) dw = 1.

Use ``softmax_expect`` for one monomial and ``softmax_expect_sum`` for a linear
combination, which is evaluated as *one* integral: use it for differences such as
Var P_1 = (L-1)/L (E[P_1^2] - E[P_1 P_2]), whose integrand
(chi_2 chi_0 - chi_1^2) chi_0^(L-2) is computed pointwise and so keeps its relative accuracy
when v is small (the difference of two separately computed moments would not).

Examples (distinct indices 1, 2, ...; ``v`` and ``L`` may be arrays, broadcast together):

    E[P_1^2]            softmax_expect(m, v, L, ((2, 0),))
    E[sum_j P_j^2]      L * softmax_expect(m, v, L, ((2, 0),))
    E[P_1^2 e_1^2]      softmax_expect(m, v, L, ((2, 2),))
    E[P_1 e_1 P_2 e_2]  softmax_expect(m, v, L, ((1, 1), (1, 1)))
    E[(sum_j P_j e_j)^2] = L E[P_1^2 e_1^2] + L (L-1) E[P_1 e_1 P_2 e_2]
                        softmax_expect_sum(m, v, L, [(L, ((2, 2),)),
                                                    (L * (L - 1), ((1, 1), (1, 1)))])
    E[P_1^2 P_2^2]      softmax_expect(m, v, L, ((2, 0), (2, 0)))

Here e_j is the centred iid logit part (z_j minus the row's shared part); a moment with
e_j should be read with that in mind (e.g. for r = 0 it is z_j - mu).

Numeric accuracy (checked against mpmath, an independent fine 2-D quadrature, L = 2
one-dimensional integrals and sampling): relative ~1e-9 or better for 1e-8 <= v <= 100 and
L up to 1e5 (1e-8 at L = 1e6: phi**L amplifies the rounding of phi by L).  Speed: about
0.1-0.3 s for 1000 configurations on one core (v up to ~20; the e-grid grows like
sqrt(v) beyond v ~ 0.2).
"""

from __future__ import annotations

import math

import numpy as np

#: Gaussian truncation used for the u-window (numeric hint only), in standard deviations
_K = 8.5


def _gaussian_moment(m, v, b):
    """E[e^b], e ~ N(0, v)."""
    if b % 2:
        return 0
    return math.prod(range(b - 1, 0, -2)) * v ** (b // 2) if b else 1


def _normalise(terms):
    terms = tuple((int(a), int(b)) for a, b in terms)
    if not terms:
        raise ValueError("softmax_expect: empty term list")
    for a, b in terms:
        if a < 0 or b < 0:
            raise ValueError(f"softmax_expect: powers must be >= 0, got ({a}, {b})")
    return terms


def softmax_expect(m, v, L, terms):
    """E[prod_j P_j**a_j * e_j**b_j] over distinct token indices j, for ``terms`` =
    ((a_1, b_1), (a_2, b_2), ...); P = softmax(e), e_j iid N(0, v), row length L
    (L >= number of terms).  ``v`` and ``L`` broadcast together (arrays, or sympy
    expressions with the symbolic namespace)."""
    return softmax_expect_sum(m, v, L, [(1, terms)])


def softmax_expect_sum(m, v, L, combo):
    """sum_k c_k E[monomial_k] for ``combo`` = [(c_1, terms_1), (c_2, terms_2), ...],
    evaluated as a single integral (see the module docstring).  The coefficients may be
    numbers or arrays/expressions broadcasting with ``v`` and ``L``."""
    return softmax_expect_sums(m, v, L, [combo])[0]


def softmax_expect_sums(m, v, L, combos, truncate=False):
    """:func:`softmax_expect_sum` for each of several combinations (a list of ``combo``),
    evaluated as one integral with several outputs: the smoothed factors chi_{a,b} and the
    powers of phi are shared (the u-window is the union of theirs).  Returns a list.

    ``truncate``: allow rows shorter than a monomial's number k of distinct tokens, where its
    power phi**(L - k) is taken as phi**0 (numeric guard only).  The monomial itself is then
    meaningless: the caller's coefficient must vanish there (like the falling factorial
    (L)_k of a sum over distinct indices)."""
    combos = [[(c, _normalise(t)) for c, t in combo] for combo in combos]
    consts = []
    integral_terms = []          # (output index, coefficient, terms, n)
    for j, combo in enumerate(combos):
        const = 0
        for c, t in combo:
            n = sum(a for a, _ in t)
            if n == 0:  # no softmax factor at all: a product of Gaussian moments
                const = const + c * math.prod(_gaussian_moment(m, v, b) for _, b in t)
            else:
                integral_terms.append((j, c, t, n))
        consts.append(const)
    if not integral_terms:
        return consts

    # one smoothed function per distinct (a, b); chi_{0,0} = phi is always needed
    keys = [(0, 0)]
    for _, _, t, _ in integral_terms:
        for ab in t:
            if ab not in keys:
                keys.append(ab)
    # G_a(w) = exp(a w - e^w) = exp(-e^w) (e^w)^a; the G_a share exp(w) and exp(-exp(w))
    # (memoised on the node array: the integrator calls them in turn on the same w)
    memo = {}

    def parts(w):
        if memo.get("w") is not w:
            ew = m.exp(w)
            memo.update(w=w, ew=ew, base=m.exp(-ew))
        return memo["ew"], memo["base"]

    def make_g(a):
        def g(w):
            ew, val = parts(w)
            for _ in range(a):
                val = val * ew
            return val
        return g

    gfun = {}
    for a, _ in keys:
        if a not in gfun:
            gfun[a] = make_g(a)
    inner = [(gfun[a], b) for a, b in keys]
    pos = {ab: i for i, ab in enumerate(keys)}
    guard = truncate and not m.SYMBOLIC

    def outer(u, S, L, *coefs):
        powers = {}
        totals = [0] * len(combos)
        for coef, (j, _, t, n) in zip(coefs, integral_terms):
            k = len(t)
            if k not in powers:
                powers[k] = S[0] ** (m.maximum(L - k, 0) if guard else L - k)
            prod = coef * m.Rational(1, math.factorial(n - 1))
            for ab in t:
                prod = prod * S[pos[ab]]
            totals[j] = totals[j] + prod * powers[k]
        return tuple(totals)

    # numeric window: below u0 = -log L - v/2, phi^L ~ 1 and the integrand decays at least
    # like exp(n u) (and like a Gaussian of variance v for wide logits); above, phi^(L-|J|)
    # and the chi's (Gaussian tails of variance v) cut it off.
    n_min = min(n for _, _, _, n in integral_terms)
    k_max = max(len(t) for _, _, t, _ in integral_terms)
    if not m.SYMBOLIC and not truncate and np.any(np.asarray(L) < k_max):
        raise ValueError(f"softmax_expect: a moment over {k_max} distinct tokens needs L >= {k_max}")
    sv = m.sqrt(v)
    lo = -m.log(L) - v / 2 - 40.0 / n_min - 3 * sv
    hi_chi = _K * sv + 5.0
    M = L - k_max
    hi_phi = -m.log(m.maximum(M, 1e-300)) + 5.0 + v / 2 + 3 * sv
    hi = -m.maximum(-hi_chi, -hi_phi)
    coefs = [c for _, c, _, _ in integral_terms]
    vals = m.integrate_smoothed(outer, inner, v, args=(L, *coefs), window=(lo, hi))
    return [const + (vals[j] if any(jj == j for jj, _, _, _ in integral_terms) else 0)
            for j, const in enumerate(consts)]
