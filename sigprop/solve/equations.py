"""The solver's equations as sympy objects, derived from the rules and solved by sympy.

* The sublayer equations (forward: the stream, or the Post-LN LayerNorm's input, has variance
  1; backward: the gradient passes unchanged) in the residual scales lambda, beta, the stream
  variance sigma^2 and the branch's forward variance V and backward gain Gamma.
* The logit variance from the linear rule applied twice (q and k), solved for
  sigma_q = sigma_k.
* The FFN branch composed symbolically from the linear, activation and dropout rules (the
  same composition as ``sigprop predict --symbolic``), its forward variance and backward gain
  as functions of sigma_in = sigma_out = s and the branch input variance v.
* Homogeneity: a branch that is homogeneous of degree 4 in s (attention in
  sigma_v = sigma_o, ReLU FFN in sigma_in = sigma_out) has V = s^4 V-hat, and sympy solves
  s^4 V-hat = V_required once, in closed form; the solver substitutes numbers per sublayer.

Nothing here is evaluated per layer symbolically: every closed form is lambdified once.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

import sympy as sp

import sigprop.backend.symbolic as sm
from sigprop.errors import DomainError
from sigprop.rules import compose, get
from sigprop.state import Backward, Forward

# symbols (LaTeX names through sympy's conventions)
lam, beta = sp.symbols("lambda beta", positive=True)
sigma2 = sp.Symbol("sigma_s^2", positive=True)          # stream variance entering sublayer s
V = sp.Symbol("V_s", positive=True)                     # branch forward variance
Gamma = sp.Symbol("Gamma_s", positive=True)             # branch backward gain (per unit gradient)
s = sp.Symbol("s", positive=True)                       # the homogeneous pair's common std
vhat = sp.Symbol("Vhat", positive=True)                 # branch variance per s^4 (printed \\hat{V})
ghat = sp.Symbol("Gammahat", positive=True)             # branch backward gain per s^4
R = sp.Symbol("V_req", positive=True)                   # required branch variance
k, N = sp.symbols("k N", positive=True)
ell = sp.Symbol("ell", positive=True)                   # attention logit variance
S2 = sp.Symbol("S_2", positive=True)                    # attention input second moment
d, dff, width = sp.symbols("d d_ff w", positive=True, integer=True)
sq, sk, sv, so = sp.symbols("sigma_q sigma_k sigma_v sigma_o", positive=True)
s_in, s_out = sp.symbols("sigma_in sigma_out", positive=True)
v_in = sp.Symbol("v", positive=True)                    # branch input variance
r = sp.Symbol("r", nonnegative=True)                    # branch input token correlation
rg = sp.Symbol("r_g", real=True)
p_f, p_h = sp.symbols("p_f p_h", nonnegative=True)


@lru_cache(maxsize=16)
def for_geometry(g) -> "SublayerEquations":
    """The (cached) equations of one geometry."""
    return SublayerEquations(g)


class SublayerEquations:
    """Equations and their closed-form solutions for one geometry (see the module doc)."""

    def __init__(self, g):
        self.g = g
        # residual scales
        self.scales = sp.Eq(lam**2 + beta**2, 1)
        self.beta_k = sp.Eq(beta**2, k / N)
        # forward: the stream (Pre-LN) or the LayerNorm input (Post-LN) has variance 1
        self.forward = sp.Eq(lam**2 * sigma2 + beta**2 * V, 1)
        (self.required,) = sp.solve(self.forward, V)
        # backward (Pre-LN: the LayerNorm divides the branch gradient by sigma^2)
        self.backward_pre = sp.Eq(lam**2 + beta**2 * Gamma / sigma2, 1)
        self.backward_post = sp.Eq((lam**2 + beta**2 * Gamma) / (lam**2 * sigma2 + beta**2 * V), 1)
        (self.required_gain,) = sp.solve(self.backward_pre, Gamma)
        # homogeneous branch
        self.scale = sp.Eq(s**4 * vhat, R)
        sols = sp.solve(self.scale, s)
        if len(sols) != 1:  # pragma: no cover - positive symbols give one root
            raise RuntimeError(f"unexpected roots of {self.scale}: {sols}")
        self.scale_solution = sols[0]
        self._scale = sp.lambdify((R, vhat), self.scale_solution, "math")
        # logits, from the linear rule (q and k are linear projections of the branch input)
        lin = get("linear")
        xq = Forward(0, S2, r)
        var_q = lin.forward(sm, xq, SimpleNamespace(d_in=d, d_out=width, w_std=sq, b_std=0)).var
        var_k = lin.forward(sm, xq, SimpleNamespace(d_in=d, d_out=width, w_std=sk, b_std=0)).var
        self.logit_expr = sp.simplify(var_q * var_k)
        self.logit = sp.Eq(self.logit_expr, ell)
        sols = sp.solve(self.logit.subs(sk, sq), sq)
        if len(sols) != 1:  # pragma: no cover
            raise RuntimeError(f"unexpected roots of {self.logit}: {sols}")
        self.qk_solution = sols[0]
        self._qk = sp.lambdify((ell, d, S2), self.qk_solution, "math")
        self._ffn = None
        self._gelu_cache: dict = {}

    # -- numbers -------------------------------------------------------------------------
    def scale_std(self, required: float, vh: float) -> float:
        """s with s^4 V-hat = V_required (the solved closed form)."""
        return float(self._scale(required, vh))

    def qk_std(self, logit_var: float, s2: float) -> float:
        """sigma_q = sigma_k giving logit variance ``logit_var`` for branch input second moment s2."""
        return float(self._qk(logit_var, self.g.d, s2))

    # -- the FFN branch, composed from the rules ------------------------------------------
    def ffn(self) -> dict:
        """FFN branch (linear -> activation -> dropout -> linear -> hidden dropout) from the
        rules with the symbolic backend: forward variance V_F, output correlation r_F and
        backward gain Gamma_F (per unit upstream gradient, at the branch input, before the
        Pre-LN LayerNorm) as functions of sigma_in, sigma_out, the input variance v and
        correlation r."""
        if self._ffn is None:
            act = self.g.activation
            chain = [("linear", dict(d_in=d, d_out=dff, w_std=s_in, b_std=0)), (act, {}),
                     ("dropout", dict(p=p_f)), ("linear", dict(d_in=dff, d_out=d, w_std=s_out, b_std=0)),
                     ("dropout", dict(p=p_h))]
            x, gb = compose(chain, Forward(0, v_in, r), Backward(1, rg), sm)
            # simplify the ReLU branch (fast, a monomial); the GeLU one stays as composed
            # (sympy's simplify takes seconds on it and gains little)
            tidy = sp.simplify if act == "relu" else (lambda e: e)
            Vf = tidy(x.var)
            Gf = tidy(gb.var)
            self._ffn = {"V": Vf, "corr": x.corr, "Gamma": Gf,
                         "numbers": {d: self.g.d, dff: self.g.d_ff, p_f: self.g.p_ffn, p_h: self.g.p_hid}}
        return self._ffn

    def ffn_solution(self):
        """ReLU: the closed form of sigma_in = sigma_out = s from V_F = V_req (sympy.solve);
        GeLU: None (solved numerically by :meth:`gelu_std`)."""
        f = self.ffn()
        Vs = f["V"].subs({s_in: s, s_out: s})
        eq = sp.Eq(Vs, R)
        per_s4 = sp.simplify(Vs / s**4)
        if s in per_s4.free_symbols:
            return eq, None
        # homogeneous of degree 4: V_F = s^4 V-hat_F, and the generic closed form applies
        # (written with the keep probabilities 1 - p, which sympy knows to be positive)
        kf, kh = sp.symbols("kf kh", positive=True)
        sol = self.scale_solution.subs(vhat, per_s4.subs({p_f: 1 - kf, p_h: 1 - kh}))
        sol = sp.powsimp(sp.powdenest(sol, force=True), force=True)
        return eq, sol.subs({kf: 1 - p_f, kh: 1 - p_h})

    def gelu_std(self, required: float, v: float) -> float:
        """GeLU FFN: sigma_in = sigma_out = s with V_F(s; v) = V_required, by sympy.nsolve on
        the symbolic branch variance (cached per (V_required, v))."""
        key = (round(required, 14), round(v, 14))
        if key not in self._gelu_cache:
            f = self.ffn()
            expr = f["V"].subs({s_in: s, s_out: s}).subs(f["numbers"]).subs(v_in, v)
            # start from the ReLU-like estimate (GeLU's second moment ~ s2/2 for large s2)
            s0 = (2 * required * (1 - self.g.p_hid) * (1 - self.g.p_ffn) / (self.g.d * self.g.d_ff * v)) ** 0.25
            try:
                root = sp.nsolve(sp.log(expr) - sp.log(required), s, s0, tol=1e-14, prec=30)
            except (ValueError, ZeroDivisionError) as e:
                raise DomainError(f"GeLU FFN: no std gives branch variance {required:g} ({e})") from None
            self._gelu_cache[key] = float(root)
        return self._gelu_cache[key]
