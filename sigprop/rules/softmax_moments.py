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

from sigprop import memo
from sigprop.backend.numeric import exp_flushed

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


# -- rows of independent logits with their own variances ------------------------------------
#
# The identity above does not need the keys to be identically distributed: for independent
# logits e_k ~ N(0, s_k),
#
#     E[P_j^a] = (1/Gamma(a)) int_R chi_a(u; s_j) prod_{k != j} phi(u; s_k) du,
#     chi_a(u; s) = E[G_a(u + e)], e ~ N(0, s),  phi = chi_0,
#
# so one row costs one sum of log phi over its keys per u node, and every key's moment is
# then one integral.  chi_a(u; s) is the Gaussian smoothing of the fixed function G_a, i.e.
# a convolution: it is computed once, by FFT on a fine w grid, for a log-spaced grid of
# variances s, and interpolated in log s (log chi and log phi, cubic).  Used for a causal
# row whose keys' logits have different variances (the first positions of a causal stream:
# sigprop.rules.attention.key_weights).

#: the variance grid of the tables: log s from _HS_LO to _HS_HI in steps of _HS_STEP
_HS_LO, _HS_HI, _HS_STEP = float(np.log(1e-6)), float(np.log(300.0)), 0.05
#: the w grid of the convolution (step, ends) and the u grid kept (every _HU_EVERY-th w node
#: within [_HU_LO, _HU_HI]); the left end is far enough out that the periodic wrap of the
#: step G_0 (1 on the left, 0 on the right) stays 10 standard deviations (s <= 300) away
_HW_STEP, _HW_LO, _HW_HI = 0.05, -540.0, 280.0
_HU_LO, _HU_HI, _HU_EVERY = -300.0, 60.0, 4
#: the (row, key, u) entries :func:`independent_row_moments` evaluates in one array operation
_ROW_BLOCK = 1 << 18
_HET = memo.Kind("softmax.het_tables", 1, "the smoothing tables' base and their rows, filled as asked for")


def _het_state() -> dict:
    """The smoothing tables' state (memoised: a pure function of the module's constants, its
    rows filled by FFT the first time each is asked for): ``base`` = (u grid, log-variance
    grid, w-grid FFTs of G_0..G_2, their frequencies, nfft, kept w indices), ``rows`` (3,
    variances, u) and ``done`` (which variances' rows are filled)."""
    def build():
        w = np.arange(_HW_LO, _HW_HI + _HW_STEP / 2, _HW_STEP)
        nfft = 1 << int(np.ceil(np.log2(2 * len(w))))
        ew = np.exp(w)
        base = np.exp(-ew)
        F = [np.fft.rfft(g, nfft) for g in (base, base * ew, base * ew * ew)]
        k = 2 * np.pi * np.fft.rfftfreq(nfft, _HW_STEP)
        ls = np.arange(_HS_LO, _HS_HI + _HS_STEP / 2, _HS_STEP)
        keep = np.nonzero((w >= _HU_LO - 1e-9) & (w <= _HU_HI + 1e-9))[0][::_HU_EVERY]
        u = w[keep]
        for arr in (u, ls, w):
            arr.flags.writeable = False
        return {"base": (u, ls, F, k, nfft, keep), "rows": np.full((3, len(ls), len(u)), np.nan),
                "done": np.zeros(len(ls), dtype=bool), "w": w}

    return _HET.get((), build)


def factor_w_grid() -> np.ndarray:
    """The w grid (step _HW_STEP) on which :func:`smoothed_factor_logs` gives the factors
    (read-only)."""
    return _het_state()["w"]


def smoothed_factor_logs(s: float, at=None) -> np.ndarray:
    """(3, nodes): log phi, log chi_1, log chi_2 at logit variance ``s``, the smoothed factors
    E[G_a(w + e)], e ~ N(0, s), of the identity above, by FFT, floored at log 1e-300; on the
    nodes ``at`` of :func:`factor_w_grid` (indices; all nodes by default).  The tables'
    rows (:func:`_het_tables`) are these at their variances and kept nodes."""
    state = _het_state()
    _, _, F, k, nfft, _ = state["base"]
    nw = len(state["w"])
    kern = np.exp(-0.5 * s * k * k)
    out = np.empty((3, nw if at is None else len(at)))
    for a in range(3):
        c = np.fft.irfft(F[a] * kern, nfft)
        out[a] = np.log(np.maximum(c[:nw] if at is None else c[at], 1e-300))
    return out


def _het_base():
    """(u grid, log-variance grid, w-grid FFTs of G_0..G_2, their frequencies, nfft, kept w
    indices): what every row of the tables is computed from (memoised)."""
    return _het_state()["base"]


def _het_tables(sub: slice | None = None):
    """(u grid, log-variance grid, log phi, log chi_1, log chi_2) as arrays (s, u): the
    smoothed factors of the identity above for the tabulated variances ``sub`` (a slice of the
    variance grid; all by default), each variance's row computed by FFT the first time it is
    asked for (memoised: a pure function of the module's constants)."""
    state = _het_state()
    u, ls, _, _, _, keep = state["base"]
    sub = slice(0, len(ls)) if sub is None else sub
    rows, done = state["rows"], state["done"]
    todo = np.arange(len(ls))[sub][~done[sub]]
    for i in todo:
        rows[:, i] = smoothed_factor_logs(math.exp(ls[i]), keep)
        done[i] = True
    return u, ls, rows[0], rows[1], rows[2]


def cubic_weights(t):
    """The four cubic Lagrange weights at t (a number or an array) through nodes 0, 1, 2, 3."""
    t1, t2, t3 = t - 1, t - 2, t - 3
    return [t1 * t2 * t3 / -6, t * t2 * t3 / 2, t * t1 * t3 / -2, t * t1 * t2 / 6]


def _het_interp(table, ls, s, clip_lo=None):
    """Table rows interpolated in log s (cubic Lagrange through the four nearest variances,
    held within their range) at the variances ``s`` (any shape): shape s.shape +
    (table.shape[1],).  ``table`` may be a slice of the tables' variances (``ls`` its log
    variances); ``clip_lo``: the whole grid's lowest log variance, where s is clipped.  The
    variances sharing their four nodes are done together: one matrix product with those four
    rows, and their range (for the clip) one row each way."""
    lo = ls[0] if clip_lo is None else clip_lo
    x = (np.log(np.clip(np.ravel(s), np.exp(lo), np.exp(_HS_HI))) - ls[0]) / _HS_STEP
    i0 = np.clip(np.floor(x).astype(np.int64) - 1, 0, len(ls) - 4)
    order = None if np.all(i0[1:] >= i0[:-1]) else np.argsort(i0, kind="stable")
    if order is not None:
        x, i0 = x[order], i0[order]
    W = np.stack(cubic_weights(x - i0), axis=1)
    starts = np.flatnonzero(np.diff(i0, prepend=-1))
    out = np.empty((len(x), table.shape[1]))
    for a, b in zip(starts, list(starts[1:]) + [len(x)]):
        nodes = table[i0[a]:i0[a] + 4]
        o = np.matmul(W[a:b], nodes, out=out[a:b])
        # where a factor underflows (its log clipped at log 1e-300) the cubic would
        # overshoot: keep the result within the four nodes' range
        np.clip(o, nodes.min(axis=0), nodes.max(axis=0), out=o)
    if order is not None:
        out[order] = out.copy()
    return out.reshape(np.shape(s) + (table.shape[1],))


def independent_row_moments(s, counts):
    """E[P_j] and E[P_j^2] for rows of independent Gaussian logits with their own variances.

    ``s``: (R, K) logit variances (row r holds keys of variance s[r, k]); ``counts``: (R, K)
    how many keys of row r have variance s[r, k] (real weights are allowed, negative ones
    too: a quadrature over the row's positions).  Returns two (R, K) arrays: the first and
    second moments of the softmax weight of one key of variance s[r, k] in row r (the row's
    other keys as ``counts`` says, less that key itself; for an entry of count 0, a key of that
    variance in addition to the row's).  The
    shared part of a row's logits cancels in the softmax and is not part of ``s``.

    Numeric only; variances are clipped to [1e-6, 300] (the tables' range); relative accuracy
    ~1e-4 (cubic interpolation in log s, steps 0.05; trapezoid in u at step 0.2 on a
    window that grows with the largest variance; within 1e-6 of step 0.05, tested, and
    ~1e-7 measured: docs/benchmarks.md, "NumPy's slow paths and the u step")."""
    s = np.asarray(s, dtype=float)
    counts = np.asarray(counts, dtype=float)
    if s.ndim != 2 or s.shape != counts.shape:
        raise ValueError("independent_row_moments: s and counts must be (rows, keys) arrays of one shape")
    u, ls = _het_base()[:2]
    smax = float(np.max(np.where(counts != 0, s, 0.0), initial=1e-6))
    smax = min(max(smax, 1e-6), 300.0)
    nmax = float(np.max(counts.sum(axis=1), initial=1.0))
    lo = -np.log(max(nmax, 1.0)) - smax / 2 - 3 * np.sqrt(smax) - 40.0
    hi = 8.5 * np.sqrt(smax) + 5.0 + 3.0
    cols = np.nonzero((u >= lo) & (u <= hi))[0]
    du = u[1] - u[0]
    # the factors at each distinct variance of the call, interpolated once
    uniq, inv = np.unique(s, return_inverse=True)
    inv = inv.reshape(s.shape)
    lo_s, hi_s = max(0, int(np.searchsorted(ls, np.log(max(uniq[0], 1e-300))) - 2)), \
        min(len(ls), int(np.searchsorted(ls, np.log(max(uniq[-1], 1e-300)))) + 3)
    sub = slice(lo_s, hi_s) if hi_s - lo_s >= 4 else slice(0, len(ls))
    lphi, lchi1, lchi2 = _het_tables(sub)[2:]
    facs = [_het_interp(np.ascontiguousarray(t[sub][:, cols]), ls[sub], uniq, ls[0])
            for t in (lphi, lchi1, lchi2)]
    lphi, lchi1, lchi2 = facs
    # per distinct variance, each moment's factor over phi (a key's own chi_a in place of its
    # phi in the row's product)
    lchi1 -= lphi
    lchi2 -= lphi
    e1 = np.zeros(s.shape)
    e2 = np.zeros(s.shape)
    live = np.nonzero(np.any(counts != 0, axis=1))[0]
    # rows in blocks of about _ROW_BLOCK (key, u) entries: one array operation per block
    step = max(1, _ROW_BLOCK // max(1, s.shape[1] * len(cols)))
    for b in range(0, len(live), step):
        rr = live[b:b + step]
        ir = inv[rr]                                          # (rows, k)
        lam = np.matmul(counts[rr][:, None, :], lphi[ir])     # (rows, 1, u): the row's sum of log phi
        for e, lchi in ((e1, lchi1), (e2, lchi2)):
            x = lchi[ir]                                      # (rows, k, u)
            x += lam
            exp_flushed(x)
            e[rr] = x.sum(axis=2) * du
    return e1, e2


def distinguished_key_moments(n, v, w):
    """(E[P_0], E[P_0^2]) of key 0 in a row of n keys whose logits are independent, key 0's
    N(0, v + w) and the other n - 1 keys' N(0, v) (arrays broadcast together; n >= 1; numeric
    only, as :func:`independent_row_moments`).  w = 0 gives the exchangeable row's 1/n and
    E[sum_j P_j^2]/n."""
    n, v, w = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (n, v, w)))
    s = np.stack([v.ravel() + w.ravel(), v.ravel()], axis=1)
    c = np.stack([np.ones(n.size), n.ravel() - 1.0], axis=1)
    e1, e2 = independent_row_moments(s, c)
    return e1[:, 0].reshape(n.shape), e2[:, 0].reshape(n.shape)
