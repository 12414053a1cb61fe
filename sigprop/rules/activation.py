"""Pointwise activations with zero-mean Gaussian input: ReLU and exact GeLU x Phi(x).

Both rules take the input x ~ N(0, s2) with token correlation r (two different tokens at the
same feature are jointly Gaussian with correlation r) and a gradient arriving at the output
with variance g2 and token correlation rg, *independent of the input* (the usual
initialisation assumption: the upstream gradient depends on weights above, not on this
pre-activation).  Backward is dx = g * f'(x), so

    grad var = g2 E[f'(x)^2],      grad cov = rg g2 E[f'(x_i) f'(x_j)].

Formulas are the [TGS-code] ones.  Every one was checked here against
independent quadrature (mpmath adaptive and 240-point Gauss-Hermite in float64) for
s2 in {0.01, 0.1, 1, 10, 100, 1000} and r in [-1, 1]: all agree to round-off, so no
published expression needed correcting.  tests/rules/test_activation.py repeats the quadrature
check at a few points.
"""

from __future__ import annotations

import math

from sigprop import registry
from sigprop.backend import numeric
from sigprop.rules.base import Rule, TokenMoments, register
from sigprop.state import Backward, Forward

_ASSUMPTIONS = (
    "Input is Gaussian with mean 0 (checked): exact for a Gaussian pre-activation, e.g. a "
    "linear layer's output at initialisation in the wide limit (d_in >> 1).",
    "Two different tokens are jointly Gaussian with correlation r (any r in [-1, 1]).",
    "The gradient arriving at the output is independent of the input x (initialisation, "
    "mean-field); its token correlation rg multiplies the covariance.",
    "Expectations over the input law, not finite-sample: no width or length correction.",
)


# ---- per-token statistics of a hidden layer ------------------------------------------
def quadrature_unit_moments(f, fp, var):
    """(E[f^2], E[f^4], E[f'^2], E[f'^2 f^2]) at x ~ N(0, var) by the strip trapezoid rule
    (:func:`sigprop.backend.numeric.expect_normal_strip`; f analytic in |Im x| < pi)."""
    e = numeric.expect_normal_strip
    return tuple(float(e(g, var)) for g in (lambda t: f(t) ** 2, lambda t: f(t) ** 4,
                                             lambda t: fp(t) ** 2, lambda t: (fp(t) * f(t)) ** 2))


def log_slopes(moments, var, which, step=1e-4):
    """d log moments(var)[i] / d log var for each i in ``which`` (central difference in log var)."""
    lo, hi = moments(var * math.exp(-step)), moments(var * math.exp(step))
    return tuple((math.log(hi[i]) - math.log(lo[i])) / (2 * step) for i in which)


class _HiddenUnit:
    """Per-token statistics of a unit act(g) of an activation layer, g = w.x the
    pre-activation (zero-mean Gaussian of variance ``x.var`` for the token; the unit's input
    gradient is act'(g) w, so A = act'(g)^2 |w|^2 with |w|^2 ~ its mean, rules.base.TokenMoments):
    k_b = E[f^4]/E[f^2]^2 - 1, k_ab = E[f'^2 f^2]/(E[f'^2] E[f^2]) - 1, and the log slopes of
    E[f^2] and E[f'^2] in the pre-activation variance (which a bias-free linear layer keeps
    proportional to the input's mean square); E[B]/(Q E[A]) = E[f^2]/(E[f'^2] V) (|w|^2 = V/Q)."""

    def unit_moments(self, var):
        raise NotImplementedError

    def token_moments(self, m, x, p):
        P2, P4, D2, DP = self.unit_moments(float(x.var))
        bB, bA = log_slopes(self.unit_moments, float(x.var), (0, 2))
        return TokenMoments(P4 / P2**2 - 1, DP / (D2 * P2) - 1, bB, bA, P2 / (D2 * float(x.var)))


# ---- ReLU -----------------------------------------------------------------------------
def _forward_from_cross(mean, var, cross):
    """Output state of a pointwise f from E[f], Var[f] and the cross moment E[f(x_i) f(x_j)]."""
    return Forward(mean, var, (cross - mean**2) / var)


def _backward_from_kernel(g, k_var, k_cross):
    """Gradient state through a pointwise f from E[f'^2] (k_var) and E[f'(x_i) f'(x_j)] (k_cross)."""
    return Backward(g.var * k_var, g.corr * k_cross / k_var)


class ReLU(_HiddenUnit, Rule):
    """ReLU, max(x, 0), on x ~ N(0, s2) with token correlation r ([TGS-code]; arc-cosine
    kernel of Cho & Saul 2009, degree 1).

    * mean sqrt(s2 / (2 pi)); E[relu^2] = s2 / 2; var = s2 (pi - 1) / (2 pi).
    * uncentred cross moment E[relu(x_i) relu(x_j)] = s2 (sqrt(1-r^2) + (pi - arccos r) r)
      / (2 pi), hence cov = s2 (pi r + sqrt(1-r^2) - r arccos r - 1) / (2 pi).
      The output correlation is cov/var = (pi r + sqrt(1-r^2) - r arccos r - 1)/(pi - 1).
      [TGS] quote the quadratic approximation 0.7 r + 0.3 r^2 of it (good to about 0.01 on
      [0, 1]); this rule computes the exact form.
    * grad var = g2 / 2 (P(x > 0) = 1/2);
      grad cov = rg g2 P(x_i > 0, x_j > 0) = rg g2 (1/4 + arcsin(r) / (2 pi)), so the gradient
      correlation is rg (1/2 + arcsin(r) / pi).
    """

    name = "relu"
    title = "ReLU max(x, 0)"
    params = ()
    assumptions = _ASSUMPTIONS + (
        "Exact under these assumptions (no approximation); the published quadratic "
        "approximation 0.7 r + 0.3 r^2 of the output correlation is not used.",
    )
    references = ("[TGS] Kedia et al. 2024, Table 1 and verification code (ReLU)",
                  "Cho & Saul 2009, arc-cosine kernels (degree 1)")
    zero_mean_input = True

    def unit_moments(self, var):
        """(E[f^2], E[f^4], E[f'^2], E[f'^2 f^2]) = (s2/2, 3 s2^2/2, 1/2, s2/2): half-normal
        moments (closed form; the kink defeats the strip quadrature)."""
        return var / 2, 1.5 * var**2, 0.5, var / 2

    def forward(self, m, x, p):
        s2, r = x.var, x.corr
        mean = m.sqrt(s2 / (2 * m.pi))
        var = s2 * (m.pi - 1) / (2 * m.pi)
        cov = s2 * (m.pi * r + m.sqrt(1 - r**2) - r * m.acos(r) - 1) / (2 * m.pi)
        return Forward(mean, var, cov / var)

    def backward(self, m, x, g, p):
        half = m.Rational(1, 2)
        # corr = rg P(both > 0) / P(x > 0); written as a ratio so g2 = 0 gives corr rg (...)
        return Backward(half * g.var, g.corr * (m.Rational(1, 4) + m.asin(x.corr) / (2 * m.pi)) / half)



def relu_ffn_euler_var(d_ff: int, w2_std: float, b1_std: float, b2_std: float,
                       p_inner: float = 0.0, p_hidden: float = 0.0) -> float:
    """Per-element variance of D = F(x) - J_F x, the departure from Euler's identity of the
    ReLU MLP branch F(x) = Dropout_h(W2 Dropout_i(relu(W1 x + b1)) + b2) (W2: d_ff -> d with
    entries of std ``w2_std``; biases of stds ``b1_std``, ``b2_std``; inner and hidden dropout
    probabilities ``p_inner``, ``p_hidden``), absolute units.

    ReLU is positively homogeneous of degree 1 (u relu'(u) = relu(u)), so with u = W1 x + b1,
    J_F x = W2 M (relu'(u) (u - b1)) and D = W2 M (relu'(u) b1) + b2 (M the inner dropout's
    mask, rescaled by 1/(1 - p_inner)): variance b2_std^2 + d_ff w2_std^2 b1_std^2 P(u > 0) /
    (1 - p_inner), P(u > 0) = 1/2 (u symmetric about 0: zero-mean weights), all over
    (1 - p_hidden) for the hidden dropout mask.  0 without biases: the branch is then
    homogeneous.  D and J_F x are uncorrelated (E[b1 w 1(w + b1 > 0)] = 0 for independent
    centred Gaussian b1, w), so E[F . J_F x] = v_F - v_D per element."""
    v = b2_std * b2_std + d_ff * w2_std * w2_std * b1_std * b1_std * 0.5 / (1.0 - p_inner)
    return v / (1.0 - p_hidden)

# ---- GeLU -----------------------------------------------------------------------------
class GeLU(_HiddenUnit, Rule):
    """Exact GeLU f(x) = x Phi(x) on x ~ N(0, s2) with token correlation r ([TGS-code]).

    With a = s2 / (1 + s2) and rho = r a:

    * mean = sqrt(s2 / (2 pi)) sqrt(a)  (Stein: E[x Phi(x)] = s2 E[phi(x)]).
    * var = s2/(2 pi) (pi - a - arccos a + 2 a sqrt((1 - a)/(1 + a))).
    * uncentred cross moment
      E[f(x_i) f(x_j)] = r s2 (1/4 + arcsin(rho)/(2 pi))
                         + s2^2 (1 + s2 + r^2 (1 - s2)) / (2 pi (1 + s2) sqrt((1+s2)^2 - r^2 s2^2)),
      which is the published s2/4 [r + (2r/pi) arcsin(r a) + (2 s2/pi)(s2(1-r^2) + 1 + r^2)
      / ((s2+1) sqrt((s2+1)^2 - r^2 s2^2))] rearranged; cov = that - mean^2.
      (Derivation: Gaussian integration by parts in x_i; Phi(x) = P(z <= x) for an
      independent z ~ N(0, 1) turns E[Phi(x_i) Phi(x_j)] into the orthant probability
      1/4 + arcsin(rho)/(2 pi) of x - z, whose correlation is rho.)
    * grad var = g2 [1/2 + (1/(2 pi))(-arccos a + a (5 s2 + 3)/(1 + 2 s2)^(3/2))].
    * grad cov = rg g2 [1/2 + (1/(2 pi))(-arccos rho
                 + rho ((s2+1)(2 s2+3) - 2 r^2 s2^2)/((s2+1)^2 - r^2 s2^2)^(3/2))].

    Checked against independent quadrature (module docstring): the published expressions are
    correct as published; the variance forms are the cross-moment forms at r = 1
    (a symbolic test checks this identity).
    """

    name = "gelu"
    title = "GeLU x Phi(x) (exact erf form)"
    params = ()
    assumptions = _ASSUMPTIONS + (
        "Exact erf GeLU x Phi(x); the tanh approximation of GeLU differs by < 1e-3 in f and "
        "is not modelled.",
    )
    references = ("[TGS] Kedia et al. 2024, Table 1 and verification code (GeLU)",
                  "Hendrycks & Gimpel 2016, GeLU")
    zero_mean_input = True

    def unit_moments(self, var):
        """(E[f^2], E[f^4], E[f'^2], E[f'^2 f^2]) by quadrature, f' = Phi(x) + x phi(x)."""
        phi = lambda t: numeric.exp(-t * t / 2) / math.sqrt(2 * math.pi)
        return quadrature_unit_moments(lambda t: t * numeric.Phi(t), lambda t: numeric.Phi(t) + t * phi(t), var)

    def forward(self, m, x, p):
        s2, r = x.var, x.corr
        pi = m.pi
        a = s2 / (1 + s2)
        rho = r * a
        mean = m.sqrt(s2 / (2 * pi)) * m.sqrt(a)
        var = s2 / (2 * pi) * (pi - a - m.acos(a) + 2 * a * m.sqrt((1 - a) / (1 + a)))
        cross = (r * s2 * (m.Rational(1, 4) + m.asin(rho) / (2 * pi))
                 + s2**2 * (1 + s2 + r**2 * (1 - s2))
                 / (2 * pi * (1 + s2) * m.sqrt((1 + s2) ** 2 - r**2 * s2**2)))
        return _forward_from_cross(mean, var, cross)

    def backward(self, m, x, g, p):
        s2, r = x.var, x.corr
        pi = m.pi
        half = m.Rational(1, 2)
        a = s2 / (1 + s2)
        rho = r * a
        k_var = half + (-m.acos(a) + a * (5 * s2 + 3) / (1 + 2 * s2) ** m.Rational(3, 2)) / (2 * pi)
        k_cross = half + (-m.acos(rho) + rho * ((s2 + 1) * (2 * s2 + 3) - 2 * r**2 * s2**2)
                          / ((s2 + 1) ** 2 - r**2 * s2**2) ** m.Rational(3, 2)) / (2 * pi)
        return _backward_from_kernel(g, k_var, k_cross)


register(ReLU())
register(GeLU())
registry.register(registry.Activation("relu", "ReLU", rule="relu", component="relu", torch="relu", glu="reglu",
                                      glu_title="ReGLU", ffn_euler_var=relu_ffn_euler_var))
registry.register(registry.Activation("gelu", "GeLU", rule="gelu", component="gelu", torch="gelu", glu="geglu",
                                      glu_title="GeGLU"))


# ---- SiLU -----------------------------------------------------------------------------
def sigmoid(m, x):
    """Logistic sigmoid 1/(1 + e^-x), written as (1 + tanh(x/2))/2 (no overflow in NumPy)."""
    return (1 + m.tanh(x / 2)) / 2


def silu(m, x):
    """SiLU (swish) x sigmoid(x)."""
    return x * sigmoid(m, x)


def silu_prime(m, x):
    """d/dx [x sigmoid(x)] = sigmoid(x) (1 + x (1 - sigmoid(x)))."""
    s = sigmoid(m, x)
    return s * (1 + x * (1 - s))


def gaussian_moments(m, f, s2, r):
    """(E[f(x)], E[f(x)^2], E[f(x_i) f(x_j)]) for x ~ N(0, s2), two tokens with correlation r,
    f analytic in |Im x| < pi (SiLU and its derivative: poles at +-i pi).  The cross moment
    as an iterated expectation, x_j | x_i ~ N(r x_i, s2 (1 - r^2))."""
    mean = m.expect_normal_strip(f, s2)
    second = m.expect_normal_strip(lambda a: f(a) ** 2, s2)
    cross = m.expect_normal_strip(
        lambda a: f(a) * m.expect_normal_strip(f, s2 * (1 - r**2), mean=r * a), s2)
    return mean, second, cross


class SiLU(_HiddenUnit, Rule):
    """SiLU (swish) f(x) = x sigmoid(x) on x ~ N(0, s2) with token correlation r.

    No closed form exists (logistic-normal integrals), so every moment is a Gaussian
    expectation evaluated by quadrature:

    * mean E[f(x)], var E[f(x)^2] - mean^2;
    * cross moment E[f(x_i) f(x_j)] as the iterated expectation over x_i and x_j | x_i
      ~ N(r x_i, s2 (1 - r^2)); cov = that - mean^2;
    * grad var = g2 E[f'(x)^2], grad cov = rg g2 E[f'(x_i) f'(x_j)],
      f'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))).

    Numerically the integrals use the trapezoid rule in the standardised variable with a
    spacing set by the distance of f's poles (+-i pi) from the real axis
    (:func:`sigprop.backend.numeric.expect_normal_strip`): relative error < 3e-12 against
    mpmath for s2 from 1e-4 to 1e3 (measured at 1e-4, 1e-3, 1, 100, 1e3: largest 2.9e-12, on
    E[f'^2] at s2 = 1; 1.5e-6 at s2 = 1e4; the tests check 1e-10 and 5e-6; Gauss-Hermite with
    256 nodes is off by 2e-3 at s2 = 100).  Symbolically they are unevaluated integrals.  Unit variance input:
    E[f] = 0.20662, E[f^2] = 0.35578, E[f'^2] = 0.37948.
    """

    name = "silu"
    title = "SiLU x sigmoid(x)"
    params = ()
    assumptions = _ASSUMPTIONS + (
        "Exact up to quadrature error (< 3e-12 relative against mpmath for input variance 1e-4 .. 1e3, "
        "< 2e-6 up to 1e4; no closed-form stand-in such as x Phi(1.702 x) is used).",
    )
    references = ("Elfwing, Uchibe & Doya 2018, SiLU; Ramachandran, Zoph & Le 2017, Swish",
                  "Shazeer 2020, GLU variants (SwiGLU)")
    zero_mean_input = True

    def unit_moments(self, var):
        """(E[f^2], E[f^4], E[f'^2], E[f'^2 f^2]) by quadrature."""
        return quadrature_unit_moments(lambda t: silu(numeric, t), lambda t: silu_prime(numeric, t), var)

    def forward(self, m, x, p):
        mean, second, cross = gaussian_moments(m, lambda t: silu(m, t), x.var, x.corr)
        var = second - mean**2
        return _forward_from_cross(mean, var, cross)

    def backward(self, m, x, g, p):
        _, k_var, k_cross = gaussian_moments(m, lambda t: silu_prime(m, t), x.var, x.corr)
        return _backward_from_kernel(g, k_var, k_cross)


register(SiLU())
registry.register(registry.Activation("silu", "SiLU", rule="silu", component="silu", torch="silu", glu="swiglu",
                                      glu_title="SwiGLU"))
