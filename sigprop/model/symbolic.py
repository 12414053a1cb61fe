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
* Post-LN: unit variance, gradient geometric in N;
* otherwise the recurrence itself.

Each closed form holds under a named assumption (block gains held at their value at the top
of the model, where the correlation has settled); the derivation reports the closed form's
value at N beside the layer-by-layer prediction, so the assumption's cost is visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import sympy as sp

import sigprop.backend.symbolic as sm
from sigprop.rules import compose
from sigprop.state import Backward, Forward


@dataclass
class Derivation:
    title: str
    lines: list[str] = field(default_factory=list)
    assumption: str = ""
    exprs: list = field(default_factory=list)


l, N, k = sp.symbols("l N k", integer=True, nonnegative=True)
s = sp.Function("sigma2")
g = sp.Function("g2")
r = sp.Symbol("r_l", real=True)
rg = sp.Symbol("r_g", real=True)
s0, gN = sp.symbols("sigma2_0 g2_N", positive=True)


def _pretty(e) -> str:
    return sp.sstr(e)


def ffn_block(model) -> tuple[dict, Derivation]:
    """FFN branch (LN'd input with variance n^2, correlation r) composed symbolically."""
    d, dff = sp.Symbol("d", positive=True), sp.Symbol("d_ff", positive=True)
    w1, w2 = sp.symbols("sigma_in sigma_out", positive=True)
    p_f, p_h = sp.symbols("p_f p_h", nonnegative=True)
    n = sp.Symbol("n", positive=True)
    chain = [("linear", dict(d_in=d, d_out=dff, w_std=w1, b_std=0)), (model.activation, {}),
             ("dropout", dict(p=p_f)), ("linear", dict(d_in=dff, d_out=d, w_std=w2, b_std=0)),
             ("dropout", dict(p=p_h))]
    x, gb = compose(chain, Forward(0, n**2, r), Backward(1, rg), sm)
    V = sp.simplify(x.var)
    der = Derivation("FFN block (derived from the rules: linear -> %s -> dropout -> linear -> dropout)" % model.activation)
    der.lines = [f"V_F(r) = {_pretty(V)}", f"r_F(r) = {_pretty(x.corr)}",
                 f"Gamma_F (backward gain per unit upstream gradient) = {_pretty(sp.simplify(gb.var))}"]
    der.exprs = [V, x.corr, gb.var]
    der.assumption = "the input is n * LayerNorm(x): mean 0, variance n^2, token correlation r"
    vals = {d: model.d_model, dff: model.d_ff, p_f: model.dropout.ffn_inner, p_h: model.dropout.hidden}
    return {"V": V, "Gamma": gb.var, "subs": vals, "w": (w1, w2), "n": n}, der


def _const(col: np.ndarray) -> float | None:
    return float(col[0]) if np.allclose(col, col[0], rtol=1e-12, atol=0) else None


def derive(model) -> list[Derivation]:
    from sigprop.model.predict import run

    records, grads = run(model)
    out = []
    _, ffn = ffn_block(model)
    out.append(ffn)

    att, ffc = model.attention, model.ffn
    post = np.concatenate([att.post, ffc.post])
    maps = Derivation("Per-sublayer update maps (sublayer kind k = attention A or FFN F)")
    if not post.any() or post.all():
        if not post.any():
            maps.lines = [
                "sigma2_{s+1} = a^2 sigma2_s + b^2 V_k(r_s) n_s^2 / n^2-homogeneous block gain",
                "r_{s+1} = (a^2 r_s sigma2_s + b^2 r_k V_k) / sigma2_{s+1}",
                "g2_s = g2_{s+1} (a^2 + b^2 n_s^2 Gamma_k(r_s) / sigma2_s)      [LayerNorm divides by sigma2_s]",
            ]
        else:
            maps.lines = [
                "sigma2_z = a^2 sigma2_s + b^2 V_k(r_s);  sigma2_{s+1} = LN variance (1 up to eps)",
                "r_{s+1} = LN_corr((a^2 r_s sigma2_s + b^2 r_k V_k) / sigma2_z)",
                "g2_s = g2_{s+1} lambda_LN (a^2 + b^2 Gamma_k(r_s)) / sigma2_z",
            ]
    else:
        maps.lines = ["mixed placements (e.g. Mix-LN): the Post-LN map for post sublayers and the Pre-LN map "
                      "for pre sublayers, in order"]
    out.append(maps)

    # block gains at the top of the model (correlation settled), per layer and kind
    top = records[-2:]
    gains = {}
    for rec in top:
        n2 = float(getattr(model, rec.kind).norm_scale[-1]) ** 2
        V = float(rec.branch_out.var) / (n2 if not rec.post else 1.0)
        gains[rec.kind] = (V, rec.branch_gain, rec)
    vals = Derivation("Block gains at the top layer (numbers from the rules)")
    for kind, (V, G, rec) in gains.items():
        vals.lines.append(f"{kind}: V = {V:.6g} (branch variance per unit input variance), "
                          f"branch backward gain = {G:.6g}")
    out.append(vals)
    out.append(_closed_forms(model, records, grads, gains))
    return out


def _closed_forms(model, records, grads, gains) -> Derivation:
    att, ffc = model.attention, model.ffn
    pre = not np.concatenate([att.post, ffc.post]).any()
    allpost = np.concatenate([att.post, ffc.post]).all()
    a = _const(np.concatenate([att.skip_scale, ffc.skip_scale]))
    b_att, b_ffn = _const(att.branch_scale), _const(ffc.branch_scale)
    n_att = att.norm_scale
    Nv = model.n_layers
    sig_top = float(np.exp(records[-1].out_log_var))
    der = Derivation("Closed forms in N")
    if pre and a is not None and b_att is not None and b_ffn is not None:
        c_sym = sp.Symbol("c", positive=True)
        c_val = b_att**2 * gains["attention"][0] + b_ffn**2 * gains["ffn"][0]
        lns = np.allclose(n_att**2 * np.arange(1, Nv + 1), n_att[0] ** 2, rtol=1e-9)
        if a == 1 and np.allclose(n_att, 1.0):
            sol = sp.rsolve(s(l + 1) - s(l) - c_sym, s(l), {s(0): s0})
            der.lines.append(f"sigma2(l) = {_pretty(sol)}   [rsolve of sigma2(l+1) = sigma2(l) + c; linear in depth]")
            gam = sp.Symbol("gamma", positive=True)
            prod = sp.product(1 + gam / (s0 + c_sym * k), (k, l, N - 1))
            der.lines.append(f"g2(l) = g2_N * {_pretty(sp.simplify(prod))}   [product of (1 + gamma / sigma2(k))]")
            der.lines.append(f"  with gamma = c: g2(l) = g2_N * {_pretty(sp.simplify(prod.subs(gam, c_sym)))}"
                             "   [telescopes: hyperbolic, g2 proportional to 1/sigma2(l)]")
            pred = float(sol.subs({s0: model.input.var, c_sym: c_val, l: Nv}))
        elif a == 1 and lns:
            # sigma2(l) = sigma2(l-1) + c / l  (norm scale 1/sqrt(l) scales the branch variance by 1/l)
            sol = s0 + sp.summation(c_sym / k, (k, 1, l))
            der.lines.append(f"sigma2(l) = {_pretty(sol)}   [LayerNorm Scaling: sigma2(l) = sigma2(l-1) + c/l summed; harmonic]")
            pred = float(sp.N(sol.subs({s0: model.input.var, c_sym: c_val, l: Nv})))
        else:
            # one layer = attention then FFN sublayer: sigma2 -> a^4 sigma2 + a^2 b_A^2 V_A + b_F^2 V_F
            A = sp.Symbol("Lambda", positive=True)
            c_val = a**2 * b_att**2 * gains["attention"][0] + b_ffn**2 * gains["ffn"][0]
            sol = sp.rsolve(s(l + 1) - A * s(l) - c_sym, s(l), {s(0): s0})
            der.lines.append(f"sigma2(l) = {_pretty(sp.simplify(sol))}   [per layer sigma2(l+1) = Lambda sigma2(l) + c, "
                             "Lambda = a^4, c = a^2 b_A^2 V_A + b_F^2 V_F]")
            der.lines.append(f"  fixed point c / (1 - Lambda) = {c_val / (1 - a**4):.6g}: the variance is conserved "
                             "when it equals sigma2_0" if a != 1 else "")
            pred = float(sp.N(sol.subs({s0: model.input.var, c_sym: c_val, A: a**4, l: Nv})))
        der.lines.append(f"numbers: c = {c_val:.6g}; closed form at N = {Nv}: {pred:.6g}; "
                         f"layer-by-layer prediction: {sig_top:.6g}")
        der.assumption = ("block gains held at their top-layer value (the correlation has settled); "
                          "the FFN gain is exactly homogeneous in the input variance, attention's only approximately")
    elif allpost and a is not None:
        rho = sp.Symbol("rho", positive=True)
        j = sp.Symbol("j", integer=True, nonnegative=True)     # j = N - l layers below the top
        h = sp.Function("h")
        sol = sp.rsolve(h(j + 1) - rho * h(j), h(j), {h(0): gN}).subs(j, N - l)
        rho_val = 1.0
        for kind in ("attention", "ffn"):
            _, G, rec = gains[kind]
            rho_val *= rec.z_gain * (a**2 + G)  # LayerNorm factor times (skip + branch); G includes b^2
        der.lines.append(f"g2(l) = {_pretty(sol)}   [g2(l) = rho g2(l+1): geometric in depth]")
        g_in = float(np.exp(grads[0][0]))
        der.lines.append(f"numbers: rho = {rho_val:.6g} per layer; closed form g2(0)/g2(N) = rho^N = {rho_val ** Nv:.6g}; "
                         f"layer-by-layer prediction: {g_in / model.grad.var:.6g}")
        der.assumption = "per-layer gradient factor held at its top-layer value"
    else:
        der.lines.append("no closed form for this combination of placements and scales: the per-sublayer "
                         "recurrence above is iterated numerically (`sigprop predict`)")
    return der
