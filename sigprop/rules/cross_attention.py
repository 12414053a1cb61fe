"""Cross-attention (encoder-decoder): forward and backward moment rules.

Definition (docs/formats.md, encoder-decoder models).  Queries from the decoder stream X
(Lq tokens: mean mu_x, variance s2_x, token correlation r_x), keys and values from the
encoder output E (Lk tokens, its own mean, variance and correlation): Q = X Wq + bq,
K = E Wk + bk, V = E Wv + bv (d -> H dh); per head A = Dropout_p(softmax(Q K^T / sqrt(dh)))
with no mask (every query row sees the Lk encoder tokens), O = A V, Y = O Wo + bo.  No rotary
positions; QK-norm (per head over dh) on the queries and the keys.

Derivation (the attention rule's, :mod:`sigprop.rules.attention`, with the two inputs apart;
checked by Monte Carlo, tests/rules/test_cross_attention.py and the cross_attention grids).
Write e_j = c + u_j (c shared by the encoder tokens, second moment c2 = r_e s2_e + mu_e^2;
u_j iid N(0, tau), tau = (1 - r_e) s2_e).  Row i's logits are a_i . e_j, a_i = Wk q_i /
sqrt(dh): the shared part a_i . c cancels in the softmax, so a row sees iid logits of
variance v = tau |a_i|^2, mean tau d sk^2 vq with vq = d sq^2 (s2_x + mu_x^2) + sbq^2 the
query component's variance (X's), and the row-to-row law of v (the query's chi-square, the
Wk contraction, X's per-token norm) and the row-pair correlation rho = cos(a_i, a_k) around
r_a = (d sq^2 c2_x + sbq^2) / vq are the query side's: every one-row and two-row softmax
statistic is the attention rule's (:mod:`sigprop.rules.softmax_moments`) for rows of Lk keys,
bidirectional.  The value vectors, the logits' token-varying part and the value gradient's
coherent part live in the same u_j (E's), exactly as in self-attention, so

* forward: the attention rule's E Y_i^2 and E Y_i Y_k with c2, tau from E and r_a from X;
  the output has Lq rows and does not depend on Lq;
* backward into X (the query path only): the attention rule's query-path variance and
  covariance (K0 tau^2 [...], tau from E, the a_i direction's amplification with X's f_x);
* backward into E (value and key paths; every query row sends gradient to every key):
  per key the value path collects sum_i P_ij g_i over the Lq rows, so its variance is
  (Lq/Lk) [A2/(1 - p) + r_g (Lq - 1) C2] K0 and its covariance over two keys
  (Lq/(Lk (Lk - 1))) [(1 - A2) + r_g (Lq - 1) (1 - C2)] K0; the key path likewise
  (Lq/Lk) [g_t E(v T2) + r_g (Lq - 1) E(rho v T2x)] K0, and its covariance is exactly
  -(its variance)/(Lk - 1) (every row's dS sums to 0 over the keys).  With Lq = Lk these are the
  attention rule's value and key paths.  Heads independent: times H.

Two rules share the definition, one per input whose gradient they give:
``cross_attention`` (input: the decoder stream X, the queries; the encoder output's state in
the parameters enc_mean, enc_var, enc_corr) and ``cross_attention_kv`` (input: the encoder output E;
the query input's state in dec_mean, dec_var, dec_corr).  Both have the same forward (the output Y).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from sigprop import symbols
from sigprop.errors import DomainError
from sigprop.rules import attention as _att
from sigprop.rules.attention import _NS, _Ctx, _backward_stats, _backward_terms, _branch, _flag, _floor, _forward_moments, _num
from sigprop.rules.base import Param, Rule, _show, positive_int, probability, register, std
from sigprop.state import Backward, Forward

symbols.register("L_enc", r"L_{\mathrm{enc}}", positive=True, integer=True)
for _side, _tex in (("enc", r"\mathrm{enc}"), ("dec", r"\mathrm{dec}")):
    symbols.register(f"{_side}_mean", rf"\mu_{{{_tex}}}", real=True)
    symbols.register(f"{_side}_std", rf"\sigma_{{{_tex}}}", positive=True)
    symbols.register(f"{_side}_corr", rf"r_{{{_tex}}}", real=True)


class _CrossCtx(_Ctx):
    """The attention rule's context with the queries' input ``xq`` and the keys' and values'
    input ``xe`` apart (no rotary positions, no soft cap, no mask; rows of L = Lk keys)."""

    def __init__(self, m, xq, xe, p, check=True):
        self.m = m
        self.rope = False
        self.capped = False
        self.norm = _flag(m, p.qk_norm)
        self.S2q = xq.var + xq.mean**2                  # the queries' input, uncentred
        self.S2 = xe.var + xe.mean**2                   # the keys' and values' input
        self.c2q = xq.corr * xq.var + xq.mean**2
        self.c2 = xe.corr * xe.var + xe.mean**2         # (the values' shared part: forward, kr)
        self.tau = (1 - xe.corr) * xe.var
        sq2, sk2, sbq2, sbk2 = _branch(
            m, self.norm, lambda: (p.q_std**2, p.k_std**2, p.q_bias_std**2, p.k_bias_std**2),
            lambda: self._normed(m, p))
        self.sq2, self.sk2, self.sbq2, self.sbk2 = sq2, sk2, sbq2, sbk2
        vx = p.d * sq2 * self.S2q
        vq = vx + sbq2
        vqf = _floor(m, vq)
        self.vq = vq
        self.fx = vx / vqf
        self.s_mean = _branch(m, self.norm, lambda: _att._row_var(self.tau, p.d, sk2, vq),
                              lambda: self._normed_var(m, p, sk2, vq))
        self.k4n = _branch(m, self.norm, lambda: 0 * self.s_mean, lambda: self._normed_k4(m, p))
        if check and not m.SYMBOLIC:
            worst = float(np.max(self.s_mean))
            if not worst <= _att.ROW_LOGIT_VAR_MAX:
                raise DomainError(
                    f"cross_attention: row logit variance {worst:.4g} is beyond the {_att.ROW_LOGIT_VAR_MAX:g} "
                    "this rule evaluates (softmax saturated): smaller Q/K weight stds or input variances")
        kap = (xq.var**2 + 2 * xq.var * xq.mean**2) / _floor(m, self.S2q)**2
        self.relvar = _branch(
            m, self.norm,
            lambda: 2 / p.d + 2 * (vx**2 + 2 * vx * sbq2) / (p.d_head * vqf**2) + self.fx**2 * 2 * kap / p.d,
            lambda: 2 / p.d + 2 * self.rk**2 / p.d_head)
        self.ra = (p.d * sq2 * self.c2q + sbq2) / vqf
        self.rho_var = (1 - self.ra**2) ** 2 * self.relvar / 2
        self.L = p.L + 0 * self.s_mean
        self.causal = 0
        self.win, self.Lr = None, self.L          # (no sliding window in cross-attention)
        self.vsh = vq * (p.d * sk2 * self.c2 + sbk2)

    def _normed(self, m, p):
        """QK-norm with the queries' and the keys' own scales (:meth:`_Ctx._normed`)."""
        sq2, sk2, sbq2, sbk2 = p.q_std**2, p.k_std**2, p.q_bias_std**2, p.k_bias_std**2
        is_ln = self.is_ln = p.qk_norm * (2 - p.qk_norm)
        ln = 1 - is_ln / p.d_head
        vq = p.d * sq2 * self.S2q + sbq2
        vk = p.d * sk2 * self.S2 + sbk2
        self.rk = (p.d * sk2 * self.c2 + sbk2) / _floor(m, vk)
        self.proj = 1 - (1 + is_ln) / p.d_head
        n = p.d_head - is_ln
        frac = _num(m, lambda t: m.maximum(t, 0.25), (n - 2) / n)
        self.hq = (ln * vq + p.qk_eps) / (ln * vq * frac + p.qk_eps)
        self.hk = (ln * vk + p.qk_eps) / (ln * vk * frac + p.qk_eps)
        self.hc = (1 + 3 / (4 * n)) ** 2
        fq = ln / (ln * vq + p.qk_eps)
        fk = 1 / (ln * vk + p.qk_eps)
        return sq2 * fq, sk2 * fk, sbq2 * fq, sbk2 * fk

    def row(self, fn):
        """Average of fn(v, Lk) over the row logit variance (every row has the Lk keys)."""
        return self.m.expect_gamma(lambda v: fn(v, self.L), self.s_mean, self.relvar, n=_NS)


def _inner(p):
    """The attention rule's parameters for rows of Lk keys (bidirectional, no rotation)."""
    keys = ("d", "n_heads", "d_head", "q_std", "k_std", "v_std", "o_std", "q_bias_std", "k_bias_std",
            "v_bias_std", "o_bias_std", "p", "qk_norm", "qk_eps")
    q = SimpleNamespace(**{k: getattr(p, k) for k in keys})
    q.L, q.causal, q.rope, q.softcap, q.kv_heads = p.L_enc, 0, 0, 0, 0
    return q


def cross_forward(m, xq, xe, p) -> Forward:
    """The output Y's moments (Lq rows)."""
    q = _inner(p)
    c = _CrossCtx(m, xq, xe, q)
    st = dict(A2=c.row(c.stat("A2")), Bz=c.row(c.stat("Bz")), Cz=c.row(c.stat("Cz")),
              m1sq=c.row(c.stat("m1sq")), C2=c.pair("C2"))
    var, cov = _forward_moments(m, c, q, st)
    return Forward(0 * xq.mean + 0 * xe.mean, var, cov / var)


def cross_backward(m, xq, xe, g, p) -> tuple[Backward, Backward]:
    """(dLoss/dX, dLoss/dE): the query path into the decoder stream; the value and key paths,
    collected over the Lq query rows, into the encoder output."""
    q = _inner(p)
    c = _CrossCtx(m, xq, xe, q)
    st = _backward_stats(m, c, q)
    t = _backward_terms(m, c, q, g, st)
    t0 = _backward_terms(m, c, q, Backward(g.var, 0 * g.corr), st)
    gx = Backward(t["qry"], t["qry_c"] / t["qry"])
    Lq, Lk = p.L, p.L_enc
    ratio, pr = Lq / Lk, (Lq - 1) / (Lk - 1)
    var = ratio * (t["val"] + t["key"] + pr * (t["val_x"] + t["key_x"]))
    cov = ratio * (t0["val_c"] + t0["key_c"]
                   + pr * (t["val_c"] - t0["val_c"] + t["key_c"] - t0["key_c"]))
    return gx, Backward(var, cov / var)


_COMMON = (
    positive_int("d", "model width (both stacks)"),
    positive_int("n_heads", "number of heads H", default=1),
    positive_int("d_head", "head width dh"),
    Param("L", "decoder tokens (query rows)", lo=2, integer=True),
    Param("L_enc", "encoder tokens (keys and values)", lo=2, integer=True),
    std("q_std", "std of Wq entries"),
    std("k_std", "std of Wk entries"),
    std("v_std", "std of Wv entries"),
    std("o_std", "std of Wo entries"),
    std("q_bias_std", "std of the query bias", default=0.0),
    std("k_bias_std", "std of the key bias (cancels in the softmax)", default=0.0),
    std("v_bias_std", "std of the value bias", default=0.0),
    std("o_bias_std", "std of the output bias", default=0.0),
    probability("p", "attention-probability dropout"),
    Param("qk_norm", "per-head norm of every query and key over d_head: 0 none, 1 LayerNorm, 2 RMSNorm",
          0, lo=0, hi=2, integer=True),
    Param("qk_eps", "epsilon of the QK-norm", 1e-5, lo=0.0),
)

_ASSUMPTIONS = (
    "The attention rule's (sigprop.rules.attention), bidirectional rows of Lk keys, without rotary "
    "positions and soft cap: Gaussian inputs with a token-shared component, large d and dh, the Gamma "
    "law of the row logit variance and the normal law of the row-pair correlation, exact softmax "
    "integrals; the value, query and key paths' cross terms dropped.",
    "The decoder stream and the encoder output are independent (at initialisation the weights that "
    "carry E into the decoder stream are independent and zero-mean), and so is the upstream gradient.",
    "No self key: a query is not one of the keys, so the attention rule's self-key approximation "
    "does not arise.",
)


def _other(m, p, prefix):
    return Forward(getattr(p, f"{prefix}_mean"), getattr(p, f"{prefix}_var"), getattr(p, f"{prefix}_corr"))


class _CrossRule(Rule):
    prefix = ""
    references = ("sigprop's own, from the attention rule ([TGS] Kedia et al. 2024 for the value path)",)

    def _check_other(self, values):
        pf = self.prefix
        for k, lo in (("var", 0.0), ("corr", 0.0)):
            v = np.asarray(values[f"{pf}_{k}"], dtype=float)
            if np.any(v < lo) or (k == "corr" and np.any(v > 1)):
                raise DomainError(f"{self.name}: {pf}_{k} must lie in [0, {'1' if k == 'corr' else 'inf'}], got "
                                  f"{_show(values[f'{pf}_{k}'])} (the shared-component law)")
        if np.any((np.asarray(values["qk_norm"]) == 1) & (np.asarray(values["d_head"]) < 2)):
            raise DomainError(f"{self.name}: a LayerNorm QK-norm needs d_head >= 2")

    def check_params(self, values):
        self._check_other(values)

    def check_state(self, x, g):
        super().check_state(x, g)
        if np.any(np.asarray(x.corr) < 0):
            raise DomainError(f"{self.name}: the input token correlation must be >= 0 (shared-component law)")
        if g is not None and np.any(np.asarray(g.corr) < 0):
            raise DomainError(f"{self.name}: the gradient token correlation must be >= 0")

    def symbolic_inputs(self):
        x, g, p = super().symbolic_inputs()
        pf = self.prefix
        setattr(p, f"{pf}_var", symbols.symbol(f"{pf}_std") ** 2)
        return x, g, p


class CrossAttention(_CrossRule):
    """Input: the decoder stream (queries); its backward is the query path's gradient."""

    name = "cross_attention"
    title = "Cross-attention, query side (decoder stream in, keys and values from the encoder output)"
    prefix = "enc"
    params = _COMMON + (
        Param("enc_mean", "mean of the encoder output E", 0.0),
        Param("enc_var", "variance of the encoder output E", lo=0.0),
        Param("enc_corr", "token correlation of the encoder output E", 0.0, lo=0.0, hi=1.0),
    )
    assumptions = _ASSUMPTIONS

    def forward(self, m, x, p):
        return cross_forward(m, x, _other(m, p, "enc"), p)

    def backward(self, m, x, g, p):
        return cross_backward(m, x, _other(m, p, "enc"), g, p)[0]


class CrossAttentionKV(_CrossRule):
    """Input: the encoder output (keys and values); its backward is the value and key paths'
    gradient, summed over the decoder's query rows."""

    name = "cross_attention_kv"
    title = "Cross-attention, key/value side (encoder output in, queries from the decoder stream)"
    prefix = "dec"
    params = _COMMON + (
        Param("dec_mean", "mean of the queries' input (the decoder stream, after its norm)", 0.0),
        Param("dec_var", "variance of the queries' input", lo=0.0),
        Param("dec_corr", "token correlation of the queries' input", 0.0, lo=0.0, hi=1.0),
    )
    assumptions = _ASSUMPTIONS

    def forward(self, m, x, p):
        return cross_forward(m, _other(m, p, "dec"), x, p)

    def backward(self, m, x, g, p):
        return cross_backward(m, _other(m, p, "dec"), x, g, p)[1]


CROSS = register(CrossAttention())
CROSS_KV = register(CrossAttentionKV())


def evaluate(xq: Forward, xe: Forward, g: Backward | None = None, **params):
    """Numeric (Y, dX, dE) at the decoder-side input ``xq`` and the encoder output ``xe``, with
    the rule's domain checks (dX, dE None without ``g``)."""
    y, gx = CROSS.evaluate(xq, g, enc_mean=xe.mean, enc_var=xe.var, enc_corr=xe.corr, **params)
    if g is None:
        return y, None, None
    _, ge = CROSS_KV.evaluate(xe, g, dec_mean=xq.mean, dec_var=xq.var, dec_corr=xq.corr, **params)
    return y, gx, ge


def logit_var(p: dict, x: Forward) -> float:
    """Variance of one pre-softmax logit q_i . k_j / sqrt(d_head) (``p``: the query-side rule's
    parameters as a dict, the encoder output's state among them; ``x``: the queries' input),
    shared parts included: var(q) var(k), q from ``x`` and k from E (zero-mean weights: var =
    d w^2 (s2 + mu^2) + b^2); with QK-norm their normalised second moments (as
    :func:`sigprop.rules.attention.logit_var`)."""
    vq = p["d"] * p["q_std"] ** 2 * (x.var + x.mean ** 2) + p.get("q_bias_std", 0.0) ** 2
    vk = p["d"] * p["k_std"] ** 2 * (p["enc_var"] + p.get("enc_mean", 0.0) ** 2) + p.get("k_bias_std", 0.0) ** 2
    norm = int(p.get("qk_norm", 0))
    if not norm:
        return float(vq * vk)
    eps = float(p.get("qk_eps", 1e-5))
    ln = 1 - 1 / p["d_head"] if norm == 1 else 1.0
    return float(ln * vq / (ln * vq + eps) * ln * vk / (ln * vk + eps) / ln)


def mean_row_logit_var(p: dict, x: Forward) -> float:
    """The mean row logit variance the rule's domain bounds (ROW_LOGIT_VAR_MAX)."""
    from sigprop.backend import numeric as m

    xe = Forward(float(p.get("enc_mean", 0.0)), float(p["enc_var"]), float(p.get("enc_corr", 0.0)))
    c = _CrossCtx(m, Forward(float(x.mean), float(x.var), float(x.corr)), xe, _inner(CROSS.param_values(p)),
                  check=False)
    return float(c.s_mean)
