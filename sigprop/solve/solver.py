"""The moment-conserving initialisation, sublayer by sublayer (targets unit-forward,
unit-variance, logit-var).

Equations (the specified semantics; sublayer s with skip scale a = lambda, branch scale b = beta,
norm scale n, stream variance sigma_s^2 entering it):

* forward, Pre-LN  x' = a x + b Drop(F(n LN x)):  sigma_{s+1}^2 = a^2 sigma_s^2 + b^2 V_s;
  forward, Post-LN x' = LN(a x + b Drop(F(x))):   the LayerNorm's input a x + b Drop(F(x)) has
  variance a^2 sigma_s^2 + b^2 V_s;
  target: that variance is 1, i.e. the branch must deliver V_s = (1 - a^2 sigma_s^2) / b^2
  (1 when sigma_s^2 = 1 and a^2 + b^2 = 1), feasible iff a^2 sigma_s^2 < 1;
* backward: g_s = g_{s+1} (a^2 + b^2 Gamma_s / sigma_s^2) (Pre-LN: the LayerNorm divides by
  the stream variance; Post-LN: the LayerNorm factor multiplies both paths); target g_s = g_{s+1};
* logits: var(q) var(k) = (d sigma_q^2 S2)(d sigma_k^2 S2) = ell (S2 the branch input's
  second moment).

Unknowns per sublayer: attention sigma_q = sigma_k (the logit variance fixes their product)
and sigma_v = sigma_o (the branch is homogeneous in sigma_v^2 sigma_o^2, so only the product is
determined; the symmetric choice is DeepScaleLM's); FFN sigma_in = sigma_out (ReLU: only the
product is determined; GeLU: the symmetric choice).  Each forward equation is solved in closed
form by sympy (:mod:`sigprop.solve.equations`) with the branch's normalised gain V-hat(r_s)
from the rules (:mod:`sigprop.solve.blocks`); r_s follows from the recursion of the stream's
token correlation, evaluated numerically layer by layer with the solved stds.

The gradient is then predicted for the solved model with :func:`sigprop.model.predict.predict`
(the same engine as ``sigprop predict --spec``), which decides the unit-variance verdict.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from sigprop.errors import DomainError
from sigprop.model.spec import WEIGHTS, Model, Sublayers
from sigprop.rules import get
from sigprop.rules.layernorm import combine_token_stats
from sigprop.solve import blocks, require_supported
from sigprop.solve.blocks import BranchTable, Geometry, geometry, rows_at
from sigprop.state import Forward

TARGETS = ("unit-variance", "unit-forward", "logit-var", "max-depth")
#: placements the unit targets solve for (the residual scales are part of the solution)
UNIT_ARCHS = ("preln", "postln")
DEFAULT_TOL = 0.01
DEFAULT_LOGIT_VAR = 1.0


class Infeasible(Exception):
    """A target with no solution; ``str(e)`` is the reason (one line, in the prose markup of
    :mod:`sigprop.solve.prose`: :func:`~sigprop.solve.prose.plain` for a terminal)."""


@dataclass
class Sublayer:
    """What the solver found for one sublayer (0-based index s = 2 l + kind)."""

    layer: int                # 1-based
    kind: str
    post: bool
    a: float
    b: float
    n: float
    x: Forward                # stream entering
    branch_in: Forward        # the branch's input state
    required: float           # V_s = (1 - a^2 sigma^2) / b^2
    vhat: float               # branch output variance per unit of the homogeneous scale
    branch_corr: float        # branch output token correlation
    stds: dict                # solved stds of this sublayer
    out: Forward              # stream leaving
    z: Forward | None = None  # Post-LN: the LayerNorm's input


@dataclass
class Solution:
    target: str
    arch: str
    model: Model | None               # None when no model could be solved
    feasible: bool
    reason: str | None
    tol: float
    logit_var: float | None = None
    sublayers: list = field(default_factory=list)
    points: list | None = None        # predict(model) of the solved model
    beta_k: float | None = None
    equations: object = None           # sigprop.solve.equations.SublayerEquations
    timings: dict = field(default_factory=dict)
    tables: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    strict: bool = False               # unit-variance: the gradient must be within tol as well
    note: str | None = None            # unit-variance: why the gradient is not exactly conserved

    # -- per-layer columns -------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return self.model.n_layers if self.model is not None else int(self.extra.get("n_layers", 0))

    def column(self, kind: str, name: str) -> np.ndarray:
        return np.asarray(getattr(self.model, kind).std[name])

    def deviations(self) -> dict:
        """Largest |forward var - 1| and |gradient var / top gradient var - 1| over the
        sublayer outputs (from the prediction of the solved model)."""
        if not self.points:
            return {}
        g_top = self.model.grad.var
        fw = max(abs(p.var - 1.0) for p in self.points[1:])
        gr = max(abs(p.gvar / g_top - 1.0) for p in self.points) if g_top > 0 else math.nan
        return {"forward_var_max_dev": fw, "grad_var_max_dev": gr,
                "grad_ratio_input_output": self.points[0].gvar / g_top if g_top > 0 else math.nan}

    def gradient_factors(self) -> np.ndarray:
        """g_s / g_{s+1} per sublayer (from the prediction)."""
        g = np.array([p.gvar for p in self.points])
        return g[:-1] / g[1:]


# ---------------------------------------------------------------------------------------
# the unit targets
# ---------------------------------------------------------------------------------------

def base_model(arch: str, **options) -> Model:
    """The model whose residual scales the unit targets keep: lambda^2 + beta^2 = 1 with
    beta^2 = beta_k / N (the presets' DeepScaleLM scales, any placement), weights to be solved."""
    from sigprop.model import presets

    if arch not in UNIT_ARCHS:
        raise DomainError(f"the unit targets solve the residual scales for a placement: --arch must be "
                          f"one of {', '.join(UNIT_ARCHS)}, got {arch!r}")
    for k in ("init", "skip_scale", "branch_scale", "init_std", "mixln_alpha"):
        if options.get(k) is not None:
            raise DomainError(f"{k.replace('_', '-')} does not apply to the unit targets: they solve the "
                              "weight stds and take the residual scales from --beta-k (beta^2 = k/N)")
    options = {k: v for k, v in options.items() if v is not None}
    model = presets.resolve("dslm" if arch == "preln" else "dslm-post", init="normal", **options)
    require_supported(model)
    return model


def solve_unit(arch: str, target: str = "unit-variance", logit_var: float = DEFAULT_LOGIT_VAR,
               tol: float = DEFAULT_TOL, verify: bool = True, strict: bool = False, **options) -> Solution:
    """Solve a unit target for ``arch`` ("preln" or "postln") and the model options of
    :func:`sigprop.model.presets.resolve` (n_layers, d_model, ..., beta_k).

    Both targets solve the forward equation exactly.  unit-variance then reports the gradient
    the solved model has (``extra["gradient"]``, :func:`gradient_summary`; ``note``) and is feasible when the forward variance
    is within ``tol``; with ``strict`` the gradient must also stay within ``tol`` of its top
    value at every sublayer."""
    from sigprop.solve.equations import for_geometry

    if target not in ("unit-variance", "unit-forward"):
        raise DomainError(f"solve_unit: target must be unit-variance or unit-forward, got {target!r}")
    if not (logit_var > 0 and math.isfinite(logit_var)):
        raise DomainError(f"the logit variance must be > 0, got {logit_var!r}")
    t0 = time.perf_counter()
    base = base_model(arch, **options)
    g = geometry(base)
    eqs = for_geometry(g)
    sol = Solution(target, arch, base, True, None, tol, logit_var=logit_var, equations=eqs,
                   beta_k=options.get("beta_k", 1.0), strict=bool(strict))
    sol.extra["n_layers"] = base.n_layers
    try:
        subs, columns = _forward_solve(base, g, eqs, logit_var, sol.tables)
    except Infeasible as e:
        # no model: the base model's placeholder stds are not a solution
        sol.feasible, sol.reason, sol.model = False, str(e), None
        sol.timings["solve_s"] = time.perf_counter() - t0
        return sol
    sol.sublayers = subs
    sol.model = _with_stds(base, columns, f"solved-{arch}", {"solve_target": target, "logit_var": logit_var})
    sol.timings["solve_s"] = time.perf_counter() - t0
    if verify:
        from sigprop.model.predict import predict

        t1 = time.perf_counter()
        sol.points = predict(sol.model)
        sol.timings["predict_s"] = time.perf_counter() - t1
        _verdict(sol)
    return sol


def _forward_solve(base: Model, g: Geometry, eqs, logit_var: float, tables: dict):
    """Layer by layer: each sublayer's required branch variance, the stds that deliver it,
    and the stream state they produce."""
    ln = get("layernorm")
    res = get("residual")
    N = base.n_layers
    x = Forward(base.input.mean, base.input.var, base.input.corr)
    cols = {kind: {w: np.zeros(N) for w in WEIGHTS[kind]} for kind in WEIGHTS}
    seen: dict = {}
    subs = []
    # per-token variance statistics of the stream (the LayerNorm rule's params centred, kappa),
    # tracked as the prediction engine does: Gaussian input (0, 1), Gaussian branch outputs,
    # sums mixed by layernorm.combine_token_stats, a LayerNorm output (1, 0)
    tok = (0.0, 1.0)
    for l in range(N):
        for kind in ("attention", "ffn"):
            c = getattr(base, kind)
            post, a, b, n = bool(c.post[l]), float(c.skip_scale[l]), float(c.branch_scale[l]), float(c.norm_scale[l])
            where = f"layer {l + 1} {kind}"
            if b == 0:
                raise Infeasible(f"{where}: branch scale 0 leaves nothing to solve")
            if post:
                xb = x
            else:
                y, _ = ln.fast(x, None, dict(d=g.d, centred=tok[0], kappa=tok[1]))
                xb = Forward(0.0, float(y.var) * n * n, float(y.corr))
            required = (1.0 - a * a * x.var) / (b * b)
            if not required > 0:
                raise Infeasible(f"{where}: the skip path alone carries variance $a^2 sigma^2$ = "
                                 f"{a * a * x.var:.6g} >= 1, so no branch variance can make the "
                                 f"{'LayerNorm input' if post else 'stream'} variance 1 "
                                 f"(stream variance entering: {x.var:.6g})")
            s2 = xb.var + xb.mean ** 2
            if kind == "attention":
                sq = eqs.qk_std(logit_var, s2)
                ref = {"q": sq, "k": sq, "v": 1.0, "o": 1.0}
            elif g.activation == "relu":
                ref = {"in": 1.0, "out": 1.0}
            else:
                s = eqs.gelu_std(required, xb.var)
                ref = {"in": s, "out": s}
            rows = _rows(tables, seen, kind, g, xb, ref, remaining=N - l)
            vhat, cov = float(rows[0]), float(rows[1])
            if not vhat > 0:
                raise Infeasible(f"{where}: the branch output variance is 0 for any weight scale")
            if kind == "attention" or g.activation == "relu":
                s = eqs.scale_std(required, vhat)
                stds = dict(ref)
                if kind == "attention":
                    stds["v"] = stds["o"] = s
                else:
                    stds["in"] = stds["out"] = s
            else:
                stds = dict(ref)
                vhat_rel = vhat / required
                if abs(vhat_rel - 1) > 1e-8:
                    raise Infeasible(f"{where}: GeLU FFN std solve did not converge (variance {vhat:.6g}, "
                                     f"wanted {required:.6g})")
            bcorr = cov / vhat
            # the rules' formulas without per-call domain checks (Rule.fast): the states come
            # out of rules, the parameters were validated with the model
            z, _ = res.fast(x, None, dict(a=a, b=b, y_mean=0.0, y_var=required, y_corr=min(max(bcorr, -1.0), 1.0)))
            z = Forward(float(z.mean), float(z.var), float(z.corr))
            tok = combine_token_stats(a * a * x.var, tok[0], tok[1], b * b * required, 0.0, 1.0)
            if post:
                o, _ = ln.fast(z, None, dict(d=g.d, centred=tok[0], kappa=tok[1]))
                out = Forward(0.0, float(o.var), float(o.corr))
                tok = (1.0, 0.0)
            else:
                out = z
            for w, v in stds.items():
                cols[kind][w][l] = v
            subs.append(Sublayer(l + 1, kind, post, a, b, n, x, xb, required, vhat, bcorr, stds, out,
                                 z if post else None))
            x = out
    return subs, cols


#: a correlation table costs about this many rule evaluations; below it, evaluate directly
TABLE_WORTH = 33


def _rows(tables: dict, seen: dict, kind: str, g: Geometry, xb: Forward, ref: dict,
          remaining: int = TABLE_WORTH) -> np.ndarray:
    """Branch rows at one input state: direct rule evaluation the first time a (kind, input
    variance, stds) combination appears, a correlation table from the second time on (the
    steady state of every layer after the first) when enough layers remain to repay it."""
    key = (kind, xb.mean == 0, round(xb.var, 12), tuple(sorted((k, round(v, 15)) for k, v in ref.items())))
    tab = tables.get(key)
    if tab is None and key in seen and xb.mean == 0 and remaining >= TABLE_WORTH:
        t0 = time.perf_counter()
        tab = tables[key] = BranchTable(kind, g, xb.var, ref)
        tab.build_s = time.perf_counter() - t0
    seen[key] = True
    if tab is not None and 0 <= xb.corr <= blocks.R_MAX:
        return tab.rows(float(xb.corr))
    return rows_at(None, kind, g, xb, ref)


def _with_stds(base: Model, columns: dict, arch: str, notes: dict) -> Model:
    subl = {}
    for kind in WEIGHTS:
        c = getattr(base, kind)
        subl[kind] = Sublayers(kind, c.post, c.skip_scale, c.branch_scale, c.norm_scale,
                               columns[kind], {w: 0.0 for w in WEIGHTS[kind]})
    return Model(arch=arch, n_layers=base.n_layers, d_model=base.d_model, n_heads=base.n_heads,
                 d_head=base.d_head, d_ff=base.d_ff, seq_len=base.seq_len, activation=base.activation,
                 norm=base.norm, causal=base.causal, dropout=base.dropout, input=base.input, grad=base.grad,
                 attention=subl["attention"], ffn=subl["ffn"], notes=notes)


# ---------------------------------------------------------------------------------------
# verdicts
# ---------------------------------------------------------------------------------------

def branch_gradient_ratios(sol: Solution) -> np.ndarray:
    """Per sublayer: the branch's backward gain over its forward variance, Gamma_s / V_s,
    read off the predicted gradient factor f_s = g_s / g_{s+1}:
    Pre-LN f = a^2 + b^2 Gamma / sigma^2 (so Gamma/V = (f - a^2) sigma^2 / (b^2 V));
    Post-LN f = lambda_LN (a^2 + b^2 Gamma) / (a^2 sigma^2 + b^2 V) (with the LayerNorm's
    own factor lambda_LN ~ 1 folded in)."""
    f = sol.gradient_factors()
    out = np.empty(len(sol.sublayers))
    for i, s in enumerate(sol.sublayers):
        if s.post:
            out[i] = (f[i] * (s.a ** 2 * s.x.var + s.b ** 2 * s.required) - s.a ** 2) / (s.b ** 2 * s.required)
        else:
            out[i] = (f[i] - s.a ** 2) * s.x.var / (s.b ** 2 * s.required)
    return out


def gradient_summary(sol: Solution) -> dict:
    """The gradient of the solved model (unit targets, from the prediction): the input/output
    ratio g_0/g_N, the largest |g_s/g_N - 1|, the branches' Gamma/V per kind (min, mean, max),
    the token correlations of the gradient and of the stream, and whether the gradient is
    within the tolerance."""
    dev = sol.deviations()
    ratios = branch_gradient_ratios(sol)
    out = {"ratio_input_output": dev["grad_ratio_input_output"], "max_dev": dev["grad_var_max_dev"],
           "within_tol": bool(dev["grad_var_max_dev"] <= sol.tol)}
    for kind in ("attention", "ffn"):
        rk = np.array([r for r, s in zip(ratios, sol.sublayers) if s.kind == kind])
        if rk.size:
            out[f"{kind}_gain_ratio"] = {"min": float(rk.min()), "mean": float(rk.mean()), "max": float(rk.max())}
    out["grad_corr"] = {"min": float(min(p.gcorr for p in sol.points)), "max": float(max(p.gcorr for p in sol.points))}
    out["stream_corr"] = {"min": float(min(p.corr for p in sol.points)), "max": float(max(p.corr for p in sol.points))}
    # ln(g_0/g_N) = sum_s ln f_s with f_s = 1 - beta^2 (1 - Gamma_s/V_s) (Pre-LN, sigma^2 = 1): with
    # beta^2 = k/N the sum is about -k times the mean of (1 - Gamma/V) over the layers, which
    # depends on the correlation trajectory r(l/N), not on N
    b2 = np.array([s.b ** 2 for s in sol.sublayers])
    out["ratio_estimate"] = float(np.exp(-np.sum(b2 * (1 - ratios))))
    return out


def gradient_note(sol: Solution, grad: dict) -> str:
    """One paragraph: why the solved model's gradient is not exactly conserved (prose markup
    of :mod:`sigprop.solve.prose`)."""
    m = sol.model
    att, ffn = grad.get("attention_gain_ratio"), grad.get("ffn_gain_ratio")
    gc, sc = grad["grad_corr"], grad["stream_corr"]
    k = sol.beta_k if sol.beta_k is not None else 1.0
    text = ("Exact unit gradient variance needs the loss gradient's token correlation $r_g$ (--grad-corr, "
            f"here {m.grad.corr:g}) to equal the stream's $r$: attention's output is close to a token average "
            "of the values, variance $~ r + (1-r)/L$, while the gradient through its value path is the token "
            "average of the upstream gradient, $~ r_g + (1-r_g)/L$. "
            "That is necessary, not sufficient: with them equal the query/key path still adds to the backward gain. "
            f"Here $r_g$ = {gc['min']:.2g} .. {gc['max']:.2g} against $r$ = {sc['min']:.2g} .. {sc['max']:.2g}")
    if att:
        text += (f", so attention passes back $Gamma/V$ = {att['min']:.2g} .. {att['max']:.2g} of what it adds"
                 + (f" (FFN {ffn['mean']:.4g})" if ffn else ""))
    text += ("; no weight std changes $Gamma/V$ with the forward held (V and O, and a ReLU FFN's in and out, "
             "enter both as one product; only the logit variance, --logit-var, does). With $beta^2 = k/N$ "
             "the factors $1 - beta^2 (1 - Gamma/V)$ multiply to $g_0/g_N ~ exp(-k * mean(1 - Gamma/V))$ = "
             f"{grad['ratio_estimate']:.3g} "
             f"($k = {k:g}$), which does not grow with the depth.")
    if m.activation == "gelu":
        text += (" A GeLU FFN's backward gain slightly exceeds its forward gain ($E[gelu^2] < s^2 E[gelu'^2]$), "
                 "which offsets a little of the loss.")
    return text


def _verdict(sol: Solution) -> None:
    dev = sol.deviations()
    tol = sol.tol
    if dev["forward_var_max_dev"] > tol:
        i = max(range(1, len(sol.points)), key=lambda j: abs(sol.points[j].var - 1))
        p = sol.points[i]
        sol.feasible = False
        sol.reason = (f"forward variance {p.var:.6g} at layer {p.layer} {p.sublayer} is outside $1 +- {tol:g}$ "
                      "in the prediction of the solved model")
        return
    if sol.target != "unit-variance":
        return
    grad = gradient_summary(sol)
    sol.extra["gradient"] = grad
    if grad["within_tol"]:
        return
    sol.note = gradient_note(sol, grad)
    if not sol.strict:
        return
    parts = []
    for kind in ("attention", "ffn"):
        rk = grad.get(f"{kind}_gain_ratio")
        if rk and max(abs(rk["min"] - 1), abs(rk["max"] - 1)) > 1e-3:
            parts.append(f"{kind} $Gamma/V$ = {rk['min']:.4g} .. {rk['max']:.4g}")
    sol.feasible = False
    sol.reason = ("unit-variance --strict: the forward variance is conserved, but the gradient is not within "
                  f"{tol:g} of 1 (input/output {grad['ratio_input_output']:.4g}, $max |g/g_N - 1|$ = "
                  f"{grad['max_dev']:.3g}): each branch would need $Gamma = V$ (backward gain equal to forward "
                  "variance) and has " + ("; ".join(parts) or "$Gamma/V$ within 1e-3 of 1")
                  + ". Without --strict the same solution is accepted with this gradient")


# ---------------------------------------------------------------------------------------
# logit-variance target
# ---------------------------------------------------------------------------------------

def solve_logit_var(value: float, arch: str = "preln", init: str | None = None, tol: float = DEFAULT_TOL,
                    verify: bool = True, **options) -> Solution:
    """Q/K stds giving attention logit variance ``value`` at every layer of the preset model
    (any arch and init; the other weights keep the init's stds)."""
    from sigprop.model import presets
    from sigprop.solve.equations import for_geometry

    if not (value > 0 and math.isfinite(value)):
        raise DomainError(f"--value (the logit variance) must be > 0, got {value!r}")
    t0 = time.perf_counter()
    options = {k: v for k, v in options.items() if v is not None}
    base = presets.resolve(arch, init, **options)
    require_supported(base)
    g = geometry(base)
    ln = get("layernorm")
    att = base.attention
    N = base.n_layers
    # the attention input's second moment: Pre-LN n^2 times the LayerNorm output variance
    # (eps makes it 1 - O(1e-5)); Post-LN the stream, which is a LayerNorm output after the
    # first sublayer and the model input before it
    v_ln = float(ln.evaluate(Forward(0.0, 1.0, 0.0), None, d=g.d)[0].var)
    s2 = np.where(att.post, v_ln, att.norm_scale ** 2 * v_ln)
    if att.post[0]:
        s2[0] = base.input.var + base.input.mean ** 2
    else:
        y, _ = ln.evaluate(Forward(base.input.mean, base.input.var, base.input.corr), None, d=g.d)
        s2[0] = att.norm_scale[0] ** 2 * float(y.var)
    eqs = for_geometry(g)
    sq = np.array([eqs.qk_std(value, float(v)) for v in s2])
    cols = {kind: {w: np.array(getattr(base, kind).std[w]) for w in WEIGHTS[kind]} for kind in WEIGHTS}
    cols["attention"]["q"] = sq
    cols["attention"]["k"] = sq
    subl = {}
    for kind in WEIGHTS:
        c = getattr(base, kind)
        subl[kind] = Sublayers(kind, c.post, c.skip_scale, c.branch_scale, c.norm_scale, cols[kind], c.bias_std)
    if any(float(np.max(att.bias_std[w])) > 0 for w in ("q", "k")):
        raise DomainError("logit-var: the init has Q/K biases; the closed form assumes none")
    model = Model(arch=base.arch, n_layers=N, d_model=base.d_model, n_heads=base.n_heads, d_head=base.d_head,
                  d_ff=base.d_ff, seq_len=base.seq_len, activation=base.activation, norm=base.norm,
                  causal=base.causal, dropout=base.dropout, input=base.input, grad=base.grad,
                  attention=subl["attention"], ffn=subl["ffn"],
                  notes={"solve_target": "logit-var", "logit_var": value, "init": base.notes.get("init")})
    sol = Solution("logit-var", arch, model, True, None, tol, logit_var=value, equations=eqs)
    sol.extra["attention_input_s2"] = s2
    sol.timings["solve_s"] = time.perf_counter() - t0
    if verify:
        from sigprop.model.predict import predict

        t1 = time.perf_counter()
        sol.points = predict(model)
        sol.timings["predict_s"] = time.perf_counter() - t1
        lv = np.array([p.logit_var for p in sol.points if p.logit_var is not None])
        dev = float(np.max(np.abs(lv / value - 1))) if lv.size else 0.0
        sol.extra["logit_var_max_dev"] = dev
        if dev > tol:
            sol.feasible = False
            sol.reason = f"predicted logit variance deviates by {dev:.3g} (relative) from {value:g}"
    return sol
