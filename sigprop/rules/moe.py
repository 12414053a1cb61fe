"""Mixture-of-experts FFN (a routed sparse FFN): y = sum_{e in S} w_e E_e(x) + m(x) E_sh(x).

One rule per expert core: ``moe_reglu``, ``moe_geglu``, ``moe_swiglu`` (every expert a gated
FFN, the GLU rule of that activation followed by its down projection, no biases).  The router
r = x W_r (d_in -> n_experts, iid N(0, router_std^2)) scores the experts: softmax
(pi = softmax(r) over all of them) or sigmoid (pi_e = sigmoid(r_e)); the top_k experts by pi
are chosen (group-limited routing, DeepSeek-V3: the experts in n_group consecutive groups, a
group scored by the sum of its two largest pi, only the topk_group best groups compete); the
chosen experts' weights are pi_e, renormalised over the chosen ones where ``norm_topk``, times
``route_scale``.  A shared expert (width ``shared_d_ff``, 0 for none) is added to every token,
times sigmoid(x w_mix) where ``shared_mix`` (Qwen2-MoE's shared-expert gate).  docs/formats.md
gives the specification.

Moments (wide limit in d_in; the experts' weights independent of each other and of the
router).  With Q = s2 + mu^2 and C = r s2 + mu^2 the input's second and cross-token moments,
the router logits of one token are iid N(0, v), v = d_in router_std^2 Q, over the experts,
and a token pair's logits have correlation rho = C / Q, expert by expert.  Given the input,
expert e's output f_e is independent of the router and of every other expert, with per-unit
variance V_f and token correlation c_f (the GLU rule and the linear rule: the dense FFN of
width d_ff), so

* forward: mean 0; var = S2 V_f + M2 V_sh; token covariance R2 V_f c_f + MP V_sh c_sh, with
  the router's averages S2 = E[sum_e w_e^2], R2 = E[sum_e w_e w'_e] (w' the other token's
  weights, 0 off its chosen set) and the shared gate's M2 = E[m^2], MP = E[m m'] (1 without
  a gate; V_sh = 0 without a shared expert);
* backward, gradient G at y (variance g2, correlation rg, independent of x): through the
  experts, S2 B_f (B_f the dense expert's gradient variance at its input) and R2 B_f c_Bf
  across tokens; through the router, dx += sum_j u_j w_r,j with u_j = sum_e (G . f_e)
  dw_e/dr_j, whose per-unit variance is router_std^2 E[sum_j u_j^2] =
  (v / Q) g2 V_f J2, J2 = E[sum_{e,j} (dw_e/dr_j)^2], and across tokens
  (v / Q) g2 rg V_f c_f RJ, RJ = E[sum_{e,j} (dw_e/dr_j)(dw'_e/dr'_j)]; through the shared
  gate likewise, (v_mix / Q) g2 V_sh D2 with D2 = E[m'(s)^2] (and DP across tokens).

The router averages S2, R2, J2, RJ are expectations over n_experts Gaussian logits with a
top-k selection (no closed form): they are evaluated on fixed draws (``DRAWS`` pairs of
logit vectors from a fixed seed, common to every evaluation, so they are smooth in v and rho),
with a relative standard error below 6e-3 (measured: E 8 to 256, top 2 to 8, logit variance 0.01
to 10; largest at v about 1 without renormalisation); the pair averages R2 and RJ are
interpolated in arccos(rho) from 17 Chebyshev angles per v, within 3.5e-3 of S2 (J2) of the
direct means (measured: E 8 to 64, v 0.05 to 6, rho -0.99 to 0.999).  Where two tokens rarely
share an expert (top 1 or 2 of 64) R2 is a mean of near coin flips and its error is larger:
against 2^20 independent pairs at v = 1, rho = 0.5, R2 is 4.2% low at top 1 of 64 (softmax
over all), 2.3% (sigmoid renormalised), 1.5% and 0.7% at top 2 (over all, renormalised),
1.9% at top 8 with v = 9; fixed by the seed, so a bias rather than noise across evaluations; the shared
gate's are Gauss-Hermite quadratures.  Not modelled: terms of relative order 1/d_in (the
router weight's component along the input, through which the router and expert paths'
gradients correlate; the per-token fluctuation of the input's norm), and the per-token spread
of sum_e w_e^2 (a norm after the branch sees its mean: the rule gives the average over tokens).
Measured against the Monte Carlo (docs/validation.md, d_in 256): the output variance about 1%
low on average, at worst 4% to 5% (softmax over 64 experts, router std 1/sqrt(d_in)), all of it
the per-token spread of the input's norm at finite width (averaging the rule over that spread
matches within noise); the gradient variance 0.6% low on average, at worst 3.6%; the token
covariance up to 16% to 18% low at top 1 or 2 of 64 experts and input correlation 0.5 (a pair of
tokens more alike than average is both likelier to share an expert and more alike in its
output: a finite-width correlation the wide limit drops; 0.8% or less of the output variance).
"""

from __future__ import annotations

import math

import numpy as np

from sigprop import memo, symbols
from sigprop.rules.base import REGISTRY, Param, Rule, positive_int, register, std
from sigprop.state import Backward, Forward

for _name, _tex, _asm in (
        ("n_experts", r"E", dict(positive=True, integer=True)), ("top_k", r"k", dict(positive=True, integer=True)),
        ("router", r"c_{\mathrm{router}}", dict(nonnegative=True, integer=True)),
        ("norm_topk", r"\nu_{k}", dict(nonnegative=True, integer=True)),
        ("route_scale", r"s_{\mathrm{route}}", dict(positive=True)),
        ("n_group", r"G", dict(positive=True, integer=True)), ("topk_group", r"G_{k}", dict(positive=True, integer=True)),
        ("router_std", r"\sigma_{\mathrm{router}}", dict(nonnegative=True)),
        ("down_std", r"\sigma_{\mathrm{down}}", dict(nonnegative=True)),
        ("shared_d_ff", r"d_{\mathrm{sh}}", dict(nonnegative=True, integer=True)),
        ("shared_gate_std", r"\sigma_{\mathrm{sh,gate}}", dict(nonnegative=True)),
        ("shared_up_std", r"\sigma_{\mathrm{sh,up}}", dict(nonnegative=True)),
        ("shared_down_std", r"\sigma_{\mathrm{sh,down}}", dict(nonnegative=True)),
        ("shared_mix", r"m_{\mathrm{sh}}", dict(nonnegative=True, integer=True)),
        ("shared_mix_std", r"\sigma_{\mathrm{mix}}", dict(nonnegative=True))):
    symbols.register(_name, _tex, **_asm)

#: draws of the router logits behind the router averages (pairs of E-vectors)
DRAWS = 1 << 14
_CHUNK = 1024
#: the seed of those draws (fixed: every evaluation uses the same ones)
SEED = 20261202
ROUTERS = ("softmax", "sigmoid")

_DRAWS = memo.Kind("moe.draws", 8, "the fixed standard-normal router draws per expert count")


def _draws(E: int):
    def make():
        rng = np.random.default_rng([SEED, E])
        return rng.standard_normal((DRAWS, E)), rng.standard_normal((DRAWS, E))
    return _DRAWS.get(E, make)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _chosen(pi, k, n_group, topk_group, tied=False):
    """Boolean mask of the chosen experts per draw (rows of ``pi``); ``tied``: every score
    equal, the first k experts chosen (they lie in the first topk_group groups)."""
    N, E = pi.shape
    if tied:
        return np.broadcast_to(np.arange(E) < k, (N, E))
    score = pi
    if n_group > 1 and topk_group < n_group:
        g = pi.reshape(N, n_group, E // n_group)
        top2 = np.sort(g, axis=2)[:, :, -2:].sum(axis=2) if E // n_group >= 2 else g[:, :, 0]
        keep_g = top2 >= _kth_largest(top2, topk_group)
        score = np.where(np.repeat(keep_g, E // n_group, axis=1), pi, -np.inf)
    return score >= _kth_largest(score, k)


def _kth_largest(a, k):
    """Per row of ``a``, its k-th largest entry (a column); ties have probability 0 here."""
    E = a.shape[1]
    if k == E:
        return a.min(axis=1, keepdims=True)
    return np.partition(a, E - k, axis=1)[:, E - k:E - k + 1]


def _terms(r, k, router, norm, n_group, topk_group, tied=False):
    """Per draw, with J_ej = dw_e/dr_j = a_e delta_ej - b_e c_j (the route scale aside): the
    weights w (0 off the chosen set) and the vectors a, b, c."""
    if router == 0:                                   # softmax over every expert
        z = np.exp(r - r.max(axis=1, keepdims=True))
        pi = z / z.sum(axis=1, keepdims=True)
        mask = _chosen(pi, k, n_group, topk_group, tied)
        w = np.where(mask, pi, 0.0)
        if norm:
            w /= w.sum(axis=1, keepdims=True)
            return w, w, w, w                         # dw_e/dr_j = w_e (delta_ej - w_j), j chosen
        return w, w, w, pi                            # dpi_e/dr_j = pi_e (delta_ej - pi_j), every j
    s = _sigmoid(r)
    mask = _chosen(s, k, n_group, topk_group, tied)
    ds = np.where(mask, s * (1.0 - s), 0.0)
    w = np.where(mask, s, 0.0)
    if norm:
        z = w.sum(axis=1, keepdims=True)
        w, a = w / z, ds / z
        return w, a, w, a                              # (delta_ej s'_e - w_e s'_j) / Z, j chosen
    return w, ds, np.zeros_like(w), np.zeros_like(w)  # s'_e delta_ej


def router_stats(E: int, k: int, router: int, norm: int, n_group: int, topk_group: int, v: float, rho: float):
    """The router averages (S2, R2, J2, RJ) (module docstring) at logit variance ``v`` and
    token correlation ``rho``, unit route scale, with the standard errors of S2 and J2 as
    ``se``: a dict.  S2 and J2 (one token) are means over the fixed draws; R2 and RJ are
    interpolated in the angle theta = arccos(rho) between their means at ``ANGLES`` + 1
    Chebyshev-Lobatto angles on [0, pi] (computed once per router and v; their dependence on
    theta is smooth, and the common draws make its sampling noise smooth too: measured within
    their standard error of the direct means, tests/rules/test_moe.py)."""
    fixed = (E, k, router, norm, n_group, topk_group, float(v))
    nodes = _NODES.get(fixed, lambda: _node_values(*fixed))
    one = nodes["one"]
    if rho >= 1.0:
        return one
    t = 2.0 * math.acos(max(-1.0, float(rho))) / math.pi - 1.0
    r2, rj = _cheb(nodes["R2"], t), _cheb(nodes["RJ"], t)
    return {**one, "R2": r2, "RJ": rj}


#: the Chebyshev degree of R2 and RJ in the angle arccos(rho)
ANGLES = 16
_T = np.cos(np.pi * np.arange(ANGLES + 1) / ANGLES)             # Chebyshev-Lobatto points in [-1, 1]
_BW = np.array([(-1.0) ** j * (0.5 if j in (0, ANGLES) else 1.0) for j in range(ANGLES + 1)])
_NODES = memo.Kind("moe.angles", 256, "router averages at the Chebyshev angles, per router and v")


def _cheb(values: np.ndarray, t: float) -> float:
    """Barycentric interpolation through ``values`` at the points _T."""
    d = t - _T
    hit = np.flatnonzero(d == 0)
    if hit.size:
        return float(values[hit[0]])
    q = _BW / d
    return float((q @ values) / q.sum())


def _node_values(E, k, router, norm, n_group, topk_group, v) -> dict:
    """The averages at every angle node (rho = cos(pi (1 + t) / 2) for t in _T)."""
    rows = [direct_stats(E, k, router, norm, n_group, topk_group, v, math.cos(math.pi * (1.0 + t) / 2.0))
            for t in _T]
    one = direct_stats(E, k, router, norm, n_group, topk_group, v, 1.0)
    return {"one": one, "R2": np.array([r["R2"] for r in rows]), "RJ": np.array([r["RJ"] for r in rows])}


def direct_stats(E: int, k: int, router: int, norm: int, n_group: int, topk_group: int, v: float, rho: float):
    """:func:`router_stats` without the interpolation in rho: every average a mean over the
    fixed draws at this (v, rho)."""
    if v == 0:
        # every logit 0: the scores tie and, as torch.topk breaks ties, every token takes
        # the first k experts (the same ones: the mixture is a dense sum)
        t = _terms(np.zeros((1, E)), k, router, norm, n_group, topk_group, tied=True)
        return _averages(_per_draw(*t, *t))
    z1, z2 = _draws(E)
    sd = math.sqrt(v)
    rho_c = min(1.0, max(-1.0, float(rho)))
    out = []
    for lo in range(0, DRAWS, _CHUNK):       # (in chunks: the work arrays stay in cache)
        r1 = sd * z1[lo:lo + _CHUNK]
        t1 = _terms(r1, k, router, norm, n_group, topk_group)
        if rho_c == 1.0:
            t2 = t1
        else:
            r2 = rho_c * r1 + (sd * math.sqrt(max(0.0, 1.0 - rho_c * rho_c))) * z2[lo:lo + _CHUNK]
            t2 = _terms(r2, k, router, norm, n_group, topk_group)
        out.append(_per_draw(*t1, *t2))
    return _averages(np.concatenate(out, axis=1))


def _per_draw(w1, a1, b1, c1, w2, a2, b2, c2) -> np.ndarray:
    """Per draw (row), from both tokens' terms (:func:`_terms`): the four summands
    sum w^2, sum w w', |J|_F^2 and <J, J'>_F, as the rows of a (4, n) array."""
    def jj(a, b, c, a_, b_, c_):
        C = (c * c_).sum(axis=1)
        return (a * a_ - a * b_ * c_ - b * c * a_).sum(axis=1) + (b * b_).sum(axis=1) * C

    return np.stack([(w1 * w1).sum(axis=1), (w1 * w2).sum(axis=1), jj(a1, b1, c1, a1, b1, c1),
                     jj(a1, b1, c1, a2, b2, c2)])


def _averages(d: np.ndarray) -> dict:
    """The router averages and the standard errors of S2 and J2 from :func:`_per_draw`'s rows."""
    n = d.shape[1]
    m, sd = d.mean(axis=1), d.std(axis=1) / math.sqrt(n)
    return {"S2": float(m[0]), "R2": float(m[1]), "J2": float(m[2]), "RJ": float(m[3]),
            "se": {"S2": float(sd[0]), "J2": float(sd[2])}}


def _router_value(m, name, p, v, rho):
    keys = ("n_experts", "top_k", "router", "norm_topk", "n_group", "topk_group")
    if getattr(m, "SYMBOLIC", False):        # a named function of (v, rho); its definition the
        import sympy as sp                   # expectation over the draws (module docstring)

        label = {"S2": r"S_2", "R2": r"R_2", "J2": r"J_2", "RJ": r"R_J"}[name]
        return m.named(f"moe.{name}", lambda v, rho, *rest: sp.Function(f"Router{name}")(v, rho, *rest),
                       shown=(("v", v, {"nonnegative": True}), ("rho", rho, {"real": True})),
                       hidden=tuple((f, getattr(p, k), {"integer": True, "nonnegative": True})
                                    for f, k in zip(("E", "k", "c", "nu", "G", "G_k"), keys)),
                       tex=label, text=name,
                       numeric=lambda v, rho, *rest: router_stats(*map(int, rest), float(v), float(rho))[name])
    fixed = tuple(int(getattr(p, k)) for k in keys)
    if np.ndim(v) == 0 and np.ndim(rho) == 0:
        return router_stats(*fixed, float(v), float(rho))[name]
    vb, rb = np.broadcast_arrays(np.asarray(v, dtype=float), np.asarray(rho, dtype=float))
    return np.array([router_stats(*fixed, a, b)[name] for a, b in zip(vb.ravel(), rb.ravel())]).reshape(vb.shape)


def _gate_stats(m, v, rho):
    """Shared-expert gate m(s) = sigmoid(s), s ~ N(0, v), correlation rho across tokens:
    (E[m^2], E[m m'], E[m'^2], E[m' m'']) (m' its derivative)."""
    def sig(x):
        return 1 / (1 + m.exp(-x))

    def dsig(x):
        return sig(x) * (1 - sig(x))

    rest = (1 - rho**2) * v
    M2 = m.expect_normal(lambda s: sig(s) ** 2, v)
    D2 = m.expect_normal(lambda s: dsig(s) ** 2, v)
    MP = m.expect_normal(lambda s: sig(s) * m.expect_normal(lambda t: sig(t), rest, rho * s), v)
    DP = m.expect_normal(lambda s: dsig(s) * m.expect_normal(lambda t: dsig(t), rest, rho * s), v)
    return M2, MP, D2, DP


class MoE(Rule):
    """Routed experts plus an optional shared expert (module docstring)."""

    core = ""
    params = (
        positive_int("d_in", "input width (d_model)"),
        positive_int("d_ff", "hidden width of every routed expert"),
        positive_int("n_experts", "number of routed experts E"),
        positive_int("top_k", "experts chosen per token k (at most E)"),
        Param("router", "router scores: 0 softmax over all experts, 1 sigmoid", 0, lo=0, hi=1, integer=True),
        Param("norm_topk", "1: the chosen weights renormalised to sum 1", 0, lo=0, hi=1, integer=True),
        Param("route_scale", "factor on every routed weight (routed_scaling_factor)", 1.0, lo=0.0, open_lo=True),
        positive_int("n_group", "expert groups of group-limited routing (1: none)", 1),
        positive_int("topk_group", "groups kept in group-limited routing", 1),
        std("router_std", "std of the iid N(0, router_std^2) router weights"),
        Param("gate_std", "std of every expert's gate weights", None, lo=0.0, open_lo=True),
        Param("up_std", "std of every expert's up weights", None, lo=0.0, open_lo=True),
        std("down_std", "std of every expert's down weights"),
        Param("shared_d_ff", "hidden width of the shared expert (0: none)", 0, lo=0, integer=True),
        std("shared_gate_std", "std of the shared expert's gate weights", 0.0),
        std("shared_up_std", "std of the shared expert's up weights", 0.0),
        std("shared_down_std", "std of the shared expert's down weights", 0.0),
        Param("shared_mix", "1: the shared expert times sigmoid(x w_mix)", 0, lo=0, hi=1, integer=True),
        std("shared_mix_std", "std of the iid N(0, shared_mix_std^2) entries of w_mix", 0.0),
    )
    assumptions = (
        "The router, every routed expert, the shared expert and its gate have independent, "
        "zero-mean, iid weights, independent of the input; no biases; every expert a gated FFN "
        "(the GLU rule) with its down projection.",
        "Wide limit in d_in: per token the router logits are iid N(0, d_in router_std^2 Q) over "
        "the experts, a token pair's correlated by C/Q, and independent of the experts' outputs "
        "given the input; terms of relative order 1/d_in (the router weight's component along the "
        "input, correlating the router and expert gradient paths; the per-token spread of the input's norm, "
        "measured 1% low output variance on average, 4% to 5% at worst; the correlation between two tokens' "
        "sharing an expert and their outputs' likeness, up to 18% low token covariance at top 1 of 64) are not "
        "modelled.",
        "The router averages over the top-k selection have no closed form: they are means over "
        f"{DRAWS} fixed draws of the logits (seed {SEED}), relative standard error below 6e-3 "
        "(E 8 to 256, top 2 to 8, logit variance 0.01 to 10) for the one-token averages; the pair average R2 "
        "up to 4% off where tokens rarely share an expert (top 1 of 64); the pair averages interpolated in arccos(rho) "
        "from 17 Chebyshev angles, within 3.5e-3 of the one-token averages of the direct means; the shared "
        "gate's by Gauss-Hermite quadrature.",
        "The rule gives the mean over tokens: the per-token spread of sum_e w_e^2 is not carried "
        "(so a norm after the branch, placements peri and output, is refused by the model).",
        "The selection is piecewise constant (its derivative is 0); the gradient arriving at the "
        "output is independent of the input.",
    )
    references = ("Shazeer et al. 2017, outrageously large neural networks (sparsely gated MoE)",
                  "Fedus et al. 2021, Switch Transformers; Jiang et al. 2024, Mixtral of Experts",
                  "DeepSeek-AI 2024, DeepSeek-V3 (sigmoid, group-limited routing)")

    def check_params(self, values):
        from sigprop.errors import DomainError

        E, k, G, kg = (int(values[n]) for n in ("n_experts", "top_k", "n_group", "topk_group"))
        if k > E:
            raise DomainError(f"{self.name}: top_k {k} exceeds n_experts {E}")
        if E % G:
            raise DomainError(f"{self.name}: n_group {G} must divide n_experts {E}")
        if kg > G:
            raise DomainError(f"{self.name}: topk_group {kg} exceeds n_group {G}")
        if k > kg * (E // G):
            raise DomainError(f"{self.name}: top_k {k} exceeds the {kg * (E // G)} experts of the kept groups")
        if values["shared_d_ff"] and not (values["shared_gate_std"] > 0 and values["shared_up_std"] > 0):
            raise DomainError(f"{self.name}: a shared expert needs positive shared_gate_std and shared_up_std")

    # -- the dense experts, by their own rules ---------------------------------------------
    def _expert(self, m, x, g, d_ff, gate, up, down, d_in):
        glu, lin = REGISTRY[self.core], REGISTRY["linear"]
        pg = _ns(d_in=d_in, d_ff=d_ff, gate_std=gate, up_std=up, gate_b_std=0.0, up_b_std=0.0)
        pl = _ns(d_in=d_ff, d_out=d_in, w_std=down, b_std=0.0)
        h = glu.forward(m, x, pg)
        y = lin.forward(m, h, pl)
        if g is None:
            return y, None
        gh = lin.backward(m, h, g, pl)
        return y, glu.backward(m, x, gh, pg)

    def _parts(self, m, x, g, p):
        q = x.var + x.mean**2
        c = x.var * x.corr + x.mean**2
        rho = c / q
        v = p.d_in * p.router_std**2 * q
        s2 = p.route_scale**2
        S2, R2 = s2 * _router_value(m, "S2", p, v, rho), s2 * _router_value(m, "R2", p, v, rho)
        f, bf = self._expert(m, x, g, p.d_ff, p.gate_std, p.up_std, p.down_std, p.d_in)
        out = dict(S2=S2, R2=R2, f=f, bf=bf, v=v, q=q, rho=rho, sh=None)
        if g is not None:
            out["J2"] = s2 * _router_value(m, "J2", p, v, rho)
            out["RJ"] = s2 * _router_value(m, "RJ", p, v, rho)
        if p.shared_d_ff:
            sf, sb = self._expert(m, x, g, p.shared_d_ff, p.shared_gate_std, p.shared_up_std,
                                  p.shared_down_std, p.d_in)
            vm = p.d_in * p.shared_mix_std**2 * q
            if p.shared_mix:
                M2, MP, D2, DP = _gate_stats(m, vm, rho)
            else:
                M2, MP, D2, DP = 1, 1, 0, 0
            out["sh"] = (sf, sb, vm, M2, MP, D2, DP)
        return out

    def forward(self, m, x, p):
        t = self._parts(m, x, None, p)
        f = t["f"]
        var = t["S2"] * f.var
        cov = t["R2"] * f.var * f.corr
        if t["sh"] is not None:
            sf, _, _, M2, MP, _, _ = t["sh"]
            var = var + M2 * sf.var
            cov = cov + MP * sf.var * sf.corr
        return Forward(0 * x.mean, var, cov / var)

    def backward(self, m, x, g, p):
        t = self._parts(m, x, g, p)
        f, bf, r = t["f"], t["bf"], t["v"] / t["q"]
        var = t["S2"] * bf.var + r * g.var * f.var * t["J2"]
        cov = t["R2"] * bf.var * bf.corr + r * g.var * g.corr * f.var * f.corr * t["RJ"]
        if t["sh"] is not None:
            sf, sb, vm, M2, MP, D2, DP = t["sh"]
            rm = vm / t["q"]
            var = var + M2 * sb.var + rm * g.var * sf.var * D2
            cov = cov + MP * sb.var * sb.corr + rm * g.var * g.corr * sf.var * sf.corr * DP
        return Backward(var, cov / var)


def _ns(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**kw)


class MoEReGLU(MoE):
    name = "moe_reglu"
    title = "mixture of ReGLU experts"
    core = "reglu"


class MoEGeGLU(MoE):
    name = "moe_geglu"
    title = "mixture of GEGLU experts"
    core = "geglu"


class MoESwiGLU(MoE):
    name = "moe_swiglu"
    title = "mixture of SwiGLU experts"
    core = "swiglu"


register(MoEReGLU())
register(MoEGeGLU())
register(MoESwiGLU())
