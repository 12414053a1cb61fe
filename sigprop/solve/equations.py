"""The solver's equations as sympy objects, derived from the rules and solved by sympy.

* The unit equations (forward: the stream, or the input of the norm after the sum, has
  variance 1; backward: the gradient passes unchanged) in the residual scales lambda, beta,
  the stream variance sigma^2 and the branch's forward variance V and backward gain Gamma.
* The logit variance var(q) var(k) from the attention rule
  (:func:`sigprop.rules.attention.qk_variances`, no biases), solved for sigma_q = sigma_k.
* The FFN branch composed symbolically from the rules of the model's own FFN chain
  (:func:`sigprop.model.blocks.branch_chain`: linear, activation, dropout, linear; or the
  gated rule, dropout, the down projection), then the hidden dropout: its forward variance
  and backward gain as functions of the common std s of its weights and the branch input
  variance v.
* Homogeneity: a branch homogeneous of degree 2k in its k free weight stds (attention in
  sigma_v = sigma_o, k = 2; a ReLU FFN, k = 2; a ReGLU FFN, k = 3) has V = s^(2k) V-hat, and
  sympy solves s^(2k) V-hat = V_required once, in closed form; the solver substitutes
  numbers per sublayer.  Other branches (GeLU, SiLU) are solved numerically on the rules
  (:func:`sigprop.solve.solver.solve_scale`).

Nothing here is evaluated per layer symbolically: every closed form is lambdified once.
"""

from __future__ import annotations

import math

import sympy as sp

import sigprop.backend.symbolic as sm
from sigprop import memo
from sigprop.rules import compose
from sigprop.rules.attention import qk_variances
from sigprop.state import Backward, Forward

# symbols (LaTeX names through sympy's conventions)
lam, beta = sp.symbols("lambda beta", positive=True)
sigma2 = sp.Symbol("sigma_s^2", positive=True)          # stream variance entering sublayer s
V = sp.Symbol("V_s", positive=True)                     # branch forward variance
Gamma = sp.Symbol("Gamma_s", positive=True)             # branch backward gain (per unit gradient)
s = sp.Symbol("s", positive=True)                       # the free weights' common std
vhat = sp.Symbol("Vhat", positive=True)                 # branch variance per s^(2k) (printed \\hat{V})
ghat = sp.Symbol("Gammahat", positive=True)             # branch backward gain per s^(2k)
R = sp.Symbol("V_req", positive=True)                   # required branch variance
k, N = sp.symbols("k N", positive=True)
ell = sp.Symbol("ell", positive=True)                   # attention logit variance
S2 = sp.Symbol("S_2", positive=True)                    # attention input second moment
d, dff, width = sp.symbols("d d_ff w", positive=True, integer=True)
sq, sk, sv, so = sp.symbols("sigma_q sigma_k sigma_v sigma_o", positive=True)
s_in, s_out = sp.symbols("sigma_in sigma_out", positive=True)
s_gate, s_up, s_down = sp.symbols("sigma_gate sigma_up sigma_down", positive=True)
#: weight name -> its std's symbol
STD_SYMBOLS = {"q": sq, "k": sk, "v": sv, "o": so, "in": s_in, "out": s_out,
               "gate": s_gate, "up": s_up, "down": s_down}
v_in = sp.Symbol("v", positive=True)                    # branch input variance
r = sp.Symbol("r", nonnegative=True)                    # branch input token correlation
rg = sp.Symbol("r_g", real=True)
p_f, p_h = sp.symbols("p_f p_h", nonnegative=True)
beta_A, beta_F = sp.symbols("beta_A beta_F", positive=True)     # a parallel block's branch scales

_EQUATIONS = memo.Kind("solve.equations", 16, "the sympy equations per model structure (solve.blocks.structure)")


def for_model(model) -> "SublayerEquations":
    """The (cached) equations of a model's structure (its widths, dropouts, kinds and branch
    rules; not its stds or residual scales)."""
    from sigprop.solve.blocks import structure

    return _EQUATIONS.get(structure(model), lambda: SublayerEquations(model))


class SublayerEquations:
    """Equations and their closed-form solutions for one model structure (module doc)."""

    def __init__(self, model):
        from sigprop.solve.blocks import Chains, geometry

        self.g = geometry(model)
        self.chains = Chains(model)
        # residual scales
        self.scales = sp.Eq(lam**2 + beta**2, 1)
        self.beta_k = sp.Eq(beta**2, k / N)
        # forward: the stream (pre) or the norm's input (post) has variance 1
        self.forward = sp.Eq(lam**2 * sigma2 + beta**2 * V, 1)
        (self.required,) = sp.solve(self.forward, V)
        # a parallel block: both branches deliver the same V
        self.forward_parallel = sp.Eq(lam**2 * sigma2 + (beta_A**2 + beta_F**2) * V, 1)
        (self.required_parallel,) = sp.solve(self.forward_parallel, V)
        # backward (pre: the input norm divides the branch gradient by sigma^2)
        self.backward_pre = sp.Eq(lam**2 + beta**2 * Gamma / sigma2, 1)
        self.backward_post = sp.Eq((lam**2 + beta**2 * Gamma) / (lam**2 * sigma2 + beta**2 * V), 1)
        (self.required_gain,) = sp.solve(self.backward_pre, Gamma)
        # homogeneous branch of degree 4 (attention) and the general degree
        self._scales: dict = {}
        self.scale, self.scale_solution = self.scale_equation(4)
        # logits: the attention rule's query and key variances (zero-mean input of second
        # moment S2, no biases)
        var_q, var_k = qk_variances(dict(d=d, q_std=sq, k_std=sk, q_bias_std=0, k_bias_std=0), Forward(0, S2, r))
        self.logit_expr = sp.simplify(var_q * var_k)
        self.logit = sp.Eq(self.logit_expr, ell)
        sols = sp.solve(self.logit.subs(sk, sq), sq)
        if len(sols) != 1:  # pragma: no cover
            raise RuntimeError(f"unexpected roots of {self.logit}: {sols}")
        self.qk_solution = sols[0]
        self._qk = sp.lambdify((ell, d, S2), self.qk_solution, "math")
        self._ffn = None
        self._ffn_solution = None
        self._homogeneous: dict = {}

    # -- numbers -------------------------------------------------------------------------
    def scale_equation(self, degree: int):
        """(equation s^degree V-hat = V_req, its positive root) (cached per degree)."""
        hit = self._scales.get(degree)
        if hit is None:
            eq = sp.Eq(s**degree * vhat, R)
            sols = sp.solve(eq, s)
            if len(sols) != 1:  # pragma: no cover - positive symbols give one root
                raise RuntimeError(f"unexpected roots of {eq}: {sols}")
            hit = self._scales[degree] = (eq, sols[0], sp.lambdify((R, vhat), sols[0], "math"))
        return hit[0], hit[1]

    def scale_std(self, required: float, vh: float, degree: int = 4) -> float:
        """s with s^degree V-hat = V_required (the solved closed form)."""
        self.scale_equation(degree)
        return float(self._scales[degree][2](required, vh))

    def qk_std(self, logit_var: float, s2: float) -> float:
        """sigma_q = sigma_k giving logit variance ``logit_var`` for branch input second moment s2."""
        return float(self._qk(logit_var, self.g.d, s2))

    def homogeneous(self, kind: str) -> bool:
        """Whether ``kind``'s branch is homogeneous of degree 2k in its k free weight stds
        (checked on the rules at a reference input: variance 1, correlation 0.5; attention
        with sigma_q = sigma_k for logit variance 1)."""
        hit = self._homogeneous.get(kind)
        if hit is None:
            from sigprop.solve.blocks import homogeneity

            ch = self.chains
            q = self.qk_std(1.0, 1.0)
            stds = {w: (q if w in ("q", "k") else 1.0 / math.sqrt(self.g.d)) for w in ch.names[kind]}
            hit = self._homogeneous[kind] = homogeneity(ch, kind, 0, Forward(0.0, 1.0, 0.5), stds)[0]
        return hit

    # -- the FFN branch, composed from the rules ------------------------------------------
    def ffn(self) -> dict:
        """The model's FFN branch (its chain from the block description, then the hidden
        dropout) composed with the symbolic backend: forward variance V_F, output
        correlation r_F and backward gain Gamma_F (per unit upstream gradient, at the branch
        input, before an input norm) as functions of its weight stds, the input variance v
        and correlation r; ``stds``: weight -> symbol; ``numbers``: the widths and dropouts."""
        if self._ffn is None:
            ch = self.chains
            names = ch.names["ffn"]
            stds = {w: STD_SYMBOLS.get(w) or sp.Symbol(f"sigma_{w}", positive=True) for w in names}
            dims = {self.g.d_ff: dff, self.g.d: d}       # d_model wins where they are equal
            chain = ch.symbolic("ffn", 0, stds, dims, p_f, p_h)
            x, gb = compose(list(chain), Forward(0, v_in, r), Backward(1, rg), sm)
            # simplify a homogeneous branch (fast: a monomial); the others stay as composed
            # (sympy's simplify takes seconds on GeLU's and cannot do SiLU's integrals)
            tidy = sp.simplify if self.homogeneous("ffn") else (lambda e: e)
            self._ffn = {"V": tidy(x.var), "corr": x.corr, "Gamma": tidy(gb.var), "stds": stds,
                         "numbers": {d: self.g.d, dff: self.g.d_ff, p_f: self.g.p_ffn, p_h: self.g.p_hid}}
        return self._ffn

    def ffn_solution(self):
        """(the equation V_F(s) = V_req with every FFN weight std = s, its closed-form root
        or None).  A homogeneous FFN (ReLU, ReGLU) has V_F = s^(2k) V-hat_F and the generic
        closed form applies; the others are solved numerically."""
        if self._ffn_solution is None:
            f = self.ffn()
            Vs = f["V"].subs({sym: s for sym in f["stds"].values()})
            eq = sp.Eq(Vs, R)
            sol = None
            if self.homogeneous("ffn"):
                degree = 2 * len(f["stds"])
                per = sp.simplify(Vs / s**degree)
                if s not in per.free_symbols:
                    # written with the keep probabilities 1 - p, which sympy knows to be positive
                    kf, kh = sp.symbols("kf kh", positive=True)
                    _, root = self.scale_equation(degree)
                    sol = root.subs(vhat, per.subs({p_f: 1 - kf, p_h: 1 - kh}))
                    sol = sp.powsimp(sp.powdenest(sol, force=True), force=True)
                    sol = sol.subs({kf: 1 - p_f, kh: 1 - p_h})
            self._ffn_solution = (eq, sol)
        return self._ffn_solution
