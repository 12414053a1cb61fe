"""What the engine derives symbolically for a whole model (`sigprop predict --symbolic`).

Never a thousand-layer-deep expression: one block is derived symbolically from the rule
definitions (the FFN branch is composed rule by rule with the sympy backend; the attention
branch enters as its block gain, whose full expression `sigprop rules attention` prints), the
per-sublayer update maps are written in terms of the block gains, and sympy's ``rsolve`` /
``product`` solve the depth recurrence where it has a closed form:

* Pre-LN, skip 1, norm 1: variance linear in N; gradient a Gamma-function ratio that telescopes
  to the hyperbolic law when the block's backward gain equals its forward gain;
* Pre-LN with norm scale 1/sqrt(l) (LayerNorm Scaling): variance harmonic in N;
* skip^2 + branch^2 = 1 (DeepScaleLM): variance relaxes geometrically to the block gain;
* Post-LN: unit variance, gradient geometric in N with the transients' prefactor;
* otherwise the recurrence itself.

Each closed form holds under a named assumption (block gains held at their value at the top
of the model, where the correlation has settled); the derivation reports the closed form's
value at N beside the layer-by-layer prediction and their relative error, and labels a form
more than 10% off an approximation outside its range.  The Post-LN gradient is given in its
asymptotic form C rho^N: rho the per-layer factor where both the stream's and the gradient's
token correlations have settled, C the prefactor of the transients at both ends, both read
off the layer-by-layer prediction of a deeper stack of the same layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import sympy as sp

import sigprop.backend.symbolic as sm
from sigprop import registry
from sigprop.rules.residual import exp_or_inf as _exp
from sigprop.model import blocks
from sigprop.model.predict import SUPPORTED as _PREDICT_SUPPORTED
from sigprop.rope import RopeFreqs
from sigprop.rules import compose
from sigprop.state import Backward, Forward


@dataclass
class Derivation:
    title: str
    lines: list[str] = field(default_factory=list)
    assumption: str = ""
    exprs: list = field(default_factory=list)
    forms: list = field(default_factory=list)     # ClosedForm, each with its error
    pairs: list = field(default_factory=list)     # (lhs, rhs) sympy definitions, typeset by the export


l, N, k = sp.symbols("l N k", integer=True, nonnegative=True)
s = sp.Function("sigma2")
g = sp.Function("g2")
r = sp.Symbol("r_l", real=True)
rg = sp.Symbol("r_g", real=True)
s0, gN = sp.symbols("sigma2_0 g2_N", positive=True)


def _pretty(e) -> str:
    return sp.sstr(e)


def ffn_block(model) -> tuple[dict, Derivation]:
    """The model's FFN branch (the block description's chain, sigprop.model.blocks.ffn_chain,
    then the hidden dropout; input: a normalised stream of variance n^2, correlation r)
    composed symbolically."""
    d, dff = sp.Symbol("d", positive=True), sp.Symbol("d_ff", positive=True)
    names = model.ffn.names
    ws = sp.symbols(" ".join(f"sigma_{w}" for w in names), positive=True)
    p_f, p_h = sp.symbols("p_f p_h", nonnegative=True)
    n = sp.Symbol("n", positive=True)
    chain = blocks.ffn_chain(model, dict(zip(names, ws)), {w: 0 for w in names}, d=d, d_ff=dff, p_inner=p_f)
    chain = chain + [("dropout", dict(p=p_h))]
    x, gb = compose(chain, Forward(0, n**2, r), Backward(1, rg), sm)
    V = _simplify(x.var)
    der = Derivation(f"FFN block (derived from the rules: {' -> '.join(name for name, _ in chain)})")
    der.lines = [f"V_F(r) = {_pretty(V)}", f"r_F(r) = {_pretty(x.corr)}",
                 f"Gamma_F (backward gain per unit upstream gradient) = {_pretty(_simplify(gb.var))}"]
    der.exprs = [V, x.corr, gb.var]
    der.assumption = f"the input is n * {registry.norm(model.norm).title}(x): mean 0, variance n^2, token correlation r"
    vals = {d: model.d_model, dff: model.d_ff, p_f: model.dropout.ffn_inner, p_h: model.dropout.hidden}
    return {"V": V, "Gamma": gb.var, "subs": vals, "w": ws, "n": n}, der



def _simplify(e):
    """sympy's simplify, except on expressions holding an unevaluated Gaussian integral (an
    activation without closed-form moments, e.g. SiLU), where it does not finish."""
    return e if e.has(sp.Integral) else sp.simplify(e)


def _const(col: np.ndarray) -> float | None:
    return float(col[0]) if np.allclose(col, col[0], rtol=1e-12, atol=0) else None


#: the modern-block features (:meth:`sigprop.model.spec.Model.features`) the derivation
#: implements: the block layouts, norms and FFN kinds of the predictor, which it runs, but for
#: layers given as other lists of sublayers (its per-sublayer maps are those of attention then FFN)
#: and the attention logits' soft cap (the rule's capped statistics are numeric only)
SUPPORTED = _PREDICT_SUPPORTED - {"sublayers", "attn_softcap", "window", "local_rope"}


def require_supported(model) -> None:
    """Refuse (DomainError) a model whose modern-block features the derivation does not implement."""
    from sigprop.model.spec import require

    require(model, SUPPORTED, "--symbolic")


def derive(model) -> list[Derivation]:
    from sigprop.model.predict import run_top

    require_supported(model)
    records, grads, top = run_top(model)
    out = []
    _, ffn = ffn_block(model)
    out.append(ffn)

    lay = blocks.layout(model)
    maps = Derivation("Per-sublayer update maps (sublayer kind k = attention A or FFN F)")
    maps.lines = list(_MAPS[lay])
    out.append(maps)

    # block gains at the top of the model (correlation settled): its last layer's units
    per = blocks.points_per_layer(model)
    gains = {}
    for rec in records[-per:]:
        # per unit input variance n^2 after an input norm (a normalised branch output: as is)
        n2 = float(model.attention.norm_scale[-1] if rec.kind == "block" else getattr(model, rec.kind).norm_scale[-1]) ** 2
        scaled = rec.in_norm and rec.out_ops is None
        V = float(rec.branch_out.var) / (n2 if scaled else 1.0)
        gains[rec.kind] = (V, rec.branch_gain, rec)
    vals = Derivation("Block gains at the top layer (numbers from the rules)")
    for kind, (V, G, rec) in gains.items():
        what = "the parallel branches' sum" if kind == "block" else "branch"
        vals.lines.append(f"{kind}: V = {V:.6g} ({what} variance per unit input variance), "
                          f"branch backward gain = {G:.6g}")
    out.append(vals)
    out.append(_closed_forms(model, records, grads, gains, top))
    att = attention_block(model, records)
    if att is not None:
        out.append(att)
    return out


def attention_block(model, records=()) -> Derivation | None:
    """The attention rule's modern features in this model (rotary positions, QK-norm, grouped
    heads), from the rule's own symbolic definitions: the rotary cosine-sum factor kbar(n)
    (and the Fejer mean it sums) and, with QK-norm, the mean row logit variance as a function of
    the normalised input's token correlation r, with the model's numbers; None for a model
    without them."""
    from types import SimpleNamespace

    from sigprop.backend import numeric as nm
    from sigprop.rules import attention as att_rule
    from sigprop.rules import get

    params = blocks.branch_chain(model, "attention", model.n_layers - 1)[0][1]
    rope, qk, kv = params.get("rope", 0.0), params.get("qk_norm", 0), params.get("kv_heads", 0)
    if not (rope or qk or kv):
        return None
    rule = get("attention")
    full = {q.name: q.default for q in rule.params}
    full.update(params)
    der = Derivation("Attention block: rotary positions, QK-norm, grouped-query heads (the attention rule's definitions)")
    if kv:
        der.lines.append(f"grouped-query heads: {kv} key/value heads for {model.n_heads} query heads; the moments are "
                         "those of multi-head attention (every cross-head term is bilinear in two heads' independent "
                         "W_o blocks and vanishes in expectation)")
    if isinstance(rope, RopeFreqs):
        val = float(att_rule._kappa_bar(nm, float(model.seq_len), rope, float(model.d_head)))
        der.lines.append(f"rotary positions given by their frequencies theta_i ({rope.describe()}): the key-shared "
                         "logit part left after a row's mean has variance v_sh (1 - kbar(n)) in a row of n keys, "
                         "kbar(n) = (2/d_h) sum_i F(n, theta_i), F the Fejer mean of cos(t theta_i) over the row's key "
                         "pairs (F = 1 on an unrotated plane, theta_i = 0)")
        der.lines.append(f"kbar(L) = {val:.6g} at L = {model.seq_len}, d_h = {model.d_head}")
        if rope.attention_factor != 1:
            der.lines.append(f"attention factor {rope.attention_factor:g} on every rotated query and key: the rule "
                             f"runs on q and k variances times {att_rule.rope_logit_scale2(rope):.6g}")
    elif rope:
        n = sp.Symbol("n", positive=True)
        kb = att_rule._kappa_bar(sm, n, sp.Float(rope), sp.Integer(model.d_head))
        val = float(sm.evaluate(kb.subs(n, model.seq_len), {}))
        der.lines.append(f"rotary positions, base b_rope = {rope:g}: the key-shared logit part left after a row's mean "
                         "has variance v_sh (1 - kbar(n)) in a row of n keys, kbar(n) the mean over the row's key pairs "
                         "of the cosine sum (2/d_h) sum_i cos(t b_rope^(-2i/d_h)) (the Fejer mean F)")
        der.lines.append(f"kbar(L) = {val:.6g} at L = {model.seq_len}, d_h = {model.d_head}")
        for lhs, rhs in sm.where([kb]):
            der.lines.append(f"{sp.sstr(lhs)} = {sp.sstr(rhs)}")
        der.pairs.append(sm.where([kb])[-1])      # kbar(n) = ...; the export defines F with it
    if qk:
        r, n2 = sp.Symbol("r", nonnegative=True), sp.Symbol("n", positive=True) ** 2
        p = SimpleNamespace(**{k: (v if isinstance(v, RopeFreqs) else sp.Float(v) if isinstance(v, float)
                                   else sp.Integer(int(v))) for k, v in full.items()})
        c = att_rule._Ctx(sm, Forward(0, n2, r), p, rope=False, check=False)
        vbar = c.s_mean
        kind = registry.norm_by_qk_code(qk).title
        der.lines.append(f"QK-norm ({kind} per head, eps {full['qk_eps']:g}): the mean row logit variance at a "
                         "normalised input of variance n^2 and token correlation r no longer depends on the W_q, W_k "
                         "stds (only through eps):")
        der.lines.append(f"vbar(r) = {sp.sstr(vbar)}")
        der.pairs.append((sp.Function("vbar")(r), vbar))
        lv = [rec.logit_var for rec in records if getattr(rec, "logit_var", None) is not None]
        if lv:
            der.lines.append(f"logit variance at the top layer's attention: {float(lv[-1]):.6g}")
    der.assumption = "the attention rule's assumptions (sigprop rules attention), at the top layer's parameters"
    return der


#: the per-sublayer update maps of each block layout (sigprop.model.blocks.layout)
_MAPS = {
    "pre": ("sigma2_{s+1} = a^2 sigma2_s + b^2 V_k(r_s) n_s^2 / n^2-homogeneous block gain",
            "r_{s+1} = (a^2 r_s sigma2_s + b^2 r_k V_k) / sigma2_{s+1}",
            "g2_s = g2_{s+1} (a^2 + b^2 n_s^2 Gamma_k(r_s) / sigma2_s)      [the norm divides by sigma2_s]"),
    "post": ("sigma2_z = a^2 sigma2_s + b^2 V_k(r_s);  sigma2_{s+1} = norm variance (1 up to eps)",
             "r_{s+1} = N_corr((a^2 r_s sigma2_s + b^2 r_k V_k) / sigma2_z)",
             "g2_s = g2_{s+1} lambda_N (a^2 + b^2 Gamma_k(r_s)) / sigma2_z"),
    "peri": ("sigma2_{s+1} = a^2 sigma2_s + b^2 nu_k,  nu_k = s2/(s2 + eps) the output norm's variance (1 up to eps)",
             "r_{s+1} = (a^2 r_s sigma2_s + b^2 r_k nu_k) / sigma2_{s+1}",
             "g2_s = g2_{s+1} (a^2 + b^2 Gamma_k(r_s) / sigma2_s)      [the input norm divides by sigma2_s]"),
    "output": ("sigma2_{s+1} = a^2 sigma2_s + b^2 nu_k,  nu_k = s2/(s2 + eps) the output norm's variance (1 up to eps)",
               "r_{s+1} = (a^2 r_s sigma2_s + b^2 r_k nu_k) / sigma2_{s+1}",
               "g2_s = g2_{s+1} (a^2 + b^2 Gamma_k(r_s))      [the output norm divides by the branch's variance]"),
    "parallel": ("sigma2_{l+1} = a^2 sigma2_l + n^2 (b_A^2 V_A(r_l) + b_F^2 V_F(r_l))      [one norm, branches summed]",
                 "r_{l+1} = (a^2 r_l sigma2_l + n^2 (b_A^2 r_A V_A + b_F^2 r_F V_F)) / sigma2_{l+1}",
                 "g2_l = g2_{l+1} (a^2 + n^2 (b_A^2 Gamma_A + b_F^2 Gamma_F) / sigma2_l)"),
    "mixed": ("mixed placements (e.g. Mix-LN): each sublayer's own map (pre, post, peri, output), in order",),
}


#: a closed form further than this (relative) from the layer-by-layer value is labelled an
#: approximation outside its range
RANGE_TOLERANCE = 0.10


class ClosedForm(NamedTuple):
    """One closed form evaluated at the model's depth beside the layer-by-layer prediction.
    Values are natural logarithms (the gradient ratio of a deep Post-LN model leaves a double)."""

    quantity: str           # what it gives, e.g. "sigma2(N)" or "g2(0)/g2(N)"
    formula: str            # sympy's string of the closed form
    log_value: float        # log of the closed form's value at N
    log_layer_by_layer: float

    @property
    def value(self) -> float:
        return _exp(self.log_value)

    @property
    def layer_by_layer(self) -> float:
        return _exp(self.log_layer_by_layer)

    @property
    def relative_error(self) -> float:
        """|closed form / layer-by-layer - 1|."""
        return abs(math.expm1(self.log_value - self.log_layer_by_layer)) \
            if self.log_value - self.log_layer_by_layer < 709 else math.inf

    @property
    def within_range(self) -> bool:
        return self.relative_error <= RANGE_TOLERANCE

    def text(self, n_layers: int) -> str:
        """The comparison line: both values, the relative error and, past RANGE_TOLERANCE, the label."""
        out = (f"{self.quantity} at N = {n_layers}: closed form {_g(self.log_value)}, layer-by-layer "
               f"{_g(self.log_layer_by_layer)}, relative error {_pct(self.relative_error)}")
        if not self.within_range:
            out += (f" (closed form / layer-by-layer = {_g(self.log_value - self.log_layer_by_layer)}): "
                    f"an approximation outside its range")
        return out


def _g(log_v: float) -> str:
    if math.isnan(log_v):
        return "undefined"
    if abs(log_v) < 700:
        return f"{math.exp(log_v):.6g}"
    k = math.floor(log_v / math.log(10))
    return f"{math.exp(log_v - k * math.log(10)):.4f}e{k:+d}"


def _pct(e: float) -> str:
    return f"{100 * e:.2g}%" if e < 0.1 else f"{100 * e:.0f}%" if math.isfinite(e) else "inf"


def _closed_forms(model, records, grads, gains, top) -> Derivation:
    """``top``: the gradient at the stream after the last sublayer (below a final norm)."""
    att, ffc = model.attention, model.ffn
    lay = blocks.layout(model)
    # layouts whose units add b^2 (branch gain) to the stream: pre, peri, output, parallel
    pre = lay in ("pre", "peri", "output", "parallel")
    allpost = lay == "post"
    a = _const(att.skip_scale if lay == "parallel" else np.concatenate([att.skip_scale, ffc.skip_scale]))
    b_att, b_ffn = _const(att.branch_scale), _const(ffc.branch_scale)
    n_att = att.norm_scale if lay in ("pre", "peri", "parallel") else np.ones_like(att.norm_scale)
    # per layer: the variance the units add (b^2 V, in units of n^2 where an input norm scales
    # it) and, with an input norm, the branch backward gains times the stream variance
    units = list(gains.values())
    scale2 = {"attention": b_att, "ffn": b_ffn, "block": 1.0}
    Nv = model.n_layers
    log_sig_top = float(records[-1].out_log_var)
    log_g_ratio = float(grads[0][0]) - top[0] if grads else 0.0
    der = Derivation("Closed forms in N")
    forms = der.forms
    if pre and a is not None and b_att is not None and b_ffn is not None:
        c_sym = sp.Symbol("c", positive=True)
        c_val = sum(scale2[rec.kind] ** 2 * V for V, _, rec in units)
        # the branches' backward gains times the stream variance they divide by (per layer)
        gam_val = sum(G * math.exp(rec.x_log_var) for _, G, rec in units)
        lns = np.allclose(n_att**2 * np.arange(1, Nv + 1), n_att[0] ** 2, rtol=1e-9)
        if a == 1 and np.allclose(n_att, 1.0) and lay != "output":
            sol = sp.rsolve(s(l + 1) - s(l) - c_sym, s(l), {s(0): s0})
            der.lines.append(f"sigma2(l) = {_pretty(sol)}   [rsolve of sigma2(l+1) = sigma2(l) + c; linear in depth]")
            gam = sp.Symbol("gamma", positive=True)
            prod = sp.simplify(sp.product(1 + gam / (s0 + c_sym * k), (k, l, N - 1)))
            der.lines.append(f"g2(l) = g2_N * {_pretty(prod)}   [product of (1 + gamma / sigma2(k))]")
            hyp = sp.simplify(prod.subs(gam, c_sym))
            der.lines.append(f"  with gamma = c: g2(l) = g2_N * {_pretty(hyp)}"
                             "   [telescopes: hyperbolic, g2 proportional to 1/sigma2(l)]")
            num = {s0: model.input.var, c_sym: c_val, gam: gam_val, l: 0, N: Nv}
            forms.append(ClosedForm("sigma2(N)", _pretty(sol), _log_eval(sol.subs(l, N), num), log_sig_top))
            forms.append(ClosedForm("g2(0)/g2(N)", _pretty(prod.subs(l, 0)), _log_eval(prod, num), log_g_ratio))
            forms.append(ClosedForm("g2(0)/g2(N), gamma = c", _pretty(hyp.subs(l, 0)), _log_eval(hyp, num),
                                    log_g_ratio))
            der.lines.append(f"numbers: c = {c_val:.6g}, gamma = {gam_val:.6g} (block gains at the top layer)")
        elif a == 1 and lns:
            # sigma2(l) = sigma2(l-1) + c / l  (norm scale 1/sqrt(l) scales the branch variance by 1/l)
            sol = s0 + sp.summation(c_sym / k, (k, 1, l))
            der.lines.append(f"sigma2(l) = {_pretty(sol)}   [LayerNorm Scaling: sigma2(l) = sigma2(l-1) + c/l summed; harmonic]")
            num = {s0: model.input.var, c_sym: c_val, l: Nv}
            forms.append(ClosedForm("sigma2(N)", _pretty(sol), _log_eval(sol, num), log_sig_top))
            der.lines.append(f"numbers: c = {c_val:.6g} (block gains at the top layer, times l)")
        else:
            # one layer = its units in turn: sequential sigma2 -> a^4 sigma2 + a^2 b_A^2 V_A + b_F^2 V_F;
            # parallel: a^2 sigma2 + c
            A = sp.Symbol("Lambda", positive=True)
            k_units = len(units)
            lam = a ** (2 * k_units)
            c_val = sum(a ** (2 * (k_units - 1 - i)) * scale2[rec.kind] ** 2 * V for i, (V, _, rec) in enumerate(units))
            sol = sp.simplify(sp.rsolve(s(l + 1) - (A if lam != 1 else 1) * s(l) - c_sym, s(l), {s(0): s0}))
            what = "Lambda = a^2, c = b_A^2 V_A + b_F^2 V_F" if k_units == 1 else "Lambda = a^4, c = a^2 b_A^2 V_A + b_F^2 V_F"
            der.lines.append(f"sigma2(l) = {_pretty(sol)}   [per layer sigma2(l+1) = Lambda sigma2(l) + c, {what}]")
            if lam != 1:
                der.lines.append(f"  fixed point c / (1 - Lambda) = {c_val / (1 - lam):.6g}: the variance is "
                                 "conserved when it equals sigma2_0")
            rho = sp.Symbol("rho", positive=True)
            rho_val = 1.0
            for _, G, rec in units:
                rho_val *= a**2 + G
            geo = rho**N
            der.lines.append("g2(0) = g2_N*rho**N   [g2(l) = rho g2(l+1), rho = the product over the layer's units of "
                             "(a^2 + Gamma_k) at the top layer: geometric in depth]")
            num = {s0: model.input.var, c_sym: c_val, A: lam, l: Nv, rho: rho_val, N: Nv}
            forms.append(ClosedForm("sigma2(N)", _pretty(sol.subs(l, N)), _log_eval(sol, num), log_sig_top))
            forms.append(ClosedForm("g2(0)/g2(N)", _pretty(geo), _log_eval(geo, num), log_g_ratio))
            der.lines.append(f"numbers: c = {c_val:.6g}, rho = {rho_val:.6g} per layer (block gains at the top layer)")
        der.assumption = ("block gains held at their top-layer value (the correlation has settled); "
                          "the FFN gain is exactly homogeneous in the input variance, attention's only approximately")
    elif allpost and a is not None:
        rho, C = sp.Symbol("rho", positive=True), sp.Symbol("C", positive=True)
        j = sp.Symbol("j", integer=True, nonnegative=True)     # j = N - l layers below the top
        h = sp.Function("h")
        sol = sp.rsolve(h(j + 1) - rho * h(j), h(j), {h(0): gN}).subs(j, N - l)
        der.lines.append(f"g2(l) = {_pretty(sol)}   [g2(l) = rho g2(l+1) where both correlations have settled: "
                         "geometric in depth]")
        der.lines.append("g2(0) = C*g2_N*rho**N   [asymptotic in N: rho the settled per-layer factor, "
                         "C the prefactor of the transients at both ends]")
        rho_top = 1.0
        for kind in ("attention", "ffn"):
            _, G, rec = gains[kind]
            rho_top *= rec.z_gain * (a**2 + G)  # LayerNorm factor times (skip + branch); G includes b^2
        asym = _asymptote(model)
        if asym is None:
            der.lines.append(f"numbers: per-layer factor at the top layer {rho_top:.6g}; the layers differ, so "
                             "no settled factor is defined")
        else:
            log_rho, log_C, settled, depth = asym
            expr = C * rho**N
            forms.append(ClosedForm("g2(0)/g2(N)", _pretty(expr), log_C + Nv * log_rho, log_g_ratio))
            der.lines.append(f"numbers: rho = {math.exp(log_rho):.6g} per layer, C = {_g(log_C)} (from a {depth}-layer "
                             f"stack of this model's layer{'' if settled else '; rho not settled there'}); "
                             f"the top layer's own factor is {rho_top:.6g} (gradient correlation 0 there)")
        der.assumption = ("the per-layer gradient factor depends on the stream's and the gradient's token "
                          "correlations; both settle away from the ends, the gradient's over tens of layers "
                          "from the top")
    else:
        der.lines.append("no closed form for this combination of placements and scales: the per-sublayer "
                         "recurrence above is iterated numerically (`sigprop predict`)")
    for f in forms:
        der.lines.append(f.text(Nv))
    return der


def _log_eval(expr, values: dict) -> float:
    """log of a closed form at numbers (sympy evaluates, at 30 digits)."""
    v = sp.N(expr.subs(values), 30)
    if not v.is_real or not v.is_positive:
        return math.nan
    return float(sp.log(v).evalf(30))


#: the deepest stack the Post-LN asymptote is read off (about 0.5 s of prediction), and the
#: shallowest (causal models pay O(L^2) per sublayer: 512 causal layers at 256 tokens take
#: about 4 s, so they get 128 and the line says when rho has not settled there)
ASYMPTOTE_MAX_DEPTH = 4096
ASYMPTOTE_MIN_DEPTH = 512
ASYMPTOTE_MIN_DEPTH_CAUSAL = 128


def _asymptote(model) -> tuple[float, float, bool, int] | None:
    """For a stack of identical layers: (log rho, log C, settled, depth) of the gradient's
    asymptotic form g2(0)/g2(N) ~ C rho^N, read off the layer-by-layer prediction of a deeper
    stack of the same layer (4 N layers, at least ASYMPTOTE_MIN_DEPTH(_CAUSAL), at most
    ASYMPTOTE_MAX_DEPTH): rho the per-layer factor at its middle,
    C the product of every layer's factor over rho.  ``settled``: the factor at the middle
    and an eighth of the depth below it agree to 1e-6 (relative).  None when the layers differ."""
    from sigprop.model.predict import run_top
    from sigprop.model.spec import Model

    if len(model.layer_runs()) != 2:
        return None
    least = ASYMPTOTE_MIN_DEPTH_CAUSAL if model.causal else ASYMPTOTE_MIN_DEPTH
    depth = max(min(4 * model.n_layers, ASYMPTOTE_MAX_DEPTH), least)
    obj = model.to_json()
    obj["layers"] = [obj["layers"][-1]] * depth
    obj["n_layers"] = depth
    _, grads, top = run_top(Model.from_json(obj))
    per = 2 if len(grads) == 2 * depth else 1
    lg = np.array([grads[i][0] for i in range(0, len(grads), per)] + [top[0]])
    f = lg[:-1] - lg[1:]                   # log of each layer's factor g2(l-1)/g2(l)
    mid = depth // 2
    log_rho = float(f[mid])
    settled = abs(f[mid] - f[mid - depth // 8]) <= 1e-6
    log_C = float(lg[0] - lg[-1] - depth * log_rho)
    return log_rho, log_C, bool(settled), depth


def to_json(blocks: list[Derivation]) -> dict:
    """The derivation as a JSON object (``predict --json --symbolic``): every block's title,
    lines and assumption, and every closed form with its value, the layer-by-layer value and
    their relative error (overflowed values as the strings "inf"/"-inf", with log10 fields)."""
    from sigprop.model.trace import num

    forms = []
    for b in blocks:
        for f in b.forms:
            forms.append({"quantity": f.quantity, "formula": f.formula, "value": num(f.value),
                          "layer_by_layer": num(f.layer_by_layer),
                          "log10_value": num(f.log_value / math.log(10)),
                          "log10_layer_by_layer": num(f.log_layer_by_layer / math.log(10)),
                          "relative_error": num(f.relative_error), "within_range": f.within_range})
    return {"blocks": [{"title": b.title, "lines": [ln for ln in b.lines if ln.strip()],
                        "assumption": b.assumption} for b in blocks],
            "closed_forms": forms, "range_tolerance": RANGE_TOLERANCE}
