"""Multi-head scaled dot-product attention: forward and backward moment rules.

Definition (docs/formats.md, attention F).  Input X: L tokens x d features, mean mu, variance s2,
token correlation r.  Q = X Wq + bq, K = X Wk + bk, V = X Wv + bv (d -> H dh); per head
A = Dropout_p(softmax(Q K^T / sqrt(dh))) (causal mask if ``causal``), O = A V; heads
concatenated; Y = O Wo + bo (H dh -> d).  Weights iid N(0, std^2), biases N(0, bias_std^2).

Derivation (sigprop's own; every step checked by Monte Carlo, see tests/rules/test_attention.py)
------------------------------------------------------------------------------------------
Write x_j = c + u_j: c is shared by the tokens (second moment c2 = r s2 + mu^2 per feature,
the input mean folded in), u_j iid N(0, tau), tau = (1 - r) s2.  Per head let
M = Wk Wq^T / sqrt(dh) and a_i = Wk q_i / sqrt(dh) (a d-vector per query row).  The logit of
key j in row i is a_i . x_j; the shared part a_i . c is the same for every key and cancels in
the softmax, so a row sees iid logits z_j = a_i . u_j ~ N(0, v) given a_i, with
v = tau |a_i|^2: the *row logit variance*.  Its mean is

    vbar = tau d sk^2 (d sq^2 (s2 + mu^2) + sbq^2),

and it fluctuates from row to row (|a_i|^2 is a product of chi-squares, relative variance
~ 2/dh + 4/d); the softmax moments are strongly convex in v, so every row statistic is
averaged over a Gamma law for v with the matched relative variance (Gauss-Laguerre).  Two
rows i, k see correlated logits for the same key, with correlation rho = cos(a_i, a_k)
~ N(r_a, (1 - r_a^2)^2 / D), r_a the shared fraction of a (= r with mean and biases folded),
D = 2 / relvar the effective dimension of the a's (1/D = 1/dh + 2/d without biases).

Softmax statistics of one row (n keys), expectations over iid N(0, v) logits
(:func:`sigprop.rules.softmax_moments.softmax_expect_sum`, exact integrals):
A2 = E sum P^2, m1 = E sum P z, Bz = E (sum P z)^2 / v, Cz = E sum P^2 z^2 / v,
T2 = E tr(D - P P^T)^2 = E[sum P^2 - 2 sum P^3 + (sum P^2)^2], trA2 = E (1 - sum P^2)^2,
Ajj2 = E sum (P - P^2)^2, Ra = E sum P_j^2 (z_j - sum P z)^2 / v.
Two rows (shared keys, logit correlation rho; exact double integrals,
``m.integrate_smoothed2``): C2 = E sum_j P_ij P_kj, T2x = E tr(A_i A_k), PP = E sum P_i^2 sum P_k^2.

Forward (per head, per feature of O = A V; u_j split along a_i and orthogonal to it):
    E O_i^2   = sv2 [d c2 (1 + q A2) + tau (d-1) A2/(1-p) + tau (Bz + q Cz)] + sbv2 (1 + q A2)
    E O_i O_k = sv2 [d c2 + tau (d-2) C2 + tau (r_a E[m1^2/v] + 2 C2)] + sbv2
with q = p/(1-p); Y: var = H dh so2 E O_i^2 + sbo2, cov = H dh so2 E O_i O_k + sbo2, mean 0.

Backward (G at the output, variance g2, correlation rg).  Per head the gradient reaching
the core is g_i = (G Wo^T)_head; b_i = Wv g_i; K0 = |b|^2/d = d sv2 dh so2 g2; the value
logit-gradient y_j = b_i . u_j has variance gam2 = tau d K0 and the shared part of v gives
kap2 = |g|^2 (sv2 d c2 + sbv2) (it survives only through dropout:
gt = (gam2 + p kap2)/((1-p) gam2)).  The gradient to X is the sum of three paths:
- value  (P^T G through Wv): K0 [A2/(1-p) + rg (L-1) C2];
- query  (Wq M^T sum_j dS_ij u_j; the row sums of dS vanish, so only u_j enters):
  K0 tau^2 [(tr - la - lb) gt T2 + la gt Ra + lb (trA2 + (2-p)/(1-p) T2 + 2q Ajj2 + q kr T2)],
  tr = d^2 sq2 sk2, lb = tr/d (the coherent part E sum_j dS_ij u_j = tau (1 - sum P^2) b_i),
  la = tr (1/dh + (1 + f_x)/d) (the a_i direction, amplified by M M^T), kr = kap2/gam2;
- key    (sum_i dS_ij a_i): K0 [gt E(v T2) + rg (L-1) E(rho v T2x)].
Token covariance: value K0 [(1 - A2)/(L-1) + rg (1 - C2)]; query
K0 tau^2 rg [tr T2x + lb (1 - 2 A2 + PP)]; key exactly -(key variance)/(L-1), because the
column sums of dS vanish (sum_j dK_j = 0).  Heads are independent: multiply by H.

Causal: row i has i+1 keys.  Row statistics are averaged over the lengths n = 1..L and
two-row statistics over the pairs of rows (the shorter row's keys are shared, the longer
row's extra keys only enter its normaliser), with the (L-1) factors unchanged.

Grouped-query heads (``kv_heads``; query head h reads key/value head floor(h kv/H))
-----------------------------------------------------------------------------------
Heads that share K and V have correlated outputs and core gradients.  But every cross-head
term of E Y_i Y_k (forward) and of E dX_i dX_k (backward: value, query and key paths, including
the key/value heads that collect several query heads' gradients) is bilinear in two different
heads' blocks of W_o (the forward through O_h W_o,h, the backward through G W_o,h^T), which are
independent and zero-mean: it vanishes in expectation.  So every moment of the rule is the
sum over query heads of the per-head moments, exactly as without sharing; ``kv_heads`` only
changes the Monte Carlo's noise (fewer independent value vectors).

QK-norm (``qk_norm`` 1 LayerNorm, 2 RMSNorm, per head over dh, gain 1, ``qk_eps``)
------------------------------------------------------------------------------------
q -> q / sqrt(mean(q^2) + eps) (LayerNorm: centred first; it then lives in dh - 1
dimensions, l = 1 - 1/dh).  The scale mean(q^2) concentrates (relative fluctuation
sqrt(2/dh)), so to leading order the rule runs on rescaled weights:
sq^2 -> sq^2 l / (l vq + eps), sk^2 -> sk^2 / (l vk + eps) (biases alike), vq, vk the query and
key component variances: the logit variance becomes l vq/(l vq + eps) vk/(l vk + eps) / l ~ 1,
independent of the weight stds and the input scale.  The 1/dh corrections kept: the
key-shared logit part times each key's own norm fluctuation adds key-specific variance,
factor 1 + rk (1 + rk)/(2 dh) (rk the key-shared fraction of vk); dividing a key by its own
norm makes the token-varying logit platykurtic, kappa_4 = -6 (1 - rk)^2 v^2/(dh + 2), which
every softmax statistic takes to first order through its Edgeworth term (as the rotary
cumulants below; the two-row statistics at the Gaussian variance with the same
E sum_j P_j^2, ``_Ctx.pair_variance``); the row-to-row law of v loses the query norm's chi-square
(|q| is fixed) and keeps 2/d + 2 rk^2/dh (the Wk contraction, the shared key norm).
Backward: the norm's Jacobian (1/scale)(I - q^ q^T/dh) removes the query's own direction,
which is the one M M^T amplifies (la), so the query path's a_i direction becomes a generic one,
and every query and key gradient loses 1/dh (LayerNorm 2/dh) of its variance.

Rotary positions (``rope`` = base; x -> x cos(t theta) + rotate_half(x) sin(t theta))
-------------------------------------------------------------------------------------
The logit of key j in row i is q_i^T R_{j-i} k_j / sqrt(dh) (R_t orthogonal), so one logit's
variance is unchanged.  Its token-varying part e_ij = q_i^T R_{j-i} Wk^T u_j is still iid
N(0, v) over the keys, but the key-shared part s_ij = q_i^T R_{j-i} kc (kc = Wk^T c + bk)
now depends on j: over the keys of a row it is a Gaussian field of variance
vsh = vq (d sk^2 c2 + sbk^2) and covariance vsh kappa(j - l), kappa(t) = (2/dh) sum_i cos(t theta_i).
The part constant over the row still cancels; what is left after the row mean has variance
vsh (1 - kbar(n)), kbar(n) the mean of kappa over the n (n - 1) ordered key pairs of a row of n
keys (the Fejer kernel: ((sin(n theta/2)/sin(theta/2))^2 - n)/(n(n - 1)) per frequency; it
falls like 1 - log n / log base), so a correlated stream keeps non-uniform attention.  The
softmax statistics are taken at v' = v + vsh (1 - kbar(n)) with that remainder treated as iid
over the keys, and the statistics that follow the token-varying part through e = beta z' +
noise, beta = v/v' (Ctx.stat).  Two non-Gaussian parts of a key's logit enter through their
fourth cumulant kappa_4, to first order (the Edgeworth term of each key's law: by Stein's
identity E f(e) changes by kappa_4/(24 v^4) E[f(e) (e^4 - 6 v e^2 + 3 v^2)], which the exact
softmax integrals evaluate as further monomials, ``_edgeworth``): the field's sinusoids are
bounded (-6 sum_i w_i^2), and the rotated query directions meet Wk's anisotropy differently
at each key, so the 2/d fluctuation of |Wk R^T q|^2 is partly per key (a scale mixture:
3 kh v^2, kh = (2/d)(1 - K2(n)), K2 the mean square of the query-direction cosine over the
row's key pairs; the rest stays in the row law).  Matching kappa_4 into one effective
variance (v + (7/12) kappa_4, the large-L limit) was ~2x too strong at L 256 and logit
variance 2-4.  Two rows i, k: their token-varying logits of one key correlate by the cosine of
their rotated queries, r_a kq(i - k), and their key-shared parts by r_a kf(i - k) (the
field's planes weighted by their within-row variance); both cosine sums carry random
frequency weights (the shared query's plane powers, Dirichlet; times the shared key's for
the field), which set the spread of the pair correlation over the row pairs
(``_kappa_moments``, ``_field_moments``, ``Ctx.pair_law``); the pair statistics are taken at
the Gaussian variance that gives a row the Edgeworth-corrected E sum P^2 (``pair_variance``).
Pairs of keys in the value-path term Bz and the cross-row m1 term carry the cosine kappa of
their rotated logit directions (kbar).  Backward: sum_j dS_ij R k_j no longer kills the shared
key kc (a generic query-path term with weight (1 - kbar) T2), and the key and query gradients
of two tokens are rotated against each other (their covariances times kbar(L)); the key
path's cross-row weight (the cosine of the two rows' rotated queries) is regressed on the
pair correlation.  Causal rows: the same at each row length n.

Sliding windows (``window`` W > 0, sigprop.rules.windows)
----------------------------------------------------------
Row i sees at most W keys (causal i-W+1..i; bidirectional W keys centred, clipped at the ends).
Nothing within a row changes: the one-row statistics at row length n are the same integrals, averaged
over the lengths that occur.  Two rows i < k now share s keys and see a (row i) and b (row k) keys
the other does not; the two-row integrals take phi2^(s - q) phi1(u)^a phi1(w)^b per pair (as the
causal sum takes its nested rows, a = 0), summed over every pair exactly, and rows that share no
key contribute nothing to C2 and T2x.  The (L - 1) factors and the 1/(L - 1) covariances hold for
any mask (the rows of A and of dS sum to 1 and 0).  The input is treated as exchangeable over
positions; with rotary positions the row-level cosine sums are taken at the mean row length.

Soft-capped logits (``softcap`` c > 0, Gemma 2's attn_logit_softcapping)
--------------------------------------------------------------------------
Every logit s becomes f(s) = c tanh(s / c) before the mask and the softmax.  The row's shared
logit part o (a_i . c, variance vsh) no longer cancels: given the row's variance v it is taken
as N(0, (vsh / vbar) v), and a row's keys see f(o + z_j), z_j iid N(0, v).  The identity of
:mod:`sigprop.rules.softmax_moments` holds for any iid key law, so every one-row statistic is an
exact integral with the factors E[z^b f'(o + z)^k G_a(u + f(o + z))] (_ROW_CAP; the backward's
logit gradients carry f' = 1 - tanh^2), averaged over o.  The forward's z statistics (Bz, Cz, m1)
are in the pre-cap logit, which is what the value vector's component along a_i follows.  Two
changes to the backward: a row's gradient sum sum_j dS_ij = sum_l delta_l P_l (f'_l - sum_j P_j f'_j)
no longer vanishes, so the query path meets the keys' shared part (weight Sc, as the rotary
key-shared term) and the key gradients' column sum is no longer 0 (its row-diagonal part v Sc);
the two-row statistics are taken at the Gaussian row with the capped row's E sum P^2
(``_Ctx._cap_pair``).  Checked against direct sampling of capped rows and against the component
(tests/rules/test_attention_softcap.py; attention grid ``softcap``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from sigprop import memo, symbols
from sigprop.errors import DomainError
from sigprop.rope import RopeFreqs
from sigprop.rules.base import Param, Rule, _show, positive_int, probability, register, std
from sigprop.rules import windows
from sigprop.rules.softmax_moments import softmax_expect_sums
from sigprop.state import Backward, Forward

symbols.register("n_heads", r"H", positive=True, integer=True)
symbols.register("d_head", r"d_{h}", positive=True, integer=True)
for _nm in ("q", "k", "v", "o"):
    symbols.register(f"{_nm}_std", rf"\sigma_{{{_nm}}}", positive=True)
    symbols.register(f"{_nm}_bias_std", rf"\sigma_{{b{_nm}}}", positive=True)
symbols.register("causal", r"\kappa_{\mathrm{causal}}", nonnegative=True, integer=True)
symbols.register("kv_heads", r"H_{kv}", nonnegative=True, integer=True)
symbols.register("qk_norm", r"\nu_{qk}", nonnegative=True, integer=True)
symbols.register("qk_eps", r"\epsilon_{qk}", positive=True)
symbols.register("rope", r"b_{\mathrm{rope}}", nonnegative=True)

#: quadrature sizes: Gauss-Laguerre nodes over the row logit variance (one-row and
#: two-row statistics) and Gauss-Hermite nodes over the row-pair correlation
_NS, _NS2, _NR = 6, 4, 3
_VMIN = 1e-30   # floor for the row logit variance where it divides (v -> 0 limits)
#: the largest mean row logit variance the rule evaluates.  The softmax integrals run over
#: grids whose width grows with the logit scale (evaluation time grows with it: ~2 s per call
#: at 100 before tables) and the Monte Carlo validation reaches ~13;
#: at ~1000 the quadratures break down (NaN).  Beyond it the softmax is saturated (near one-hot
#: rows), a regime this rule does not model.
ROW_LOGIT_VAR_MAX = 100.0


def _row_var(tau, d, sk2, vq):
    """A row's token-varying logit variance without QK-norm and rotary positions: tau d sk^2 vq
    (tau = (1 - r) s2 the token-varying part of the input's second moment, vq the query
    component's variance), in any arithmetic."""
    return tau * d * sk2 * vq


def mean_row_logit_var(p: dict, x: Forward) -> float:
    """The mean row logit variance at input ``x`` (floats; ``p`` the rule's parameters as a
    dict): the variance of the part of a row's logits that the softmax sees (what does not
    cancel in it), averaged over rows: the quantity the rule's domain bounds
    (ROW_LOGIT_VAR_MAX) and on which its cost grows (the softmax quadratures' grids widen with
    the logit scale).  Without QK-norm and rotary positions it is
    vbar = (1 - r) s2 d sk^2 (d sq^2 (s2 + mu^2) + sbq^2); QK-norm replaces the query and key
    scales by the normalised ones, rotary positions add the key-shared part that no longer
    cancels, vsh (1 - kbar(L)) (see the module docstring)."""
    if not p.get("qk_norm", 0) and not p.get("rope", 0.0):
        return float(_row_var((1 - x.corr) * x.var, p["d"], p["k_std"] ** 2, qk_variances(p, x)[0]))
    from sigprop.backend import numeric as m
    c = _Ctx(m, Forward(float(x.mean), float(x.var), float(x.corr)), _RULE.param_values(p),
             rope=bool(p.get("rope", 0.0)), check=False)
    if not p.get("rope", 0.0):
        return float(c.s_mean)
    return float(c.s_mean + c.vsh * (1 - c.kbL))


def logit_var(p: dict, x: Forward) -> float:
    """Variance of one pre-softmax logit q . k / sqrt(d_head) at input ``x`` (floats; ``p``
    the rule's parameters as a dict), shared parts included: var(q) var(k) with q and k the
    query and key components (zero-mean weights: var = d w^2 (s2 + mu^2) + b^2); with QK-norm
    their normalised second moments instead (RMSNorm v / (v + eps); LayerNorm, whose output
    lives in d_head - 1 dimensions, l v / (l v + eps) and the logit variance divided by
    l = 1 - 1/d_head).  Rotary positions rotate q and k orthogonally: no change."""
    vq, vk = qk_variances(p, x)
    norm = int(p.get("qk_norm", 0))
    s4 = rope_logit_scale2(p.get("rope", 0.0)) ** 2      # a rotary attention factor (yarn, longrope)
    if not norm:
        return float(vq * vk * s4)
    eps = float(p.get("qk_eps", 1e-5))
    ln = 1 - 1 / p["d_head"] if norm == 1 else 1.0
    return float(ln * vq / (ln * vq + eps) * ln * vk / (ln * vk + eps) / ln * s4)


_POS = {"positive": True}
_REAL = {"real": True}


def _nm():
    """The numeric backend (the numeric twin of a named symbolic quantity evaluates with it)."""
    from sigprop.backend import numeric
    return numeric


def _rope_args(n, base, dh):
    """(shown, hidden) arguments of the symbolic rotary quantities (functions of the row
    length n; the base and d_head are carried, not printed)."""
    return ((("n", n, _POS),), (("b", base, _POS), ("d_h", dh, _POS)))


def _fejer_mean(m, n, phi):
    """Mean of cos((i - k) phi) over the n (n - 1) ordered pairs of distinct positions
    i, k in 0..n-1: ((sin(n phi/2) / sin(phi/2))^2 - n) / (n (n - 1)) (the Fejer kernel;
    1 at phi = 0 and for n <= 1), smooth in n (the causal sums evaluate it between integers)."""
    if getattr(m, "SYMBOLIC", False):
        import sympy as sp

        def fejer(n, phi):
            return sp.Piecewise((1, sp.Eq(sp.sin(phi / 2), 0)),
                                (((sp.sin(n * phi / 2) / sp.sin(phi / 2)) ** 2 - n) / (n * (n - 1)), True))
        return m.named("fejer", fejer, shown=(("n", n, _POS), ("phi", phi, _REAL)), tex="F", text="F",
                       numeric=lambda n, phi: _fejer_mean(_nm(), n, phi))
    n, phi = np.asarray(n, dtype=float), np.asarray(phi, dtype=float)
    s = np.sin(phi / 2)
    small = np.abs(s) < 1e-300
    f = ((np.sin(n * phi / 2) / np.where(small, 1.0, s)) ** 2 - n) / np.maximum(n * (n - 1), 1e-300)
    return np.where(small | (n <= 1), 1.0, f)


def _rope_freqs(m, base, dh):
    """theta_i = base^(-2i/dh), i < dh/2, along a new last axis (numeric; base and dh scalars
    or arrays: entries beyond a configuration's dh/2 are NaN-free and masked by ``_rope_mask``),
    or ``base`` a :class:`sigprop.rope.RopeFreqs`: its frequencies (dh/2 of them, every
    configuration's dh the same), mask 1.  A frequency 0 (partial rotary's unrotated planes)
    is a plane whose cosine is 1 at every offset: the Fejer mean F is 1 there."""
    if isinstance(base, RopeFreqs):
        base.check_head(dh)
        theta = base.theta()
        return theta, np.ones_like(theta)
    base, dh = np.asarray(base, dtype=float), np.asarray(dh, dtype=float)
    i = np.arange(int(np.max(dh)) // 2, dtype=float)
    theta = base[..., None] ** (-2 * i / dh[..., None])
    mask = (i < dh[..., None] / 2).astype(float)
    return theta, mask


def _kappa_bar(m, n, base, dh):
    """kbar(n) = mean over ordered pairs of distinct key positions in 0..n-1 of
    kappa(j - l) = (2/dh) sum_i cos((j - l) theta_i): the rotary correlation of the key-shared
    logit part between two keys of a row of n keys."""
    if getattr(m, "SYMBOLIC", False):
        import sympy as sp

        def kbar(n, base, dh):
            i = sp.Dummy("i", integer=True, nonnegative=True)
            return 2 / dh * sp.Sum(_fejer_mean(m, n, base ** (-2 * i / dh)), (i, 0, dh / 2 - 1))
        return m.named("kbar", kbar, *_rope_args(n, base, dh), tex=r"\bar{\kappa}", text="kbar",
                       numeric=lambda n, b, dh: _kappa_bar(_nm(), n, b, dh))
    theta, mask = _rope_freqs(m, base, dh)
    n = np.asarray(n, dtype=float)
    f = _fejer_mean(m, n[..., None], theta)
    return 2 / np.asarray(dh, dtype=float) * np.sum(f * mask, axis=-1)


_ROPE_ROWS = memo.Kind("attention.rope_rows", 256, ":func:`_rope_row_moments` per (L, base, d_head), numeric scalars")


def _rope_row_moments(m, L, base, dh):
    """(kbar(L), M2, D of :func:`_kappa_moments`, :func:`_field_moments`) at L keys: functions
    of the positions and the rotary frequencies alone, memoised for numeric scalar arguments
    (every attention evaluation of a model asks for the same ones)."""
    def compute():
        kb = _kappa_bar(m, L, base, dh)
        _, k2, dd = _kappa_moments(m, L, base, dh)
        return (kb, k2, dd, _field_moments(m, L, base, dh))

    if not getattr(m, "SYMBOLIC", False) and np.ndim(L) == 0 and np.ndim(base) == 0 and np.ndim(dh) == 0:
        return _ROPE_ROWS.get((float(L), _rope_key(base), float(dh)), compute)
    return compute()


_ROPE_SHIFT = memo.Kind("attention.rope_shift", 256, ":func:`_rope_shift_moments` per (n, base, d_head), numeric "
                         "(n a scalar, or an array of row lengths by its bytes and shape; arrays read-only)")


def _rope_shift_moments(m, n, base, dh):
    """(kbar(n), :func:`_kappa_sq`, M2 and D of :func:`_kappa_moments`) at n keys for
    ``_Ctx.shifted``: functions of the positions and the rotary frequencies alone, memoised for
    numeric arguments with a scalar base and d_head (the same numbers; n a scalar or an array
    of row lengths, such as a causal sum's quadrature nodes, which every layer shares)."""
    def compute():
        kb = _kappa_bar(m, n, base, dh)
        _, m2, dd = _kappa_moments(m, n, base, dh)
        return (kb, _kappa_sq(m, n, base, dh), m2, dd)

    if not getattr(m, "SYMBOLIC", False) and np.ndim(base) == 0 and np.ndim(dh) == 0:
        if np.ndim(n) == 0:
            return _ROPE_SHIFT.get((float(n), _rope_key(base), float(dh)), compute)
        nn = np.ascontiguousarray(n, dtype=float)
        return _ROPE_SHIFT.get((nn.tobytes(), nn.shape, _rope_key(base), float(dh)), lambda: memo.frozen(compute()))
    return compute()


def _rope_key(base):
    """A memo key of a rotary argument: the base as a float, a RopeFreqs itself (hashable)."""
    return base if isinstance(base, RopeFreqs) else float(base)


def _rope_on(value) -> bool:
    """Whether a numeric rope parameter (a base, an array of bases, a RopeFreqs) rotates anywhere."""
    return isinstance(value, RopeFreqs) or bool(np.any(np.asarray(value, dtype=float) != 0))


def rope_logit_scale2(rope) -> float:
    """A RopeFreqs' attention factor as the factor s_eff^2 on the query and on the key
    variance (:meth:`sigprop.rope.RopeFreqs.logit_scale2`: exactly s^2 when every plane
    rotates); 1 for a base."""
    return rope.logit_scale2() if isinstance(rope, RopeFreqs) else 1.0


def _kappa_sq(m, n, base, dh):
    """sum_i ((2/dh) (1 - F_i(n)))^2, F_i(n) the mean of cos((j - l) theta_i) over a row's key
    pairs: with w_i = vsh (2/dh)(1 - F_i) the within-row variance frequency i contributes,
    sum_i w_i^2 = vsh^2 times this."""
    if getattr(m, "SYMBOLIC", False):
        import sympy as sp

        def ksq(n, base, dh):
            i = sp.Dummy("i", integer=True, nonnegative=True)
            return sp.Sum((2 / dh * (1 - _fejer_mean(m, n, base ** (-2 * i / dh)))) ** 2, (i, 0, dh / 2 - 1))
        return m.named("kappa_sq", ksq, *_rope_args(n, base, dh), tex=r"W_{\kappa}", text="W_k",
                       numeric=lambda n, b, dh: _kappa_sq(_nm(), n, b, dh))
    theta, mask = _rope_freqs(m, base, dh)
    n = np.asarray(n, dtype=float)
    f = _fejer_mean(m, n[..., None], theta)
    return np.sum((2 / np.asarray(dh, dtype=float)[..., None] * (1 - f)) ** 2 * mask, axis=-1)


def _kappa_moments(m, n, base, dh):
    """(kbar(n), M2, D) over the ordered pairs of distinct positions in 0..n-1 (offset t):
    M2 = mean of kappa(t)^2 = (2/dh^2) sum_{i,i'} [F(theta_i - theta_i') + F(theta_i + theta_i')]
    (F the Fejer mean of ``_fejer_mean``) and D = (2/dh)^2 sum_i mean cos^2(t theta_i)
    = (2/dh)^2 sum_i (1 + F(2 theta_i))/2: the terms of the mean square of a cosine sum
    sum_i w_i cos(t theta_i) whose weights w_i fluctuate (``_Ctx.pair_law``)."""
    kb = _kappa_bar(m, n, base, dh)
    if getattr(m, "SYMBOLIC", False):
        import sympy as sp

        def moments(n, base, dh):
            i, j = sp.Dummy("i", integer=True, nonnegative=True), sp.Dummy("j", integer=True, nonnegative=True)
            ti, tj = base ** (-2 * i / dh), base ** (-2 * j / dh)
            k2 = 2 / dh**2 * sp.Sum(_fejer_mean(m, n, ti - tj) + _fejer_mean(m, n, ti + tj),
                                    (i, 0, dh / 2 - 1), (j, 0, dh / 2 - 1))
            dd = 2 / dh**2 * sp.Sum(1 + _fejer_mean(m, n, 2 * ti), (i, 0, dh / 2 - 1))
            return k2, dd
        k2, dd = m.named("kappa_moments", moments, *_rope_args(n, base, dh),
                         tex=(r"M_{\kappa}", r"D_{\kappa}"), text=("M_k", "D_k"),
                         numeric=lambda n, b, dh: _kappa_moments(_nm(), n, b, dh)[1:])
        return kb, k2, dd
    theta, mask = _rope_freqs(m, base, dh)
    nn = np.asarray(n, dtype=float)
    n2 = nn[..., None, None]
    ti, tj = theta[..., :, None], theta[..., None, :]
    mm = mask[..., :, None] * mask[..., None, :]
    dhf = np.asarray(dh, dtype=float)
    k2 = 2 / dhf**2 * np.sum((_fejer_mean(m, n2, ti - tj) + _fejer_mean(m, n2, ti + tj)) * mm, axis=(-2, -1))
    dd = 2 / dhf**2 * np.sum((1 + _fejer_mean(m, nn[..., None], 2 * theta)) * mask, axis=-1)
    return kb, k2, dd


def _field_moments(m, n, base, dh):
    """(kf, Ef2, Eqf) of the row-pair correlation of the key-shared logit field (rows of n keys,
    pairs of distinct positions at offset t): the field's within-row covariance of two rows is,
    per frequency plane i, proportional to its within-row variance weight u_i (1 - F_i(n)),
    normalised to sum 1, so its correlation is kf(t) = sum_i nu_i u_i cos(t theta_i), nu_i the
    plane's shared query power times shared key power over its mean (a product of two
    independent exponentials: E nu_i nu_i' = 1 + 3 delta_ii').  Over the pairs and draws:
    kf = sum_i u_i F_i (its mean), Ef2 = sum_{i,i'} u_i u_i' C_ii' + 3 sum_i u_i^2 C_ii (its mean
    square) and Eqf = (1/K) sum_{i,i'} u_i' (1 + delta_ii') C_ii' (its mean product with the
    query-direction cosine kq, Dirichlet weights over the K = dh/2 planes), with
    C_ii' = [F(theta_i - theta_i') + F(theta_i + theta_i')]/2 the pair mean of
    cos(t theta_i) cos(t theta_i')."""
    if getattr(m, "SYMBOLIC", False):
        import sympy as sp

        def moments(n, base, dh):
            i, j = sp.Dummy("i", integer=True, nonnegative=True), sp.Dummy("j", integer=True, nonnegative=True)
            ti, tj = base ** (-2 * i / dh), base ** (-2 * j / dh)
            top = dh / 2 - 1
            fi, fj = _fejer_mean(m, n, ti), _fejer_mean(m, n, tj)
            cij = (_fejer_mean(m, n, ti - tj) + _fejer_mean(m, n, ti + tj)) / 2
            cii = (1 + _fejer_mean(m, n, 2 * ti)) / 2
            s1 = sp.Sum(1 - fi, (i, 0, top))
            kf = sp.Sum((1 - fi) * fi, (i, 0, top)) / s1
            ef2 = (sp.Sum((1 - fi) * (1 - fj) * cij, (i, 0, top), (j, 0, top))
                   + 3 * sp.Sum((1 - fi) ** 2 * cii, (i, 0, top))) / s1**2
            eqf = (sp.Sum((1 - fj) * cij, (i, 0, top), (j, 0, top)) + sp.Sum((1 - fi) * cii, (i, 0, top))) / (s1 * dh / 2)
            return kf, ef2, eqf
        return m.named("field_moments", moments, *_rope_args(n, base, dh),
                       tex=(r"\kappa_{f}", r"E_{f^{2}}", r"E_{qf}"), text=("k_f", "E_f2", "E_qf"),
                       numeric=lambda n, b, dh: _field_moments(_nm(), n, b, dh))
    theta, mask = _rope_freqs(m, base, dh)
    nn = np.asarray(n, dtype=float)
    F = _fejer_mean(m, nn[..., None], theta)
    w = (1 - F) * mask
    u = w / np.maximum(np.sum(w, axis=-1, keepdims=True), 1e-300)
    n2 = nn[..., None, None]
    ti, tj = theta[..., :, None], theta[..., None, :]
    C = (_fejer_mean(m, n2, ti - tj) + _fejer_mean(m, n2, ti + tj)) / 2
    Cd = (1 + _fejer_mean(m, nn[..., None], 2 * theta)) / 2
    kf = np.sum(u * F, axis=-1)
    ef2 = np.einsum("...i,...ij,...j->...", u, C, u) + 3 * np.sum(u**2 * Cd, axis=-1)
    K = np.asarray(dh, dtype=float) / 2
    qm = mask[..., :, None] * mask[..., None, :]
    eqf = (np.einsum("...ij,...j->...", C * qm, u) + np.sum(u * Cd, axis=-1)) / K
    return kf, ef2, eqf


def _kappa_var(m, n, base, dh):
    """Variance over ordered pairs of distinct positions in 0..n-1 of kappa(i - k) (fixed,
    equal frequency weights): M2 - kbar^2 (``_kappa_moments``)."""
    kb, k2, _ = _kappa_moments(m, n, base, dh)
    return _num(m, lambda t: np.maximum(t, 0.0), k2 - kb**2)


def _flag(m, value):
    """A 0/1 flag for ``m.choose``: numeric, value != 0; symbolic, the value itself (the
    Piecewise tests Eq(value, 0))."""
    if getattr(m, "SYMBOLIC", False):
        return value
    if isinstance(value, RopeFreqs):
        return 1.0
    f = np.asarray(value) != 0
    return float(f) if f.ndim == 0 else f.astype(float)


def _branch(m, flag, f0, f1, defaults=None):
    """``m.choose`` for results that are tuples or dicts: f0() where flag == 0, f1() where
    flag == 1; numeric and uniform flags, and a literal 0 flag in the symbolic namespace,
    evaluate one branch only.  ``defaults``: values for dict keys only f1's result has."""
    if getattr(m, "SYMBOLIC", False) and isinstance(flag, (int, float)) and flag == 0:
        return f0()
    if not getattr(m, "SYMBOLIC", False):
        fl = np.asarray(flag, dtype=float)
        if np.all(fl == 0):
            return f0()
        if np.all(fl == 1):
            return f1()
    a, b = f0(), f1()
    if isinstance(a, dict):
        a = {**(defaults or {}), **a}
        return {k: m.choose(flag, lambda k=k: a[k], lambda k=k: b[k]) for k in b}
    out = m.choose(flag, lambda: a, lambda: b)
    return type(a)(*out) if hasattr(a, "_fields") else out      # keep Forward / Backward


def _cap_flag(m, p):
    """The softcap flag for ``_branch``; the symbolic namespace refuses a cap (its statistics
    are numeric only) before building anything."""
    cap = getattr(p, "softcap", 0.0)
    if getattr(m, "SYMBOLIC", False):
        if not (isinstance(cap, (int, float)) and cap == 0):
            raise DomainError("attention: soft-capped logits (softcap) have no symbolic form")
        return 0
    return _flag(m, cap)


def _num(m, guard, x):
    """A purely numerical guard (a floor against 0/0, a clip against rounding): applied by
    the numeric backend, the identity in the symbolic one (where it would only add Max/Min
    noise to the expressions)."""
    return x if getattr(m, "SYMBOLIC", False) else guard(x)


def _floor(m, v):
    return _num(m, lambda t: m.maximum(t, _VMIN), v)


_STATS = memo.Kind("attention.stats", 256, "the rule's expensive statistics, keyed by their exact inputs")


def _memo(m, tag, arrays, fn):
    """Numeric results of the expensive statistics, keyed by their exact inputs, so that the
    forward and backward of one evaluation (and repeated evaluations) share them."""
    if getattr(m, "SYMBOLIC", False):
        return fn()
    key = (tag,) + tuple((np.shape(a), np.asarray(a, dtype=float).tobytes()) for a in arrays)
    return _STATS.get(key, fn)


class _Ctx:
    """Derived quantities shared by forward and backward (works for any namespace).
    ``rope``: build the rotary-position quantities (the caller branches on the rope flag)."""

    def __init__(self, m, x, p, rope=False, check=True, cap=False):
        self.m = m
        self.rope = rope
        # soft-capped logits (numeric only; the caller branches on the softcap flag): the cap,
        # 0 entries (other configurations of a mixed array, discarded) replaced by a harmless one
        self.capped = cap
        if cap:
            if getattr(m, "SYMBOLIC", False):
                raise DomainError("attention: soft-capped logits (softcap) have no symbolic form")
            sc = np.asarray(p.softcap, dtype=float)
            self.cap = np.where(sc > 0, sc, 1e6)
        self.norm = _flag(m, getattr(p, "qk_norm", 0))
        self.S2 = x.var + x.mean**2                    # uncentred second moment
        self.c2 = x.corr * x.var + x.mean**2           # shared (token-constant) part
        self.tau = (1 - x.corr) * x.var                # token-varying part
        # query/key scales: the weights' own, or (QK-norm) those of the normalised vectors
        sq2, sk2, sbq2, sbk2 = _branch(
            m, self.norm, lambda: (p.q_std**2, p.k_std**2, p.q_bias_std**2, p.k_bias_std**2),
            lambda: self._normed(m, p))
        s2r = rope_logit_scale2(getattr(p, "rope", 0.0))
        if s2r != 1:
            # the rotary attention factor (yarn, longrope) scales every rotated query and key
            # after their norms: the rule runs on weights scaled by it (exact when every plane
            # rotates; with unrotated planes s_eff, the logit variance's)
            sq2, sk2, sbq2, sbk2 = sq2 * s2r, sk2 * s2r, sbq2 * s2r, sbk2 * s2r
        self.sq2, self.sk2, self.sbq2, self.sbk2 = sq2, sk2, sbq2, sbk2
        vx = p.d * sq2 * self.S2                       # q component variance from x
        vq = vx + sbq2
        vqf = _floor(m, vq)                            # (no queries at all: uniform rows)
        self.vq = vq
        self.fx = vx / vqf
        self.s_mean = _branch(m, self.norm, lambda: _row_var(self.tau, p.d, sk2, vq), lambda: self._normed_var(m, p, sk2, vq))
        # QK-norm: the relative fourth cumulant kappa_4 / v^2 of the token-varying logit (0 without)
        self.k4n = _branch(m, self.norm, lambda: 0 * self.s_mean, lambda: self._normed_k4(m, p))
        if check and not m.SYMBOLIC:
            worst = float(np.max(self.s_mean))
            if not worst <= ROW_LOGIT_VAR_MAX:
                raise DomainError(
                    f"attention: row logit variance {worst:.4g} is beyond the {ROW_LOGIT_VAR_MAX:g} this rule "
                    "evaluates (softmax saturated; validated by Monte Carlo up to ~13): smaller "
                    "Q/K weight stds or input variance")
        kap = (x.var**2 + 2 * x.var * x.mean**2) / _floor(m, self.S2)**2
        self.relvar = _branch(
            m, self.norm,
            lambda: 2 / p.d + 2 * (vx**2 + 2 * vx * sbq2) / (p.d_head * vqf**2) + self.fx**2 * 2 * kap / p.d,
            lambda: 2 / p.d + 2 * self.rk**2 / p.d_head)
        self.ra = (p.d * sq2 * self.c2 + sbq2) / vqf
        self.rho_var = (1 - self.ra**2) ** 2 * self.relvar / 2
        self.L = p.L + 0 * self.s_mean                 # broadcast to the configuration shape
        self.causal = p.causal
        # a sliding window (numeric only): the mask geometry, and the row length at which the
        # row-level laws (rotary cosine sums, the pair law) are taken: the mean row length
        self.win = _window_of(m, p)
        self.Lr = self.L if self.win is None else self.win.mean_len + 0 * self.s_mean
        # the key-shared logit part q . kc / sqrt(dh), its variance (key bias included: it is
        # shared by the tokens too); it cancels in the softmax unless rotary positions rotate it
        self.vsh = vq * (p.d * sk2 * self.c2 + sbk2)
        if rope:
            self.base = p.rope if isinstance(p.rope, RopeFreqs) else _num(
                m, lambda t: np.where(np.asarray(t) > 0, t, 1e4), p.rope)
            self.dh = p.d_head
            self.d = p.d
            self.kbL, self.k2L, self.dL, self.fieldL = _rope_row_moments(m, self.Lr, self.base, self.dh)
            if check and not m.SYMBOLIC:
                worst = float(np.max(self.s_mean + self.vsh * (1 - self.kbL)))
                if not worst <= ROW_LOGIT_VAR_MAX:
                    raise DomainError(
                        f"attention: row logit variance {worst:.4g} (rotary positions: the key-shared "
                        f"part that varies over positions included) is beyond the {ROW_LOGIT_VAR_MAX:g} "
                        "this rule evaluates: smaller Q/K weight stds or input variance")
        if cap:
            # the row offset's variance over the token-varying logit variance (see _ROW_CAP)
            self.ro = self.vsh / _floor(m, self.s_mean)

    def _normed(self, m, p):
        """QK-norm: per head q -> q / sqrt(mean(q^2) + eps) (LayerNorm: centred first, in
        dh - 1 dimensions, factor l = 1 - 1/dh).  To leading order in 1/dh every query and key
        is divided by the same scale, so the rule runs on scaled weights: the normalised
        query's squared entries average l vq / (l vq + eps), and the key enters the logit as
        k / sqrt(l vk + eps).  Also sets ``rk``, the key-shared fraction of the key."""
        sq2, sk2, sbq2, sbk2 = p.q_std**2, p.k_std**2, p.q_bias_std**2, p.k_bias_std**2
        is_ln = self.is_ln = p.qk_norm * (2 - p.qk_norm)   # 1 for LayerNorm (1), 0 for RMSNorm (2)
        ln = 1 - is_ln / p.d_head
        vq = p.d * sq2 * self.S2 + sbq2
        vk = p.d * sk2 * self.S2 + sbk2
        self.rk = (p.d * sk2 * self.c2 + sbk2) / _floor(m, vk)
        self.proj = 1 - (1 + is_ln) / p.d_head
        # backward: each query's (key's) gradient is divided by its own squared scale, whose
        # inverse averages to more than the inverse average (inverse chi-square with n = dh
        # (LayerNorm dh - 1) degrees of freedom: E[1/rho^2] = 1/(rho_bar^2 (n - 2)/n)), eps
        # included as for LayerNorm; two different tokens' scales, taken as independent,
        # give E[1/rho]^2 = (1 + 3/(4n))^2 / rho_bar^2 to first order
        n = p.d_head - is_ln
        frac = _num(m, lambda t: m.maximum(t, 0.25), (n - 2) / n)
        self.hq = (ln * vq + p.qk_eps) / (ln * vq * frac + p.qk_eps)
        self.hk = (ln * vk + p.qk_eps) / (ln * vk * frac + p.qk_eps)
        self.hc = (1 + 3 / (4 * n)) ** 2
        fq = ln / (ln * vq + p.qk_eps)
        fk = 1 / (ln * vk + p.qk_eps)
        return sq2 * fq, sk2 * fk, sbq2 * fq, sbk2 * fk

    def _normed_var(self, m, p, sk2, vq):
        """QK-norm: the row logit variance the softmax sees.  Each key is divided by its own
        norm, which fluctuates by O(1/sqrt(dh)) from key to key; to O(1/dh):
        (1) the key-shared logit part times that fluctuation adds key-specific variance, a
        factor 1 + rk (1 + rk) / (2 dh) (checked by sampling: dh 32-128, rk 0-0.9);
        (2) the token-varying logit is no longer Gaussian: its fourth cumulant is
        -6 (1 - rk)^2 v^2 / (dh + 2) (exact at rk = 0: a coordinate of a uniform point on the
        sphere), which every row statistic takes to first order through its Edgeworth term
        (``k4n`` = kappa_4 / v^2, see ``stat``).  An effective Gaussian variance with the
        same log-moment-generating function, v + (7/12) kappa_4 (the large-L limit), put
        E sum_j P_j^2 3.5% low at dh 32 and 32 keys (4% at 8 keys, 2.4% at 128); the Edgeworth
        term is within 0.1% up to 32 keys and 0.8% at 128 (dh 32; iid sphere-coordinate
        logits, 4e5 rows)."""
        return _row_var(self.tau, p.d, sk2, vq) * (1 + self.rk * (1 + self.rk) / (2 * p.d_head))

    def _normed_k4(self, m, p):
        """QK-norm: the relative fourth cumulant kappa_4 / v^2 of a row's token-varying logits,
        -(1 - rk)^2 (6/(dh + 2) + 6 max(0, 1 - 12/dh)/d).  The first term is exact for isotropic
        keys (a coordinate of a uniform point on the sphere of dh dimensions); the second is
        Wk's anisotropy (Wk^T Wk a Wishart matrix of d degrees of freedom: dividing each key
        by its own norm then flattens its law further): -6/d at leading order, its 1/(d dh)
        part measured (dh 32-128, d 128-1024: -3.7/d, -4.7/d, -5.3/d at dh 32, 64, 128,
        60 weight draws x 50 queries x 2e4 keys each, SE ~0.0007)."""
        aniso = 6 * _num(m, lambda t: m.maximum(t, 0.0), 1 - 12 / p.d_head) / p.d
        return -(1 - self.rk) ** 2 * (6 / (p.d_head + 2) + aniso) + 0 * self.s_mean

    # -- rotary positions ------------------------------------------------------------------
    def kbar(self, n):
        return _kappa_bar(self.m, n, self.base, self.dh)

    def shifted(self, n):
        """(variance of the row's softmax-visible logits, beta = its token-varying share,
        kbar(n), the relative variance of the row's variance, k4 = the relative fourth cumulant
        of a row's logits) for rows of n keys.

        Within a row the key-shared part is a sum of dh/2 sinusoids in the key position,
        frequency i with a random amplitude A_i fixed for the row (|A_i|^2 a product of two
        2-dof chi-squares: E A^4 = 4 (E A^2)^2), contributing w_i = vsh (2/dh)(1 - F_i(n)) of
        within-row variance: vsh (1 - kbar) in all.  Its values are bounded (fourth cumulant
        -3 A^4/8 per sinusoid, -6 sum_i w_i^2 in all).  The row's field variance
        sum_i A_i^2 (1 - F_i)/2 varies from row to row, relative variance
        3 sum_i w_i^2 / (sum_i w_i)^2, added to the Gamma law's.

        Rotated queries meet the key projection in different directions: key j's token-varying
        logit has variance tau |Wk R_(j-i)^T q_i|^2 / dh, and the anisotropy of Wk^T Wk (relative
        variance 2/d of a quadratic form, covariance 2 kappa(t)^2/d between two directions
        rotated by t) makes it vary from key to key within a row: of the 2/d that the row law
        carries without rotation, the fraction K2(n) = mean over all n^2 key pairs of kappa^2
        (kappa with the query's own frequency weights |q_i|^2/|q|^2, Dirichlet(1, ..., 1) over
        the dh/2 planes: mean square dh/(dh + 2) (M2 + D), ``_kappa_moments``) stays a
        row-level fluctuation and the rest, kh = (2/d)(1 - K2), is per key: a scale
        mixture of Gaussians, fourth cumulant 3 kh v^2.

        The two cumulants are kept to first order by the Edgeworth term of each key's logit law
        (``_row_value``'s ``k4`` statistics): exact in the limit of small k4 for every row
        length and variance.  (Matching them into an effective variance, the large-L limit
        v + (7/12) kappa_4, is off by about 2x at L 256 and logit variance 2-4.)"""
        m = self.m
        kb, ksq, m2, dd = _rope_shift_moments(m, n, self.base, self.dh)
        ws = self.vsh * (1 - kb)
        w2 = self.vsh**2 * ksq
        kk = self.dh / 2
        k2 = (n + n * (n - 1) * kk / (kk + 1) * (m2 + dd)) / n**2
        kh = 2 / self.d * (1 - k2)
        ve = self.s_mean + ws
        vef = _floor(m, ve)
        relvar = (self.s_mean**2 * (self.relvar - kh) + 3 * w2) / vef**2
        k4 = ((3 * kh + self.k4n) * self.s_mean**2 - 6 * w2) / vef**2
        return ve, self.s_mean / vef, kb, relvar, k4

    # -- one row ---------------------------------------------------------------------------
    def at_n(self, fn, n):
        """Average of fn(v, n) over the row logit variance at row length(s) n."""
        m = self.m
        if not self.rope:
            return m.expect_gamma(lambda v: fn(v, n), self.s_mean + 0 * n, self.relvar + 0 * n, n=_NS)
        ve, beta, kb, relvar, k4 = self.shifted(n)
        return m.expect_gamma(lambda v: fn(v, n, beta, kb, k4), ve + 0 * n, relvar + 0 * n, n=_NS)

    def row(self, fn):
        """Average of fn(v, n) over the row logit variance v and (causal) the row length n.
        With rotary positions fn(v, n, beta, kbar) at the shifted variance (see ``stat``)."""
        m = self.m
        if self.win is not None:        # a sliding window: the mean over the row lengths that occur
            n = self.win.nodes_for(np.ndim(self.s_mean))
            return np.sum(self.win.len_weights.reshape(n.shape) * self.at_n(fn, n), axis=0)
        if not self.rope:
            def bi():
                return m.expect_gamma(lambda v: fn(v, self.L), self.s_mean, self.relvar, n=_NS)

            def ca():
                return m.sum_over_lengths(
                    lambda n: m.expect_gamma(lambda v: fn(v, n), self.s_mean + 0 * n,
                                             self.relvar + 0 * n, n=_NS), self.L) / self.L

            return m.choose(self.causal, bi, ca)
        return m.choose(self.causal, lambda: self.at_n(fn, self.L),
                        lambda: m.sum_over_lengths(lambda n: self.at_n(fn, n), self.L) / self.L)

    def stat(self, name):
        """The row statistic ``name`` as the forward and backward use it, a function of the row
        logit variance and length (``_row_value`` names, and m1sq = m1^2/v, vT2 = v T2,
        trA2 = 1 + trA2m1).  With rotary positions the logits a row's softmax sees are
        z' = e + s' (e the token-varying part, variance v = beta v'; s' the key-shared part
        left after the row mean, variance (1 - beta) v', treated as iid over keys), and the
        statistics of e are those of z' through e = beta z' + (independent noise):
        Bz, Cz -> beta (.) + (1 - beta) A2, where in Bz = E (sum_j P_j e_j)^2 / v the pairs of
        distinct keys also carry the cosine kappa(j - l) of their logit directions a_ij, a_il
        (replaced by kbar(n)); the query direction's Ra -> Ra / beta,
        v T2 -> beta v' T2; trA2 (the coherent query term) -> kbar trA2 + (1 - kbar) Ajj2;
        T2kc = (1 - kbar) T2 (the key-shared part of the query gradient); m1sq carries the
        cross-row direction factor kbar(L)."""
        m = self.m

        def rv(nm, v, n):
            return _row_value(m, nm, v, n)

        def r4(nm, v, n, k4):       # with the first-order (Edgeworth) fourth-cumulant term
            return rv(nm, v, n) + k4 * v**2 / 24 * _row_value(m, nm, v, n, k4=True)

        if self.capped:
            return self._cap_stat(name)
        if not self.rope:
            if not self.has_k4():
                rq = rv
            else:                   # QK-norm: the token-varying logit's fourth cumulant
                def rq(nm, v, n):
                    return r4(nm, v, n, self.k4n)
            plain = {"m1sq": lambda v, n: rq("m1", v, n) ** 2 / _floor(m, v),
                     "vT2": lambda v, n: v * rq("T2", v, n),
                     "vT2e2": lambda v, n: v * rq("T2e2", v, n),
                     "trA2": lambda v, n: 1 + rq("trA2m1", v, n)}
            return plain.get(name, lambda v, n: rq(name, v, n))

        rope = {
            "Bz": lambda v, n, b, kb, k4: (b * (kb * r4("Bz", v, n, k4) + (1 - kb) * r4("Cz", v, n, k4))
                                           + (1 - b) * r4("A2", v, n, k4)),
            "Cz": lambda v, n, b, kb, k4: b * r4("Cz", v, n, k4) + (1 - b) * r4("A2", v, n, k4),
            "m1sq": lambda v, n, b, kb, k4: self.kbL * b * r4("m1", v, n, k4) ** 2 / _floor(m, v),
            "Ra": lambda v, n, b, kb, k4: r4("Ra", v, n, k4) / _floor(m, b),
            "vT2": lambda v, n, b, kb, k4: b * v * r4("T2", v, n, k4),
            "vT2e2": lambda v, n, b, kb, k4: v * r4("T2e2", v, n, k4),
            "trA2": lambda v, n, b, kb, k4: kb * (1 + r4("trA2m1", v, n, k4)) + (1 - kb) * r4("Ajj2", v, n, k4),
            "T2kc": lambda v, n, b, kb, k4: (1 - kb) * r4("T2", v, n, k4),
            "m1": lambda v, n, b, kb, k4: b * r4("m1", v, n, k4),
        }
        return rope.get(name, lambda v, n, b, kb, k4: r4(name, v, n, k4))

    def _cap_stat(self, name):
        """``stat`` with soft-capped logits: the capped one-row statistics (_ROW_CAP, exact
        integrals over the row offset and the token-varying logit, the QK-norm and rotary fourth
        cumulants as Edgeworth weights), and with rotary positions the same transformations of
        the token-varying part as the uncapped ``stat``.  Further names: Sckc (the square of
        the row's gradient sum, which meets the key-shared part of the keys: the shared part of
        a rotary row, kbar, of it) and vSc = v Sc (its key-path share)."""
        cap, names = self.cap, tuple(_ROW_CAP)

        if not self.rope:
            def cv(nm, v, n):
                return _cap_row_stats(v, self.ro, n, cap, self.k4n, names)[nm]
            plain = {"m1sq": lambda v, n: cv("m1", v, n) ** 2 / _floor(self.m, v),
                     "vT2": lambda v, n: v * cv("T2", v, n),
                     "vT2e2": lambda v, n: v * cv("T2e2", v, n),
                     "Sckc": lambda v, n: cv("Sc", v, n),
                     "vSc": lambda v, n: v * cv("Sc", v, n)}
            return plain.get(name, lambda v, n: cv(name, v, n))

        def rc(nm, v, n, b, kb, k4):     # the offset: the key-shared part constant over the row
            return _cap_row_stats(v, self.vsh * kb * b / _floor(self.m, self.s_mean), n, cap, k4, names)[nm]

        rope = {
            "Bz": lambda v, n, b, kb, k4: (b * (kb * rc("Bz", v, n, b, kb, k4) + (1 - kb) * rc("Cz", v, n, b, kb, k4))
                                           + (1 - b) * rc("A2", v, n, b, kb, k4)),
            "Cz": lambda v, n, b, kb, k4: b * rc("Cz", v, n, b, kb, k4) + (1 - b) * rc("A2", v, n, b, kb, k4),
            "m1sq": lambda v, n, b, kb, k4: self.kbL * b * rc("m1", v, n, b, kb, k4) ** 2 / _floor(self.m, v),
            "Ra": lambda v, n, b, kb, k4: rc("Ra", v, n, b, kb, k4) / _floor(self.m, b),
            "vT2": lambda v, n, b, kb, k4: b * v * rc("T2", v, n, b, kb, k4),
            "vT2e2": lambda v, n, b, kb, k4: v * rc("T2e2", v, n, b, kb, k4),
            "trA2": lambda v, n, b, kb, k4: kb * rc("trA2", v, n, b, kb, k4) + (1 - kb) * rc("Ajj2", v, n, b, kb, k4),
            "T2kc": lambda v, n, b, kb, k4: (1 - kb) * rc("T2", v, n, b, kb, k4),
            "m1": lambda v, n, b, kb, k4: b * rc("m1", v, n, b, kb, k4),
            "Sckc": lambda v, n, b, kb, k4: kb * rc("Sc", v, n, b, kb, k4),
            "vSc": lambda v, n, b, kb, k4: b * v * rc("Sc", v, n, b, kb, k4),
        }
        return rope.get(name, lambda v, n, b, kb, k4: rc(name, v, n, b, kb, k4))

    def has_k4(self) -> bool:
        """Whether some configuration carries QK-norm's fourth cumulant (``k4n`` not
        identically 0; the symbolic namespace: not the literal 0 of a model without QK-norm)."""
        if getattr(self.m, "SYMBOLIC", False):
            return not (getattr(self.k4n, "is_zero", False) is True or self.k4n == 0)
        return bool(np.any(np.asarray(self.k4n) != 0))

    # -- two rows --------------------------------------------------------------------------
    def pair_law(self, newton: bool = True):
        """(mean logit variance, its relative variance, mean and variance of the row-pair
        logit correlation rho), for the pair statistics.  Rotary positions: two rows' token-
        varying logits of one key correlate by the cosine of their rotated query directions,
        r_a kq(i - k), and their key-shared parts (after the row means) by r_a kf(i - k), so
        rho = r_a [beta kq + (1 - beta) kf].  Both are cosine sums sum_i w_i cos(t theta_i) whose
        frequency weights fluctuate: kq's are the shared query's plane powers |qc_i|^2/|qc|^2
        (Dirichlet(1, ..., 1) over the K = dh/2 planes, E w_i w_i' = (1 + delta_ii')/(K (K + 1)):
        mean kbar, variance K/(K + 1) (M2 + D) - kbar^2 over the pairs and draws,
        ``_kappa_moments``); kf's are the field's within-row planes (``_field_moments``: mean
        kf, mean square Ef2, mean product with kq Eqf).  The spread of rho adds that of the plain
        cosine (beta^2 (1 - mean^2)^2 relvar/2).  ``pair_dir``: the linear regression of the
        key-path weight r_a kq on rho (r_a kbar at the mean of rho, slope cov(r_a kq, rho)/var(rho))."""
        if not self.rope:
            ve = self.s_mean
            if self.capped:
                return self._cap_pair(ve, self.ro, self.k4n, self.relvar, self.ra, self.rho_var)
            if newton and self.has_k4():        # QK-norm: the Gaussian row with its E sum P^2
                ve = self.pair_variance(ve, self.k4n)
            return ve, self.relvar, self.ra, self.rho_var
        m = self.m
        ve, beta, kb, relvar, k4 = self.shifted(self.Lr)
        ve_pre = ve
        if newton and not self.capped:
            ve = self.pair_variance(ve, k4)
        kf, ef2, eqf = self.fieldL
        kk = self.dh / 2
        var_q = kk / (kk + 1) * (self.k2L + self.dL) - kb**2
        var_f = ef2 - kf**2
        cov_qf = eqf - kb * kf
        mean = self.ra * (beta * kb + (1 - beta) * kf)
        plain = (1 - mean**2) ** 2 * self.relvar / 2
        ra2, g = self.ra**2, 1 - beta
        var = beta**2 * (plain + ra2 * var_q) + 2 * beta * g * ra2 * cov_qf + g**2 * ra2 * var_f
        var = _num(m, lambda t: np.maximum(t, 0.0), var)
        cov_w = beta * (plain + ra2 * var_q) + g * ra2 * cov_qf
        self.pair_dir = (self.ra * kb, cov_w / _floor(m, var), mean)
        if self.capped:
            return self._cap_pair(ve_pre, self.vsh * kb / _floor(m, ve_pre), k4, relvar, mean, var)
        return ve, relvar, mean, var

    def _cap_pair(self, ve, ro, k4, relvar, mean, var):
        """The two-row law with soft-capped logits: the Gaussian row variance vg with the capped
        row's E sum_j P_j^2 at L keys (three Newton steps in log v from ve), the pair correlation
        times bc = v (E f')^2 / Var f (the capped logits' correlation to first order in rho, a
        Hermite coefficient's share); sets ``cap_pair`` = (rT2, ve / vg, bc), rT2 the capped
        row's T2 over the Gaussian row's at vg (the f'^2 on the key-path pair terms)."""
        m, L = self.m, self.Lr
        names = tuple(_ROW_CAP)
        st = _cap_row_stats(ve, ro, L, self.cap, k4, names)
        target = st["A2"]
        vg = np.asarray(ve, dtype=float) + 0 * target
        for _ in range(3):
            a0 = _row_value(m, "A2", vg, L + 0 * vg)
            ap = _row_value(m, "A2", vg * 1.05, L + 0 * vg)
            am = _row_value(m, "A2", vg / 1.05, L + 0 * vg)
            slope = (ap - am) / (2 * math.log(1.05))
            step = np.clip((target - a0) / np.where(np.abs(slope) > 1e-300, slope, 1e-300), -3.0, 3.0)
            vg = np.clip(vg * np.exp(step), 1e-8 * np.maximum(ve, 1e-30), np.maximum(ve, 1e-30))
        t2g = _row_value(m, "T2", vg, L + 0 * vg)
        rT2 = st["T2"] / np.where(t2g > 0, t2g, 1.0)
        shape = np.shape(vg)
        flat = [np.broadcast_to(np.asarray(a, dtype=float), shape).ravel() for a in (ve, ro, self.cap, k4)]
        bc = np.array([(lambda ef, vy: vv * ef * ef / max(vy, 1e-300))(*cap_law_moments(vv, rr, cc, kk))
                       for vv, rr, cc, kk in zip(*flat)])
        bc = np.minimum(bc, 1.0).reshape(shape)
        # two rows' slopes at one key are correlated, not equal: E f'_i f'_k / E f'^2 over their
        # total logits (offset and token part, variance (1 + ro) v, correlation the pair's rho)
        rho = np.broadcast_to(np.asarray(mean, dtype=float), shape).ravel()
        fpair = np.array([cap_pair_slope(vv, rr, cc, qq) for vv, rr, cc, qq in zip(flat[0], flat[1], flat[2], rho)])
        self.cap_pair = (rT2 * fpair.reshape(shape), np.asarray(ve, dtype=float) / vg, bc)
        return vg, relvar, mean * bc, var * bc**2

    def pair_variance(self, ve, k4):
        """The Gaussian logit variance at which a row of L keys has the E sum P^2 of the
        non-Gaussian row (fourth cumulant k4 ve^2, first order as in ``stat``): one Newton step
        from ve with a central difference (ve (1 +- 0.05)).  The two-row statistics are taken
        there (their own fourth-cumulant terms are not computed)."""
        m, L = self.m, self.Lr
        a0 = _row_value(m, "A2", ve, L)
        da = (_row_value(m, "A2", 1.05 * ve, L) - _row_value(m, "A2", 0.95 * ve, L)) / (0.1 * _floor(m, ve))
        shift = k4 * ve**2 / 24 * _row_value(m, "A2", ve, L, k4=True) / _num(m, lambda t: np.maximum(t, 1e-300), da)
        del a0
        return _num(m, lambda t: np.maximum(t, 0.25 * ve), ve + shift)

    def pair(self, name, weight=None):
        """Average over v, rho (and causal row pairs) of a two-row statistic times weight(v, rho)."""
        m = self.m
        s_mean, relvar, ra, rho_var = self.pair_law()

        def f(v, rho):
            val = self._pair_stats(v, rho)[name]
            return val if weight is None else weight(v, rho) * val

        return m.expect_gamma(
            lambda v: m.expect_normal(lambda rho: f(v, _num(m, lambda t: np.clip(t, -0.999, 0.999), rho)),
                                      rho_var + 0 * v, ra + 0 * v, n=_NR),
            s_mean, relvar, n=_NS2)

    def _pair_stats(self, v, rho):
        if self.win is not None:
            w = self.win
            return _memo(self.m, "pair_win", (v, rho, np.array([w.L, w.W, w.causal])),
                         lambda: _two_row_window(self.m, v, rho, w))
        if getattr(self.m, "SYMBOLIC", False):   # named functions of (v, rho, L)
            return self.m.named("pair", lambda v, rho, L, causal: _two_row(self.m, v, rho, L, causal),
                                shown=(("v", v, _POS), ("rho", rho, _REAL), ("L", self.L, _POS)),
                                hidden=(("causal", self.causal, {"nonnegative": True}),),
                                tex=lambda k: {"C2": r"C_{2}", "T2x": r"T_{2\times}", "PP": r"P_{2}"}[k],
                                text=lambda k: k, numeric=lambda v, rho, L, causal: _memo(
                                    _nm(), "pair", (v, rho, L, causal), lambda: _two_row(_nm(), v, rho, L, causal)))
        return _memo(self.m, "pair", (v, rho, self.L, self.causal),
                     lambda: _two_row(self.m, v, rho, self.L, self.causal))


def _gs(m):
    """G_0, G_1, G_2, G_a(w) = exp(a w - e^w): they share exp(w) (memoised on the node
    array, on which the integrator calls them in turn)."""
    memo = {}

    def ew(w):
        if memo.get("w") is not w:
            memo.update(w=w, ew=m.exp(w))
        return memo["ew"]

    return tuple((lambda w, a=a: m.exp(a * w - ew(w))) for a in (0, 1, 2))


def _t2x_one(pq, pq2, p2q, p2q2):
    """T2x's one-shared-key integrand: E[(A_i)_jj (A_i')_jj]'s part of tr(A_i A_i') per key,
    P Q - P Q^2 - P^2 Q + P^2 Q^2 (A = diag(P) - P P^T; the factors' smoothed integrals),
    shared by the rule's two-row statistics and :func:`pair_length_ratios`."""
    return pq - pq2 - p2q + p2q2


def _two_row(m, v, rho, L, causal):
    """C2, T2x and PP of two rows (see the module docstring), one double integral."""
    g0, g1, g2 = _gs(m)
    inner = [(g0, g0), (g1, g1), (g1, g2), (g2, g1), (g2, g2), (g2, g0), (g0, g2), (None, g0)]
    v = _floor(m, v)
    sd = m.sqrt(v)
    lo = None if getattr(m, "SYMBOLIC", False) else -m.log(L) - v / 2 - 3 * sd - 18.0

    def outer_bi(u, w, S, L):
        phi2, pq, pq2, p2q, p2q2, p2, q2, _ = S
        phi2 = _num(m, lambda t: m.maximum(t, 0), phi2)   # interpolation may undershoot 0
        pw = phi2 ** (L - 2)                              # (one power for both weights)
        w1 = L * pw * phi2
        w2 = L * (L - 1) * pw
        c2 = w1 * pq
        t2x = w1 * _t2x_one(pq, pq2, p2q, p2q2) + w2 * pq**2
        pp = w1 * p2q2 + w2 * p2 * q2
        return c2, t2x, pp

    def outer_ca(u, w, S, L):
        phi2, pq, pq2, p2q, p2q2, p2, q2, phi1 = S
        l2 = m.log(_num(m, lambda t: m.maximum(t, 1e-300), phi2))
        l1 = m.log(_num(m, lambda t: m.maximum(t, 1e-300), phi1))
        norm = 2 / (L * (L - 1))
        w1, w2 = m.pair_length_sum(l2, l1, L, (1, 2))
        w1, w2 = norm * w1, norm * w2
        c2 = w1 * pq
        t2x = w1 * _t2x_one(pq, pq2, p2q, p2q2) + w2 * pq**2
        return c2, t2x, 0 * c2

    symbolic = getattr(m, "SYMBOLIC", False)   # the integration window is numeric-only

    def bi():
        win = None if symbolic else (lo, -m.maximum(-(8.5 * sd + 5.0), -(-m.log(L - 1) + 5.0 + v / 2 + 3 * sd)))
        return m.integrate_smoothed2(outer_bi, inner, v, rho, args=(L,), window=win)

    def ca():
        win = None if symbolic else (lo, 8.5 * sd + 5.0)
        return m.integrate_smoothed2(outer_ca, inner, v, rho, args=(L,), window=win)

    c2, t2x, pp = m.choose(causal, bi, ca)
    return {"C2": c2, "T2x": t2x, "PP": pp}


def _two_row_window(m, v, rho, win):
    """C2 and T2x of two rows under a sliding-window mask (PP is not computed: the callers
    take the square of the row average of sum P^2), averaged over the pairs of distinct rows
    (pairs that share no key contribute 0): as the causal sum, with each pair's shared keys s,
    and its rows' own keys a (row i, variable u) and b (row k, variable w), exactly
    (:class:`sigprop.rules.windows.Window`)."""
    if getattr(m, "SYMBOLIC", False):
        raise DomainError("attention: a sliding window (window) has no symbolic form")
    g0, g1, g2 = _gs(m)
    inner = [(g0, g0), (g1, g1), (g1, g2), (g2, g1), (g2, g2), (g2, g0), (g0, g2), (None, g0), (g0, None)]
    v = _floor(m, v)
    sd = m.sqrt(v)
    L = win.L
    lo = -m.log(L) - v / 2 - 3 * sd - 18.0
    norm = 2 / (L * (L - 1))

    def outer(u, w, S, L):
        phi2, pq, pq2, p2q, p2q2, p2, q2, phi1w, phi1u = S
        l2 = m.log(np.maximum(phi2, 1e-300))
        l1w = m.log(np.maximum(phi1w, 1e-300))
        l1u = m.log(np.maximum(phi1u, 1e-300))
        w1, w2 = win.pair_weights(l2, l1u, l1w, (1, 2))
        w1, w2 = norm * w1, norm * w2
        c2 = w1 * pq
        t2x = w1 * _t2x_one(pq, pq2, p2q, p2q2) + w2 * pq**2
        return c2, t2x, 0 * c2

    if win.runs[0].size == 0:       # no two rows share a key (W = 1)
        z = 0 * v * rho
        return {"C2": z, "T2x": z, "PP": z}
    c2, t2x, pp = m.integrate_smoothed2(outer, inner, v, rho, args=(L,), window=(lo, 8.5 * sd + 5.0))
    return {"C2": c2, "T2x": t2x, "PP": pp}


def _window_of(m, p):
    """The :class:`sigprop.rules.windows.Window` of an active sliding window, else None.
    The window, the sequence length and the mask must be one value per evaluation."""
    W = getattr(p, "window", 0)
    if getattr(m, "SYMBOLIC", False):
        if not getattr(W, "free_symbols", None) and W == 0:     # (a number or a sympy 0)
            return None
        raise DomainError("attention: a sliding window (window) has no symbolic form")
    Wa, La, ca = (np.asarray(a) for a in (W, p.L, p.causal))
    if not np.any(Wa > 0):
        return None
    combos = {(int(l), int(w), bool(c)) for l, w, c in
              zip(*(np.broadcast_to(a, np.broadcast_shapes(Wa.shape, La.shape, ca.shape)).ravel() for a in (La, Wa, ca)))}
    act = {k for k in combos if windows.active(*k)}
    if not act:
        return None
    if len(combos) > 1:
        raise DomainError("attention: a sliding window needs one (L, window, causal) per evaluation")
    return windows.window(*act.pop())


def _ff(n, k):
    out = 1
    for j in range(k):
        out = out * (n - j)
    return out


# one-row statistics: sums over distinct key indices, so a monomial with k indices carries
# the coefficient c (n)_k; (name: ([(c, monomial), ...], divide by v))
_ROW = {
    "A2": ([(1, ((2, 0),))], False),
    "m1": ([(1, ((1, 1),))], False),
    "Bz": ([(1, ((2, 2),)), (1, ((1, 1), (1, 1)))], True),
    "Cz": ([(1, ((2, 2),))], True),
    "T2": ([(1, ((2, 0),)), (-2, ((3, 0),)), (1, ((4, 0),)), (1, ((2, 0), (2, 0)))], False),
    "trA2m1": ([(-2, ((2, 0),)), (1, ((4, 0),)), (1, ((2, 0), (2, 0)))], False),
    "Ajj2": ([(1, ((2, 0),)), (-2, ((3, 0),)), (1, ((4, 0),))], False),
    "Ra": ([(1, ((2, 2),)), (-2, ((3, 2),)), (-2, ((2, 1), (1, 1))), (1, ((4, 2),)),
            (1, ((2, 2), (2, 0))), (2, ((3, 1), (1, 1))), (1, ((1, 1), (1, 1), (2, 0)))], True),
    # E sum_j dS_j^2 z_j^2 / v: T2 with each key's squared logit (QK-norm's projection)
    "T2e2": ([(1, ((2, 2),)), (-2, ((3, 2),)), (1, ((4, 2),)), (1, ((2, 2), (2, 0)))], True),
}


#: statistics evaluated in their own integral when asked for; the rest share one
_ROW_ON_DEMAND = ("T2e2",)
_ROW_SHARED = tuple(k for k in _ROW if k not in _ROW_ON_DEMAND)


def _row_value(m, name, v, n, k4=False):
    """The one-row statistic ``name`` of ``_ROW`` at row logit variance v and length n.
    ``k4``: instead 24 times its first-order response to a fourth cumulant kappa_4 of the iid
    key logits, per unit kappa_4 (see ``_row_stats``)."""
    if getattr(m, "SYMBOLIC", False):        # the statistic as a named function of (v, n)
        return m.named(f"row.{name}" + (".k4" if k4 else ""), lambda v, n: _row_stats(m, v, n, (name,), k4)[name],
                       shown=(("v", v, _POS), ("n", n, _POS)), tex=_row_tex(name, k4), text=name + ("_k4" if k4 else ""),
                       numeric=lambda v, n: _row_value(_nm(), name, v, n, k4))
    if name in _ROW_ON_DEMAND:               # (QK-norm only: not in every model's integrals)
        tag = f"rows.{name}" + (".k4" if k4 else "")
        return _memo(m, tag, (v, n), lambda: _row_stats_tabled(m, tag, v, n, (name,), k4))[name]
    tag = "rows4" if k4 else "rows"
    return _memo(m, tag, (v, n), lambda: _row_stats_tabled(m, tag, v, n, _ROW_SHARED, k4))[name]


def _row_stats_tabled(m, tag, v, n, names, k4):
    """:func:`_row_stats`, from the shipped interpolant (:mod:`sigprop.rules.row_table`) at the
    (v, n) it covers and by the integrals elsewhere (numeric only)."""
    from sigprop.rules import row_table

    t = row_table.table(tag)
    if t is None:
        return _row_stats(m, v, n, names, k4)
    vv, nn = np.asarray(v, dtype=float), np.asarray(n, dtype=float)
    shape = np.broadcast_shapes(vv.shape, nn.shape)
    vf = np.maximum(np.broadcast_to(vv, shape).ravel(), _VMIN)     # _row_stats's floor
    nf = np.broadcast_to(nn, shape).ravel()
    ok = t.covers(vf, nf)
    out = np.empty((len(names), vf.size))
    if ok.any():
        out[:, ok] = t.lookup(vf[ok], nf[ok])
    if not ok.all():
        rest = _row_stats(m, vf[~ok], nf[~ok], names, k4)
        for i, name in enumerate(names):
            out[i, ~ok] = rest[name]
    return {name: out[i].reshape(shape)[()] for i, name in enumerate(names)}


def _row_tex(name, k4):
    """LaTeX name of the one-row statistic ``name`` (``k4``: its fourth-cumulant response)."""
    base = {"A2": r"A_{2}", "m1": r"m_{1}", "Bz": r"B_{z}", "Cz": r"C_{z}", "T2": r"T_{2}",
            "trA2m1": r"T_{A}", "Ajj2": r"A_{jj}", "Ra": r"R_{a}", "T2e2": r"T_{2e}"}[name]
    return base + (r"^{(4)}" if k4 else "")


def _edgeworth(c, t, v, n):
    """The first-order fourth-cumulant term of the monomial sum c (n)_k E[prod_{j in t} P_j^a_j
    e_j^b_j] (k = len(t) distinct keys), times v^4 / kappa_4.  A key logit law N(0, v) plus
    its Edgeworth term changes E f(e) by (kappa_4 / 24) E f^(4)(e)
    = (kappa_4 / (24 v^4)) E[f(e) (e^4 - 6 v e^2 + 3 v^2)] (Stein's identity), summed over the
    keys: each key of the monomial, and the other n - k keys of the row, whose factor phi
    becomes a new index (0, b) (coefficient (n)_(k+1); its (0, 0) term is the monomial itself).
    Returns [(coefficient, monomial), ...] (the 1/24 is left to the caller)."""
    out = []
    ck = c * _ff(n, len(t))
    for j, (a, b) in enumerate(t):
        for db, w in ((4, 1), (2, -6 * v), (0, 3 * v**2)):
            out.append((ck * w, t[:j] + ((a, b + db),) + t[j + 1:]))
    ck1 = c * _ff(n, len(t) + 1)
    out += [(ck1, t + ((0, 4),)), (-6 * v * ck1, t + ((0, 2),)), (3 * v**2 * ck1, t)]
    return out


def _row_stats(m, v, n, names, k4=False):
    """The one-row statistics ``names`` (of ``_ROW``) at row logit variance v and row length
    n, as one integral with several outputs (they share the smoothed factors and phi's
    powers).  A monomial with k distinct indices carries (n)_k, which vanishes for n < k;
    there its phi^(n-k) would not be finite, so its power is floored at phi^0 (``truncate``).
    ``k4``: 24 times the statistics' first-order response to a fourth cumulant kappa_4 of the
    key logits, per unit kappa_4 (``_edgeworth`` summed, divided by v^4)."""
    vv = _floor(m, v)      # (the floor only matters at v < 1e-30, where it divides)
    if not k4:
        parts = [(name, k) for name in names for k in sorted({len(t) for _, t in _ROW[name][0]})]
        combos = [[(c * _ff(n, k), t) for c, t in _ROW[name][0] if len(t) == k] for name, k in parts]
    else:
        terms = {name: [e for c, t in _ROW[name][0] for e in _edgeworth(c, t, vv, n)] for name in names}
        parts = [(name, k) for name in names for k in sorted({len(t) for _, t in terms[name]})]
        combos = [[(c / vv**4, t) for c, t in terms[name] if len(t) == k] for name, k in parts]
    vals = softmax_expect_sums(m, vv, n, combos, truncate=True)
    out = dict.fromkeys(names, 0)
    for (name, _), val in zip(parts, vals):      # one integral output per number of indices
        out[name] = out[name] + val
    return {name: val / vv if _ROW[name][1] else val for name, val in out.items()}


# -- soft-capped logits ----------------------------------------------------------------------
#
# ``softcap`` c > 0 (Gemma 2's attn_logit_softcapping): every logit s (after the 1/sqrt(dh)
# scaling) becomes c tanh(s / c) before the mask and the softmax.  The part of s shared by a
# row's keys (the offset o = a_i . c, which cancels in an uncapped softmax) no longer cancels:
# a row's keys see y_j = f(o + z_j), f(s) = c tanh(s / c), z_j iid N(0, v) the token-varying
# logits and o ~ N(0, ro v) over the rows (given the row's a_i, o = a_i . c has variance
# |a_i|^2 c2 while v = |a_i|^2 tau: ro = vsh / v, the key-shared to token-varying ratio).  The
# identity of sigprop.rules.softmax_moments holds for any iid law of a row's logits, so the
# one-row statistics stay exact integrals: the smoothed factors become
# chi_{a,b,k}(u) = E[z^b f'(o + z)^k G_a(u + f(o + z))] (f' = 1 - tanh^2 the cap's slope, which
# multiplies every logit gradient), by quadrature over z (Gauss-Hermite for narrow laws, else
# the trapezoid rule) and then over o (Gauss-Hermite); a fourth cumulant of z (QK-norm, rotary
# positions) enters as the Edgeworth factor 1 + k4/24 He_4 on the z nodes.

#: Gauss-Hermite nodes over the row offset o; the z law's nodes: Gauss-Hermite below a standard
#: deviation _CAP_SD_GH (_CAP_NGH nodes), else the trapezoid rule at step _CAP_H
_CAP_NO, _CAP_SD_GH, _CAP_NGH, _CAP_H = 16, 0.45, 24, 0.3
#: offsets wider than _CAP_SO_GH caps: the trapezoid rule in o at step _CAP_HO caps
_CAP_SO_GH, _CAP_HO = 0.5, 0.4

#: the capped one-row statistics: monomials of (a, b, k) = P_j^a z_j^b f'_j^k over distinct
#: keys, (name: ([(c, monomial), ...], divide by v)).  The forward ones are those of _ROW
#: (k = 0, z the pre-cap logit); every logit gradient carries f' of its key:
#: T2 = E sum_j f'_j^2 sum_l A_jl^2, Ajj2 = E sum_j f'_j^2 A_jj^2, trA2 = E (sum_j f'_j A_jj)^2,
#: Ra = E sum_l P_l^2 (w_l - sum_j P_j w_j)^2 / v with w = f' z, T2e2 = E sum_j f'^2 z^2 sum_l A_jl^2 / v,
#: and Sc = E sum_l P_l^2 (f'_l - sum_j P_j f'_j)^2, the square of a row's gradient sum
#: (sum_j dS_ij, 0 without a cap) per unit upstream variance.
_ROW_CAP = {
    "A2": ([(1, ((2, 0, 0),))], False),
    "m1": ([(1, ((1, 1, 0),))], False),
    "Bz": ([(1, ((2, 2, 0),)), (1, ((1, 1, 0), (1, 1, 0)))], True),
    "Cz": ([(1, ((2, 2, 0),))], True),
    "T2": ([(1, ((2, 0, 2),)), (-2, ((3, 0, 2),)), (1, ((4, 0, 2),)), (1, ((2, 0, 2), (2, 0, 0)))], False),
    "trA2": ([(1, ((2, 0, 2),)), (-2, ((3, 0, 2),)), (1, ((4, 0, 2),)), (1, ((1, 0, 1), (1, 0, 1))),
              (-2, ((2, 0, 1), (1, 0, 1))), (1, ((2, 0, 1), (2, 0, 1)))], False),
    "Ajj2": ([(1, ((2, 0, 2),)), (-2, ((3, 0, 2),)), (1, ((4, 0, 2),))], False),
    "Ra": ([(1, ((2, 2, 2),)), (-2, ((3, 2, 2),)), (-2, ((2, 1, 1), (1, 1, 1))), (1, ((4, 2, 2),)),
            (1, ((2, 2, 2), (2, 0, 0))), (2, ((3, 1, 1), (1, 1, 1))), (1, ((1, 1, 1), (1, 1, 1), (2, 0, 0)))], True),
    "T2e2": ([(1, ((2, 2, 2),)), (-2, ((3, 2, 2),)), (1, ((4, 2, 2),)), (1, ((2, 2, 2), (2, 0, 0)))], True),
    "Sc": ([(1, ((2, 0, 2),)), (-2, ((3, 0, 2),)), (-2, ((2, 0, 1), (1, 0, 1))), (1, ((4, 0, 2),)),
            (1, ((2, 0, 2), (2, 0, 0))), (2, ((3, 0, 1), (1, 0, 1))), (1, ((1, 0, 1), (1, 0, 1), (2, 0, 0)))], False),
}


def softcap(s, cap):
    """The soft cap cap * tanh(s / cap) (Gemma 2's attention logits); ``cap`` 0: s itself."""
    s = np.asarray(s, dtype=float)
    return s if not cap else cap * np.tanh(s / cap)


def _cap_nodes(v, ro, k4, cap):
    """(o nodes, o weights, z nodes, z weights) of one logit law: o ~ N(0, ro v), z ~ N(0, v)
    with relative fourth cumulant k4 (Edgeworth weights, floored at 0)."""
    sd = math.sqrt(max(v, 0.0))
    so = math.sqrt(max(ro * v, 0.0))
    if so <= 0:
        o, wo = np.zeros(1), np.ones(1)
    elif so <= _CAP_SO_GH * cap:
        xo, wo = np.polynomial.hermite_e.hermegauss(_CAP_NO)
        o, wo = xo * so, wo / math.sqrt(2 * math.pi)
    else:       # wide offsets: the statistics vary with o on the cap's scale (trapezoid)
        h = _CAP_HO * cap / so
        xo = np.arange(-math.ceil(8.5 / h), math.ceil(8.5 / h) + 1) * h
        o, wo = xo * so, h * np.exp(-0.5 * xo * xo) / math.sqrt(2 * math.pi)
    if sd < _CAP_SD_GH:
        x, wz = np.polynomial.hermite_e.hermegauss(_CAP_NGH)
        wz = wz / math.sqrt(2 * math.pi)
    else:
        h = _CAP_H / sd
        x = np.arange(-math.ceil(8.5 / h), math.ceil(8.5 / h) + 1) * h
        wz = h * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    if k4:
        wz = wz * np.maximum(1 + k4 / 24 * (x**4 - 6 * x**2 + 3), 0.0)
    return o, wo, sd * x, wz


def _cap_plan(names):
    """The fixed structure of the capped integrals of ``names``: the smoothed factors' keys
    (a, b, k), each term's factor indices (padded with the constant factor 1, index len(keys)),
    and per number of distinct keys kk the coefficient matrix (terms, names) of
    c / (sum a - 1)! (memoised)."""
    return _CAP_PLANS.get(tuple(names), lambda: _cap_plan_build(names))


def _cap_plan_build(names):
    terms = [(i, c, t) for i, name in enumerate(names) for c, t in _ROW_CAP[name][0]]
    keys = sorted({ab for _, _, t in terms for ab in t} | {(0, 0, 0)})
    pos = {k: i for i, k in enumerate(keys)}
    width = max(len(t) for _, _, t in terms)
    idx = np.full((len(terms), width), len(keys))
    coef = {}
    for j, (i, c, t) in enumerate(terms):
        idx[j, :len(t)] = [pos[ab] for ab in t]
        m = coef.setdefault(len(t), np.zeros((len(terms), len(names))))
        m[j, i] += c / math.factorial(sum(a for a, _, _ in t) - 1)
    by_a = {}
    for i, (a, b, k) in enumerate(keys):
        by_a.setdefault(a, []).append((i, b, k))
    return keys, idx, sorted(coef.items()), by_a, pos[(0, 0, 0)]


_CAP_PLANS = memo.Kind("attention.cap_plans", 8, "the capped integrals' structure per tuple of names")


def _cap_law(v, ro, cap, k4, ns, names):
    """The capped one-row statistics ``names`` (of _ROW_CAP) of one logit law at the row lengths
    ``ns`` (an array): dict of arrays.  One array computation over the offset nodes o, the u
    grid and the z nodes."""
    o, wo, z, wz = _cap_nodes(v, ro, k4, cap)
    keys, idx, coefs, by_a, i_phi = _cap_plan(names)
    nmax = float(np.max(ns))
    h = SMOOTHED_H_CAP
    t = np.tanh((o[:, None] + z[None, :]) / cap)                      # (o, z)
    y, fp = cap * t, 1 - t * t
    lo = -math.log(max(nmax, 1.0)) - float(y.max()) - 40.0
    hi = 4.5 - float(y.min())
    u = np.arange(lo, hi + h, h)
    out = np.zeros((len(names), len(ns)))
    # chunks of offset nodes: (o, u, z) arrays of at most ~2e6 entries
    step = max(1, int(2e6 // (len(u) * len(z))))
    for s0 in range(0, len(o), step):
        yy, ff, ww = y[s0:s0 + step], fp[s0:s0 + step], wo[s0:s0 + step]
        with np.errstate(over="ignore", under="ignore"):
            ew = np.exp(np.minimum(u[None, :, None] + yy[:, None, :], 700.0))      # (o, u, z)
            g = np.exp(-ew)
        chi = np.empty((len(yy), len(u), len(keys) + 1))
        chi[..., -1] = 1.0
        a_max = max(by_a)
        for a in range(a_max + 1):
            if a:
                g = g * ew
            if a not in by_a:
                continue
            cols = by_a[a]
            wk = np.stack([np.broadcast_to(wz[None, :] * (z**b if b else 1.0) * (ff**k if k else 1.0), ff.shape)
                           for _, b, k in cols], axis=-1)                # (o, z, keys)
            chi[..., [i for i, _, _ in cols]] = np.matmul(g, wk)
        lphi = np.log(np.maximum(chi[..., i_phi], 1e-300))             # (o, u)
        prods = np.prod(chi[..., idx], axis=-1)                        # (o, u, terms)
        for kk, cm in coefs:
            q = prods @ cm                                              # (o, u, names)
            with np.errstate(under="ignore"):
                pw = np.exp(np.maximum(ns - kk, 0.0)[None, None, :] * lphi[..., None])   # (o, u, ns)
            out += _ff(ns, kk)[None, :] * np.einsum("oum,oun,o->mn", q, pw, ww) * h
    res = {}
    for i, name in enumerate(names):
        res[name] = out[i] / max(v, _VMIN) if _ROW_CAP[name][1] else out[i]
    return res


SMOOTHED_H_CAP = 0.3     # u step of the capped integrals (the integrands are analytic in a strip)
_CAP_STATS = memo.Kind("attention.cap_stats", 512, "capped one-row statistics per (law, row lengths)")


def _cap_row_stats(v, ro, n, cap, k4, names):
    """The capped one-row statistics ``names`` at (broadcast) row logit variances ``v``, offset
    ratios ``ro``, row lengths ``n``, caps and relative fourth cumulants ``k4``: dict of arrays
    of the broadcast shape (numeric only)."""
    arrs = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (v, ro, n, cap, k4)))
    shape = arrs[0].shape
    v, ro, n, cap, k4 = (a.ravel() for a in arrs)
    laws = np.stack([v, ro, cap, k4], axis=1)
    uniq, inv = np.unique(laws, axis=0, return_inverse=True)
    inv = inv.ravel()
    out = {name: np.empty(v.size) for name in names}
    for i, law in enumerate(uniq):
        sel = np.nonzero(inv == i)[0]
        ns = n[sel]
        key = (tuple(float(t) for t in law), ns.tobytes(), tuple(names))
        vals = _CAP_STATS.get(key, lambda: _cap_law(float(law[0]), float(law[1]), float(law[2]),
                                                     float(law[3]), ns, names))
        for name in names:
            out[name][sel] = vals[name]
    return {name: val.reshape(shape) for name, val in out.items()}


def cap_pair_slope(v, ro, cap, rho):
    """E[f'(s1) f'(s2)] / E[f'(s)^2], (s1, s2) Gaussian of variance (1 + ro) v and correlation
    rho: how much less two rows' cap slopes at one key multiply than one row's squared slope."""
    x, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / w.sum()
    sd = math.sqrt(max((1 + ro) * v, 0.0))
    rho = min(max(float(rho), -1.0), 1.0)
    s1 = sd * x[:, None] + 0 * x[None, :]
    s2 = sd * (rho * x[:, None] + math.sqrt(1 - rho * rho) * x[None, :])
    f1, f2 = 1 - np.tanh(s1 / cap) ** 2, 1 - np.tanh(s2 / cap) ** 2
    ww = w[:, None] * w[None, :]
    den = float(np.sum(ww * f1 * f1))
    return float(np.sum(ww * f1 * f2)) / den if den > 0 else 1.0


def cap_law_moments(v, ro, cap, k4=0.0):
    """(E f', Var f(o + z)) of one logit law (o ~ N(0, ro v) the row offset, z ~ N(0, v)),
    averaged over o: the capped logits' slope and variance within a row."""
    o, wo, z, wz = _cap_nodes(float(v), float(ro), float(k4), float(cap))
    t = np.tanh((o[:, None] + z[None, :]) / cap)
    y, fp = cap * t, 1 - t * t
    ef = float(wo @ (fp @ wz))
    m1 = y @ wz
    var = float(wo @ ((y * y) @ wz - m1**2))
    return ef, var


class Attention(Rule):
    name = "attention"
    title = "Multi-head scaled dot-product attention"
    params = (
        positive_int("d", "model width (input and output features)"),
        positive_int("n_heads", "number of heads H", default=1),
        positive_int("d_head", "head width dh"),
        Param("L", "sequence length (tokens)", lo=2, integer=True),
        std("q_std", "std of Wq entries"),
        std("k_std", "std of Wk entries"),
        std("v_std", "std of Wv entries"),
        std("o_std", "std of Wo entries"),
        std("q_bias_std", "std of the query bias", default=0.0),
        std("k_bias_std", "std of the key bias (cancels in the softmax)", default=0.0),
        std("v_bias_std", "std of the value bias", default=0.0),
        std("o_bias_std", "std of the output bias", default=0.0),
        probability("p", "attention-probability dropout"),
        Param("causal", "1 for a causal mask (row i sees keys 0..i), else 0", 0, lo=0, hi=1,
              integer=True),
        Param("kv_heads", "key/value heads (grouped-query: query head i reads key/value head "
              "floor(i kv_heads / n_heads)); must divide n_heads; 0 = n_heads", 0, lo=0, integer=True),
        Param("qk_norm", "per-head norm of every query and key over d_head, before the rotation: "
              "0 none, 1 LayerNorm, 2 RMSNorm (gain 1)", 0, lo=0, hi=2, integer=True),
        Param("qk_eps", "epsilon of the QK-norm", 1e-5, lo=0.0),
        Param("rope", "rotary position base (theta_i = rope^(-2i/d_head)), or a sigprop.rope.RopeFreqs (the "
              "frequencies and attention factor themselves); 0 = no rotation", 0.0, lo=0.0, accepts=(RopeFreqs,)),
        Param("softcap", "soft cap c of the logits (Gemma 2's attn_logit_softcapping): s -> c tanh(s / c) after "
              "the scaling, before the mask and the softmax; 0 = none (numeric only)", 0.0, lo=0.0),
        Param("window", "sliding window: each row attends to at most this many keys (causal: keys i-W+1..i; "
              "bidirectional: the W keys i-floor((W-1)/2)..i+ceil((W-1)/2), clipped at the ends); 0 = every key "
              "(numeric only)", 0, lo=0, integer=True),
    )
    assumptions = (
        "Input Gaussian with a token-shared component carrying the correlation (the sampler's "
        "law); the input mean is folded into the shared part (zero-mean weights: only the "
        "uncentred second moments enter).  Upstream gradient independent of the input.",
        "Large d and dh: the logit, value-gradient and orthogonal directions of a key are "
        "treated as independent (a_i . b_i ~ 0); corrections kept to O(1/d) and O(1/dh) "
        "(the (d-1), (d-2) factors, the a_i and b_i directions of the query path).  Relative "
        "error O(1/d^2, 1/(d dh)).",
        "Row logit variance v = tau |a_i|^2 averaged over a Gamma law with the exact mean and "
        "the leading relative variance 2/d + 2/dh + 2/d (mu = 0, no bias): the exact law is a "
        "product of three chi-squares; the Gamma matches its first two moments (checked: "
        "< 0.5% on the statistics used, d >= 100, dh >= 32).  6 Gauss-Laguerre nodes (4 for "
        "two-row statistics).",
        "Two rows: logit correlation rho ~ Normal(r_a, (1 - r_a^2)^2/D), the sampling law of the "
        "cosine of two a-vectors with D = 2/relvar effective dimensions; both rows share one "
        "logit variance.  3 Gauss-Hermite nodes in rho.",
        "The self key (key i in row i, which also enters a_i) is treated as another iid key: "
        "its logit has a random offset of relative size sqrt((1-r)/d); error O(1/(L sqrt d)) "
        "(larger for the first rows of a causal mask).",
        "Cross terms between the value, query and key paths of the gradient are dropped "
        "(zero mean over the weight signs up to O(1/d)).",
        "Causal: sums over row lengths are exact up to n = 12, then the midpoint-rule integral "
        "with Euler-Maclaurin end corrections by Gauss-Legendre in log n (relative error "
        "< 1e-4); the pair statistic E[sum P_i^2 sum P_k^2] (only in an O(1/d) term of the "
        "query-path covariance) is replaced by the square of the row average of sum P^2.",
        "Softmax moments are exact integrals (Laplace transform of the normaliser), evaluated "
        "by trapezoid/Gauss-Hermite quadrature (relative error ~1e-6).",
        "Mean row logit variance at most 100 (ROW_LOGIT_VAR_MAX; a DomainError beyond): the "
        "quadrature grids grow with the logit scale and break down near 1000, and the Monte "
        "Carlo validation grid reaches ~13.  Saturated (near one-hot) softmax rows are not modelled.",
        "Grouped-query heads (kv_heads): exact in expectation (cross-head terms vanish with the "
        "independent zero-mean W_o blocks); no approximation beyond the plain rule's.",
        "QK-norm: every query and key divided by its own norm is treated as a fixed rescaling "
        "(the norm concentrates), with the key-norm fluctuation kept to O(1/dh): a variance "
        "factor 1 + rk (1 + rk)/(2 dh) (checked by sampling, dh 32-128, rk 0-0.9) and a "
        "platykurtic logit (fourth cumulant -6 (1 - rk)^2 v^2/(dh + 2), exact at rk = 0) entering "
        "through one effective variance matched on log E e^{2z} - 2 log E e^z; the Jacobian's "
        "projection as a 1/dh (LayerNorm 2/dh) loss of the query and key gradients, and their "
        "division by each query's and key's own squared scale as its inverse-chi-square mean "
        "(n/(n-2), n = dh or dh - 1; two tokens' scales independent in the cross-token terms).  Range: "
        "dh >= 32, logit variance ~1 (what the norm gives).  eps enters exactly in the scales.",
        "Rotary positions: the key-shared logit part left after a row's mean, a sum of dh/2 "
        "sinusoids in the key position with amplitudes fixed for the row, is treated as iid over "
        "the keys with its variance vsh (1 - kbar(n)) and its amplitudes' row-to-row spread in the "
        "Gamma law; its fourth cumulant (bounded sinusoids) and that of the per-key variance "
        "spread (the rotated query directions meeting Wk's anisotropy, O(1/d)) enter every row "
        "statistic to first order (Edgeworth term, exact softmax integrals).  Checked by direct "
        "sampling of rotary rows (d 256, 4 heads of 64, base 1e4, logit variance ~4): E sum P^2 "
        "within 0.3% at r 0 and 0.5 (L 64 and 256), -3% to +5% at r 0.9 (first order in a large "
        "negative kurtosis; 5e5: -10% at r 0.9, L 256); the row-pair statistic C2 within 2% at "
        "r 0-0.5, +4% to +7% at r 0.9.  The two-row statistics use no fourth-cumulant term of their "
        "own (taken at the Gaussian variance with the row's E sum P^2).  Measured against the "
        "component by gradient path (40 x 8 sequences): at r 0.5 the value and key paths within "
        "~4% and the query path ~+3%; at r 0.9 the query path (small, except with dropout) 17-26% "
        "high and the key path 4-23% low where the gradient correlation is 0.5 (the attention "
        "follows the field, which the rule's (1 - kbar) T2 and pair weights treat as unrelated to it).",
        "Rotary positions given by their frequencies (rope a sigprop.rope.RopeFreqs): the same cosine "
        "sums over the given theta_i, a frequency 0 (partial rotary's unrotated planes) contributing "
        "cos = 1 at every offset; the weights are iid, so which features form a plane does not "
        "matter.  The attention factor s (yarn, longrope) is exact when every plane rotates (q and k "
        "times s); with unrotated planes the rule takes one factor s_eff on the query and key "
        "variances, s_eff^4 = (r s^4 + K - r)/K (r of K = dh/2 planes rotated), which gives the logit "
        "its variance but weights the planes uniformly: the within-row variance of the key-shared part "
        "(which only the rotated planes carry) is then s_eff^4/s^4 of the true one (0.81 for longrope "
        "on 3/4 of the head with s = sqrt 2).  Measured (attention grid rope_freqs): without QK-norm "
        "within 2% (longrope on 3/4 of the head, s = sqrt 2) and 3% (yarn, every plane rotating).  "
        "With QK-norm the factor puts the normalised logits at variance ~s^4 (3 to 4), beyond the ~1 "
        "the QK-norm terms were validated at: the gradient variance is then 7% to 14% high, with "
        "every plane rotating too (s = sqrt 2: +11.5%).",
        "Soft-capped logits (softcap c: s -> c tanh(s / c)): one-row statistics are exact integrals "
        "over the capped law, the row's shared logit offset (which no longer cancels) taken as Gaussian; "
        "two-row statistics at the Gaussian row with the capped row's E sum P^2; the cross-row part of a "
        "row's gradient sum left out; numeric only (the module docstring has the details).",
        "Sliding window W (numeric only): one-row statistics averaged over the row lengths that occur, "
        "two-row statistics summed exactly over row pairs by shared and own keys (sigprop.rules.windows has "
        "the details); the input exchangeable over positions, so exact for a stack's first windowed layer "
        "only (the predictor refuses a second).  Measured (grid window, 96 points): x var p99 1.40%, g var "
        "p99 4.35%.",
    )
    references = (
        "[TGS] Kedia et al. 2024 (single-head value-path formulas; this rule adds the query "
        "and key paths, finite-width corrections, multi-head, biases, causal masks)",
    )

    def symbolic(self, modern: bool = True) -> dict:
        """sympy expressions of the outputs, QK-norm and rotary positions included (sympy
        Piecewise in qk_norm and rope; kv_heads does not enter the moments).  The rotary cosine
        sums, the one-row and row-pair softmax statistics and the Gamma and normal densities
        are named quantities (:class:`sigprop.backend.symbolic.Defined`), each defined once
        (``sigprop.backend.symbolic.where`` lists the definitions).  ``modern=False``: plain
        attention's (qk_norm = 0, rope = 0)."""
        import sigprop.backend.symbolic as sm

        if modern:          # (the soft cap is numeric only: the uncapped rule's form)
            x, g, p = self.symbolic_inputs()
            p.softcap, p.window = 0, 0
            y, gb = self.forward(sm, x, p), self.backward(sm, x, g, p)
            return {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": gb.var, "g_corr": gb.corr}

        x, g, p = self.symbolic_inputs()
        p.qk_norm, p.rope, p.softcap, p.window = 0, 0, 0, 0
        y = self.forward(sm, x, p)
        gb = self.backward(sm, x, g, p)
        return {"x_mean": y.mean, "x_var": y.var, "x_corr": y.corr, "g_var": gb.var, "g_corr": gb.corr}

    def check_params(self, values):
        if np.any(np.asarray(values["L"]) < 2):
            raise DomainError("attention: L must be >= 2")
        H, kv = np.asarray(values["n_heads"]), np.asarray(values["kv_heads"])
        if np.any((kv > 0) & (np.mod(H, np.maximum(kv, 1)) != 0)):
            raise DomainError(f"attention: kv_heads ({_show(values['kv_heads'])}) must divide n_heads "
                              f"({_show(values['n_heads'])})")
        if isinstance(values["rope"], RopeFreqs):
            try:
                values["rope"].check_head(values["d_head"])
            except DomainError as e:
                raise DomainError(f"attention: {e}") from None
        else:
            rope = np.asarray(values["rope"])
            if np.any((rope != 0) & (rope <= 1)):
                raise DomainError(f"attention: the rotary base rope must be 0 (no rotation) or > 1, got "
                                  f"{_show(values['rope'])}")
            if np.any((rope != 0) & (np.mod(np.asarray(values["d_head"]), 2) != 0)):
                raise DomainError("attention: rotary positions need an even d_head")
        if np.any((np.asarray(values["qk_norm"]) == 1) & (np.asarray(values["d_head"]) < 2)):
            raise DomainError("attention: a LayerNorm QK-norm needs d_head >= 2")

    def check_state(self, x, g):
        super().check_state(x, g)
        if np.any(np.asarray(x.corr) < 0):
            raise DomainError("attention: the input token correlation must be >= 0 (shared-component law)")
        if g is not None and np.any(np.asarray(g.corr) < 0):
            raise DomainError("attention: the gradient token correlation must be >= 0")

    # ------------------------------------------------------------------------------------
    def forward(self, m, x, p):
        return _branch(m, _flag(m, getattr(p, "rope", 0.0)),
                       lambda: self._forward(m, x, p, False), lambda: self._forward(m, x, p, True))

    def _forward(self, m, x, p, rope):
        return _branch(m, _cap_flag(m, p), lambda: self._forward_c(m, x, p, rope, False),
                       lambda: self._forward_c(m, x, p, rope, True))

    def _forward_c(self, m, x, p, rope, cap):
        c = _Ctx(m, x, p, rope, cap=cap)
        st = dict(A2=c.row(c.stat("A2")), Bz=c.row(c.stat("Bz")), Cz=c.row(c.stat("Cz")),
                  m1sq=c.row(c.stat("m1sq")), C2=c.pair("C2"))
        var, cov = _forward_moments(m, c, p, st)
        return Forward(0 * x.mean, var, cov / var)

    def backward(self, m, x, g, p):
        return _branch(m, _flag(m, getattr(p, "rope", 0.0)),
                       lambda: self._backward(m, x, g, p, False), lambda: self._backward(m, x, g, p, True))

    def _backward(self, m, x, g, p, rope):
        return _branch(m, _cap_flag(m, p), lambda: self._backward_c(m, x, g, p, rope, False),
                       lambda: self._backward_c(m, x, g, p, rope, True))

    def _backward_c(self, m, x, g, p, rope, cap):
        c = _Ctx(m, x, p, rope, cap=cap)
        t = _backward_terms(m, c, p, g, _backward_stats(m, c, p))
        var = t["val"] + t["val_x"] + t["qry"] + t["key"] + t["key_x"]
        cov = t["val_c"] + t["qry_c"] + t["key_c"]
        return Backward(var, cov / var)

    # -- causal: per row length -------------------------------------------------------------
    def rows(self, m, x, g, p, n):
        """Causal mask, the row of length n (= query position + 1; ``n`` an array of
        lengths): what the forward and backward average over the rows, before averaging.
        The same statistics and the same combinations as :meth:`forward`/:meth:`backward`,
        evaluated at one row length instead of the row average (the pair statistics, which
        need two lengths, stay averaged over the pairs of rows).  Returns a dict:

        * ``var``: E Y_i^2 of the output row (Y's variance at that position);
        * ``spread``: the gradient a unit upstream gradient at that row sends through its
          attention weights, value and key paths (shared evenly by its n keys: keys are
          exchangeable within a row);
        * ``local``: the query path's part (lands on the row's own position);
        * ``same_c``: the off-diagonal gradient covariance a row with unit gradient produces
          among its own keys, summed over its n (n - 1) ordered key pairs (value and key paths;
          ``same_k``: the key path's part of it);
        * per unit gradient correlation rg (scalars: row-pair averages, the rule's own terms):
          ``cross``: the pair-of-rows parts of the value and key paths' variance (``cross_k``:
          the key path's part of it; ``cross_u``: the value path's part at uniform attention
          weights, E[A_ij A_i'j] = 1/(n_i n_i') on the shared keys, C2 = 1/max(n_i, n_i')
          averaged over the pairs of distinct rows); ``cross_c``: their covariance; ``qry_c``:
          the query path's covariance.

        Rotary positions: every per-row statistic at its row length's shifted logit variance
        (the module docstring); the row-pair terms as in :meth:`backward`."""
        return _branch(m, _flag(m, getattr(p, "rope", 0.0)), lambda: self._rows(m, x, g, p, n, False),
                       lambda: self._rows(m, x, g, p, n, True))

    def _rows(self, m, x, g, p, n, rope):
        return _branch(m, _cap_flag(m, p), lambda: self._rows_c(m, x, g, p, n, rope, False),
                       lambda: self._rows_c(m, x, g, p, n, rope, True))

    def _rows_c(self, m, x, g, p, n, rope, cap):
        c = _Ctx(m, x, p, rope, cap=cap)
        if c.win is not None:
            raise DomainError("attention: the per-row-length terms (rows) of a sliding-window mask are not "
                              "modelled (the causal position model assumes keys 0..i)")

        def at_n(fn):
            return c.at_n(fn, n)

        st = dict(A2=at_n(c.stat("A2")), Bz=at_n(c.stat("Bz")), Cz=at_n(c.stat("Cz")),
                  m1sq=0 * n, C2=0 * n)
        var, _ = _forward_moments(m, c, p, st)
        g0, g1 = Backward(g.var, 0 * g.corr), Backward(g.var, 1 + 0 * g.corr)
        bst = _backward_row_stats(m, c, at_n)
        bst.update(C2=0 * n, T2x=0 * n, PP=0 * n, rvT2x=0 * n)
        t = _backward_terms(m, c, p, g0, bst)           # rg = 0: the one-row terms
        avg = _backward_stats(m, c, p)
        t0, t1 = _backward_terms(m, c, p, g0, avg), _backward_terms(m, c, p, g1, avg)
        # the value path's pair-of-rows part at uniform weights: E[A_ij A_i'j] = 1/(n_i n_i')
        # for the shared keys, C2 = 1/max(n_i, n_i') averaged over the pairs of distinct rows
        L = p.L
        harm = m.sum_over_lengths(lambda k: 1 / k, L)
        tu = _backward_terms(m, c, p, g1, {**avg, "C2": 2 * (L - harm) / (L * (L - 1))})
        return {"var": var, "spread": t["val"] + t["key"], "local": t["qry"],
                "same_c": (p.L - 1) * (t["val_c"] + t["key_c"]), "same_k": (p.L - 1) * t["key_c"],
                "cross": t1["val_x"] + t1["key_x"], "cross_k": t1["key_x"], "cross_u": tu["val_x"],
                "cross_c": t1["val_c"] + t1["key_c"] - t0["val_c"] - t0["key_c"],
                "qry_c": t1["qry_c"]}


def row_moments(params: dict, x: Forward, n=None) -> np.ndarray:
    """The rule's one-row statistics A2 = E sum_j P_ij^2 and m1 = E sum_j P_ij z_ij (z the row's
    token-varying logits, so m1 / n = E[P_ij z_ij] per key), averaged over the row logit
    variance exactly as in its forward and backward, at attention input ``x``: shape (2,)
    bidirectional (every row has L keys), (2, L) causal (row lengths n = 1..L).  Before
    attention dropout.  Used by the whole-model predictor's Post-LN gradient shares
    (:func:`euler_terms`).  Causal: ``n`` the row lengths to
    evaluate instead of 1..L (a graded position grid's)."""
    from sigprop.backend import numeric as m
    p = _RULE.param_values(params)
    xx = Forward(np.float64(x.mean), np.float64(x.var), np.float64(x.corr))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if p.rope:     # rotary positions: the statistics of the token-varying part (Ctx.stat)
            c = _Ctx(m, xx, p, rope=True, cap=bool(p.softcap))
            if not p.causal:
                return np.array([float(c.row(c.stat(nm))) for nm in ("A2", "m1")])
            n = np.arange(1.0, int(p.L) + 1) if n is None else np.asarray(n, dtype=float)
            return np.stack([np.broadcast_to(np.asarray(c.at_n(c.stat(nm), n), dtype=float), n.shape)
                             for nm in ("A2", "m1")])
        c = _Ctx(m, xx, p, cap=bool(p.softcap))
        if not p.causal:
            return np.array([float(c.row(c.stat(nm))) for nm in ("A2", "m1")])
        n = np.arange(1.0, int(p.L) + 1) if n is None else np.asarray(n, dtype=float)
        return np.stack([np.broadcast_to(np.asarray(c.at_n(c.stat(nm), n), dtype=float), n.shape)
                         for nm in ("A2", "m1")])



def pair_law_mean(params: dict, x: Forward, newton: bool = True) -> tuple[float, float]:
    """(mean row logit variance, mean row-pair logit correlation) of the two-row statistics
    at attention input ``x`` (``_Ctx.pair_law``; rotary positions: its shifted variance and
    rotated correlation).  ``newton=False`` (rotary positions): the shifted variance before
    the fourth-cumulant Newton step of ``_Ctx.pair_variance`` (four row integrals, ~8 ms;
    without rotary positions there is no such step and both are the same)."""
    from sigprop.backend import numeric as m
    p = _RULE.param_values(params)
    xx = Forward(np.float64(x.mean), np.float64(x.var), np.float64(x.corr))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        c = _Ctx(m, xx, p, rope=bool(p.rope), check=False, cap=bool(p.softcap))
        v, _, rho, _ = c.pair_law(newton)
    return float(np.asarray(v, float).ravel()[0]), float(np.asarray(rho, float).ravel()[0])


def pair_length_ratios(v: float, rho: float, lengths) -> tuple[np.ndarray, np.ndarray]:
    """(R, K) over two causal rows of n_a <= n_b keys (row i the shorter, all its keys shared
    with row i', whose further n_b - n_a keys enter only its normaliser), iid N(0, v) logits
    per row, correlated rho between the two rows on each shared key (the longer row's extra
    keys independent of row i's):

    * R = n_a n_b E[P_ij P_i'j] for one shared key j, = n_b C2(n_a, n_b) with the rule's
      C2 = E sum_{j < n_a} P_ij P_i'j at two given lengths: the value path's pair-of-rows weight
      relative to uniform weights (1 with a one-key row; to first order 1 + rho v (1 - 1/n_a));
    * K = n_b T2x(n_a, n_b), T2x = E tr(A_i A_i') (A = diag(P) - P P^T, over the shared keys):
      the key path's, relative to its uniform-weight value (1 - 1/n_a, the same first order).

    Attention dropout leaves both: the masks of two different rows are independent.
    Symmetric matrices over the given ``lengths`` (positive integers; the diagonal: two rows
    of equal length sharing every key).  Exact double integrals (the rows' normalisers by
    1/S = int exp(-t S) dt, t = e^u, as :func:`_two_row`), one integration for every pair."""
    from sigprop.backend import numeric as m
    lengths = np.asarray(lengths, dtype=float)
    k = len(lengths)
    pairs = [(a, b) for a in range(k) for b in range(a, k)]
    R, K = np.ones((k, k)), np.zeros((k, k))
    v = max(float(v), 1e-12)
    rho = float(np.clip(rho, -0.999, 0.999))
    g0, g1, g2 = _gs(m)
    inner = [(g0, g0), (g1, g1), (g1, g2), (g2, g1), (g2, g2), (None, g0)]
    sd = np.sqrt(v)
    lo = -np.log(max(lengths.max(), 2.0)) - v / 2 - 3 * sd - 18.0

    def outer(u, w, S):
        phi2, pq, pq2, p2q, p2q2, phi1 = S
        phi2 = np.maximum(phi2, 0.0)                     # (interpolation may undershoot 0)
        l2 = np.log(np.maximum(phi2, 1e-300))
        l1 = np.log(np.maximum(phi1, 1e-300))
        one = _t2x_one(pq, pq2, p2q, p2q2)
        two = pq * pq
        res = []
        for a, b in pairs:
            na, nb = lengths[a], lengths[b]
            if na == 1:          # a one-key row: P = 1, A = 0
                res.append(np.exp((nb - 1) * l1) * pq)
                res.append(0 * pq)
                continue
            e = na * np.exp((na - 2) * l2 + (nb - na) * l1)
            res.append(e * phi2 * pq)
            res.append(e * (phi2 * one + (na - 1) * two))
        return tuple(res)

    vals = m.integrate_smoothed2(outer, inner, v, rho, window=(lo, 8.5 * sd + 5.0))
    for t, (a, b) in enumerate(pairs):
        R[a, b] = R[b, a] = lengths[b] * float(vals[2 * t])
        K[a, b] = K[b, a] = lengths[b] * float(vals[2 * t + 1])
    return R, K


#: the smallest per-key logit variance, relative to the row's, that :func:`key_weights` uses
#: (the first-order scales of a strongly structured stream could fall below 0)
KEY_REL_MIN = 0.02
#: :func:`key_weights` expands the moments to second order in the keys' variance offsets
#: where the largest offset (in units of logit variance) is at most this
KEY_SERIES_MAX = 0.1
#: below this largest offset the weights are 1 (exchangeable keys): they would differ from 1 by
#: about half of it, below the accuracy of the statistics tables (1e-4)
KEY_EXCHANGEABLE_MAX = 1e-5
#: the relative step of the finite differences in :func:`_key_weights_series`
_KEY_FD_STEP = 0.1


def _key_weights_series(dv: np.ndarray, counts: np.ndarray, s0: float, node_coefs=None):
    """:func:`key_weights` to second order in the per-key variance offsets ``dv`` (rows, keys)
    about the common row variance ``s0``.  By exchangeability, a moment of key j's weight in a
    row of n keys (n = the row's counts' sum) expands as

        h + A x_j + B R1 + A2 x_j^2/2 + C x_j R1 + B2 R2/2 + E (R1^2 - R2)/2,

    x_j = dv_j, R1 = D1 - x_j and R2 = D2 - x_j^2 the sums of the other keys' offsets and
    squared offsets (D1, D2 over the whole row, each key times its count), with one set of
    coefficients per row length: the first and second derivatives in key j's own variance and
    another key's, and the mixed ones (j and another; two others), from :func:`_series_coefs`:
    the cost does not grow with the number of keys.  The
    error is third order in the offsets.  Evaluated as a quadratic in x_j with per-row
    coefficients (R1 and R2 substituted), divided by h; rows of one key (and h <= 0) give 1.
    Returned as one array (2, rows, keys): the two moments' weights."""
    n, many = _row_lengths(counts)
    cd = counts * dv
    D1 = cd.sum(axis=1)
    cd *= dv
    D2 = cd.sum(axis=1)
    q = _series_coefs(s0, n, node_coefs)                                   # (2, 7, rows)
    c = np.stack([q[:, 0] + D1 * (q[:, 1] + D1 * q[:, 3]) + D2 * q[:, 2], q[:, 4] + q[:, 5] * D1, q[:, 6]])
    ok = many & (q[:, 0] > 0)
    c *= ok / np.where(ok, q[:, 0], 1.0)
    c = np.where(ok, c, _NO_SERIES)                                          # (3, 2, rows)
    out = c[2][:, :, None] * dv
    out += c[1][:, :, None]
    out *= dv
    out += c[0][:, :, None]
    return out


_ROW_LENGTHS = memo.Kind("attention.row_lengths", 64,
                         "(row lengths, rows of more than one key) per read-only ``counts`` array")


def _row_lengths(counts: np.ndarray):
    """(n, n > 1) of rows whose keys ``counts`` says: memoised for a read-only array (a
    position grid's quadrature weights, the same at every layer)."""
    def compute():
        n = counts.sum(axis=1)
        return n, n > 1.0 + 1e-9

    if counts.flags.writeable:
        return compute()
    return _ROW_LENGTHS.for_object(counts, compute)


#: the quadratic's coefficients (1, 0, 0) of a row that keeps the weights at 1
_NO_SERIES = np.array([1.0, 0.0, 0.0])[:, None, None]
#: the log-variance step of the nodes at which :func:`_series_coefs` evaluates its coefficients
_KEY_COEF_STEP = 0.2


def _quadratic(c: np.ndarray) -> np.ndarray:
    """The series' coefficients (f0, A, B, A2, C, B2, E) (axis -2) as those of the quadratic
    in x_j of :func:`_key_weights_series`: the moment is q0 + q1 D1 + q2 D2 + q3 D1^2
    + (q4 + q5 D1) x_j + q6 x_j^2 with (q0 .. q6) = (f0, B, (B2 - E)/2, E/2, A - B, C - E,
    A2/2 - C - B2/2 + E) (R1 = D1 - x_j and R2 = D2 - x_j^2 substituted)."""
    f0, A, B, A2, C, B2, E = np.moveaxis(c, -2, 0)
    return np.stack([f0, B, (B2 - E) / 2, E / 2, A - B, C - E, A2 / 2 - C - B2 / 2 + E], axis=-2)


def _series_coefs(s0: float, n: np.ndarray, node_coefs=None):
    """The coefficients of :func:`_key_weights_series` for rows of lengths ``n`` (an array) at
    the common variance ``s0``: for E[P_j] and E[P_j^2], the quadratic's (q0 .. q6)
    (:func:`_quadratic`), each an array over the rows.  Computed at nodes _KEY_COEF_STEP apart
    in log s (memoised per node and row lengths: consecutive layers of a deep model share them)
    and interpolated in log s0 (cubic Lagrange through the four nearest nodes); shape (2, 7,
    rows).  ``node_coefs(k, nkey)``: the series coefficients (f0, A, B, A2, C, B2, E) at node k
    (default :func:`_series_coefs_at`; the same numbers, e.g. kept on disk)."""
    x = math.log(max(s0, 1e-300)) / _KEY_COEF_STEP
    k0 = int(math.floor(x)) - 1
    t = x - k0
    key = np.ascontiguousarray(n, dtype=float).tobytes()
    at = _series_coefs_at if node_coefs is None else node_coefs
    nodes = _SERIES_NODES.get((k0, key, at),            # (4, 2 * 7 * rows)
                              lambda: np.stack([_quadratic(at(k0 + j, key)) for j in range(4)]).reshape(4, -1))
    from sigprop.rules.softmax_moments import cubic_weights
    return (np.array(cubic_weights(t)) @ nodes).reshape(2, 7, -1)


_SERIES_NODES = memo.Kind("attention.series_nodes", 64,
                          "the four nodes' quadratic coefficients of :func:`_series_coefs`, stacked and "
                          "flattened, per (first node, row lengths, source of the node coefficients)")


@memo.memoised(memo.Kind("attention.series_coefs_at", 4096, ":func:`_series_coefs_at` per (node, row lengths)"))
def _series_coefs_at(k: int, nkey: bytes):
    """:func:`_series_coefs` at the node s = exp(k _KEY_COEF_STEP) for the row lengths packed in
    ``nkey``: finite differences (relative step _KEY_FD_STEP) of the independent-row moments on
    four-class rows [j, k, l, the other n - 3] (shorter rows: the classes they have), all in
    one call."""
    from sigprop.rules.softmax_moments import independent_row_moments
    n = np.frombuffer(nkey, dtype=float)
    s0 = math.exp(k * _KEY_COEF_STEP)
    R = len(n)
    h = _KEY_FD_STEP * s0
    pts = [(0, 0, 0), (1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (1, 1, 0), (1, -1, 0), (-1, 1, 0),
           (-1, -1, 0), (0, 1, 1), (0, 1, -1), (0, -1, 1), (0, -1, -1)]
    S = np.concatenate([np.stack([np.full(R, s0 + h * p[0]), np.full(R, s0 + h * p[1]),
                                  np.full(R, s0 + h * p[2]), np.full(R, s0)], axis=1) for p in pts])
    Cn = np.tile(np.stack([np.ones(R), np.clip(n - 1.0, 0.0, 1.0), np.clip(n - 2.0, 0.0, 1.0),
                           np.maximum(n - 3.0, 0.0)], axis=1), (len(pts), 1))
    out = []
    for e in independent_row_moments(S, Cn):
        f = e[:, 0].reshape(len(pts), R)
        f0 = f[0]
        A = (f[1] - f[2]) / (2 * h)
        B = (f[3] - f[4]) / (2 * h)
        A2 = (f[1] - 2 * f0 + f[2]) / h**2
        B2 = (f[3] - 2 * f0 + f[4]) / h**2
        C = (f[5] - f[6] - f[7] + f[8]) / (4 * h * h)
        E = (f[9] - f[10] - f[11] + f[12]) / (4 * h * h)
        out.append(np.stack((f0, A, B, A2, C, B2, E)))
    return memo.frozen(np.stack(out))


def key_logit_vars(params: dict, x: Forward) -> tuple[float, float]:
    """(v_tok, v_common): the row logit variance of the token-varying part that carries the
    stream's per-key structure (the mean row logit variance; with QK-norm or rotary positions
    the rule's s_mean), and the rotary key-shared part vsh (1 - kbar(L)), which every key takes
    on its own (0 without rotary positions); see :func:`key_weights_and_offset`."""
    if not params.get("qk_norm", 0) and not params.get("rope", 0.0):
        return mean_row_logit_var(params, x), 0.0
    from sigprop.backend import numeric as m
    c = _Ctx(m, Forward(float(x.mean), float(x.var), float(x.corr)), _RULE.param_values(params),
             rope=bool(params.get("rope", 0.0)), check=False)
    return float(c.s_mean), (float(c.vsh * (1 - c.kbL)) if params.get("rope", 0.0) else 0.0)


def key_offset(v_tok: float, rel: np.ndarray) -> float:
    """The largest per-key logit offset v_tok max|max(rel, KEY_REL_MIN) - 1| (logit-variance
    units) of the relative per-key variances ``rel`` (:func:`key_weights_and_offset`)."""
    rel = np.asarray(rel, dtype=float)
    return float(v_tok) * (float(np.abs(np.maximum(rel, KEY_REL_MIN) - 1.0).max()) if rel.size else 0.0)


def key_weights(params: dict, x: Forward, rel: np.ndarray, counts: np.ndarray, node_coefs=None):
    """:func:`key_weights_and_offset`'s weights alone."""
    return key_weights_and_offset(params, x, rel, counts, node_coefs)[0]


def key_weights_and_offset(params: dict, x: Forward, rel: np.ndarray, counts: np.ndarray, node_coefs=None,
                           logit_vars=None):
    """(weights, offset): the per-key weights below and the largest per-key logit offset
    v max|rel - 1| (logit-variance units) that chose their regime.

    Causal rows whose keys' logits have variances of their own: (w1, w2), each (rows, keys)
    (a pair of arrays, or one array of shape (2, rows, keys)),
    w1 = n_i E[P_ij] (the mean attention weight of key j in row i over the uniform 1/n_i) and
    w2 = E[P_ij^2] over the exchangeable row's E[P^2] = A2(n_i)/n_i.  Both are 1 for
    exchangeable keys, which the rule's statistics assume.

    ``rel[i, j]``: the variance of key j's token-varying logit in row i relative to the row's
    mean row logit variance (the rule's v at input ``x``): for a stream whose token
    correlation is r + S_jk over pairs of positions (S the deviation from the mean r), the
    logits of a row have covariance v (I + S / (1 - r)) up to parts shared by the row; an
    additive fit S_jk ~ mu_i + b_j + b_k over the row's key pairs, whose additive parts are
    shifts the softmax ignores, leaves independent logits with variances
    v (1 + (mu_i - 2 m_ij) / (1 - r)), m_ij the mean of S_jk over the row's other keys and
    mu_i its mean over the row's pairs (exact for two keys and for a constant S; the caller,
    sigprop.model.profile.key_logit_scales, computes it).  ``counts[i, j]``: how many keys of
    row i the entry stands for (1 for every key of the row; a position grid's quadrature
    weights on its nodes).

    The moments are those of independent Gaussian logits with these variances
    (:func:`sigprop.rules.softmax_moments.independent_row_moments`), each over the same rows
    with every key at the row's own variance, so S = 0 gives exactly 1.  Assumptions: the
    row logit variance at its mean (the rule averages its statistics over the row-to-row law;
    here only the ratios are taken); QK-norm and rotary positions: the token-varying part
    (the rule's s_mean) carries the per-key scales, the rotary key-shared part
    vsh (1 - kbar(L)) stays common to every key.  ``node_coefs``: where the series
    coefficients at their log-variance nodes come from (:func:`_series_coefs`);
    ``logit_vars``: :func:`key_logit_vars` where the caller has it."""
    from sigprop.rules.softmax_moments import independent_row_moments
    rel = np.maximum(np.asarray(rel, dtype=float), KEY_REL_MIN)
    counts = np.asarray(counts, dtype=float)
    v_tok, v_common = key_logit_vars(params, x) if logit_vars is None else logit_vars
    if not v_tok > 0:
        return (np.ones(rel.shape), np.ones(rel.shape)), 0.0
    rel1 = rel - 1.0
    offset = key_offset(v_tok, rel)
    if offset <= KEY_EXCHANGEABLE_MAX:
        return (np.ones(rel.shape), np.ones(rel.shape)), offset
    if offset <= KEY_SERIES_MAX:
        rel1 *= v_tok
        return _key_weights_series(rel1, counts, v_tok + v_common, node_coefs), offset
    tot = counts.sum(axis=1, keepdims=True)
    e1, e2 = independent_row_moments(v_tok * rel + v_common, counts)
    h1, h2 = independent_row_moments(np.full(tot.shape, v_tok + v_common), tot)
    with np.errstate(divide="ignore", invalid="ignore"):
        w1 = np.where(h1 > 0, e1 / h1, 1.0)
        w2 = np.where(h2 > 0, e2 / h2, 1.0)
    return (w1, w2), offset


def rope_offset_ratio(params: dict, t) -> np.ndarray | None:
    """kappa(t) / kbar(L) at key offsets ``t`` (an array), or None without rotary positions:
    kappa(t) = (2/dh) sum_i cos(t theta_i) is the correlation of a rotated direction with itself
    rotated by t positions, kbar(L) its mean over the ordered pairs of distinct positions of a
    row of L keys.  The rule multiplies the key path's within-row covariance (two keys of one
    row: the row's query rotated by the two offsets, q^T R_(j - j') q) and the query path's
    covariance of two rows (one key rotated by the two offsets, k^T R_(j - j') k) by kbar(L);
    at a pair of positions j, j' the factor is kappa(j - j') instead: for neighbouring
    positions close to 1, for distant ones below the mean."""
    base = params.get("rope", 0.0)
    if not _rope_on(base):
        return None
    base = _rope_key(base)
    dh = float(params["d_head"])
    theta, mask = _rope_freqs(None, base, dh)
    t = np.asarray(t, dtype=float)
    kap = 2 / dh * np.sum(np.cos(t[..., None] * theta) * mask, axis=-1)
    return kap / float(_kappa_bar(None, float(params["L"]), base, dh))


def value_gain(p: dict) -> float:
    """The value path's gain d v_std^2 H d_head o_std^2 (floats; ``p`` the rule's parameters as
    a dict): the variance of one feature of W_o W_v x (all heads, no biases) per unit second
    moment E x_i^2 of the input's features, x one token (W_v: d -> H d_head, W_o: H d_head -> d,
    iid zero-mean entries).  Uniform attention over keys whose shared second moment is c2 passes
    this gain times c2, so it is also the gain of the value path on the stream's covariance
    over positions."""
    return p["d"] * p["v_std"] ** 2 * p["n_heads"] * p["d_head"] * p["o_std"] ** 2


def at_unit_value_gain(p: dict) -> dict:
    """The parameters ``p`` (a dict) with the value path at unit gain (:func:`value_gain` 1:
    v_std = 1/sqrt(d), o_std = 1/sqrt(H d_head)), where the rule is homogeneous of degree 2 in
    v_std o_std: without value/output biases every output moment and every backward path
    (and every per-row term of :meth:`Attention.rows`) carries v_std^2 o_std^2 as a factor,
    so layers that differ only in those scales share these parameters up to that factor;
    ``p`` itself where a bias breaks the homogeneity."""
    if p.get("v_bias_std", 0.0) or p.get("o_bias_std", 0.0):
        return p
    return {**p, "v_std": 1.0 / np.sqrt(p["d"]), "o_std": 1.0 / np.sqrt(p["n_heads"] * p["d_head"])}


def value_token_moments(p: dict, x: Forward):
    """The attention branch's hidden layer, as a norm on the branch output sees it
    (rules.layernorm.branch_output_terms): (its units' per-token statistics,
    rules.base.TokenMoments; its width).  That layer is the value projection W_v x (width
    kv_heads d_head; the linear rule's statistics: Gaussian entries) at the branch input
    ``x``; the token's own input norm is taken not to reach it (the values are averaged over
    the tokens: beta_b = beta_a = 0).  The attention dropout is not modelled here."""
    from sigprop.backend import numeric
    from sigprop.rules.base import REGISTRY
    lin = REGISTRY["linear"]
    width = p.get("kv_heads", p["n_heads"]) * p["d_head"]
    t = lin.token_moments(numeric, x, lin.param_values(dict(d_in=p["d"], d_out=width, w_std=p["v_std"],
                                                            b_std=p["v_bias_std"])))
    return t._replace(beta_b=0.0, beta_a=0.0), width


class EulerTerms(NamedTuple):
    """The attention branch's Euler terms at a Post-LN residual unit (:func:`euler_terms`), per
    unit variance of the gradient g below the norm and in units of the stream variance: per
    position (arrays) or averaged (floats)."""

    shared: object        # E (x_t . g_x,t)^2 / b^2, the parts along token-shared vectors
    own: object           # ... the token-specific parts
    cross_shared: object  # E (sum_s g_s . E_st)(g_t . F_t) / b^2, token-shared part
    cross_own: object     # ... token-specific part


def _suffix(a: np.ndarray) -> np.ndarray:
    """sum_{s >= t} a_s for every t (a reversed cumulative sum, as total - prefix + entry)."""
    c = np.cumsum(a)
    c = c[-1] - c
    c += a
    return c


def _right_of_diagonal(W: np.ndarray, f: np.ndarray) -> np.ndarray:
    """sum_{s > t} W_ts f_s for every t (W symmetric: the row right of the diagonal)."""
    C = np.cumsum(W * f, axis=1)
    return C[:, -1] - np.diag(C)


def euler_terms(p: dict, x: Forward, rows, rg: float, W: np.ndarray | None = None, grid=None,
                p_hidden: float = 0.0) -> EulerTerms:
    """The attention's part of the Post-LN gradient split, x' = N(z), z = a x + b
    Dropout_h(F(x)), F this attention (floats; ``p`` the rule's parameters as a dict; ``x``
    its input state, actual mean and variance; ``rows`` = (A2, m1) from :func:`row_moments`,
    per row length when causal; ``rg`` the token correlation of the gradient g = g_z below the
    norm; causal: ``W`` its covariance over positions (mean diagonal 1) and ``grid`` a graded
    position grid (``sigprop.model.positions``: its representative row lengths ``n``, weighted
    suffix sums and means) or None for every position; ``p_hidden`` the hidden dropout on F).
    The residual weights and the projection off z come in
    :func:`sigprop.rules.residual.post_norm_attention`.

    Share.  Per token t, g_t is orthogonal to z_t, so x_t . g_x,t = a x_t . g_t + b x_t .
    (J^T g)_t = b [sum_s g_s . E_st - g_t . F_t] exactly, with E_st = J_st x_t =
    d/de F_s(x_t -> (1 + e) x_t) the response of output token s to scaling input token t alone
    (Euler's identity per token; the position-wise case is an FFN's D = F - J x).  Attention:
    F_s = sum_h Wo_h sum_j A_sj (Wv_h x_j + bv) + bo; the value path gives E_st = A_st Wo Wv
    x_t; the key of column t (logit w_s = q_s . Wk x_t / sqrt(dh) in every row s) gives
    A_st w_s Wo (V_t - sum_j A_sj V_j); the query of row t a term of relative size (row logit
    variance) / n, dropped.  Averaging over Wv, Wo (E[(b_s . x_j)(b_s' . x_j')] with
    b_s = Wv^T Wo^T g_s is dh sv^2 so^2 (g_s . g_s')(x_j . x_j') per head) gives
    E (x_t . g_x,t)^2 = b^2 gamma_v d g2 v_x [S2 T1 - 2 T2 + T3] with gamma_v =
    :func:`value_gain`,
        T1 = sum_{s,s'} E[A_st A_s't] W~_ss',  T2 = sum_{s,j} E[A_st A_tj] W~_st X_tj,
        T3 = W~_tt sum_{j,j'} E[A_tj A_tj'] X_jj',
    X_jj' = c2 + tau delta_jj' (the stream's normalised token covariance, c2 = r + mu^2/v_x,
    tau = 1 - r, S2 = 1 + mu^2/v_x), W~ = W with its diagonal over (1 - p_hidden) (the hidden
    dropout mask multiplies g).  The biases add W~_tt (H dh so^2 sbv^2 E sum A + sbo^2) / v_x
    (they pair with g_t alone).  With E A_sj = 1/n_s, E sum_j A_sj^2 = A2/(1-p) and
    E (sum_j A_sj)^2 = 1 + p A2/(1-p) (p the attention dropout).
    Key path.  Its mean: E[A_st w_s] = m1(n_s) / n_s (m1 = E sum_j P_j z_j, ~ the row logit
    variance), so in the pairing of g_s with x_t's token-specific part the column weight 1/n_s
    becomes (1 + m1_s)/n_s (T1u, and T2's off-diagonal part); its fluctuation and that of the
    column sum sum_s A_st (first order in the logits: rows s, s' share key t, so their weights
    are correlated through the queries' covariance Q_ss') add Lam (K_u c2 + (K_x + 3 K_u) tau),
    Lam = sum_{s,s'} W~_ss' Q_ss' phi_s phi_s' / (n_s n_s'), K_x, K_u the key variance from
    x_t and from its token-specific part, phi_s^2 = 1 - 1/n_s (a one-key row has no logit
    effect).  When the gradient tokens are correlated like the stream's (W ~ X ~ 1 1^T:
    collapse) the terms cancel (the attention then averages a shared value, homogeneous of
    degree 1 in each token's share); with rg = 0 the bracket is T3 ~ v_F / gamma_v.

    Returned (per unit g2 and v_x): ``shared`` = gamma_v c2 (T1 - 2 T2 + T3 + Lam K_u) + biases
    and ``own`` = gamma_v tau (T1u - 2 T2u + T3u + Lam (K_x + 3 K_u)), the token-shared and
    token-specific parts of the bracket; ``cross_shared`` = gamma_v c2 T2, ``cross_own`` =
    gamma_v tau T2u, those of E[(sum_s g_s . E_st)(g_t . F_t)] that give the skip-branch cross
    term.

    Approximations: (i) the query path is dropped and the key path kept to first order in the
    logits beyond its exact mean (relative error O(logit variance^2)); (ii) attention weights
    of different rows independent (E[A_st A_s't] = 1/(n_s n_s'), the rule's C2 = 1/L): error
    O(rho v) in the rg-carried terms, v the row logit variance; (iii) E A_tt sum_j A_tj =
    E (sum A)^2 / n (exchangeable keys); (iv) g isotropic within the complement of 1 and z_t
    and independent of this sublayer's weights but for that orthogonality; (v) the key bias is
    taken as 0 (it does not cancel in a single-key logit change); (vi) the cross term keeps the
    value path only."""
    L, pa, ph = p["L"], p["p"], p_hidden
    if W is None and windows.active(int(L), int(p.get("window", 0)), bool(p.get("causal", 0))):
        # a bidirectional sliding window: the sums over the rows that see key t, taken at the
        # mean row length (the rows at the ends are shorter; first order in their share)
        L = windows.window(int(L), int(p["window"]), False).mean_len
    H, dh, d = p["n_heads"], p["d_head"], p["d"]
    gv = value_gain(p)
    vx = float(x.var)
    mu2 = x.mean * x.mean / vx if x.mean else 0.0
    S2, c2, tau = 1.0 + mu2, x.corr + mu2, 1.0 - x.corr
    # query covariance per component (same token, different tokens) and the key's variance
    # from x alone and from its token-varying part (no key bias: see (v) above)
    Qd = d * p["q_std"] ** 2 * vx * S2 + p["q_bias_std"] ** 2
    Qo = d * p["q_std"] ** 2 * vx * c2 + p["q_bias_std"] ** 2
    Kx = d * p["k_std"] ** 2 * vx * S2
    Ku = d * p["k_std"] ** 2 * vx * tau
    gg, q = 1.0 / (1.0 - ph), pa / (1.0 - pa)
    A2, m1 = np.asarray(rows, dtype=float)
    A2d, E1 = A2 / (1.0 - pa), 1.0 + q * A2
    if W is None:                                  # every row has L keys, W flat
        dg, nn = 1.0, float(L)
        om = 1.0 + m1                              # n x the mean column weight of the u_t pairing
        T1 = gg * A2d + rg * (L - 1) / L
        T1u = (gg * A2d + rg * (L - 1) / L) * om * om
        Lam = (gg * Qd + rg * (L - 1) * Qo) / L * (1.0 - 1.0 / L)
        k = rg * (L - 1) / L                       # sum_{s != t} E A_st W_st
        ku = k * om
    elif grid is not None:
        # the same sums on the graded grid: weighted over blocks
        G = grid
        nn = G.n
        inv = 1.0 / nn
        om = (1.0 + m1) * inv
        dg = np.diag(W)
        k, ku = G.right_of_diagonal(W, inv), G.right_of_diagonal(W, om)
        off = 2.0 * G.suffix_h(k)
        T1 = gg * G.suffix_h(dg * A2d) + off
        T1u = gg * G.suffix_h(dg * A2d * (1.0 + m1) ** 2) + 2.0 * G.suffix_h(ku * (1.0 + m1))
        wl = inv * np.sqrt(1.0 - inv)
        kl = G.right_of_diagonal(W, wl)
        Lam = gg * Qd * G.suffix(dg * wl * wl) + Qo * 2.0 * G.suffix(kl * wl)
    else:
        nn = np.arange(1.0, L + 1)
        inv = 1.0 / nn
        om = (1.0 + m1) * inv
        dg = np.diag(W)
        # k_t = sum_{s > t} W_st / n_s (W symmetric: row t right of the diagonal); the
        # off-diagonal sums sum_{s != s' >= t} W_ss' f_s f_s' = 2 sum_{s >= t} f_s sum_{s' > s} W_ss' f_s'
        k, ku = _right_of_diagonal(W, inv), _right_of_diagonal(W, om)
        off = 2.0 * _suffix(k * inv)
        T1 = gg * _suffix(dg * A2d * inv) + off
        T1u = gg * _suffix(dg * A2d * (1.0 + m1) ** 2 * inv) + 2.0 * _suffix(ku * om)
        # the logit fluctuations of row s move F_s by (V_t - mean V), of squared size
        # tau (1 - 1/n_s): weight phi_s = sqrt(1 - 1/n_s) (a one-key row has none)
        wl = inv * np.sqrt(1.0 - inv)
        kl = _right_of_diagonal(W, wl)
        Lam = gg * Qd * _suffix(dg * wl * wl) + Qo * 2.0 * _suffix(kl * wl)
    T2c = gg * dg * E1 / nn + k
    T2t = gg * dg * A2d / nn + ku / nn
    T3c, T3t = gg * dg * E1, gg * dg * A2d
    bias = gg * dg * (H * dh * p["o_std"] ** 2 * p["v_bias_std"] ** 2 * E1 + p["o_bias_std"] ** 2) / vx
    return EulerTerms(gv * c2 * (T1 - 2 * T2c + T3c + Lam * Ku) + bias,
                      gv * tau * (T1u - 2 * T2t + T3t + Lam * (Kx + 3 * Ku)),
                      gv * c2 * T2c, gv * tau * T2t)

def _forward_moments(m, c, p, st):
    """Output variance and covariance from the (row- and pair-averaged, or per-row) statistics."""
    q = p.p / (1 - p.p)
    A2, Bz, Cz, m1sq, C2 = st["A2"], st["Bz"], st["Cz"], st["m1sq"], st["C2"]
    sv2, sbv2 = p.v_std**2, p.v_bias_std**2
    EO2 = sv2 * (p.d * c.c2 * (1 + q * A2) + c.tau * (p.d - 1) * A2 / (1 - p.p)
                 + c.tau * (Bz + q * Cz)) + sbv2 * (1 + q * A2)
    EOO = sv2 * (p.d * c.c2 + c.tau * (p.d - 2) * C2 + c.tau * (c.ra * m1sq + 2 * C2)) + sbv2
    gain = p.n_heads * p.d_head * p.o_std**2
    return gain * EO2 + p.o_bias_std**2, gain * EOO + p.o_bias_std**2


def _backward_stats(m, c, p):
    """Row- and pair-averaged statistics of the backward."""
    st = _backward_row_stats(m, c, c.row)
    # soft cap: the pair law's variance and correlation are the capped rows' Gaussian
    # equivalents; the weight is in the pre-cap logits' units and the key-path pair terms carry
    # the capped row's f'^2 (Ctx._cap_pair)
    rT2, vs, bc = (1.0, 1.0, 1.0)
    if c.capped:
        c.pair_law()
        rT2, vs, bc = c.cap_pair
    if c.rope:
        # the key path's two-row weight is the cosine of the two rows' key-gradient directions,
        # r_a kq(i - k), regressed on the pair's logit correlation rho (Ctx.pair_law)
        _, beta, _, _, _ = c.shifted(c.Lr)
        c.pair_law()
        w0, slope, mean = c.pair_dir
        weight = lambda v, rho: (w0 + slope * (rho / bc - mean)) * beta * v * vs  # noqa: E731
    else:
        weight = lambda v, rho: rho / bc * v * vs  # noqa: E731
    st.update(C2=c.pair("C2"), T2x=rT2 * c.pair("T2x"), rvT2x=rT2 * c.pair("T2x", weight=weight))
    st["PP"] = st["A2"] ** 2 if c.win is not None else m.choose(p.causal, lambda: c.pair("PP"), lambda: st["A2"] ** 2)
    return st


def _backward_row_stats(m, c, avg):
    """The one-row statistics of the backward, each averaged by ``avg`` (row average or per length)."""
    names = ("A2", "T2", "Ajj2", "Ra", "vT2") + (("T2kc",) if c.rope else ()) + (("Sckc", "vSc") if c.capped else ())
    if c.has_k4():       # QK-norm (its fourth cumulant marks it): the projection's statistic
        names += ("vT2e2",)
    st = {k: avg(c.stat(k)) for k in names}
    st["trA2"] = avg(c.stat("trA2")) if (c.rope or c.capped) else 1 + avg(c.stat("trA2m1"))
    return st


def _qk_norm_paths(m, c, p, st, gt, tr, qry, key, key_x, qry_c, key_c):
    """The QK-norm Jacobian on the query and key paths (see ``_backward_terms``).  Without
    the norm, E|sum_j dS_ij k_j|^2 / dh = sum_j E dS_ij^2 |k_j|^2 / dh (iid keys); with it every
    key has norm sqrt(dh), of which s_ij^2 lies along the query, and the projection removes
    exactly that component: sum_j E dS_ij^2 (dh - s_ij^2) / dh = T2 - E sum_j dS_ij^2 s_ij^2 / dh,
    s_ij = z_ij + c_i (z the logit the softmax sees, variance v; c_i the key-shared part
    constant over the row, variance vc, which cancels in the softmax but not here):
    E dS^2 s^2 = v T2e2 + vc T2.  Exact for iid keys on the sphere (rk = 0); the key-shared
    direction's cross-key terms are left out.  The key path alike (by the rows' symmetry).
    LayerNorm also removes the constant direction (a generic 1/dh)."""
    T2 = st["T2"]
    vc = c.vsh * (c.kbL if c.rope else 1)       # the part constant over a row
    # (v T2e2 is not computed where every configuration's fourth cumulant is 0: keys fully
    # correlated, rk = 1, whose token-varying logit variance v, and with it v T2e2, is 0)
    lost = (c.is_ln * T2 + st.get("vT2e2", 0.0) + vc * T2) / p.d_head     # per unit of the generic T2
    qry = c.hq * (qry - c.tau**2 * tr * gt * lost)
    key = c.hk * (key - gt * c.s_mean * lost)
    return qry, key, c.proj * c.hk * key_x, c.proj * c.hc * qry_c, c.proj * c.hc * key_c


def _backward_terms(m, c, p, g, st):
    """The gradient variance by path (value, query, key; ``_x``: the pair-of-rows parts that
    carry the gradient correlation) and covariance by path, all heads, from the statistics."""
    L, rg, pp = p.L, g.corr, p.p
    q = pp / (1 - pp)
    sq2, sk2, sv2 = c.sq2, c.sk2, p.v_std**2
    A2, T2, trA2, Ajj2, Ra, vT2 = st["A2"], st["T2"], st["trA2"], st["Ajj2"], st["Ra"], st["vT2"]
    C2, T2x, rvT2x, PP = st["C2"], st["T2x"], st["rvT2x"], st["PP"]
    # gradient reaching one head's value/logit products
    K0 = sv2 * p.d_head * p.d * p.o_std**2 * g.var
    kr = (sv2 * p.d * c.c2 + p.v_bias_std**2) / _floor(m, p.d * sv2 * c.tau)
    gt = (1 + pp * kr) / (1 - pp)
    tr = p.d**2 * sq2 * sk2
    lb = tr / p.d
    # the a_i direction is amplified by M M^T; a QK-norm's Jacobian removes the query's own
    # direction, so there it is a generic direction
    la = _branch(m, c.norm, lambda: tr * (1 / p.d_head + (1 + c.fx) / p.d), lambda: tr / p.d)
    perp = _num(m, lambda t: m.maximum(t, 0), tr - la - lb)
    val = A2 / (1 - pp)
    val_x = rg * (L - 1) * C2
    qry = c.tau**2 * (perp * gt * T2 + la * gt * Ra
                      + lb * (trA2 + (2 - pp) / (1 - pp) * T2 + 2 * q * Ajj2 + q * kr * T2))
    key = gt * vT2
    key_x = rg * (L - 1) * rvT2x
    val_c = (1 - A2) / (L - 1) + rg * (1 - C2)
    qry_c = c.tau**2 * rg * (tr * T2x + lb * (1 - 2 * A2 + PP))
    key_c = -(key + key_x) / (L - 1)
    if c.capped:
        # soft cap: a row's gradient sum sum_j dS_ij = sum_l delta_l P_l (f'_l - sum_j P_j f'_j)
        # no longer vanishes: it meets the keys' shared part on the query path (as the rotary
        # key-shared part does), and the key gradients' column sum (sum_j dK_j = sum_i R_i a_i)
        # is no longer 0 (its row-diagonal part kept; the cross-row part, O(rg), left out)
        qry = qry + c.tau * p.d * sq2 * (p.d * sk2 * c.c2 + c.sbk2) * gt * st["Sckc"]
        key_c = -(key + key_x - gt * st["vSc"]) / (L - 1)
    if c.rope:
        # rotated keys: the key-shared part no longer cancels in sum_j dS_ij R k_j (a generic
        # direction, weight (1 - kbar) T2), and the rotation offsets decorrelate the key and
        # query gradients of different tokens by kbar
        qry = qry + c.tau * p.d * sq2 * (p.d * sk2 * c.c2 + c.sbk2) * gt * st["T2kc"]
        key_c = c.kbL * key_c
        qry_c = c.kbL * qry_c
    # QK-norm: its Jacobian projects the query and key gradients off the normalised vector
    # (and, LayerNorm, off the constant direction), and divides them by each query's and
    # key's own scale (harmonic factors hq, hk, hc: _normed).  The one-row paths lose the
    # component along the vector itself, sum_j dS_ij s_ij / sqrt(dh) (s_ij = the logit:
    # the key's component along the query): (v T2e2 + vc T2)/dh per unit, not a generic
    # 1/dh of T2 (the keys a row attends to have large logits); the pair-of-rows and
    # covariance terms a generic 1/dh
    qry, key, key_x, qry_c, key_c = _branch(
        m, c.norm, lambda: (qry, key, key_x, qry_c, key_c),
        lambda: _qk_norm_paths(m, c, p, st, gt, tr, qry, key, key_x, qry_c, key_c))
    hk = p.n_heads * K0
    return {"val": hk * val, "val_x": hk * val_x, "qry": hk * qry, "key": hk * key,
            "key_x": hk * key_x, "val_c": hk * val_c, "qry_c": hk * qry_c, "key_c": hk * key_c}


_RULE = Attention()
register(_RULE)


class AttentionPublished(Rule):
    """[TGS] single-head formulas, per head, with the output
    projection Wo applied exactly (a linear map: var and cov times H dh so2 forward, the
    gradient into the core d so2 g2).  For comparison in the validation table."""

    name = "attention-published"
    title = "Attention, published [TGS] formulas (value path only)"
    params = Attention.params
    zero_mean_input = True
    assumptions = (
        "[TGS] single-head attention formulas, applied per head; "
        "biases ignored; the causal flag is ignored (bidirectional formulas); kv_heads, qk_norm "
        "and rope are ignored (plain multi-head attention).",
        "Backward keeps only the value path (the published weakness).",
    )
    references = ("[TGS] Kedia et al. 2024, attention rule and verification code",)

    def forward(self, m, x, p):
        s2, r, L, pp = x.var, x.corr, p.L, p.p
        qk = p.q_std**2 * p.k_std**2
        sv2, d = p.v_std**2, p.d
        var_c = d * sv2 * (r * s2 + (1 / L) * ((1 - r) ** 2 * (L - 1) * d * qk * s2**3
                           + m.exp((1 - r) * d**2 * qk * s2**2) / (1 - pp)
                           * (4 * (1 - r) ** 2 * d * qk * s2**3 + (1 - r) * s2)))
        cov_c = d * sv2 * (r * s2 + (1 / L) * (2 * (1 - r) ** 2 * d * qk * s2**3 + (1 - r) * s2))
        gain = p.n_heads * p.d_head * p.o_std**2
        var = gain * var_c + p.o_bias_std**2
        cov = gain * cov_c + p.o_bias_std**2
        return Forward(0 * x.mean, var, cov / var)

    def backward(self, m, x, g, p):
        L, rg, pp = p.L, g.corr, p.p
        g2c = p.d * p.o_std**2 * g.var
        var = p.n_heads * g2c * p.d_head * p.v_std**2 * (1 + (L - 1) * rg * (1 - pp)) / (L * (1 - pp))
        cov = p.n_heads * g2c * p.d_head * p.v_std**2 * (1 + (L - 1) * rg) / L
        return Backward(var, cov / var)


register(AttentionPublished())


def qk_variances(p: dict, x: Forward):
    """(var(q), var(k)) of one query and one key component at input ``x`` without QK-norm,
    in any arithmetic (floats, arrays, sympy expressions): zero-mean weights, var = d w^2
    (s2 + mu^2) + b^2.  Their product is the logit variance (:func:`logit_var`); the solver
    solves it for the query and key stds."""
    S2 = x.var + x.mean ** 2
    vq = p["d"] * p["q_std"] ** 2 * S2 + p.get("q_bias_std", 0) ** 2
    vk = p["d"] * p["k_std"] ** 2 * S2 + p.get("k_bias_std", 0) ** 2
    return vq, vk
