"""Sliding-window (local) attention masks: which keys each query row sees, as the attention
rule needs them (its row averages and its sums over pairs of rows).

A window of W keys (``window`` W > 0):

* causal: row i sees keys max(0, i - W + 1) .. i (at most W; the first W - 1 rows fewer);
* bidirectional: row i sees the W keys i - left .. i + right, left = floor((W - 1) / 2),
  right = W - 1 - left (centred; one more key on the right when W is even), clipped to
  0 .. L - 1, so the rows within ``left`` of the start and ``right`` of the end are shorter.
  (ModernBERT's local attention, |i - j| <= w / 2, is the window W = w + 1.)

W = 0 is global attention (every key; causal: keys 0..i).  A window is *active* when some
row sees fewer keys than it would globally: causal W < L, bidirectional left < L - 1 or
right < L - 1.

Two rows i < k see s = hi_i - lo_k + 1 shared keys (when s >= 1), row i a further
a = lo_k - lo_i keys of its own and row k b = hi_k - hi_i.  The rule's two-row statistics
are sums over the ordered pairs of
(s)_q phi2^(s - q) phi1(u)^a phi1(w)^b (one factor per key: phi2 for a shared key, phi1
for a key only one row sees; (s)_q the falling factorial).  :class:`Window` lists the pairs
exactly, as runs: for fixed s, a and b step by 0 or 1 over T consecutive terms of equal
multiplicity, so that a run's sum is one geometric series (``pair_weights``).  Pairs that
share no key contribute nothing to those statistics.

The attention rule's window assumption in full: Sliding window (window W; numeric only): the one-
row statistics are averaged over the row lengths that occur (causal min(i + 1, W); bidirectional
shorter rows at both ends), exactly up to 16 consecutive lengths of equal count and by the causal
sums' length quadrature beyond (relative error < 1e-4); the two-row statistics are summed over
every pair of rows by its shared keys and each row's own keys, exactly (sigprop.rules.windows;
refused beyond 4e7 row pairs, L x min(W, L)); the (L - 1) factors of the pair terms keep their
meaning (pairs that share no key contribute 0). The input is taken as exchangeable over positions
(one token correlation): exact for the first windowed layer of a stack, not after one (the stream's
correlation then falls with the distance between positions; the predictor refuses a second windowed
layer). The row-level laws (the rotary cosine sums kbar, the pair law's variance) are taken at the
mean row length; the E[sum P_i^2 sum P_k^2] pair term (O(1/d)) as the square of the row average.
Measured (attention grid window: W 1, 5, 32, 300 at L 16, 64, 256, causal and bidirectional, rotary
on and off, 96 points): x var p50 / p90 / p99 0.35 / 0.95 / 1.40 %, g var 0.57 / 1.41 / 4.35 % (the
worst points causal W >= L, i.e. the global rule with rotary positions; every windowed point within
2.1%).
"""

from __future__ import annotations

import numpy as np

from sigprop import memo
from sigprop.errors import DomainError

#: the most row pairs a window's exact pair list is built from (L x min(W, L)); beyond it
#: the rule refuses (DomainError) rather than approximate
PAIR_MAX = 40_000_000

_LEN_EXACT = 16     # consecutive row lengths summed term by term; beyond, the length quadrature


def sides(W: int, causal: bool) -> tuple[int, int]:
    """(left, right): the keys a full row sees before and after its own position."""
    if causal:
        return W - 1, 0
    left = (W - 1) // 2
    return left, W - 1 - left


def active(L: int, W: int, causal: bool) -> bool:
    """Whether a window W changes the mask at L positions (some row sees fewer keys than
    without it)."""
    if W <= 0:
        return False
    left, right = sides(int(W), bool(causal))
    if causal:
        return W < L
    return left < L - 1 or right < L - 1


def bounds(L: int, W: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi): the first and last key of every row (W = 0: global)."""
    i = np.arange(L)
    if W <= 0:
        return (np.zeros(L, dtype=np.int64), i.copy()) if causal else \
            (np.zeros(L, dtype=np.int64), np.full(L, L - 1, dtype=np.int64))
    left, right = sides(W, causal)
    return np.maximum(0, i - left), np.minimum(L - 1, i + right)


def mask(L: int, W: int, causal: bool) -> np.ndarray:
    """The (L, L) boolean mask (row = query, column = key) of a window W (0: global)."""
    lo, hi = bounds(L, W, causal)
    j = np.arange(L)
    return (j[None, :] >= lo[:, None]) & (j[None, :] <= hi[:, None])


def row_lengths(L: int, W: int, causal: bool) -> np.ndarray:
    lo, hi = bounds(L, W, causal)
    return hi - lo + 1


class Window:
    """The mask geometry of one (L, W, causal): row-length nodes and the runs of row pairs."""

    def __init__(self, L: int, W: int, causal: bool):
        self.L, self.W, self.causal = int(L), int(W), bool(causal)
        if self.L * min(self.W, self.L) > PAIR_MAX:
            raise DomainError(f"attention: a sliding window of {self.W} keys at {self.L} positions has "
                              f"{self.L * min(self.W, self.L):.3g} row pairs to list, beyond the "
                              f"{PAIR_MAX:.3g} the rule evaluates")
        self.lo, self.hi = bounds(self.L, self.W, self.causal)
        n = self.hi - self.lo + 1
        self.n_rows = n
        self.mean_len = float(np.mean(n))
        self.len_nodes, self.len_weights = _length_quadrature(n)
        self.runs = _pair_runs(self.lo, self.hi, self.L, self.W)

    def row_mean(self, f):
        """Mean over the rows of f(n) (n the row length; f takes an array of lengths with
        the node axis first and may broadcast it against the configuration shape)."""
        n = self.len_nodes
        vals = f(n.reshape((-1,)))
        vals = np.asarray(vals, dtype=float)
        w = self.len_weights.reshape((-1,) + (1,) * (vals.ndim - 1))
        return np.sum(w * vals, axis=0)

    def nodes_for(self, ndim: int) -> np.ndarray:
        """The row-length nodes shaped (K, 1, ..., 1) against ``ndim`` configuration axes."""
        return self.len_nodes.reshape((-1,) + (1,) * ndim)

    def pair_weights(self, l2, l1u, l1w, ks=(1, 2)):
        """sum over the row pairs i < k of (s)_q phi2^(s - q) phi1u^a phi1w^b for each q in
        ``ks`` (1 or 2), from the logs of the factors (<= 0): ``l2`` of shape (C, n, m) (the
        two rows' variables u along axis 1, w along axis 2), ``l1u`` and ``l1w`` broadcasting
        to it (functions of u and of w alone).  The caller divides by the number of pairs.

        Per shared-key count s: the runs whose sums factor into a function of u times one of
        w (a or b stepping, or neither) are one batched matrix product; the runs along which a
        rises and b falls are summed elementwise; phi2^(s - q) by repeated products."""
        l2 = np.asarray(l2, dtype=float)
        if l2.ndim < 3:
            l2 = l2.reshape((1,) * (3 - l2.ndim) + l2.shape)
        shape = np.broadcast_shapes(l2.shape, np.shape(l1u), np.shape(l1w))
        if len(shape) != 3:
            raise ValueError("pair_weights: factors of shape (C, n, m)")
        l2 = np.broadcast_to(l2, shape)
        u1 = np.broadcast_to(np.asarray(l1u, dtype=float), shape)[:, :, 0]      # (C, n)
        w1 = np.broadcast_to(np.asarray(l1w, dtype=float), shape)[:, 0, :]      # (C, m)
        outs = {q: np.zeros(shape) for q in ks}
        s, a0, da, b0, db, T, c = self.runs
        if s.size == 0:
            return tuple(outs[q] for q in ks)
        sep = ~((da == 1) & (db == -1))

        def geo(x, TT):         # sum_{t < T} e^(x t), x <= 0
            em = np.expm1(x)
            return np.where(x > -1e-12, TT, np.expm1(np.maximum(TT * x, -745.0)) / np.where(em < 0, em, -1.0))

        # the separable runs' factors, (C, runs, n) and (C, runs, m)
        i_sep = np.nonzero(sep)[0]
        U = c[i_sep][None, :, None] * np.exp(a0[i_sep][None, :, None] * u1[:, None, :])
        Vf = np.exp(b0[i_sep][None, :, None] * w1[:, None, :])
        ru = da[i_sep] == 1
        if ru.any():
            U[:, ru, :] *= geo(u1[:, None, :], T[i_sep][ru][None, :, None])
        rw = db[i_sep] == 1
        if rw.any():
            Vf[:, rw, :] *= geo(w1[:, None, :], T[i_sep][rw][None, :, None])
        s_sep = s[i_sep]
        i_ad = np.nonzero(~sep)[0]
        e2 = np.exp(l2)
        power, at = None, None            # phi2^(s - 2) at s = ``at``
        for sv in np.unique(s):
            sv = int(sv)
            if power is None or sv - at > 4:
                power = np.exp(np.maximum((sv - 2) * l2, -745.0)) if sv >= 2 else None
            else:
                for _ in range(sv - at):
                    power = power * e2
            at = sv
            M = np.zeros(shape)
            sel = np.nonzero(s_sep == sv)[0]
            if sel.size:
                M += np.matmul(np.swapaxes(U[:, sel, :], 1, 2), Vf[:, sel, :])
            for r in i_ad[s[i_ad] == sv]:
                x = u1[:, :, None] - w1[:, None, :]
                base = a0[r] * u1[:, :, None] + b0[r] * w1[:, None, :] + np.where(x > 0, (T[r] - 1) * x, 0.0)
                M += c[r] * np.exp(np.minimum(base, 700.0)) * geo(-np.abs(x), T[r])
            if 1 in outs:
                outs[1] += sv * (M if sv == 1 else power * e2 * M)
            if 2 in outs and sv >= 2:
                outs[2] += sv * (sv - 1) * power * M
        return tuple(outs[q] for q in ks)


def _length_quadrature(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights w with sum w f(nodes) = mean over the rows of f(n_row): the distinct
    lengths with their counts, runs of consecutive lengths of equal count longer than
    _LEN_EXACT summed by the backend's length quadrature (exact terms, then Gauss-Legendre in
    log n with Euler-Maclaurin end corrections)."""
    from sigprop.backend.numeric import _length_nodes
    vals, counts = np.unique(n, return_counts=True)
    nodes, weights = [], []
    i = 0
    while i < vals.size:
        j = i
        while j + 1 < vals.size and vals[j + 1] == vals[j] + 1 and counts[j + 1] == counts[i]:
            j += 1
        lo, hi, c = int(vals[i]), int(vals[j]), float(counts[i])
        if hi - lo + 1 <= _LEN_EXACT:
            nodes.extend(range(lo, hi + 1))
            weights.extend([c] * (hi - lo + 1))
        else:
            nn, ww = _length_nodes(float(lo), float(hi))
            keep = ww != 0
            nodes.extend(nn[keep].tolist())
            weights.extend((c * ww[keep]).tolist())
        i = j + 1
    return np.asarray(nodes, dtype=float), np.asarray(weights, dtype=float) / n.size


def _pair_runs(lo: np.ndarray, hi: np.ndarray, L: int, W: int):
    """The ordered row pairs i < k that share a key, as runs (s, a0, da, b0, db, T, count):
    T terms t = 0..T-1 with s shared keys, a = a0 + da t, b = b0 + db t, each of multiplicity
    count.  Exact (every pair listed, then merged)."""
    keys = []
    nmax = W + 2
    for delta in range(1, L):
        i = np.arange(0, L - delta)
        k = i + delta
        s = hi[i] - lo[k] + 1
        ok = s >= 1
        if not ok.any():
            if delta > W:
                break
            continue
        i, k, s = i[ok], k[ok], s[ok]
        a = lo[k] - lo[i]
        b = hi[k] - hi[i]
        keys.append((s * nmax + a) * nmax + b)
    if not keys:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, z, z, z, z.astype(float)
    key, cnt = np.unique(np.concatenate(keys), return_counts=True)
    s, rest = np.divmod(key, nmax * nmax)
    a, b = np.divmod(rest, nmax)
    out = []
    # pass 1: runs in b at fixed (s, a), consecutive b of equal count
    run1, single = _runs(s, a, b, cnt)
    ss, aa, bb, TT, cc, _ = run1
    out.append((ss, aa, bb, TT, cc, "b"))
    # pass 2: the single terms left, runs in a at fixed (s, b)
    s1, a1, b1, c1 = single
    order = np.lexsort((a1, b1, s1))
    run2, single2 = _runs(s1[order], b1[order], a1[order], c1[order])
    ss, bb, aa, TT, cc, _ = run2
    out.append((ss, aa, bb, TT, cc, "a"))
    s2, b2, a2, c2 = single2
    # pass 3: runs along a with b falling (a + b fixed: rows clipped at both ends)
    order = np.lexsort((a2, a2 + b2, s2))
    s2, a2, b2, c2 = s2[order], a2[order], b2[order], c2[order]
    run3, single3 = _runs(s2, a2 + b2, a2, c2)
    ss, tot, aa, TT, cc, _ = run3
    out.append((ss, aa, tot - aa, TT, cc, "ab"))
    s3, t3, a3, c3 = single3
    out.append((s3, a3, t3 - a3, np.ones_like(s3), c3, None))
    parts = []
    for ss, aa, bb, TT, cc, along in out:
        if along == "b":
            da, db = np.zeros_like(ss), np.ones_like(ss)
        elif along == "a":
            da, db = np.ones_like(ss), np.zeros_like(ss)
        elif along == "ab":
            da, db = np.ones_like(ss), -np.ones_like(ss)
        else:
            da, db = np.zeros_like(ss), np.zeros_like(ss)
        parts.append((ss, aa, da, bb, db, TT, cc.astype(float)))
    return tuple(np.concatenate([p[j] for p in parts]) for j in range(7))


def _runs(s, a, b, c):
    """Split sorted (s, a, b) with counts c into runs of consecutive b at fixed (s, a) and
    equal count (length >= 2), and the terms left single."""
    n = s.size
    if n == 0:
        z = s[:0]
        return (z, z, z, z, z, "b"), (z, z, z, c[:0])
    cont = np.zeros(n, dtype=bool)
    cont[1:] = (s[1:] == s[:-1]) & (a[1:] == a[:-1]) & (b[1:] == b[:-1] + 1) & (c[1:] == c[:-1])
    start = ~cont
    rid = np.cumsum(start) - 1
    length = np.bincount(rid)
    first = np.nonzero(start)[0]
    multi = length >= 2
    f = first[multi]
    run = (s[f], a[f], b[f], length[multi], c[f], "b")
    single_mask = multi[rid] == 0
    return run, (s[single_mask], a[single_mask], b[single_mask], c[single_mask])


_WINDOWS = memo.Kind("attention.windows", 32, "sliding-window mask geometries by (L, W, causal)")


def window(L: int, W: int, causal: bool) -> Window:
    """The (memoised) :class:`Window` of (L, W, causal)."""
    return _WINDOWS.get((int(L), int(W), bool(causal)), lambda: Window(L, W, causal))
