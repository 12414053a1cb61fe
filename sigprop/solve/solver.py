"""The moment-conserving initialisation, residual unit by residual unit (targets
unit-forward, unit-variance, logit-var).

The model's layers are read from its block description (:mod:`sigprop.model.blocks`): each
residual unit has a skip scale a, an optional norm before its branches (with norm scale n),
one branch or (a parallel block) two, an optional norm on each branch output and an optional
norm after the sum; the norm is the model's (LayerNorm or RMSNorm, :func:`blocks.norm_params`).
With sigma^2 the stream variance entering the unit and V_i, b_i each branch's output
variance and scale:

* forward: the sum a x + sum_i b_i y_i (the stream, or the input of the norm after it) has
  variance a^2 sigma^2 + sum_i b_i^2 V_i = 1, so each branch, all delivering the same V
  (the symmetric choice for a parallel block), must deliver
  V = (1 - a^2 sigma^2) / sum_i b_i^2 (1 once sigma^2 = 1 and a^2 + b^2 = 1), feasible iff
  a^2 sigma^2 < 1;
* a branch with an output norm (placements peri and output) adds b^2 times the norm's
  output variance (~1) whatever its weights: the residual scales alone fix the stream's
  variance.  Its weights are solved for V = 1 at the norm's input (the norm is then an
  identity at initialisation), the one gauge left;
* backward: g_s = g_{s+1} (a^2 + b^2 Gamma_s / sigma_s^2) (an input norm divides by the
  stream variance; a norm after the sum multiplies both paths); target g_s = g_{s+1};
* logits: var(q) var(k) = (d sigma_q^2 S2)(d sigma_k^2 S2) = ell (S2 the attention input's
  second moment).

Unknowns per branch: attention sigma_q = sigma_k (the logit variance fixes their product)
and sigma_v = sigma_o (the branch is homogeneous in sigma_v^2 sigma_o^2, so only the product is
determined; the symmetric choice is DeepScaleLM's); an FFN's weights share one std s
(sigma_in = sigma_out; gated: sigma_gate = sigma_up = sigma_down).  Homogeneous branches
(checked on the rules) are solved in closed form by sympy (:mod:`sigprop.solve.equations`)
with the branch's normalised gain V-hat(r_s) from the rules (:mod:`sigprop.solve.blocks`);
the others (GeLU, SiLU FFNs) by a safeguarded secant in log s on the rules
(:func:`solve_scale`).  r_s follows from the recursion of the stream's token correlation,
evaluated numerically unit by unit with the solved stds.

The gradient is then predicted for the solved model with :func:`sigprop.model.predict.predict`
(the same engine as ``sigprop predict --spec``), which decides the unit-variance verdict.
With a final norm the gradient is judged at the stream below it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from sigprop.errors import DomainError
from sigprop.model import blocks as model_blocks
from sigprop.model.spec import KINDS, Model, Sublayers
from sigprop.rules import attention as attention_rule
from sigprop.rules import get
from sigprop.rules.layernorm import combine_token_stats
from sigprop.solve import blocks, require_supported
from sigprop.solve.blocks import BranchTable, free_weights, rows_at
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
    """What the solver found for one branch of a residual unit."""

    layer: int                # 1-based
    kind: str                 # the branch: "attention" | "ffn"
    post: bool                # a norm after the residual sum
    a: float
    b: float
    n: float
    x: Forward                # stream entering the unit
    branch_in: Forward        # the branch's input state (after the input norm and n)
    required: float           # V the branch must deliver (at its output norm's input, if any)
    vhat: float               # branch output variance per unit of the homogeneous scale
    branch_corr: float        # branch output token correlation
    stds: dict                # solved stds of this branch
    out: Forward              # stream leaving the unit
    z: Forward | None = None  # post: the norm's input
    unit: str = ""            # the unit's trace point: "attention" | "ffn" | "block"
    index: int = 0            # the unit's index (0-based; the trace point is index + 1)
    in_norm: bool = True
    out_norm: bool = False
    homogeneous: bool = True  # solved in closed form (else numerically)
    unit_b2: float = 0.0      # sum over the unit's branches of b^2 times their output variance


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
        residual unit outputs (from the prediction of the solved model); the top gradient is
        the one at the last unit's output (below a final norm, where the model has one)."""
        if not self.points:
            return {}
        g_top = self.points[-1].gvar
        fw = max(abs(p.var - 1.0) for p in self.points[1:])
        gr = max(abs(p.gvar / g_top - 1.0) for p in self.points) if g_top > 0 else math.nan
        return {"forward_var_max_dev": fw, "grad_var_max_dev": gr,
                "grad_ratio_input_output": self.points[0].gvar / g_top if g_top > 0 else math.nan}

    def gradient_factors(self) -> np.ndarray:
        """g_s / g_{s+1} per residual unit (from the prediction)."""
        g = np.array([p.gvar for p in self.points])
        return g[:-1] / g[1:]

    def units(self) -> list:
        """The solved branches grouped by residual unit, in order."""
        out: list = []
        for s in self.sublayers:
            if out and out[-1][0].index == s.index:
                out[-1].append(s)
            else:
                out.append([s])
        return out


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
    return presets.resolve("dslm" if arch == "preln" else "dslm-post", init="normal", **options)


def _beta_k(model: Model) -> float | None:
    """k of beta^2 = k/N when every branch scale of ``model`` is the same, else None."""
    b = np.concatenate([np.asarray(model.attention.branch_scale), np.asarray(model.ffn.branch_scale)])
    if b.size and np.all(b == b[0]):
        return float(b[0] ** 2 * model.n_layers)
    return None


def solve_unit(arch: str | None, target: str = "unit-variance", logit_var: float = DEFAULT_LOGIT_VAR,
               tol: float = DEFAULT_TOL, verify: bool = True, strict: bool = False, model: Model | None = None,
               **options) -> Solution:
    """Solve a unit target for ``arch`` ("preln" or "postln") and the model options of
    :func:`sigprop.model.presets.resolve` (n_layers, d_model, ..., beta_k), or for a given
    ``model``: its layout, widths, kinds and residual and norm scales are kept, every weight
    std is solved (biases 0).

    Both targets solve the forward equation exactly.  unit-variance then reports the gradient
    the solved model has (``extra["gradient"]``, :func:`gradient_summary`; ``note``) and is feasible when the forward variance
    is within ``tol``; with ``strict`` the gradient must also stay within ``tol`` of its top
    value at every sublayer."""
    from sigprop.solve.equations import for_model

    if target not in ("unit-variance", "unit-forward"):
        raise DomainError(f"solve_unit: target must be unit-variance or unit-forward, got {target!r}")
    if not (logit_var > 0 and math.isfinite(logit_var)):
        raise DomainError(f"the logit variance must be a finite number > 0, got {logit_var!r}")
    t0 = time.perf_counter()
    if model is not None:
        if any(v is not None for v in options.values()):
            raise DomainError("a given model is fully resolved: drop the model options "
                              f"({', '.join(k for k, v in options.items() if v is not None)})")
        base, arch, beta_k = model, model.arch, _beta_k(model)
    else:
        base = base_model(arch, **options)
        beta_k = options.get("beta_k") or 1.0
    require_supported(base)
    eqs = for_model(base)
    sol = Solution(target, arch, base, True, None, tol, logit_var=logit_var, equations=eqs,
                   beta_k=beta_k, strict=bool(strict))
    sol.extra["n_layers"] = base.n_layers
    try:
        subs, columns = _forward_solve(base, eqs, logit_var, sol.tables)
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
        if sol.deviations()["forward_var_max_dev"] > REFINE_ABOVE:
            t2 = time.perf_counter()
            _refine(sol, columns)
            sol.points = predict(sol.model)
            sol.timings["refine_s"] = time.perf_counter() - t2
        _verdict(sol)
    return sol


#: the solution is refined on the prediction where its forward variance is further than
#: REFINE_ABOVE from 1 (a norm after the sum alone is 1 - O(eps) from it), until the variance
#: entering every norm after a sum, and every other unit's output, is within REFINE_TO of 1
REFINE_ABOVE = 1e-4
REFINE_TO = 1e-5
REFINE_ROUNDS = 4


def _refine(sol: Solution, columns: dict) -> None:
    """Correct the solved stds on the prediction engine, whose stream differs from the
    solver's mean-field recursion where the model has structure the recursion leaves out (a
    causal model's position profile: the first positions' attention rows average fewer keys).
    Per unit, the branches' contribution to the variance is predicted as P, the forward
    equation asks for T = sum_i b_i^2 V (V as solved: the units below are corrected in the
    same round, so the stream entering is taken as the solver's), and every free weight std
    of its branches is multiplied by (T/P)^(1/2k) (exact for a branch homogeneous of degree
    2k, a secant-like step otherwise); units whose branches end in a
    norm are left as they are (their contribution does not depend on their stds).  Rounds of
    forward predictions until the variance is within REFINE_TO of 1 or REFINE_ROUNDS rounds;
    ``sol.extra["refined"]`` records them."""
    from sigprop.model.predict import Predictor

    chains = sol.equations.chains
    units = sol.units()
    devs, factors = [], []
    for _ in range(REFINE_ROUNDS + 1):
        with np.errstate(divide="ignore", invalid="ignore"):
            records = Predictor(sol.model).forward()
        dev = max(abs(math.exp(r.z_log_var if r.post else r.out_log_var) - 1.0) for r in records)
        devs.append(dev)
        if dev <= REFINE_TO or len(factors) == REFINE_ROUNDS:
            break
        step = 0.0
        for rec, u in zip(records, units):
            if u[0].out_norm:
                continue
            P = rec.b ** 2 * float(rec.branch_out.var)
            T = u[0].required * sum(sub.b ** 2 for sub in u)
            if not (P > 0 and T > 0):
                continue
            c = T / P
            step = max(step, abs(math.log(c)))
            for sub in u:
                free = free_weights(sol.model, sub.kind)
                f = c ** (1.0 / (2 * len(free)))
                for w in free:
                    columns[sub.kind][w][sub.layer - 1] *= f
                    sub.stds[w] *= f
        factors.append(step)
        sol.model = _with_stds(sol.model, columns, sol.model.arch, dict(sol.model.notes))
    sol.extra["refined"] = {"rounds": len(factors), "forward_var_max_dev": devs,
                            "largest_log_correction": factors}


def solve_scale(variance, required: float, s0: float, degree: float, where: str = "",
                rtol: float = 1e-13, max_iter: int = 100) -> float:
    """The std s > 0 with ``variance(s)`` = ``required``, for a variance increasing in s
    that behaves roughly like s^degree: secant steps in (log s, log variance), starting from
    the slope ``degree`` at ``s0``, kept inside a bracket once one is known (bisection in log s
    where a step leaves it).  Converged when the log variance is within ``rtol``."""
    target = math.log(required)

    def g(u):
        v = float(variance(math.exp(u)))
        if not (v > 0 and math.isfinite(v)):
            raise Infeasible(f"{where}: the branch variance is {v:g} at std {math.exp(u):g}")
        return math.log(v) - target

    u0 = math.log(s0)
    g0 = g(u0)
    lo = hi = None                     # (u, g) with g < 0 and g > 0
    u_prev, g_prev = None, None
    u, gu = u0, g0
    for _ in range(max_iter):
        if abs(gu) <= rtol:
            return math.exp(u)
        if gu < 0:
            lo = (u, gu) if lo is None or u > lo[0] else lo
        else:
            hi = (u, gu) if hi is None or u < hi[0] else hi
        slope = degree if u_prev is None or u == u_prev else (gu - g_prev) / (u - u_prev)
        if not (slope > 0 and math.isfinite(slope)):
            slope = degree
        step = u - gu / slope
        if lo is not None and hi is not None and not (lo[0] < step < hi[0]):
            step = 0.5 * (lo[0] + hi[0])
        u_prev, g_prev = u, gu
        u = step
        gu = g(u)
    raise Infeasible(f"{where}: no std gives branch variance {required:.6g} (the numerical solve did not converge)")


def _forward_solve(base: Model, eqs, logit_var: float, tables: dict):
    """Unit by unit: the variance each branch must deliver, the stds that deliver it, and
    the stream state they produce."""
    res = get("residual")
    chains = eqs.chains
    N = base.n_layers
    x = Forward(base.input.mean, base.input.var, base.input.corr)
    cols = {kind: {w: np.zeros(N) for w in chains.names[kind]} for kind in KINDS}
    seen: dict = {}
    solved: dict = {}
    subs = []
    norms: dict = {}

    def norm(tok):
        # one parameter dict per distinct per-token statistics (Rule.fast memoises on it)
        hit = norms.get(tok)
        if hit is None:
            rule, prm = model_blocks.norm_params(base, tok)
            hit = norms[tok] = (get(rule), prm)
        return hit

    # per-token variance statistics of the stream (the norm rule's params), tracked as the
    # prediction engine does: Gaussian input, Gaussian branch outputs, a norm's output, sums
    # mixed by layernorm.combine_token_stats
    tok = model_blocks.GAUSSIAN_TOKENS
    lcols = model_blocks.columns(base)
    index = 0
    for l in range(N):
        for unit in model_blocks.layer_units(base, l, lcols):
            a = unit.skip
            where = f"layer {l + 1} {unit.label}"
            if unit.in_norm:
                rule, prm = norm(tok)
                y, _ = rule.fast(x, None, prm)
                h = Forward(float(y.mean), float(y.var), float(y.corr))
            else:
                h = x
            normed = [br.out_norm for br in unit.branches]
            b2 = sum(br.scale ** 2 for br in unit.branches)
            if b2 == 0:
                raise Infeasible(f"{where}: branch scale 0 leaves nothing to solve")
            if all(normed):
                required = 1.0
            elif any(normed):  # pragma: no cover - no layout of the model object has it
                raise DomainError(f"{where}: branches with and without an output norm in one unit")
            else:
                required = (1.0 - a * a * x.var) / b2
                if not required > 0:
                    raise Infeasible(f"{where}: the skip path alone carries variance $a^2 sigma^2$ = "
                                     f"{a * a * x.var:.6g} >= 1, so no branch variance can make the "
                                     f"{'norm input' if unit.post_norm else 'stream'} variance 1 "
                                     f"(stream variance entering: {x.var:.6g})")
            outs = []
            for br in unit.branches:
                n = br.norm_scale if unit.in_norm else 1.0
                xb = Forward(h.mean * n, h.var * n * n, h.corr)
                stds, vhat, bvar, bcorr, homog = _solve_branch(eqs, br.kind, l, xb, required, logit_var,
                                                               tables, seen, solved, N - l, where)
                yb = Forward(0.0, bvar, min(max(bcorr, -1.0), 1.0))
                if br.out_norm:
                    rule, prm = norm(model_blocks.GAUSSIAN_TOKENS)
                    yn, _ = rule.fast(yb, None, prm)
                    yb = Forward(float(yn.mean), float(yn.var), float(yn.corr))
                outs.append((br, xb, stds, vhat, bcorr, yb, homog))
                for w, v in stds.items():
                    cols[br.kind][w][l] = v
            # the residual sum (the rules' formulas without per-call domain checks, Rule.fast:
            # the states come out of rules, the parameters were validated with the model)
            if len(outs) == 1:
                br, yb = outs[0][0], outs[0][5]
                bsum, ysum = br.scale, yb
            else:
                v = sum(o[0].scale ** 2 * o[5].var for o in outs)
                c = sum(o[0].scale ** 2 * o[5].var * o[5].corr for o in outs)
                m = sum(o[0].scale * o[5].mean for o in outs)
                bsum, ysum = 1.0, Forward(m, v, c / v)
            z, _ = res.fast(x, None, dict(a=a, b=bsum, y_mean=ysum.mean, y_var=ysum.var, y_corr=ysum.corr))
            z = Forward(float(z.mean), float(z.var), float(z.corr))
            btok = model_blocks.NORM_TOKENS if all(normed) and len(outs) == 1 else model_blocks.GAUSSIAN_TOKENS
            tok = combine_token_stats(a * a * x.var, tok[0], tok[1], bsum * bsum * ysum.var, btok[0], btok[1])
            if unit.post_norm:
                rule, prm = norm(tok)
                o, _ = rule.fast(z, None, prm)
                out = Forward(float(o.mean), float(o.var), float(o.corr))
                tok = model_blocks.NORM_TOKENS
            else:
                out = z
            unit_b2 = bsum * bsum * ysum.var
            for br, xb, stds, vhat, bcorr, yb, homog in outs:
                subs.append(Sublayer(l + 1, br.kind, unit.post_norm, a, br.scale, br.norm_scale, x, xb, required,
                                     vhat, bcorr, stds, out, z if unit.post_norm else None, unit.label, index,
                                     unit.in_norm, br.out_norm, homog, unit_b2))
            x = out
            index += 1
    return subs, cols


def _solve_branch(eqs, kind: str, l: int, xb: Forward, required: float, logit_var: float, tables: dict,
                  seen: dict, solved: dict, remaining: int, where: str):
    """The stds of one branch delivering variance ``required`` at input ``xb``: (stds,
    V-hat, output variance, output correlation, solved in closed form)."""
    chains = eqs.chains
    names = chains.names[kind]
    free = free_weights(chains.model, kind)
    degree = 2 * len(free)
    ref = {w: 1.0 for w in names}
    if kind == "attention":
        sq = eqs.qk_std(logit_var, xb.var + xb.mean ** 2)
        ref.update(q=sq, k=sq)
    homog = eqs.homogeneous(kind)
    if not homog:
        key = (kind, round(required, 14), round(xb.var, 14), round(xb.mean, 14),
               tuple(sorted((w, v) for w, v in ref.items() if w not in free)))
        s = solved.get(key)
        if s is None:
            # start from the degree-2k estimate through the variance at unit stds
            v1 = float(blocks.branch_rows(chains.chain(kind, l, ref), Forward(xb.mean, xb.var, xb.corr))[0])
            s0 = (required / v1) ** (1.0 / degree) if v1 > 0 else 1.0

            def variance(s_):
                st = {**ref, **{w: s_ for w in free}}
                return blocks.branch_rows(chains.chain(kind, l, st), Forward(xb.mean, xb.var, xb.corr))[0]

            s = solved[key] = solve_scale(variance, required, s0, degree, where)
        ref.update({w: s for w in free})
    rows = _rows(tables, seen, chains, kind, l, ref, xb, remaining)
    vhat, cov = float(rows[0]), float(rows[1])
    if not vhat > 0:
        raise Infeasible(f"{where}: the {kind} branch's output variance is 0 for any weight scale")
    stds = dict(ref)
    if homog:
        s = eqs.scale_std(required, vhat, degree)
        stds.update({w: s for w in free})
        return stds, vhat, required, cov / vhat, True
    if abs(vhat / required - 1) > 1e-8:
        raise Infeasible(f"{where}: the {kind} std solve did not converge (variance {vhat:.6g}, "
                         f"wanted {required:.6g})")
    return stds, vhat, vhat, cov / vhat, False


#: a correlation table costs about this many rule evaluations; below it, evaluate directly
TABLE_WORTH = 33


def _rows(tables: dict, seen: dict, chains, kind: str, l: int, stds: dict, xb: Forward,
          remaining: int = TABLE_WORTH) -> np.ndarray:
    """Branch rows at one input state: direct rule evaluation the first time a (chain, input
    variance) combination appears, a correlation table from the second time on (the steady
    state of every layer after the first) when enough layers remain to repay it."""
    ckey = chains.key(kind, stds)
    key = (xb.mean == 0, round(xb.var, 12), ckey)
    tab = tables.get(key)
    if tab is None and key in seen and xb.mean == 0 and remaining >= TABLE_WORTH:
        t0 = time.perf_counter()
        tab = tables[key] = BranchTable(chains.chain(kind, l, stds), xb.var, ckey)
        tab.build_s = time.perf_counter() - t0
    seen[key] = True
    if tab is not None and 0 <= xb.corr <= blocks.R_MAX:
        return tab.rows(float(xb.corr))
    return rows_at(None, chains.chain(kind, l, stds), xb)


def _with_stds(base: Model, columns: dict, arch: str, notes: dict) -> Model:
    subl = {}
    for kind in KINDS:
        c = getattr(base, kind)
        subl[kind] = Sublayers(kind, c.placement, c.skip_scale, c.branch_scale, c.norm_scale,
                               columns[kind], {w: 0.0 for w in c.names})
    return base.replace(arch=arch, attention=subl["attention"], ffn=subl["ffn"], notes=notes)


# ---------------------------------------------------------------------------------------
# verdicts
# ---------------------------------------------------------------------------------------

def branch_gradient_ratios(sol: Solution) -> np.ndarray:
    """Per residual unit: its branches' backward gain over their forward variance,
    Gamma / V, read off the predicted gradient factor f = g_s / g_{s+1} of the unit, with
    B = sum_i b_i^2 V_i the branches' contribution to the unit's output variance:
    without a norm after the sum f = a^2 + Gamma_total, Gamma_total the branch path's gain
    (an input norm included), so Gamma/V = (f - a^2) sigma^2 / B;
    with one (post) f = lambda_N (a^2 + b^2 Gamma) / (a^2 sigma^2 + B) (the norm's own factor
    lambda_N ~ 1 folded in), so Gamma/V = (f (a^2 sigma^2 + B) - a^2) / B.
    A parallel block's two branches give one ratio, their variance-weighted mean."""
    f = sol.gradient_factors()
    units = sol.units()
    out = np.empty(len(units))
    for i, u in enumerate(units):
        s = u[0]
        B = s.unit_b2
        if s.post:
            out[i] = (f[i] * (s.a ** 2 * s.x.var + B) - s.a ** 2) / B
        else:
            out[i] = (f[i] - s.a ** 2) * s.x.var / B
    return out


def gradient_summary(sol: Solution) -> dict:
    """The gradient of the solved model (unit targets, from the prediction): the input/output
    ratio g_0/g_N, the largest |g_s/g_N - 1|, the branches' Gamma/V per unit kind
    (attention, ffn, or a parallel block; min, mean, max), the token correlations of the
    gradient and of the stream, and whether the gradient is within the tolerance."""
    dev = sol.deviations()
    ratios = branch_gradient_ratios(sol)
    units = sol.units()
    out = {"ratio_input_output": dev["grad_ratio_input_output"], "max_dev": dev["grad_var_max_dev"],
           "within_tol": bool(dev["grad_var_max_dev"] <= sol.tol)}
    for kind in ("attention", "ffn", "block"):
        rk = np.array([r for r, u in zip(ratios, units) if u[0].unit == kind])
        if rk.size:
            out[f"{kind}_gain_ratio"] = {"min": float(rk.min()), "mean": float(rk.mean()), "max": float(rk.max())}
    out["grad_corr"] = {"min": float(min(p.gcorr for p in sol.points)), "max": float(max(p.gcorr for p in sol.points))}
    out["stream_corr"] = {"min": float(min(p.corr for p in sol.points)), "max": float(max(p.corr for p in sol.points))}
    # ln(g_0/g_N) = sum_s ln f_s with f_s = 1 - B_s (1 - Gamma_s/V_s) (sigma^2 = 1, a^2 + B = 1): with
    # B = beta^2 = k/N the sum is about -k times the mean of (1 - Gamma/V) over the layers, which
    # depends on the correlation trajectory r(l/N), not on N
    b2 = np.array([u[0].unit_b2 / (u[0].a ** 2 * u[0].x.var + u[0].unit_b2) for u in units])
    out["ratio_estimate"] = float(np.exp(-np.sum(b2 * (1 - ratios))))
    return out


def gradient_note(sol: Solution, grad: dict) -> str:
    """One paragraph: why the solved model's gradient is not exactly conserved (prose markup
    of :mod:`sigprop.solve.prose`)."""
    m = sol.model
    att, ffn, blk = grad.get("attention_gain_ratio"), grad.get("ffn_gain_ratio"), grad.get("block_gain_ratio")
    gc, sc = grad["grad_corr"], grad["stream_corr"]
    k = sol.beta_k
    text = ("Exact unit gradient variance needs the loss gradient's token correlation $r_g$ (--grad-corr, "
            f"here {m.grad.corr:g}) to equal the stream's $r$: attention's output is close to a token average "
            "of the values, variance $~ r + (1-r)/L$, while the gradient through its value path is the token "
            "average of the upstream gradient, $~ r_g + (1-r_g)/L$. "
            "That is necessary, not sufficient: with them equal the query/key path still adds to the backward gain. "
            f"Here $r_g$ = {gc['min']:.2g} .. {gc['max']:.2g} against $r$ = {sc['min']:.2g} .. {sc['max']:.2g}")
    if att:
        text += (f", so attention passes back $Gamma/V$ = {att['min']:.2g} .. {att['max']:.2g} of what it adds"
                 + (f" (FFN {ffn['mean']:.4g})" if ffn else ""))
    if blk:
        text += (f", so a parallel block (attention and FFN together) passes back $Gamma/V$ = "
                 f"{blk['min']:.2g} .. {blk['max']:.2g} of what it adds")
    text += ("; no weight std changes $Gamma/V$ with the forward held (V and O enter both as one product, as "
             "do the weights of a homogeneous FFN; only the logit variance, --logit-var, does). With "
             "$beta^2 = k/N$ the factors $1 - beta^2 (1 - Gamma/V)$ multiply to "
             f"$g_0/g_N ~ exp(-k * mean(1 - Gamma/V))$ = {grad['ratio_estimate']:.3g}"
             + (f" ($k = {k:g}$)" if k is not None else "") + ", which does not grow with the depth.")
    fm = (ffn or {}).get("mean")
    # (a homogeneous MLP's Gamma/V is 1 up to the norm's finite-d factor: nothing to say)
    if fm is not None and fm > 1 and (m.ffn_kind == "glu" or not sol.equations.homogeneous("ffn")):
        text += (" The FFN's backward gain exceeds its forward gain"
                 + (" (a gated FFN passes the gradient back through both its gate and its up projection)"
                    if m.ffn_kind == "glu" else
                    f" ($E[{m.activation}^2] < s^2 E[{m.activation}'^2]$)")
                 + ", which offsets some of the loss.")
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
        u = sol.units()[i - 1][0] if len(sol.units()) >= i else None
        if u is not None and u.out_norm:
            sol.reason += (" (its branch output is normalised: the residual scales alone set that variance, "
                           f"$a^2 sigma^2 + b^2 V_N$ with $sigma^2$ = {u.x.var:.6g})")
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
    for kind in ("attention", "ffn", "block"):
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
                    verify: bool = True, model: Model | None = None, **options) -> Solution:
    """Q/K stds giving attention logit variance ``value`` at every layer of the preset model
    (any arch and init; the other weights keep the init's stds), or of a given ``model``."""
    from sigprop.model import presets
    from sigprop.solve.equations import for_model

    if not (value > 0 and math.isfinite(value)):
        raise DomainError(f"--value (the logit variance) must be a finite number > 0, got {value!r}")
    t0 = time.perf_counter()
    if model is not None:
        if init is not None or any(v is not None for v in options.values()):
            raise DomainError("a given model is fully resolved: drop the model options and the init")
        base, arch = model, model.arch
    else:
        options = {k: v for k, v in options.items() if v is not None}
        base = presets.resolve(arch, init, **options)
    require_supported(base)
    att = base.attention
    if any(float(np.max(att.bias_std[w])) > 0 for w in ("q", "k")):
        raise DomainError("logit-var: the init has Q/K biases; the closed form assumes none")
    N = base.n_layers
    eqs = for_model(base)
    cols = {kind: {w: np.array(getattr(base, kind).std[w]) for w in getattr(base, kind).names} for kind in KINDS}
    notes = {"solve_target": "logit-var", "logit_var": value, "init": base.notes.get("init")}
    out = base
    for _ in range(4):
        # an attention input read off a prediction (placement output) depends on Q and K a
        # little (through the output norm's eps on a small branch output): repeat with the
        # solved Q and K until the second moments settle
        s2, predicted = _attention_input_s2(out)
        # a rotary attention factor (yarn, longrope) multiplies the logit variance by s_eff^4
        s4 = attention_rule.rope_logit_scale2(base.rope) ** 2 if base.rope is not None else 1.0
        sq = np.array([eqs.qk_std(value / s4, float(v)) for v in s2])
        cols["attention"]["q"] = sq
        cols["attention"]["k"] = sq
        subl = {}
        for kind in KINDS:
            c = getattr(base, kind)
            subl[kind] = Sublayers(kind, c.placement, c.skip_scale, c.branch_scale, c.norm_scale, cols[kind],
                                   c.bias_std)
        prev, out = out, base.replace(attention=subl["attention"], ffn=subl["ffn"], notes=notes)
        if not predicted or np.allclose(np.asarray(prev.attention.std["q"]), sq, rtol=1e-10, atol=0):
            break
    sol = Solution("logit-var", arch, out, True, None, tol, logit_var=value, equations=eqs)
    sol.extra["attention_input_s2"] = s2
    sol.extra["n_layers"] = N
    sol.timings["solve_s"] = time.perf_counter() - t0
    if verify:
        from sigprop.model.predict import predict

        t1 = time.perf_counter()
        sol.points = predict(out)
        sol.timings["predict_s"] = time.perf_counter() - t1
        lv = np.array([p.logit_var for p in sol.points if p.logit_var is not None])
        dev = float(np.max(np.abs(lv / value - 1))) if lv.size else 0.0
        sol.extra["logit_var_max_dev"] = dev
        if dev > tol:
            sol.feasible = False
            sol.reason = f"predicted logit variance deviates by {dev:.3g} (relative) from {value:g}"
    return sol


def _attention_input_s2(base: Model) -> tuple[np.ndarray, bool]:
    """(Per layer, the attention input's second moment: after an input norm n^2 times the
    norm's output second moment (a stream of variance 1 is assumed after the first layer:
    the norm makes it 1 - O(eps) whatever the stream's scale); without one the stream's,
    which after a norm after the sum is that norm's output and otherwise (a normalised
    branch output, placement output) is read off a prediction of the model (such a stream's
    variance is set by the residual scales and the normalised branches, hardly by Q and K);
    whether a prediction was used)."""
    def second(y):
        return float(y.var) + float(y.mean) ** 2

    def norm_out(x, tok):
        rule, prm = model_blocks.norm_params(base, tok)
        return get(rule).evaluate(x, None, **prm)[0]

    x0 = Forward(base.input.mean, base.input.var, base.input.corr)
    unit_norm = second(norm_out(Forward(0.0, 1.0, 0.0), model_blocks.GAUSSIAN_TOKENS))
    N = base.n_layers
    s2 = np.empty(N)
    cols = model_blocks.columns(base)
    points = None
    prev_post, index = False, 0
    for l in range(N):
        for unit in model_blocks.layer_units(base, l, cols):
            br = next((b for b in unit.branches if b.kind == "attention"), None)
            if br is not None:
                if unit.in_norm:
                    v = second(norm_out(x0, model_blocks.GAUSSIAN_TOKENS)) if index == 0 else unit_norm
                    s2[l] = br.norm_scale ** 2 * v
                elif index == 0:
                    s2[l] = second(x0)
                elif prev_post:
                    s2[l] = unit_norm
                else:
                    if points is None:
                        from sigprop.model.predict import predict

                        points = predict(base)
                    p = points[index]
                    s2[l] = p.var + p.mean ** 2
            prev_post = unit.post_norm
            index += 1
    return s2, points is not None
