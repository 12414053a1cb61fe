"""Gated FFN core (GLU variants): y = act(x W_gate + b_gate) * (x W_up + b_up).

One rule per activation: ``reglu`` (ReLU), ``geglu`` (exact GeLU), ``swiglu`` (SiLU), as
named by Shazeer 2020.  A rule takes the state of the FFN *input* x (the normalised stream)
and the two projections' widths and stds: it is linear (gate) + linear (up) + product in
one rule, because gate and up are computed from the same x (their per-token scales move
together, and a non-zero input mean reaches both).  A whole FFN is then the chain
``swiglu -> dropout -> linear(down)`` (d_in = d_ff of the down projection).

Moments (independent, zero-mean weights; wide limit in d_in).  With Q = s2 + mu^2 and
C = r s2 + mu^2 the input's second and cross-token moments, the gate pre-activation is
Gaussian with variance V_g = d_in s_g^2 Q + b_g^2 and token correlation
rho_g = (d_in s_g^2 C + b_g^2)/V_g (the linear rule), likewise the up projection (V_u,
rho_u); given the input, gate and up are independent.  So, with A = E[act(g)^2],
K = E[act(g_t) act(g_s)] (uncentred, correlation rho_g), B = E[act'(g)^2] and
K' = E[act'(g_t) act'(g_s)], taken from the activation's own rule:

* forward: mean 0 (the up factor has mean 0 and is independent of the gate);
  var = A V_u; token covariance K rho_u V_u (the activation's kernel at the gate
  correlation times the up covariance).
* backward, gradient G at y (variance g2, correlation rg, independent of x):
  dg = G act'(g) u, du = G act(g); dx = dg W_gate^T + du W_up^T, so
  grad var = d_ff g2 (s_g^2 B V_u + s_u^2 A) and
  grad cov = d_ff g2 rg (s_g^2 K' rho_u V_u + s_u^2 K).

Terms of relative order 1/d_in are not modelled: the per-token fluctuation of the input's
mean square (which multiplies both factors; about 2/d_in on the second moments of a
Gaussian input, none for a normalised input of fixed per-token norm) and the correlation of
a weight with the pre-activation it enters (Stein's lemma: the two paths' cross term in the
backward, 2 d_ff s_g^2 s_u^2 Q g2 dA/dV at V_g, which is 1/d_in of the gradient variance for
ReLU with unit-variance projections).  Measured (Monte Carlo, Gaussian
input var 1, r 0.4, unit-variance projections, d_ff = 8 d_in/3, seed 1): ReGLU output variance
+3.07% (se 0.33) at d_in 64, +0.72% (0.25) at 256, +0.40% (0.15) at 1024, gradient variance
+1.45% (0.34), +0.34% (0.16), +0.29% (0.10); SwiGLU +3.92%, +0.92% (output) and +2.23%,
+0.54% (gradient) at 64 and 256: the rule is low by about 2/d_in (output) and 1/d_in
(gradient), as the two terms above predict for ReLU.  docs/validation.md has the sweep.
"""

from sigprop.rules.activation import log_slopes
from sigprop.rules.base import REGISTRY, Param, Rule, TokenMoments, positive_int, register, std
from sigprop.state import Backward, Forward


def _projection(x, w_std, b_std, d_in):
    """Variance and token correlation of x W + b (the linear rule's forward)."""
    w2, b2 = w_std**2, b_std**2
    var = d_in * w2 * (x.var + x.mean**2) + b2
    return var, (d_in * w2 * (x.corr * x.var + x.mean**2) + b2) / var


class GLU(Rule):
    """act(x W_gate + b_gate) * (x W_up + b_up); ``activation`` names the activation rule."""

    activation = ""
    params = (
        positive_int("d_in", "input width (d_model)"),
        positive_int("d_ff", "width of the gate and up projections (the hidden width)"),
        Param("gate_std", "std of the iid N(0, gate_std^2) gate weights", None, lo=0.0, open_lo=True),
        Param("up_std", "std of the iid N(0, up_std^2) up weights", None, lo=0.0, open_lo=True),
        std("gate_b_std", "std of the gate bias entries (shared by all tokens)", default=0.0),
        std("up_b_std", "std of the up bias entries (shared by all tokens)", default=0.0),
    )
    assumptions = (
        "W_gate, W_up (and the biases) independent, zero-mean, iid entries, independent of the "
        "input; the input has any mean mu, variance s2 and token correlation r.",
        "Wide limit in d_in: the gate and up pre-activations are jointly Gaussian over tokens "
        "with the linear rule's variance and correlation, and independent of each other given "
        "the input; terms of relative order 1/d_in (per-token fluctuation of the input's mean "
        "square, about 2/d_in on the output variance for a Gaussian input and 0 for a normalised "
        "one; the backward cross term between the two paths, about 1/d_in of the gradient "
        "variance) are not modelled: measured +3.1% output and +1.5% gradient variance for "
        "ReGLU at d_in 64, +0.7% and +0.3% at 256.",
        "The activation's moments come from its own rule (exact closed forms for ReLU and GeLU, "
        "quadrature for SiLU).",
        "The gradient arriving at the output is independent of the input.",
    )
    references = ("Shazeer 2020, GLU Variants Improve Transformer (ReGLU, GEGLU, SwiGLU)",
                  "Dauphin et al. 2017, gated linear units")

    def _act(self, m, var, corr):
        """(A, K, B, K') of the activation at a zero-mean Gaussian input (module docstring)."""
        rule = REGISTRY[self.activation]
        y = rule.forward(m, Forward(0, var, corr), None)
        gb = rule.backward(m, Forward(0, var, corr), Backward(1, 1), None)
        return y.var + y.mean**2, y.corr * y.var + y.mean**2, gb.var, gb.corr * gb.var

    def token_moments(self, m, x, p):
        """Per-token statistics of a hidden unit h = act(g) u (rules.base.TokenMoments) for
        one token: g, u independent zero-mean Gaussians of variances V_g, V_u, so with the
        activation's unit moments (P2, P4, D2, DP) = E[act^2], E[act^4], E[act'^2],
        E[act'^2 act^2] at V_g: B = act^2 u^2, E[B] = P2 V_u, E[B^2] = 3 P4 V_u^2; the unit's
        input gradient act'(g) u w_g + act(g) w_u has squared norm
        A = d_in (s_g^2 act'^2 u^2 + s_u^2 act^2) (weight norms at their means, the cross term
        at its mean 0), E[A B] = d_in (3 s_g^2 DP V_u^2 + s_u^2 P4 V_u), E[A] = d_in (s_g^2 D2 V_u
        + s_u^2 P2).  Biases neglected in
        the log slopes (V_g and V_u taken proportional to the input's mean square)."""
        vg, _ = _projection(x, p.gate_std, p.gate_b_std, p.d_in)
        vu, _ = _projection(x, p.up_std, p.up_b_std, p.d_in)
        act = REGISTRY[self.activation]
        P2, P4, D2, DP = act.unit_moments(vg)
        sg2, su2 = p.gate_std**2, p.up_std**2
        EA = sg2 * D2 * vu + su2 * P2
        EAB = 3 * sg2 * DP * vu**2 + su2 * P4 * vu
        bP2, bD2 = log_slopes(act.unit_moments, vg, (0, 2))
        bA = (sg2 * D2 * vu * (bD2 + 1) + su2 * P2 * bP2) / EA
        q = x.var + x.mean**2
        return TokenMoments(3 * P4 / P2**2 - 1, EAB / (EA * P2 * vu) - 1, bP2 + 1, bA, P2 * vu / (q * p.d_in * EA))

    def forward(self, m, x, p):
        vg, rg_ = _projection(x, p.gate_std, p.gate_b_std, p.d_in)
        vu, ru = _projection(x, p.up_std, p.up_b_std, p.d_in)
        A, K, _, _ = self._act(m, vg, rg_)
        return Forward(0 * x.mean, A * vu, K * ru / A)

    def backward(self, m, x, g, p):
        vg, rg_ = _projection(x, p.gate_std, p.gate_b_std, p.d_in)
        vu, ru = _projection(x, p.up_std, p.up_b_std, p.d_in)
        A, K, B, Kp = self._act(m, vg, rg_)
        var = p.d_ff * g.var * (p.gate_std**2 * B * vu + p.up_std**2 * A)
        cov = p.d_ff * g.var * g.corr * (p.gate_std**2 * Kp * ru * vu + p.up_std**2 * K)
        return Backward(var, cov / var)


class ReGLU(GLU):
    name = "reglu"
    title = "ReGLU relu(x W_g) * (x W_u)"
    activation = "relu"


class GeGLU(GLU):
    name = "geglu"
    title = "GEGLU gelu(x W_g) * (x W_u)"
    activation = "gelu"


class SwiGLU(GLU):
    name = "swiglu"
    title = "SwiGLU silu(x W_g) * (x W_u)"
    activation = "silu"


register(ReGLU())
register(GeGLU())
register(SwiGLU())
