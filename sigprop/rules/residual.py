"""Residual combination x' = a x + b y with a branch y independent of the stream x; and, as
plain-float functions, what a norm after the sum (Post-LN) adds to the gradient's split."""

import math

import numpy as np

from sigprop import symbols
from sigprop.rules.base import Param, Rule, register
from sigprop.state import Backward, Forward

symbols.register("y_mean", r"\mu_{y}")
symbols.register("y_std", r"\sigma_{y}", positive=True)
symbols.register("y_corr", r"r_{y}")
symbols.SQUARES["y_var"] = "y_std"


class Residual(Rule):
    name = "residual"
    title = "Residual x' = a x + b y"
    params = (
        Param("a", "skip scale", 1.0),
        Param("b", "branch scale", 1.0),
        Param("y_mean", "branch output mean", 0.0),
        Param("y_var", "branch output variance", 1.0, lo=0.0),
        Param("y_corr", "branch output token correlation", 0.0, lo=-1.0, hi=1.0),
    )
    assumptions = (
        "At initialisation the branch output y is uncorrelated with the stream x (zero-mean "
        "random weights in the branch); exact under that assumption.",
        "Backward gives the skip path only (gradient to x through a); the branch adds its own "
        "backward when a whole block is composed.",
    )
    references = ("[TGS] section 3; [DeepNet] eq. 1",)

    def forward(self, m, x, p):
        mean = p.a * x.mean + p.b * p.y_mean
        var = p.a**2 * x.var + p.b**2 * p.y_var
        cov = p.a**2 * x.cov + p.b**2 * p.y_corr * p.y_var
        return Forward(mean, var, cov / var)

    def backward(self, m, x, g, p):
        return Backward(p.a**2 * g.var, g.corr)


register(Residual())


# -- a residual sum under a norm: Post-LN, x' = N(z), z = a x + b F(x) ------------------------
# Weights and variances come as natural logarithms (a, b or a variance may lie beyond float64
# when squared); these are plain-float helpers for the whole-model predictor, written here
# because they are the residual unit's own maths: the gradient g = g_z below the norm is
# orthogonal to z per token (the norm's Jacobian removes its input's direction), so the skip
# and branch gradients a g and b J_F^T g are tied together through x . g = -(b/a) F . g.


def exp_or_inf(v: float) -> float:
    """exp(v) for a value carried as a logarithm; inf where exp overflows (v above
    log(1.797e308) = 709.78; a bound of 709 wrote an input variance of 1e308 as inf)."""
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def log_share(l1: float, l2: float) -> float:
    """e^l1 / (e^l1 + e^l2) without overflow (0 for l1 = -inf)."""
    if l1 == -math.inf:
        return 0.0
    t = l2 - l1
    return 1.0 / (1.0 + math.exp(t)) if t < 709.0 else 0.0


def log_add(l1: float, l2: float) -> float:
    """log(e^l1 + e^l2) without overflow."""
    hi, lo = (l1, l2) if l1 >= l2 else (l2, l1)
    return hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))


def post_norm_euler_share(log_a2: float, log_b2: float, log_gain: float, log_vx: float,
                          euler_var: float) -> float:
    """Share along the stream's direction of the gradient handed below a Post-LN unit with a
    position-wise branch F, relative to an isotropic gradient: b^2 v_D / (v_x (a^2 + gain)),
    at most 1.

    Per token x . g_x = z . g - b (F - J_F x) . g = -b D . g exactly (g = g_z orthogonal to
    z), D = F(x) - J_F x the branch's departure from Euler's identity, of per-element variance
    ``euler_var`` (absolute units; 0 for a branch positively homogeneous of degree 1, which
    makes the unit scale-invariant in x).  Assumes g isotropic within the (d - 2)-dimensional
    complement of 1 and z (corrections O(1/d)), and D taken as lying in that complement: D's
    own component along z = a x + b F (F contains D), a fraction b^2 v_D / v_z of |D|^2
    (v_z = a^2 v_x + b^2 v_F), is not removed, so the share is high by that fraction (0 without
    biases; measured 0.12 at v_D / v_F = 0.35, b 0.8: tests/rules/test_residual_postln.py).
    ``log_gain``: log of the branch path's
    gradient gain, ``log_vx``: log of the stream variance (clipped as its user carries it)."""
    if euler_var <= 0 or log_b2 == -math.inf:
        return 0.0
    return min(1.0, exp_or_inf(log_b2 + math.log(euler_var) - log_vx - log_add(log_a2, log_gain)))


def post_norm_cross_log_factor(log_b2: float, log_vx: float, log_total: float, branch_var: float,
                               euler_var: float, d: int) -> float:
    """log of 1 + (skip-branch cross term) / (a^2 + branch gain) of a Post-LN unit with a
    position-wise branch F, ``log_total`` = log(a^2 + branch gain) per unit gradient variance.

    With J_F = (J_F x) x^T / |x|^2 + J_perp (J_perp x = 0, zero mean over the weights) and
    x . g = -(b/a) F . g: 2 a b g . J_F^T g = -2 b^2 (g . J_F x)(g . F) / |x|^2 + (zero mean),
    expectation -2 b^2 E[F . J_F x] / (d v_x) per unit |g|^2 (g isotropic in the complement of
    1 and z; corrections O(1/d^2)).  E[F . J_F x] per element is v_F - v_D when D = F - J_F x
    is uncorrelated with J_F x (``branch_var`` v_F, ``euler_var`` v_D, absolute units): without
    biases the term is -(2/d) gamma/(1 + gamma) of the sum (gamma = branch over skip).  Kept
    above -1/2 (first order).  Position-wise: every position's variance and covariance scale
    alike.  Measured at d 64, d_ff 128, b 0.8, a = 1 on a LayerNorm output (one unit, 600
    weight draws of 64 tokens): 0.71 +- 0.09 of this term without biases and 0.74 +- 0.09 with
    v_D / v_F = 0.35 (tests/rules/test_residual_postln.py), so at small d it overstates the term."""
    c = branch_var - euler_var
    if c <= 0:
        return 0.0
    lc = math.log(2.0 * c / d) + log_b2 - log_vx - log_total
    return math.log1p(-min(exp_or_inf(lc), 0.5))


def post_norm_attention(terms, x: Forward, log_a2: float, log_b2: float, log_gain: float,
                        branch_var: float, d: int, mean=None, relative: bool = False):
    """(share along the stream's direction of the gradient below a Post-LN attention unit,
    skip-branch cross term per position), both per unit variance of g = g_z, from the
    attention's Euler terms (``terms``: :func:`sigprop.rules.attention.euler_terms`, per
    position or averaged) at stream ``x`` (actual mean and variance, as the attention saw it)
    and the unit's logarithmic weights (``log_gain``: the branch path's gradient gain;
    ``branch_var``: v_F, absolute units).  ``mean``: the average over positions of a per-position
    array (a graded grid's weighted mean; default the plain mean).  ``relative``: the cross
    term in units of a^2 + branch gain instead (b^2 and that sum entering as one ratio of
    logarithms).

    The gradient g_t below the norm is orthogonal to z_t, whose direction carries the fraction
    pi = b^2 v_F / (a^2 v_x S2 + b^2 v_F) of F_t (S2 = 1 + mu^2/v_x); the token-shared parts of
    the Euler terms lie along F, so they are multiplied by 1 - pi (exact in the collapsed limit
    r -> 1; the token-specific parts are not).  Share: b^2 [(1 - pi) shared + own] / (S2 (a^2 +
    gain)), its mean over positions clipped to [0, 1]; cross term, with J_st = E_st x_t^T /
    |x_t|^2 + (zero mean) and x_t . g_t = -(b/a) F_t . g_t:
    -2 b^2 [(1 - pi) cross_shared + cross_own] / (d S2)."""
    vx = float(x.var)
    mu2 = x.mean * x.mean / vx if x.mean else 0.0
    S2 = 1.0 + mu2
    log_vx = math.log(vx)
    pi = log_share(log_b2 + math.log(branch_var), log_a2 + log_vx + math.log(S2)) if branch_var > 0 else 0.0
    b2_rel = exp_or_inf(log_b2 - log_add(log_a2, log_gain))
    bracket = (1.0 - pi) * terms.shared + terms.own
    mb = float(np.mean(bracket)) if mean is None else mean(bracket)
    along = min(1.0, max(0.0, b2_rel * mb / S2))
    b2_cross = b2_rel if relative else exp_or_inf(log_b2)
    cross = -2.0 * b2_cross * ((1.0 - pi) * terms.cross_shared + terms.cross_own) / (d * S2)
    return along, (np.asarray(cross, dtype=float) if np.ndim(cross) else float(cross))


def post_norm_skip_share(log_a2: float, log_b2: float, log_vx: float, branch_var: float) -> float:
    """Share along the stream's direction x of the skip path's part a J^T g of the gradient
    below a Post-LN unit z = a x + b F, relative to an isotropic gradient: b^2 v_F / (a^2 v_x),
    at most 1 (``branch_var`` v_F in absolute units, ``log_vx`` the log stream variance as its
    user carries it; 0 without a branch, 1 without a skip).

    The norm's Jacobian leaves J^T g orthogonal to its input z (LayerNorm: and to 1), so
    x . J^T g = -(b/a) F . J^T g: the skip part's component along x is that of F scaled by
    b/a, whose energy relative to |x|^2 is b^2 v_F / (a^2 v_x), assuming J^T g isotropic in
    the complement of z (and 1).  First order in that ratio: the projection off z also removes
    F's own component along z, which makes the exact share b^2 v_F / (a^2 v_x + b^2 v_F), so
    this is high by a factor 1 + b^2 v_F / (a^2 v_x) (tests/rules/test_residual_postln.py)."""
    if log_a2 == -math.inf:
        return 1.0
    if branch_var > 0 and log_b2 > -math.inf:
        return min(1.0, exp_or_inf(log_b2 + math.log(branch_var) - log_vx - log_a2))
    return 0.0
