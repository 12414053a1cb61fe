"""The derivation of a solution as data: a list of steps, each a sentence and (optionally) a
sympy expression or equation, in the order a person would write them down.

``steps(solution)`` is the public entry point (also used by LaTeX exporters); the CLI prints
the text with sympy's string printer, or LaTeX with ``sympy.latex``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sympy as sp

from sigprop import registry
from sigprop.solve import equations as E


@dataclass(frozen=True)
class Step:
    """One step of a derivation: ``text`` (a sentence) and ``expr`` (a sympy expression or
    Eq, or None)."""

    text: str
    expr: object = None

    def as_tuple(self) -> tuple:
        return (self.text, self.expr)


_GREEK = ("alpha", "beta", "gamma", "delta", "epsilon", "lambda", "mu", "rho", "sigma", "tau", "Gamma", "Lambda")


def latex(expr) -> str:
    """``sympy.latex`` with the derivation's brace-style symbol names (sigma_{s+1}^2,
    r_{B,s}, sigma_v^{(3)}) typeset as written, Greek letters included."""
    names = {}
    for sym in getattr(expr, "free_symbols", ()):
        name = getattr(sym, "name", "")
        if "{" in name:
            for g in _GREEK:
                if name.startswith(g) and not name[len(g):len(g) + 1].isalpha():
                    name = "\\" + name
                    break
            names[sym] = name
    return sp.latex(expr, symbol_names=names)


def _f(v: float, digits: int = 6):
    return sp.Float(float(f"{float(v):.{digits}g}"))


def steps(sol) -> list[Step]:
    """The derivation of ``sol`` (a :class:`sigprop.solve.solver.Solution` or
    :class:`sigprop.solve.depth.DepthResult`) as a list of :class:`Step`."""
    if sol.target == "max-depth":
        return _depth_steps(sol)
    if sol.target == "logit-var":
        return _logit_steps(sol)
    return _unit_steps(sol)


# ---------------------------------------------------------------------------------------

def _logit_block(eqs, value, s2_first, s2_rest, g) -> list[Step]:
    out = [
        Step("$q$ and $k$ are linear projections of the attention input (second moment "
             "$S_2$); the linear rule gives their variances, and the logit $q.k/sqrt(d_head)$ has variance "
             "$var(q) var(k)$:", sp.Eq(E.ell, eqs.logit_expr)),
        Step("sympy.solve with $sigma_q = sigma_k$:", sp.Eq(E.sq, eqs.qk_solution)),
    ]
    nums = {E.ell: value, E.d: g.d}
    out.append(Step(f"with $ell = {value:g}$, $d = {g.d}$, $S_2 = {s2_rest:.8g}$:",
                    sp.Eq(E.sq, _f(eqs.qk_solution.subs({**nums, E.S2: s2_rest})))))
    if abs(s2_first - s2_rest) > 1e-12:
        out.append(Step(f"first layer ($S_2 = {s2_first:.8g}$):",
                        sp.Eq(E.sq, _f(eqs.qk_solution.subs({**nums, E.S2: s2_first})))))
    return out


#: the unit forms, by (input norm, output norm, norm after the sum, parallel)
_FORMS = {
    (True, False, False, False): ("pre", "$x' = lambda x + beta Dropout(F(n {N}(x)))$"),
    (False, False, True, False): ("post", "$x' = {N}(lambda x + beta Dropout(F(x)))$"),
    (True, True, False, False): ("peri", "$x' = lambda x + beta {N}(Dropout(F(n {N}(x))))$"),
    (False, True, False, False): ("output", "$x' = lambda x + beta {N}(Dropout(F(x)))$"),
    (True, False, False, True): ("parallel", "$x' = lambda x + beta_A Dropout(Att(n {N}(x))) + "
                                             "beta_F Dropout(FFN(n {N}(x)))$"),
}


def _forms(sol) -> list[tuple[str, str]]:
    """The unit forms the solved model uses, in order of first use: (name, formula)."""
    out, seen = [], set()
    nn = registry.norm(sol.model.norm).short
    for u in sol.units():
        s0 = u[0]
        key = (s0.in_norm, s0.out_norm, s0.post, len(u) > 1)
        if key not in seen:
            seen.add(key)
            name, form = _FORMS.get(key, ("unit", "a residual unit"))
            out.append((name, form.replace("{N}", nn)))
    return out


def _unit_steps(sol) -> list[Step]:
    eqs = sol.equations
    g = eqs.g
    N = sol.n_layers
    m = sol.model if sol.model is not None else None
    units = sol.units()
    post = any(u[0].post for u in units)
    normed = any(u[0].out_norm for u in units)
    parallel = any(len(u) > 1 for u in units)
    nn = registry.norm(g.norm).short
    out: list[Step] = []
    sN = sp.Symbol("sigma_{s+1}^2", positive=True)
    forms = _forms(sol) if m is not None else []
    for name, form in forms:
        out.append(Step(f"{name} residual unit $s$ (norm: {g.norm}, gain 1): {form}"))
    out.append(Step("the branches are independent of the stream and of each other at initialisation, so the "
                    + ("norm's input (post) or the stream has" if post else "stream has") + " variance",
                    sp.Eq(sN, E.lam**2 * E.sigma2 + E.beta**2 * E.V)))
    out.append(Step("forward target: that variance is 1 at every unit", eqs.forward))
    out.append(Step("sympy.solve for the variance the branch must deliver:", sp.Eq(E.V, eqs.required)))
    if parallel:
        out.append(Step("a parallel block sums two branches: both deliver the same $V$ (the symmetric choice)",
                        sp.Eq(E.V, eqs.required_parallel)))
    if normed:
        out.append(Step(f"a branch with an output norm ({nn}) adds $beta^2$ times the norm's output variance "
                        "(~1) whatever its weights: the residual scales alone set the stream's variance there. "
                        "What its init still decides is the norm's input; it is solved for $V = 1$ there, which "
                        "makes the output norm an identity at initialisation (the branch's output correlation, "
                        "and for a homogeneous branch its $Gamma/V$, do not depend on that scale)"))
    k_val = sol.beta_k
    if k_val is not None:
        b2 = k_val / N
        out.append(Step(f"residual scales: $lambda^2 + beta^2 = 1$ and $beta^2 = k/N$ ($k = {k_val:g}$, $N = {N}$)",
                        sp.Eq(E.beta, sp.sqrt(E.k / E.N))))
        out.append(Step("numbers:", sp.Eq(sp.Tuple(E.lam, E.beta),
                                          sp.Tuple(_f(math.sqrt(max(1 - b2, 0.0)), 8), _f(math.sqrt(b2), 8)))))
    else:
        out.append(Step("residual scales: the given model's, per unit"))
    if sol.sublayers:
        s0 = sol.sublayers[0]
        out.append(Step(f"the input has $sigma^2 = {s0.x.var:g}$, so the first branch must deliver $V = "
                        f"{s0.required:.8g}$; from then on $sigma^2 = 1$ and every branch must deliver the $V$ above"
                        + (" (up to the norm's eps)" if post else ""),
                        sp.Eq(E.V, _f(s0.required, 8))))
    grad_target = sol.target == "unit-variance"
    bw = eqs.backward_post if post else eqs.backward_pre
    out.append(Step("gradient recursion (the branch path adds $beta^2 Gamma_s$; " +
                    ("the norm after the sum divides both paths by the variance of its input" if post else
                     "the branch's input norm divides it by $sigma_s^2$") + "); "
                    + ("the gradient is as flat as $g_s = g_{s+1}$ allows" if grad_target else
                       "not a target of unit-forward, reported after the solve")
                    + ("; with a final norm the gradient is judged at the stream below it" if g and m is not None
                       and m.final_norm else ""), bw))
    if grad_target and not post:
        out.append(Step("sympy.solve for the backward gain the branch must have (1 when $sigma_s^2 = 1$ and "
                        "$lambda^2 + beta^2 = 1$): exact conservation needs $Gamma_s = V_s$ in every branch", sp.Eq(E.Gamma, eqs.required_gain)))

    # logits
    att_subs = [s for s in sol.sublayers if s.kind == "attention"]
    if att_subs:
        s2s = [s.branch_in.var + s.branch_in.mean ** 2 for s in att_subs]
        out += _logit_block(eqs, sol.logit_var, s2s[0], s2s[-1], g)
        out.append(Step(f"(the logit variance {sol.logit_var:g} is DeepScaleLM's convention for a normalised "
                        "input; --logit-var changes it: the forward equation alone does not fix $sigma_q sigma_k$)"))

    # FFN
    out += _ffn_steps(sol, eqs, grad_target)

    # attention
    if att_subs:
        a0 = att_subs[0]
        probe = _homogeneity_probe(eqs, a0)
        out.append(Step("attention branch (rule 'attention', then the hidden dropout): output variance and backward "
                        "gain are homogeneous of degree 2 in $sigma_v$ and in $sigma_o$ (value and output projections "
                        f"act after the softmax); checked on the rule at layer 1: doubling $sigma_v = sigma_o$ "
                        f"multiplies them by {probe[0]:.9g} and {probe[1]:.9g}; so $V_A = s^4 V-hat_A(r)$",
                        sp.Eq(sp.Symbol("V_A"), E.s**4 * E.vhat)))
        out.append(Step("sympy.solve of $s^4 V-hat = V_req$ ($s = sigma_v = sigma_o$, the symmetric choice):",
                        sp.Eq(E.s, eqs.scale_solution)))
        rs, rF, rn = sp.Symbol("r_s"), sp.Symbol("r_{B,s}"), sp.Symbol("r_{s+1}")
        out.append(Step("$V-hat_A$ depends on the branch input's token correlation $r$, which follows the stream's "
                        "recursion (residual rule" + (", then the norm's correlation factor" if post else "")
                        + "), evaluated numerically with the solved stds:",
                        sp.Eq(rn, (E.lam**2 * E.sigma2 * rs + E.beta**2 * E.V * rF) / (E.lam**2 * E.sigma2 + E.beta**2 * E.V))))
        picks = sorted({0, len(att_subs) // 2, len(att_subs) - 1})
        for i in picks:
            a = att_subs[i]
            out.append(Step(f"layer {a.layer}: branch input correlation $r = {a.branch_in.corr:.6g}$ (stream "
                            f"{a.x.corr:.6g}), $V-hat_A = {a.vhat:.8g}$, $V_req = {a.required:.8g}$",
                            sp.Eq(sp.Symbol(f"sigma_v^{{({a.layer})}}"), _f(a.stds["v"], 8))))
        # DeepScaleLM's simplification
        r_sym = sp.Symbol("r_l", positive=True)
        dslm = ((1 - E.p_h) / (r_sym * E.d * E.width)) ** sp.Rational(1, 4)
        out.append(Step("DeepScaleLM keeps only the token-average part of the attention output (small logits, "
                        "large $L$): $V-hat_A = d w r/(1-p_h)$, i.e.", sp.Eq(E.s, dslm)))
        for j, i in enumerate(picks):
            a = att_subs[i]
            dv = float(dslm.subs({E.p_h: g.p_hid, r_sym: a.x.corr, E.d: g.d, E.width: g.width}))
            why = (": the solved $V-hat$ adds the rule's $1/L$ terms (each token's own share of its attention average, "
                   "amplified by the softmax's non-uniformity $exp((1-r) ell)$ and by the attention dropout) and the "
                   "norm's finite-$d$ correlation factor, both of which the simplified form drops") if j == 0 else ""
            out.append(Step(f"layer {a.layer} with the stream correlation $r = {a.x.corr:.6g}$: DeepScaleLM {dv:.6g}, "
                            f"solved {a.stds['v']:.6g} ({100 * (a.stds['v'] / dv - 1):+.2f}%){why}"))
        if grad_target and sol.points:
            out += _attention_gradient_steps(sol, a0, eqs)
    ref = sol.extra.get("refined")
    if ref and ref["rounds"]:
        devs = ref["forward_var_max_dev"]
        out.append(Step(f"refined on the prediction engine, whose stream has structure the mean-field recursion "
                        f"leaves out (a causal model's positions): {ref['rounds']} rounds scaling each unit's free "
                        f"stds by $(V_req/V_predicted)^(1/2k)$, forward $max |var - 1|$ {devs[0]:.3g} -> {devs[-1]:.3g}"))
    # verdict
    dev = sol.deviations()
    if dev:
        out.append(Step(f"prediction of the solved model (sigprop.model.predict): $max |var - 1|$ = "
                        f"{dev['forward_var_max_dev']:.3g}, gradient input/output $g_0/g_N$ = "
                        f"{dev['grad_ratio_input_output']:.6g} ($max |g/g_N - 1|$ = {dev['grad_var_max_dev']:.3g})"))
    if sol.note:
        out.append(Step("note: " + sol.note))
    out.append(Step(verdict(sol)))
    return out


def _ffn_steps(sol, eqs, grad_target: bool) -> list[Step]:
    """The FFN branch: composed symbolically from its rule chain, its weights' common std in
    closed form (homogeneous) or numerically, and its gradient equation."""
    g = eqs.g
    f = eqs.ffn()
    chain, _ = eqs.chains.template("ffn", 0)
    names = eqs.chains.names["ffn"]
    rules = ", ".join(rule if rule != "dropout" else "dropout $p_f$" for rule, _ in chain)
    weights = " = ".join(f"sigma_{w}" for w in names)
    out = [Step(f"FFN branch composed from the rules of the block description ({rules}, then the hidden dropout "
                "$p_h$), input variance $v$, token correlation $r$: forward variance",
                sp.Eq(sp.Symbol("V_F"), f["V"])),
           Step("and backward gain per unit upstream gradient variance (at the branch input)",
                sp.Eq(sp.Symbol("Gamma_F"), f["Gamma"]))]
    eq, closed = eqs.ffn_solution()
    degree = 2 * len(names)
    ffn_subs = [s for s in sol.sublayers if s.kind == "ffn"]
    if closed is not None:
        out.append(Step(f"homogeneous of degree {degree} in ${weights} = s$ (the symmetric choice); sympy.solve "
                        "of $V_F = V_req$:", sp.Eq(E.s, closed)))
    else:
        out.append(Step(f"not homogeneous in ${weights} = s$ (the activation {g.activation} is not): $V_F(s) = V_req$ "
                        "is solved numerically on the rules (secant steps in log s, to 1e-13 in log V)", eq))
    if not ffn_subs:
        return out
    fs = ffn_subs[-1]
    w0 = names[0]
    out.append(Step(f"numbers ($d = {g.d}$, $d_ff = {g.d_ff}$, $p_f = {g.p_ffn:g}$, $p_h = {g.p_hid:g}$, "
                    f"$v = {fs.branch_in.var:.8g}$, $V_req = {fs.required:.8g}$):", sp.Eq(E.s, _f(fs.stds[w0], 8))))
    if grad_target:
        from sigprop.solve.blocks import branch_rows

        rows = branch_rows(eqs.chains.chain("ffn", fs.layer - 1, fs.stds), fs.branch_in, backward=True)
        rv = float(rows[2] / rows[0])
        expr = None
        if closed is not None:
            expr = sp.Eq(sp.Symbol("Gamma_F") / sp.Symbol("V_F"),
                         sp.simplify((f["Gamma"] / f["V"]).subs({sym: E.s for sym in f["stds"].values()})))
        vin = fs.branch_in.var
        out.append(Step(f"FFN gradient equation: $Gamma_F v / V_F = {rv * vin:.8g}$ at the solved std (on the rules, "
                        "upstream $r_g = 0$; times the input norm's backward factor); the two equations "
                        + ("coincide" if abs(rv * vin - 1) < 1e-9 else "differ: no common solution")
                        + ("" if names != ("gate", "up", "down") else
                           " (a gated FFN passes the gradient back through both the gate and the up projection)"),
                        expr))
    return out


def verdict(sol) -> str:
    """The one-line verdict of a solution (prose markup): feasible, with the gradient the
    unit-variance solution reaches, or infeasible with the reason."""
    if not sol.feasible:
        return "infeasible: " + (sol.reason or "")
    grad = getattr(sol, "extra", {}).get("gradient") if sol.target == "unit-variance" else None
    if not grad:
        return "feasible"
    if grad["within_tol"]:
        return (f"feasible: forward and gradient variance within {sol.tol:g} of 1 at every sublayer "
                f"(gradient input/output {grad['ratio_input_output']:.4g})")
    return (f"feasible: forward variance within {sol.tol:g} of 1 at every sublayer; the gradient is as flat as the "
            f"free quantities allow, input/output $g_0/g_N$ = {grad['ratio_input_output']:.4g} "
            f"($max |g/g_N - 1|$ = {grad['max_dev']:.3g}; --strict requires it within {sol.tol:g})")


def _homogeneity_probe(eqs, a0) -> tuple[float, float]:
    """(variance ratio, backward-gain ratio) of the attention branch at layer 1 when
    sigma_v = sigma_o doubles: 16 for a branch homogeneous of degree 4 in s."""
    from sigprop.solve.blocks import branch_rows

    ch = eqs.chains
    st1 = dict(a0.stds)
    st2 = dict(st1, v=2 * st1["v"], o=2 * st1["o"])
    x = a0.branch_in
    r1 = branch_rows(ch.chain("attention", a0.layer - 1, st1), x, backward=True)
    r2 = branch_rows(ch.chain("attention", a0.layer - 1, st2), x, backward=True)
    return float(r2[0] / r1[0]), float(r2[2] / r1[2])


def split_probes(eqs, a0, f0) -> dict:
    """Which free quantities change a branch's backward gain over its forward variance, on the
    rules at layer 1: the ratio (Gamma/V after) / (Gamma/V before) for sigma_v x 2 with
    sigma_o / 2 (attention), the FFN's first weight std x 2 with its last / 2 (``in_out_split``:
    in and out; gated: gate and down), a gated FFN's gate x 2 with up / 2
    (``gate_up_split``), and the logit variance doubled (sigma_q = sigma_k times 2^(1/4));
    upstream gradient correlation 0.  ``eqs``: the solution's equations (their chains)."""
    from sigprop.solve.blocks import branch_rows

    ch = eqs.chains

    def ratio(kind, sub, st):
        rows = branch_rows(ch.chain(kind, sub.layer - 1, st), sub.branch_in, backward=True)
        return float(rows[2] / rows[0])

    out = {}
    st = dict(a0.stds)
    base = ratio("attention", a0, st)
    out["attention_base"] = base
    out["v_o_split"] = ratio("attention", a0, dict(st, v=2 * st["v"], o=st["o"] / 2)) / base
    q = 2 ** 0.25
    out["logit_var_x2"] = ratio("attention", a0, dict(st, q=q * st["q"], k=q * st["k"])) / base
    if f0 is not None:
        sf = dict(f0.stds)
        names = ch.names["ffn"]
        fb = ratio("ffn", f0, sf)
        out["ffn_base"] = fb
        out["in_out_split"] = ratio("ffn", f0, dict(sf, **{names[0]: 2 * sf[names[0]], names[-1]: sf[names[-1]] / 2})) / fb
        if "gate" in names:
            out["gate_up_split"] = ratio("ffn", f0, dict(sf, gate=2 * sf["gate"], up=sf["up"] / 2)) / fb
    return out


def _attention_gradient_steps(sol, a0, eqs) -> list[Step]:
    """Layer 1's attention gradient equation with the rule's backward gain at the gradient
    correlation the prediction finds there, and which free quantities could change it."""
    from sigprop.model import blocks as model_blocks
    from sigprop.rules import get
    from sigprop.solve.blocks import branch_rows
    from sigprop.state import Backward

    g = eqs.g
    rg = sol.points[a0.index + 1].gcorr     # gradient correlation arriving at the unit's output
    unit = dict(a0.stds, v=1.0, o=1.0)
    rows = branch_rows(eqs.chains.chain("attention", a0.layer - 1, unit), a0.branch_in, backward=True)
    vh = float(rows[0])
    gh = float(rows[2] + rg * rows[3])
    # an input norm also passes the branch gradient (~1/sigma^2 (d-2)/(d-3))
    if a0.in_norm:
        rule, prm = model_blocks.norm_params(sol.model, model_blocks.GAUSSIAN_TOKENS)
        _, nb = get(rule).evaluate(a0.x, Backward(1.0, 0.0), **prm)
        gh *= float(nb.var)
    # a^2 + b^2 Gamma = 1 (with the input norm's 1/sigma^2; post: the norm's input has variance 1)
    b2 = a0.b ** 2 if len([s for s in sol.sublayers if s.index == a0.index]) == 1 else a0.unit_b2 / a0.required
    gam_req = (1.0 - a0.a**2) / b2
    system = [sp.Eq(E.s**4 * _f(vh, 8), _f(a0.required, 8)), sp.Eq(E.s**4 * _f(gh, 8), _f(gam_req, 8))]
    sols = sp.solve(system, E.s)
    sols = sols if isinstance(sols, list) else []
    f0 = next((s for s in sol.sublayers if s.kind == "ffn"), None)
    pr = split_probes(eqs, a0, f0)
    sol.extra["split_probes"] = pr
    out = [
        Step(f"attention gradient equation at layer 1: the rule's backward gain per $s^4$ at the predicted gradient "
             f"correlation $r_g = {rg:.4g}$ ($B_0 + r_g B_1$, times the input norm's factor) is "
             f"$Gamma-hat = {gh:.6g}$, against $V-hat = {vh:.6g}$ (ratio {gh / vh:.4g}); the value path carries "
             "$~ 1/L + r_g$, the forward variance $~ r$"),
        Step("the forward and the gradient equation of that branch, in $s = sigma_v = sigma_o$:", sp.Tuple(*system)),
        Step("sympy.solve of the system for $s$ gives the solution set", sp.FiniteSet(*sols) if sols else sp.S.EmptySet),
    ]
    if sols:
        out.append(Step("both equations hold"))
        return out
    k = sol.beta_k
    ffn_txt = ""
    if "in_out_split" in pr:
        names = eqs.chains.names["ffn"]
        homog = eqs.homogeneous("ffn")
        ffn_txt = (f"; doubling $sigma_{names[0]}$ and halving $sigma_{names[-1]}$ multiplies the FFN's by "
                   f"{pr['in_out_split']:.9g}"
                   + (f", doubling $sigma_gate$ and halving $sigma_up$ by {pr['gate_up_split']:.9g}"
                      if "gate_up_split" in pr else "")
                   + (" (a homogeneous FFN is homogeneous in each weight)" if homog else
                      f" ({g.activation} is not homogeneous: the split moves its pre-activation variance)"))
    out.append(Step(
        "which free quantities change $Gamma/V$ with the forward held (on the rules at layer 1, upstream "
        f"$r_g = 0$): doubling $sigma_v$ and halving $sigma_o$ multiplies attention's $Gamma/V$ by {pr['v_o_split']:.9g}"
        + ffn_txt + f"; doubling the logit variance (--logit-var) multiplies it by {pr['logit_var_x2']:.4g}; "
        + (f"$beta^2 = k/N$ ($k = {k:g}$, --beta-k)" if k is not None else "the branch scale $beta$")
        + " sets how much each branch adds and so how much the mismatch "
        "counts, not the mismatch. So at the given logit variance the symmetric solution is already as flat "
        "as the free quantities allow"))
    return out


def _logit_steps(sol) -> list[Step]:
    eqs = sol.equations
    g = eqs.g
    s2 = sol.extra["attention_input_s2"]
    out = [Step(f"target: attention logit variance $ell = {sol.logit_var:g}$ at every layer of the "
                f"{sol.arch} model (other weights from the init '{sol.model.notes.get('init')}')")]
    out += _logit_block(eqs, sol.logit_var, float(s2[0]), float(s2[-1]), g)
    from sigprop.solve.formula import compress

    fq = compress(sol.column("attention", "q"))
    if fq.expr is not None and fq.law != "constant":
        out.append(Step(f"per layer ($S_2$ varies with the norm scale): {fq.law} law in $l$", sp.Eq(E.sq, fq.expr)))
    if "logit_var_max_dev" in sol.extra:
        out.append(Step(f"prediction of the solved model: logit variance within {sol.extra['logit_var_max_dev']:.2g} "
                        f"(relative) of {sol.logit_var:g} at every layer"))
    return out


def _depth_steps(res) -> list[Step]:
    n_sym = sp.Symbol("N", positive=True, integer=True)
    ratio = sp.Function("rho")(n_sym)
    out = [Step(f"gradient ratio between the model's input and output, $rho(N) = g_0 / g_N$, predicted layer by layer "
                f"for the {res.arch} model with init '{res.init}'; target $|log rho(N)| <= log R$, $R = {res.max_ratio:g}$",
                sp.Le(sp.Abs(sp.log(ratio)), sp.log(_f(res.max_ratio))))]
    out.append(Step("search: doubling $N$ until the ratio leaves the band, then bisection (assumes the ratio is "
                    "monotone in N; every evaluation is listed)"))
    for n, rv in res.evaluations:
        out.append(Step(f"$N = {n}$: $rho = {rv:.6g}$" + ("" if abs(math.log(rv)) <= math.log(res.max_ratio) else "  (outside)")))
    if res.max_depth is None:
        out.append(Step(f"no limit found up to $N = {res.n_max}$: growth law of the gradient there: {res.law}"))
    else:
        out.append(Step(f"largest $N$: {res.max_depth}; the limit comes from the gradient's {res.law} growth law "
                        f"({res.law_detail})"))
    return out
