"""NumPy implementation of the rule namespace (no sympy here, by design)."""

from __future__ import annotations

import numpy as np

from sigprop import memo

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
@memo.memoised(memo.Kind("numeric.hermite", 64, "Gauss-Hermite nodes per n"))
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


# --- integrals of products of Gaussian-smoothed functions over a line ------------------
# (used by the softmax moments, sigprop.rules.softmax_moments)
SMOOTHED_H = 0.3       # node spacing in u, and in e where the Gaussian is wide: the integrands
#                        are analytic in a strip |Im| < pi/2, trapezoid error ~exp(-2 pi 1.3/h)
SMOOTHED_K = 8.5       # Gaussian truncation, in standard deviations (tail mass < 2e-17)
SMOOTHED_SD_GH = 0.45  # below this standard deviation the e-integral uses Gauss-Hermite
SMOOTHED_NGH = 16      # Gauss-Hermite nodes for those narrow Gaussians
_SMOOTHED_CHUNK = 2_000_000  # max elements of one work array (bounds memory)


def integrate_smoothed(outer, inner, var, args=(), window=(-40.0, 40.0)):
    """Integral over the real line of ``outer(u, S, *args)``, where
    ``S[i](u) = E[e**b_i f_i(u + e)]``, e ~ N(0, var), for ``inner = [(f_1, b_1), ...]``.

    ``window = (lo, hi)`` (numeric only, like ``expect_normal``'s ``n``): the u-range outside
    which the integrand is negligible.  ``var``, ``args`` and the window bounds broadcast
    together to the configuration shape, which is the shape of the result.  ``outer`` may
    return a tuple (several integrals sharing the S's; then a tuple of results).

    Requirement on the callables: each ``f_i`` is a function of the node array w = u + e
    alone (it must not capture per-configuration arrays: pass those through ``args``); the
    same function object listed several times is evaluated once, and all ``f_i`` are called
    in order on the same array, so they may share work (memoise on ``w``'s identity).
    ``outer`` receives u with the quadrature axis first, shape (n_u, n_configs), the S's of
    the same shape, and the args with shape (1, n_configs); nodes beyond a configuration's
    window are padding (their values are discarded).

    Method: trapezoid rule in u (spacing 0.3; the window ends are negligible).  The S's
    depend on var and u only, so configurations with equal var share one u-grid (anchored
    at the lowest of their window starts, each configuration summing over the nodes that
    cover its window) and its S's.  Inner expectations: for standard deviations >= 0.45 the
    trapezoid rule in e with the same spacing, so that every u + e lies on one grid of w and
    each f_i is evaluated once per w node (the e-sums are then sliding dot products, no
    further transcendental calls); for narrower Gaussians 16-point Gauss-Hermite.  Sums of
    positive terms keep their relative accuracy.  Distinct variances are grouped by grid
    size and processed in vectorised chunks.
    """
    var = np.asarray(var, dtype=float)
    lo, hi = (np.asarray(w, dtype=float) for w in window)
    args = [np.asarray(a, dtype=float) for a in args]
    shape = np.broadcast_shapes(var.shape, lo.shape, hi.shape, *(a.shape for a in args))
    flat = [np.broadcast_to(a, shape).ravel() for a in (var, lo, hi, *args)]
    var, lo, hi, args = flat[0], flat[1], flat[2], flat[3:]
    if np.any(var < 0) or not np.all(np.isfinite(var)):
        raise ValueError("integrate_smoothed: variances must be finite and >= 0")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi > lo)):
        raise ValueError("integrate_smoothed: the window must be finite with lo < hi")
    funcs, which = [], []
    for f, b in inner:
        k = next((i for i, g in enumerate(funcs) if g is f), None)
        if k is None:
            funcs.append(f)
            k = len(funcs) - 1
        which.append((k, int(b)))

    H = SMOOTHED_H
    # distinct variances, each with one grid a + H * arange(n_grid) covering its configurations
    uvar, inv = np.unique(var, return_inverse=True)
    inv = inv.ravel()
    a = np.full(uvar.size, np.inf)
    np.minimum.at(a, inv, lo)
    first = np.floor((lo - a[inv]) / H).astype(int)             # the config's first node
    last = np.ceil((hi - a[inv]) / H).astype(int)               # ... and its last
    n_grid = np.zeros(uvar.size, dtype=int)
    np.maximum.at(n_grid, inv, last + 1)
    # the S's of each distinct variance on its grid, padded to the longest grid
    sd = np.sqrt(uvar)
    n_max = int(n_grid.max())
    S_all = [np.empty((n_max, uvar.size)) for _ in which]
    groups = []
    narrow = sd < SMOOTHED_SD_GH
    idx = np.nonzero(narrow)[0]
    if idx.size:
        groups.append((idx, 0))
    idx = np.nonzero(~narrow)[0]
    if idx.size:
        n_e = 2 * np.ceil(SMOOTHED_K * sd[idx] / H).astype(int) + 1
        bins = np.ceil(np.log2(n_e)).astype(int)
        for bb in np.unique(bins):
            groups.append((idx[bins == bb], int(n_e[bins == bb].max())))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        for sel, ne in groups:
            nu = int(n_grid[sel].max())
            per = max(1, _SMOOTHED_CHUNK // (nu * (ne or SMOOTHED_NGH)))
            for s in range(0, sel.size, per):
                c = sel[s:s + per]
                if ne == 0:
                    S = _smoothed_gh(funcs, which, sd[c], a[c], nu)
                else:
                    S = _smoothed_trap(funcs, which, uvar[c], a[c], nu, ne)
                for dst, src in zip(S_all, S):
                    dst[:nu, c] = src
        # each configuration: its nodes first .. last of its variance's grid
        count = last - first + 1
        order = np.argsort(count, kind="stable")
        results = None
        per = max(1, _SMOOTHED_CHUNK // (4 * int(count.max()) * max(1, len(which))))
        for s in range(0, order.size, per):
            c = order[s:s + per]
            n = int(count[c].max())
            rows = first[c][None, :] + np.arange(n)[:, None]              # (n, C)
            inside = rows <= last[c][None, :]
            rows = np.minimum(rows, n_grid[inv[c]][None, :] - 1)
            cols = inv[c][None, :]
            u = a[cols] + rows * H
            out = outer(u, [Sk[rows, cols] for Sk in S_all], *(x[c][None, :] for x in args))
            multi = isinstance(out, tuple)
            vals = [H * np.sum(np.where(inside, o, 0.0), axis=0) for o in (out if multi else (out,))]
            if results is None:
                results = [np.empty(var.size) for _ in vals]
                is_multi = multi
            for r, v in zip(results, vals):
                r[c] = v
    res = [r.reshape(shape) for r in results]
    return tuple(res) if is_multi else res[0]


def _smoothed_gh(funcs, which, sd, lo, nu):
    """The S's (each (nu, C)) on the grids lo + H * arange(nu), narrow Gaussians."""
    x, w = _hermite(SMOOTHED_NGH)
    u = lo + np.arange(nu)[:, None] * SMOOTHED_H              # (nu, C)
    e = x[:, None, None] * sd                                  # (ngh, 1, C)
    wnodes = u[None] + e                                       # (ngh, nu, C)
    vals = [f(wnodes) for f in funcs]
    S = []
    for k, b in which:
        wb = np.broadcast_to(w[:, None, None] * (e**b if b else 1.0), wnodes.shape)
        S.append(np.einsum("knc,knc->nc", wb, vals[k]))
    return S


def _smoothed_trap(funcs, which, var, lo, nu, ne):
    """The S's (each (nu, C)) on the grids lo + H * arange(nu), wide Gaussians."""
    h = SMOOTHED_H
    half = (ne - 1) // 2
    e = (np.arange(ne) - half)[:, None] * h                    # (ne, 1)
    dens = h * np.exp(-0.5 * e**2 / var) / np.sqrt(2 * np.pi * var)    # (ne, C)
    wnodes = lo + (np.arange(nu + ne - 1) - half)[:, None] * h         # (nu + ne - 1, C)
    vals = [np.ascontiguousarray(f(wnodes)) for f in funcs]
    S = []
    for k, b in which:
        g = vals[k]
        view = np.lib.stride_tricks.as_strided(      # view[i, j] = g[i + j] = f(u_i + e_j)
            g, shape=(nu, ne, g.shape[1]), strides=(g.strides[0], g.strides[0], g.strides[1]),
            writeable=False)
        S.append(np.einsum("ijc,jc->ic", view, dens * (e**b if b else 1.0)))
    return S


# --- primitives of the attention rule (sigprop.rules.attention) ------------------------
@memo.memoised(memo.Kind("numeric.gen_laguerre", 4096, "generalised Gauss-Laguerre nodes per (n, alpha)"))
def _gen_laguerre(n: int, alpha: float):
    """Nodes and normalised weights of n-point generalised Gauss-Laguerre quadrature,
    weight x^alpha e^-x (Golub-Welsch: eigen-decomposition of the Jacobi matrix)."""
    i = np.arange(n, dtype=float)
    off = np.sqrt(np.arange(1, n) * (np.arange(1, n) + alpha))
    J = np.diag(2 * i + alpha + 1) + np.diag(off, 1) + np.diag(off, -1)
    x, V = np.linalg.eigh(J)
    w = V[0] ** 2
    return x, w / w.sum()


def expect_gamma(f, mean, relvar, n: int = 6):
    """E[f(X)] for X ~ Gamma with mean ``mean`` and relative variance ``relvar`` (shape
    1/relvar), by n-point generalised Gauss-Laguerre quadrature (exact for polynomials of
    degree < 2n).  Quadrature axis first, like :func:`expect_normal`."""
    mean = np.asarray(mean, dtype=float)
    relvar = np.asarray(relvar, dtype=float)
    shape = np.broadcast_shapes(mean.shape, relvar.shape)
    k = 1.0 / np.maximum(np.broadcast_to(relvar, shape), 1e-12)
    kf = k.ravel()
    # one quadrature per distinct shape, gathered to every element that has it (a loop over the
    # distinct shapes with a mask each cost O(elements x shapes): QK-norm's per-element shapes)
    uk, inv = np.unique(kf, return_inverse=True)
    xu, wu = np.empty((n, uk.size)), np.empty((n, uk.size))
    for i, kk in enumerate(uk.tolist()):
        x, w = _gen_laguerre(n, kk - 1.0)
        xu[:, i], wu[:, i] = x / kk, w
    inv = inv.reshape(-1)
    xs, ws = xu[:, inv], wu[:, inv]
    xs = xs.reshape((n,) + shape) * np.broadcast_to(mean, shape)
    vals = f(xs)
    vals = np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), xs.shape))
    return np.sum(ws.reshape((n,) + shape + (1,) * (vals.ndim - 1 - len(shape))) * vals, axis=0)


_LEN_EXACT = 12   # lengths summed term by term; beyond, Gauss-Legendre in log n
_LEN_GL = 12


@memo.memoised(memo.Kind("numeric.legendre", 64, "Gauss-Legendre nodes per n"))
def _legendre(n: int):
    return np.polynomial.legendre.leggauss(n)


def _length_nodes(lo, hi):
    """Nodes and weights approximating sum_{n=lo}^{hi} f(n) (integers, hi may be an array):
    exact terms n = lo .. lo+11, then the midpoint-rule integral of the smooth remainder over
    [lo + 11.5, hi + 0.5] by Gauss-Legendre in log n, with the Euler-Maclaurin end
    corrections (f'(a-1/2) - f'(b+1/2))/24 by differences of f.  Quadrature axis first."""
    hi = np.asarray(hi, dtype=float)
    ex = lo + np.arange(_LEN_EXACT + 1, dtype=float)
    n_ex = ex.reshape((-1,) + (1,) * hi.ndim) + 0 * hi
    w_ex = (n_ex <= hi).astype(float)
    # Euler-Maclaurin: the midpoint rule's error -(f'(b+1/2) - f'(a-1/2))/24; the left end
    # term, f'(a-1/2) ~ f(a) - f(a-1) at a = lo + 12, is added through the last two nodes
    tail = hi > lo + _LEN_EXACT - 1
    w_ex[-1] = np.where(tail, 1.0 / 24, 0.0)
    w_ex[-2] = np.where(tail, 1.0 - 1.0 / 24, w_ex[-2])
    x, w = _legendre(_LEN_GL)
    a = np.log(lo + _LEN_EXACT - 0.5)
    b = np.log(np.maximum(hi + 0.5, lo + _LEN_EXACT - 0.5))
    u = a + (b - a) * (x.reshape((-1,) + (1,) * hi.ndim) + 1) / 2
    n_gl = np.exp(u)
    w_gl = w.reshape((-1,) + (1,) * hi.ndim) * (b - a) / 2 * n_gl
    # right end term -f'(b+1/2)/24 ~ -(f(b+1) - f(b))/24
    n_r = np.stack([hi, hi + 1])
    w_r = np.stack([np.where(tail, 1.0 / 24, 0.0), np.where(tail, -1.0 / 24, 0.0)])
    n_r = np.where(np.stack([tail, tail]), n_r, 1.0)
    return np.concatenate([n_ex, n_gl, n_r]), np.concatenate([w_ex, w_gl, w_r])


def sum_over_lengths(f, L):
    """sum_{n=1}^{L} f(n), for a function f smooth in n (row lengths of causal attention):
    exact for L <= 12; beyond, the first 12 terms exactly and the rest as the midpoint-rule
    integral with Euler-Maclaurin end corrections, by 12-point Gauss-Legendre in log n
    (relative error < 1e-4 for sums like 1/n, 1/n^2, e^(-n/10)).  ``f`` receives n
    (possibly non-integer) with the quadrature axis first."""
    n, w = _length_nodes(1.0, L)
    vals = f(n)
    vals = np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), n.shape))
    return np.sum(w.reshape(w.shape + (1,) * (vals.ndim - w.ndim)) * vals, axis=0)


#: elements of the arrays :func:`pair_length_sum` works on at a time: its ~15 passes per length
#: node then stay in cache (on a (87, 97, 97) call, 0.125 s in chunks of 32,768 against 0.20 s
#: in one piece, 0.13 s in chunks of 8,192 and 0.16 s of 131,072; the sums bit-identical)
PAIR_CHUNK = 32768


def pair_length_sum(log_phi2, log_phi1, L, k):
    """sum_{n=1}^{L-1} (n)_k exp((n-k) log_phi2) * sum_{m=1}^{L-n} exp(m log_phi1), with
    (n)_k the falling factorial: the length weights of a pair of causal rows (the shorter
    row n keys, all shared; the longer n + m).  L a scalar; log_phi* arrays (<= 0).  ``k``
    an integer, or a tuple of integers (then a tuple of sums, computed in one pass).  Terms
    below exp(-700) (~1e-304) are taken as 0 (:func:`exp_flushed`).

    One pass over the length nodes: at each node n >= kt = max(k) one power phi2^(n - kt) is
    shared by every k, whose sum takes the factor phi2^(kt - k) once at the end (nodes
    n < kt are summed term by term).  The elements are independent: they are taken
    :data:`PAIR_CHUNK` at a time, each chunk through every node."""
    ks = (k,) if isinstance(k, int) else tuple(k)
    L = float(L)
    n, w = _length_nodes(1.0, L - 1.0)
    l1 = np.asarray(log_phi1, dtype=float)
    l2 = np.asarray(log_phi2, dtype=float)
    shape = np.broadcast_shapes(l1.shape, l2.shape)
    kt = max(ks)
    # per node: n, the longer row's extra keys M = L - n, the coefficients w (n)_k of each k
    plan = []
    for nn, ww in zip(n.tolist(), w.tolist()):
        if ww == 0:
            continue
        ffs = []
        for kk in ks:
            ff = 1.0
            for j in range(kk):
                ff *= nn - j
            ffs.append(ww * ff if ff > 0 else 0.0)
        if any(ffs):
            plan.append((nn, L - nn, ffs))
    l1f = np.broadcast_to(l1, shape).reshape(-1)
    l2f = np.broadcast_to(l2, shape).reshape(-1)
    outs = [np.empty(l1f.size) for _ in ks]
    for a in range(0, l1f.size, PAIR_CHUNK):
        b = min(l1f.size, a + PAIR_CHUNK)
        c1, c2, sh = l1f[a:b], l2f[a:b], (b - a,)
        em1 = np.expm1(c1)
        small = em1 > -1e-12
        any_small = bool(small.any())
        ratio = np.exp(c1) / np.where(small, -1.0, em1)
        head = [np.zeros(sh) for _ in ks]       # nodes n < kt, each k's terms directly
        acc = [np.zeros(sh) for _ in ks]        # nodes n >= kt, without phi2^(kt - k)
        term, geo, tmp = np.empty(sh), np.empty(sh), np.empty(sh)
        for nn, M, ffs in plan:
            # the longer row's extra keys, sum_{m=1}^{M} phi1^m = phi1 (phi1^M - 1) / (phi1 - 1)
            # (M where phi1 ~ 1)
            np.multiply(c1, M, out=geo)
            np.expm1(geo, out=geo)
            geo *= ratio
            if any_small:
                np.copyto(geo, M, where=small)
            if nn < kt:
                for i, (kk, c) in enumerate(zip(ks, ffs)):
                    if c:
                        t = exp_flushed(np.multiply(c2, nn - kk, out=term)) if nn > kk else np.ones(sh)
                        t *= c
                        t *= geo
                        head[i] += t
                continue
            if nn > kt:
                exp_flushed(np.multiply(c2, nn - kt, out=term))
                term *= geo
            else:
                np.copyto(term, geo)
            for i, c in enumerate(ffs):
                if c:
                    acc[i] += np.multiply(term, c, out=tmp)
        for kk, h, ac, o in zip(ks, head, acc, outs):
            if kk < kt:
                ac *= exp_flushed(np.multiply(c2, kt - kk, out=np.empty(sh)))
            ac += h
            o[a:b] = ac
    outs = [o.reshape(shape) for o in outs]
    return outs[0] if isinstance(k, int) else tuple(outs)


#: :func:`exp_flushed` gives 0 below this argument
EXP_FLUSH = -700.0


def exp_flushed(x: np.ndarray) -> np.ndarray:
    """exp(x), with 0 where x < EXP_FLUSH (results below ~1e-304), computed in place on ``x``
    (a fresh array the caller owns).  NumPy's vectorised exp leaves its fast path for results
    near or below the smallest normal double (x below about -707): 14-100 ns an element there
    against 0.8 ns (measured; docs/benchmarks.md, "NumPy's slow paths and the u step").  Where
    the callers use it (:func:`pair_length_sum`, the per-key row moments) their results with
    the flush are within 2e-15 relative of the unflushed ones (measured on a LLaMA model's
    calls)."""
    tiny = x < EXP_FLUSH
    np.maximum(x, EXP_FLUSH, out=x)
    np.exp(x, out=x)
    np.copyto(x, 0.0, where=tiny)
    return x


def choose(flag, if0, if1):
    """``if0()`` where flag == 0 and ``if1()`` where flag == 1 (lazy: a branch is evaluated
    only if some configuration needs it)."""
    flag = np.asarray(flag, dtype=float)
    if np.all(flag == 0):
        return if0()
    if np.all(flag == 1):
        return if1()
    a, b = if0(), if1()
    if isinstance(a, tuple):
        return tuple(np.where(flag == 1, y, x) for x, y in zip(a, b))
    return np.where(flag == 1, b, a)


_S2_H = 0.3       # (u, w) grid spacing of integrate_smoothed2
_S2_HX = 0.1      # lattice spacing of the smoothed inner functions (cubic interpolation)
_S2_SD_GH = 0.45  # below this standard deviation the smoothing uses Gauss-Hermite
_S2_NGH = 24      # ... with this many nodes
_S2_K = 8.5       # Gaussian truncation (standard deviations)
_S2_SD_WIDE = 2.0  # from this standard deviation the lattice convolution steps by ...
_S2_WIDE_STEP = 3  # ... this many lattice steps (see _smooth_lattice_batch)


def integrate_smoothed2(outer, inner, var, rho, args=(), window=(-40.0, 40.0)):
    """Double integral over (u, w) of ``outer(u, w, S, *args)``, where
    ``S[i](u, w) = E[f_i(u + e) g_i(w + e')]`` for ``inner = [(f_1, g_1), ...]``, (e, e')
    bivariate normal with variances ``var`` and correlation ``rho``; ``f_i`` or ``g_i`` may
    be None (factor 1).  The bivariate analogue of :func:`integrate_smoothed`.

    ``var``, ``rho``, ``args`` and the window broadcast to the configuration shape (the
    result's).  ``outer`` may return a tuple (several integrals sharing the S's).  It is
    called on a batch of configurations with equal ``args``: u of shape (C, n, 1), w of shape
    (C, 1, n), S of shape (C, n, n) and the args as floats (nodes beyond a configuration's
    own grid are padding, discarded after the call).  The f's are called in turn on the same
    node array (they may share work, memoised on its identity, as in :func:`integrate_smoothed`).

    Method: e = b eta + c xi, e' = +-b eta + c xi' (b^2 = |rho| var, c^2 = (1-|rho|) var):
    each f is smoothed over xi on a lattice (spacing 0.1; convolution, summed every third
    lattice step for c >= 2, or Gauss-Hermite for narrow c), interpolated (cubic) at
    u + b eta_k, and the eta expectation (Gauss-Hermite, 8 + 6 b nodes) is one matrix product
    per configuration over every pair.  Trapezoid rule in u and w (spacing 0.3).  Every
    configuration keeps its own grids; configurations are batched (padded to common sizes).
    """
    var = np.asarray(var, dtype=float)
    rho = np.asarray(rho, dtype=float)
    lo, hi = (np.asarray(w, dtype=float) for w in window)
    args = [np.asarray(a, dtype=float) for a in args]
    shape = np.broadcast_shapes(var.shape, rho.shape, lo.shape, hi.shape, *(a.shape for a in args))
    flat = [np.broadcast_to(a, shape).ravel() for a in (var, rho, lo, hi, *args)]
    var, rho, lo, hi, args = flat[0], flat[1], flat[2], flat[3], flat[4:]
    if np.any(var < 0) or not np.all(np.isfinite(var)) or np.any(np.abs(rho) > 1):
        raise ValueError("integrate_smoothed2: need finite var >= 0 and |rho| <= 1")
    funcs = []
    for pair in inner:
        for f in pair:
            if f is not None and all(f is not g for g in funcs):
                funcs.append(f)
    h = _S2_H
    ar = np.minimum(np.abs(rho), 1.0)
    b, sd = np.sqrt(ar * var), np.sqrt((1 - ar) * var)
    sg = np.where(rho >= 0, 1.0, -1.0)
    nu = (np.ceil((hi - lo) / h)).astype(int) + 1
    K = np.minimum(48, np.maximum(8, np.ceil(8 + 6 * b))).astype(int)
    # batches: equal args (the outer gets them as floats), bounded work-array size
    if args:
        _, group = np.unique(np.stack(args, axis=1), axis=0, return_inverse=True)
        group = group.ravel()
    else:
        group = np.zeros(var.size, dtype=int)
    results = None
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        for gi in range(group.max() + 1 if group.size else 0):
            sel = np.nonzero(group == gi)[0]
            sel = sel[np.argsort(nu[sel], kind="stable")]      # similar sizes together
            start = 0
            while start < sel.size:
                # a batch is padded to its largest grid: take configurations whose grids are
                # within 10% of the smallest remaining one (sorted ascending: a prefix)
                n_max = int(nu[sel[start]] * 1.1) + 1
                per = max(1, _S2_CHUNK // (n_max * n_max))
                c = sel[start:start + per]
                c = c[nu[c] <= n_max] if nu[c[0]] <= n_max else c[:1]
                start += c.size
                vals = _smoothed2_batch(outer, inner, funcs, b[c], sd[c], sg[c], lo[c], nu[c], K[c],
                                        [float(a[c[0]]) for a in args])
                multi = isinstance(vals, tuple)
                if results is None:
                    results = [np.empty(var.size) for _ in (vals if multi else (vals,))]
                    is_multi = multi
                for r, v in zip(results, vals if multi else (vals,)):
                    r[c] = v
    res = [r.reshape(shape) for r in results]
    return tuple(res) if is_multi else res[0]


_S2_CHUNK = 1_000_000     # max elements of one (configurations x n x n) work array
_S2_STACK_N = 160         # from this u-grid size the pair products are one stacked product


def _smoothed2_batch(outer, inner, funcs, b, sd, sg, lo, nu, K, args):
    """integrate_smoothed2 for a batch of C configurations (arrays of length C), padded to
    the largest u-grid and Gauss-Hermite size of the batch."""
    h, hx = _S2_H, _S2_HX
    C, n, kmax = b.size, int(nu.max()), int(K.max())
    u = lo[:, None] + h * np.arange(n)                          # (C, n): own grid, padded
    eta = np.zeros((C, kmax))
    we = np.zeros((C, kmax))
    for k in np.unique(K):                                      # own nodes, zero-weight padding
        x, w = _hermite(int(k))
        eta[K == k, :k], we[K == k, :k] = x, w
    reach = b * np.abs(eta).max(axis=1) + 2 * hx
    x0 = lo - reach - 2 * hx
    # lattice covering the padded grid (values at the config's own lattice points unchanged)
    nx = int(np.max(np.ceil((h * (n - 1) + 2 * reach + 4 * hx) / hx))) + 4
    pu = u[:, :, None] + (b[:, None] * eta)[:, None, :]         # (C, n, kmax)
    neg = sg < 0
    pw = u[:, :, None] + ((sg * b)[:, None] * eta)[:, None, :] if neg.any() else pu
    Fu, Fw = {}, {}
    lats = _smooth_lattice_batch(funcs, x0, nx, sd)
    for f, lat in zip(funcs, lats):
        Fu[f] = _interp_batch(lat, x0, pu)
        Fw[f] = _interp_batch(lat, x0, pw) if neg.any() else Fu[f]
    # every product E_eta[F_f(u + b eta) F_g(w + sg b eta)] of the pairs.  Large grids (large
    # logit variances): one matrix product per configuration over all the f's and g's stacked
    # ([F_f1; F_f2; ...] (rows) against [F_g1; F_g2; ...] (columns)), blocks picked out after:
    # there each pair's product is big enough for BLAS to thread it, and seven thread
    # start-ups per configuration dominated on a busy machine (attention at logit variance
    # 43: 6.6-7.4 s -> 2.0-2.3 s).  Small grids: one product per pair (stacked, the products
    # grew past BLAS's threading threshold and ran ~10x slower on a busy machine).
    stacked = n >= _S2_STACK_N
    left = [f for f, g in inner if f is not None and g is not None] if stacked else []
    right = [g for f, g in inner if f is not None and g is not None]
    left = [f for i, f in enumerate(left) if all(f is not h for h in left[:i])]
    right = [g for i, g in enumerate(right) if all(g is not h for h in right[:i])]
    FwT = {}                                                    # (C, kmax, n), contiguous for BLAS
    if left:
        A = np.concatenate([Fu[f] * we[:, None, :] for f in left], axis=1)            # (C, a n, kmax)
        B = np.ascontiguousarray(np.swapaxes(np.concatenate([Fw[g] for g in right], axis=1), 1, 2))
        P = np.matmul(A, B)                                                            # (C, a n, b n)
    S = []
    for f, g in inner:
        if f is None and g is None:
            S.append(np.ones((C, n, n)))
        elif g is None:
            S.append(np.broadcast_to(np.einsum("cik,ck->ci", Fu[f], we)[:, :, None], (C, n, n)))
        elif f is None:
            S.append(np.broadcast_to(np.einsum("cik,ck->ci", Fw[g], we)[:, None, :], (C, n, n)))
        elif stacked:
            i = next(k for k, h in enumerate(left) if h is f)
            j = next(k for k, h in enumerate(right) if h is g)
            S.append(P[:, i * n:(i + 1) * n, j * n:(j + 1) * n])
        else:
            if g not in FwT:
                FwT[g] = np.ascontiguousarray(np.swapaxes(Fw[g], 1, 2))
            S.append(np.matmul(Fu[f] * we[:, None, :], FwT[g]))
    out = outer(u[:, :, None], u[:, None, :], S, *args)
    inside = np.arange(n)[None, :] < nu[:, None]                # (C, n)
    mask = inside[:, :, None] & inside[:, None, :]
    multi = isinstance(out, tuple)
    vals = tuple(h * h * np.sum(np.where(mask, o, 0.0), axis=(1, 2)) for o in (out if multi else (out,)))
    return vals if multi else vals[0]


def _smooth_lattice_batch(funcs, x0, nx, sd):
    """F(x) = E[f(x + sd*xi)] on the lattices x0 + _S2_HX * arange(nx) (one per
    configuration: x0, sd arrays of length C) for each f in ``funcs``; the same arithmetic
    as a per-configuration convolution (or Gauss-Hermite sum), batched."""
    hx = _S2_HX
    C = x0.size
    out = [np.empty((C, nx)) for _ in funcs]
    narrow = sd < _S2_SD_GH
    idx = np.nonzero(narrow)[0]
    if idx.size:
        xg, wg = _hermite(_S2_NGH)
        xl = x0[idx, None] + hx * np.arange(nx)                     # (c, nx)
        pts = xl[:, :, None] + sd[idx, None, None] * xg             # (c, nx, ngh)
        for o, f in zip(out, funcs):
            o[idx] = f(pts) @ wg
    for m in (1, _S2_WIDE_STEP):
        # the convolution sums over e = j hx with j a multiple of m: every lattice step for
        # ordinary widths, every third (e step 0.3, as integrate_smoothed's trapezoid in e)
        # for Gaussians wider than _S2_SD_WIDE (large logit variances, where the kernel spans
        # thousands of lattice steps).  The trapezoid rule for these analytic integrands
        # converges like exp(-pi^2 / step): ~5e-15 relative at 0.3 (measured: < 1e-12 on the
        # attention rule's outputs against every step), at a third of the work.
        wide = sd >= _S2_SD_WIDE
        idx = np.nonzero(~narrow & (wide if m > 1 else ~wide))[0]
        if not idx.size:
            continue
        halves = np.ceil(_S2_K * sd[idx] / (m * hx)).astype(int)
        H = int(halves.max())
        j = np.arange(-H, H + 1)
        e = j * (m * hx)
        kern = np.where(np.abs(j)[None, :] <= halves[:, None],
                        np.exp(-0.5 * (e[None, :] / sd[idx, None]) ** 2), 0.0)   # (c, 2H+1)
        kern /= kern.sum(axis=1, keepdims=True)
        xe = x0[idx, None] - H * m * hx + hx * np.arange(nx + 2 * H * m)    # (c, nx + 2Hm)
        for o, f in zip(out, funcs):
            fe = np.ascontiguousarray(f(xe))
            view = np.lib.stride_tricks.as_strided(       # view[c, i, j] = fe[c, i + m j]
                fe, shape=(idx.size, nx, 2 * H + 1),
                strides=(fe.strides[0], fe.strides[1], m * fe.strides[1]), writeable=False)
            o[idx] = np.einsum("cij,cj->ci", view, kern)
    return out


def _interp_batch(F, x0, x):
    """Cubic (4-point Lagrange) interpolation of lattice values F (C, nx) at points x
    (C, ...), lattice c starting at x0[c]."""
    C, nx = F.shape
    t = (x - x0.reshape((C,) + (1,) * (x.ndim - 1))) / _S2_HX
    i = np.clip(np.floor(t).astype(int), 1, nx - 3)
    s = t - i
    flat = F.ravel()
    base = (np.arange(C) * nx).reshape((C,) + (1,) * (x.ndim - 1)) + i
    f0, f1, f2, f3 = flat[base - 1], flat[base], flat[base + 1], flat[base + 2]
    return (f1 + s * (0.5 * (f2 - f0) + s * (f0 - 2.5 * f1 + 2 * f2 - 0.5 * f3
                                              + s * (1.5 * (f1 - f2) + 0.5 * (f3 - f0)))))


# --- Gaussian expectations of functions with poles near the real axis ------------------
@memo.memoised(memo.Kind("numeric.strip_nodes", 64, "strip quadrature nodes per half-width"))
def _strip_nodes(n_half: int):
    z = (9.5 / n_half) * np.arange(-n_half, n_half + 1)
    return z, (9.5 / n_half) * np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)


def expect_normal_strip(f, var, mean=0.0, strip=np.pi, max_nodes: int = 1601):
    """E[f(X)], X ~ N(mean, var), for f analytic in the strip |Im x| < ``strip`` (the
    logistic sigmoid and SiLU: strip = pi), by the trapezoid rule in z = (X - mean)/sd over
    |z| <= 9.5 (Gaussian tail beyond: < 1e-20).

    Gauss-Hermite (:func:`expect_normal`) converges slowly for such f once sd is large
    (measured for SiLU: relative error 2e-3 on E[silu'(X)^2] at var 100 with 256 nodes).
    For the trapezoid rule the error is about exp(tau^2/2 - 2 pi tau/h) with tau = strip/sd
    the pole distance in z and h the node spacing (and exp(-2 pi^2/h^2) without poles);
    h = min(0.5, tau/6.5) keeps it below ~1e-15.  Nodes are capped at ``max_nodes`` (enough
    for that spacing up to sd ~ 40 at strip pi; beyond it the spacing is coarser and the
    error grows: 1.5e-6 relative on E[silu'(X)^2] at var 1e4, measured).  One node set
    serves all configurations (the smallest spacing any of them needs); quadrature axis
    first, like :func:`expect_normal`, so calls nest (pass the outer node array through
    ``mean``)."""
    var = np.asarray(var, dtype=float)
    mean = np.asarray(mean, dtype=float)
    shape = np.broadcast_shapes(var.shape, mean.shape)
    sd = np.sqrt(var)
    sd_max = float(np.max(sd)) if sd.size else 0.0
    h = 0.5 if sd_max * 6.5 * 0.5 <= strip else strip / (6.5 * sd_max)
    n_half = int(min(np.ceil(9.5 / h), (max_nodes - 1) // 2))
    z, w = _strip_nodes(max(n_half, 1))
    xs = z.reshape((-1,) + (1,) * len(shape)) * sd + mean
    vals = f(xs)
    vals = np.broadcast_to(vals, np.broadcast_shapes(np.shape(vals), xs.shape))
    return np.tensordot(w, vals, axes=(0, 0))
