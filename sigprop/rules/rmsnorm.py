"""RMSNorm over d features, gain 1 (its initial value; no bias).

    y_t = x_t / sqrt(mean_f(x_t^2) + eps)

Unlike LayerNorm it does not centre: an input mean survives (as mu / sqrt(s2 + mu^2) in the
wide limit), and the next zero-mean linear layer turns it into token correlation
(:mod:`sigprop.rules.linear` counts mu^2 in the covariance).

Derivation (finite d; the sampling convention of :mod:`sigprop.mc.sampling`: per feature,
x = mu + sigma (sqrt(r) c + sqrt(1-r) e_t), c shared by the tokens).  In units of sigma,
x_t = m 1 + a_t with m = mu/sigma, and along the unit vector e = 1/sqrt(d) and its
(d-1)-dimensional complement x_t = (sqrt(d) m + w_t) e + a_t', w_t ~ N(0, 1) (correlation r
between tokens) and a_t' isotropic Gaussian.  With eps -> 0, y_t = sqrt(d) x_t / |x_t|, so

* E[y^2] = 1 exactly; the output mean is E[P/sqrt(D)] and the token cross moment is
  E[cos(x_t, x_s)] = E[N / sqrt(D_t D_s)], with P = e.x_t/sqrt(d) = m + w_t/sqrt(d),
  D_t = |x_t|^2/d, N = x_t.x_s/d, whose expectations are exactly m, m^2 + 1, m^2 + r.
* Second-order delta method (third cumulants are O(1/d^2)), in relative units of
  Q = s2 + mu^2: var D / Q^2 = vq = (4 mu^2 s2 + 2 s2^2)/(d Q^2),
  cov(D_t, D_s)/Q^2 = cq = (4 mu^2 r s2 + 2 r^2 s2^2)/(d Q^2),
  cov(N, D_t)/Q^2 = cn = (2 mu^2 (1+r) s2 + 2 r s2^2)/(d Q^2), cov(P, D)/... = 2m/d:
    mean  = mu/sqrt(Q) (1 + t),  t = (2 mu^2 s2 - s2^2)/(4 d Q^2);
    cross = c0 (1 + (3 vq + cq)/4) - cn,  c0 = (mu^2 + r s2)/Q.
  At mu = 0 this is r (1 - (1-r^2)/(2d)), LayerNorm's series with n = d (nothing is
  centred); for |mu| >> sigma the output is 1 + (sigma/mu)(a - mean_f a) and the
  variance and covariance come out as (s2/mu^2)(1 - 1/d) and r of that, as they should.
  Variance and covariance are written without the cancellation 1 - mean^2:
  var = s2/Q - (mu^2/Q) t (2 + t), cov = r s2/Q + c0 (3 vq + cq)/4 - cn - (mu^2/Q) t (2 + t).
* eps: E[y^2] = E[D/(D + eps/s2)] ~ Q_h/(Q_h + eps) with Q_h = Q (1 - vq) the harmonic mean
  of the per-token mean square (exact for mu = 0: s2 (d-2)/d, inverse chi-square); second
  moments are multiplied by that factor, the mean by its square root, correlations
  unchanged (first order in eps/Q).
* backward: dy/dx = (I - y y^T/d)/rho_t, rho_t = sqrt(D_t s2 + eps): divide by the rms and
  remove the component along the output.  For an upstream gradient independent of x:
  grad var = g2 (d - 1)/(d (Q_h + eps)) (E[1/rho^2] = 1/(Q_h + eps)); gradient covariance
  g2 rg E[tr(P_t P_s)/(rho_t rho_s)]/d with tr(P_t P_s) = d - 2 + cos^2, and
  E[1/sqrt(D_t D_s)]/E[1/D] = 1 - (vq - cq)/4, so
  grad corr = rg (1 - (1 - c0^2)/d - (vq - cq)/4) (at mu = 0: rg (1 - 3 (1-r^2)/(2d)), as
  LayerNorm with n = d).

Per-token statistics (as for LayerNorm): every finite-d term above except the removed
direction comes from the fluctuation of the per-token mean square; ``kappa_rms`` scales them
(1 for a Gaussian input, 0 for an input whose per-token mean square is fixed, e.g. the
output of another norm), and ``g_generic_rms`` the removed-direction terms (1 for a gradient
independent of the input, 0 for one already orthogonal to the output).  An upstream gradient
whose per-token mean square has slope ``g_slope_rms`` on the input's relative per-token mean
square multiplies the gradient variance by 1 - g_slope_rms vq Q_h/(Q_h + eps), as for
LayerNorm (sigprop.rules.layernorm.token_slope_factor).
"""

from sigprop import registry, symbols
from sigprop.rules.base import Param, Rule, register
from sigprop.rules.layernorm import branch_output_terms, token_slope_factor

symbols.register("g_slope_rms", r"\lambda_{\mathrm{RMS}}", real=True)
from sigprop.state import Backward, Forward


def _terms(x, p):
    """(Q, c0, vq, cq, cn, t) of the module docstring, the fluctuation terms scaled by kappa."""
    s2, mu2, r, d, k = x.var, x.mean**2, x.corr, p.d, p.kappa_rms
    Q = s2 + mu2
    # the variance's and the squared mean's shares of the mean square (the terms are ratios of
    # degree 2 in them: in shares, Q^2 never forms, which overflowed from Q ~ 1e154 on)
    a, b = s2 / Q, mu2 / Q
    c0 = b + r * a
    vq = k * (4 * b * a + 2 * a**2) / d
    cq = k * (4 * b * r * a + 2 * r**2 * a**2) / d
    cn = k * (2 * b * (1 + r) * a + 2 * r * a**2) / d
    t = k * (2 * b * a - a**2) / (4 * d)
    return Q, c0, vq, cq, cn, t


class RMSNorm(Rule):
    name = "rmsnorm"
    title = "RMSNorm (gain 1)"
    params = (
        Param("d", "number of features normalised over (d >= 4)", None, lo=4, integer=True),
        Param("eps", "floor added to the mean square inside the square root (LLaMA: 1e-6)", 1e-6, lo=0.0),
        Param("kappa_rms", "relative variance of the per-token mean square in units of its value "
              "for a Gaussian input of this mean and variance (1 Gaussian, 0 for a fixed "
              "per-token norm such as another norm's output, above 1 for a heavy-tailed one such "
              "as an FFN output; first order in 2 kappa/d)", 1.0, lo=0.0),
        Param("g_generic_rms", "share of the upstream gradient along the output direction the "
              "Jacobian removes, relative to a gradient independent of the input (1); 0 for a "
              "gradient already orthogonal to the output", 1.0, lo=0.0, hi=1.0),
        Param("g_slope_rms", "slope of the upstream gradient's relative per-token mean square on "
              "the input's relative per-token mean square (0: a gradient independent of the input; "
              "-1: one that scales as 1/rho_t^2, as below another norm of the same stream); first "
              "order in vq", 0.0),
    )
    assumptions = (
        "Per feature, two different tokens are jointly Gaussian with correlation r (a component "
        "shared by all tokens carries it, as in the Monte Carlo sampler); the input mean mu is "
        "the same for every feature and is kept (not removed as by LayerNorm).",
        "Output mean mu/sqrt(s2 + mu^2) (1 + t) and token cross moment c0 (1 + (3 vq + cq)/4) - cn "
        "(module docstring): second-order delta method in the per-token mean square, exact at "
        "order 1/d, truncation error O(1/d^2).",
        "E[y^2] = Q_h/(Q_h + eps), Q_h = (s2 + mu^2)(1 - vq): exact for eps -> 0 (E[y^2] = 1), "
        "first order in eps/(s2 + mu^2) otherwise; mean scaled by its square root, correlation "
        "unchanged.",
        "Gradient variance g2 (d - g_generic)/(d (Q_h + eps)): exact for mu = 0 and eps -> 0 "
        "(inverse chi-square with d degrees of freedom), first order in vq otherwise; the "
        "upstream gradient is independent of the input.",
        "Gradient correlation rg (1 - g_generic (1 - c0^2)/d - (vq - cq)/4): first order in 1/d.",
        "Upstream gradient with per-token slope g_slope_rms on the input's per-token mean square: "
        "gradient variance times 1 - g_slope_rms vq Q_h/(Q_h + eps) (first order in vq), "
        "correlation unchanged.",
        "kappa_rms scales every term from the fluctuation of the per-token mean square (exact "
        "at kappa 1, Gaussian input, and kappa 0, fixed norms; interpolated in between).",
        "Gain 1 (the initial value; Gemma's (1 + w) form is gain 1 at w = 0).",
    )
    references = (
        "Zhang & Sennrich 2019, Root Mean Square Layer Normalization",
        "finite-d terms derived here (delta method), as for sigprop's LayerNorm rule",
    )

    def forward(self, m, x, p):
        Q, c0, vq, cq, cn, t = _terms(x, p)
        Qh = Q * (1 - vq)
        scale = Qh / (Qh + p.eps)
        mean = x.mean / m.sqrt(Q) * (1 + t) * m.sqrt(scale)
        shrink = x.mean**2 / Q * t * (2 + t)                    # mean0^2 - mu^2/Q
        var = x.var / Q - shrink
        cov = x.corr * x.var / Q + c0 * (3 * vq + cq) / 4 - cn - shrink
        return Forward(mean, scale * var, cov / var)

    def backward(self, m, x, g, p):
        Q, c0, vq, cq, cn, t = _terms(x, p)
        Qh = Q * (1 - vq)
        var = g.var * (p.d - p.g_generic_rms) / (p.d * (Qh + p.eps))
        # a parameter set without the slope (rules.compose takes dicts as given): 0
        var = var * token_slope_factor(getattr(p, "g_slope_rms", 0), vq, Qh, p.eps)
        corr = g.corr * (1 - p.g_generic_rms * (1 - c0**2) / p.d - (vq - cq) / 4)
        return Backward(var, corr)


register(RMSNorm())


def branch_output_kappa(v_b, d):
    """``kappa_rms`` (the relative variance of the per-token mean square in units of 2/d) of a
    branch output F = W h normalised by an RMSNorm of width d, where h's per-token squared norm
    |h|^2 has relative variance ``v_b`` across tokens: given h, F's d entries are iid Gaussian,
    so F's per-token mean square is |h|^2 times a chi-square of d degrees of freedom over d;
    its relative variance is 2/d + v_b to first order (the product term 2 v_b/d is dropped),
    i.e. kappa_rms = 1 + d v_b/2.  Gaussian h-norms (v_b = 0) give 1.  Plain arithmetic on
    floats or arrays."""
    return 1.0 + d * v_b / 2


def branch_output_stats(t, width, d, x, x_kappa, in_norm):
    """An RMSNorm on a branch output: (its ``kappa_rms``, the factor on the gradient variance
    at the branch input), rules.layernorm.branch_output_terms with this rule's
    :func:`branch_output_kappa`."""
    v_b, ratio = branch_output_terms(t, width, d, x, x_kappa, in_norm)
    return branch_output_kappa(v_b, d), ratio


registry.register(registry.Norm(
    "rmsnorm", "RMSNorm", short="RMSNorm", tag="RMS", rule="rmsnorm", component="rmsnorm", torch="RMSNorm",
    qk_code=2,
    params=lambda d, eps, tok, g_generic: dict(d=d, eps=eps, kappa_rms=tok[1], g_generic_rms=g_generic),
    # its Jacobian removes the output's direction only (it keeps the mean)
    generic_key="g_generic_rms", generic_share=lambda gen: gen[1], shares_below=(1.0, 0.0),
    slope_key="g_slope_rms", branch_output_stats=branch_output_stats))
