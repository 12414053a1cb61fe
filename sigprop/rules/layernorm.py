"""LayerNorm over d features, no affine part at initialisation (gain 1, bias 0).

    y_t = (x_t - mean_f x_t) / sqrt(var_f x_t + eps)      (biased variance over features)

Derivation (finite d, under the sampling convention of :mod:`sigprop.mc.sampling`: per
feature, the values of two different tokens are bivariate normal with correlation r, the
correlation carried by a component shared by all tokens).  Centering projects every token
onto the (n = d - 1)-dimensional subspace orthogonal to the all-ones vector (and removes any
input mean exactly); there the centred tokens are a = sigma (sqrt(r) u + sqrt(1-r) v_t) with
u, v_t iid standard normal in n dimensions, so ``y_t = sqrt(d) a_t / |a_t|`` (eps -> 0) and

* output variance: |y_t|^2 / d = 1 exactly (eps -> 0);
* output token covariance: E[cos(a_t, a_u)], the expected *uncentred* sample correlation of
  n iid bivariate normal pairs.  Its exact value is
  r (2/n) (Gamma((n+1)/2)/Gamma(n/2))^2 2F1(1/2, 1/2; n/2+1; r^2); for large n
  r [1 - q/(2n) + q(1-9r^2)/(8n^2) - q(75r^4-42r^2-1)/(16n^3) + O(n^-4)], q = 1-r^2.
  The 1/n term is the bias from the norms |a_t| fluctuating together with the shared
  component (|u|^2 is not exactly n).
  Neither the published r (1 - 1/d) nor the naive large-sample r is right at order 1/d;
  Monte Carlo at d = 16 ... 1000 agrees with this series to about 1e-4.
* backward: dy/dx = (1/sigma_t)(P - y_t y_t^T / d), P the centring projector, so with an
  upstream gradient g independent of x, E|g_x|^2 / d = g2 E[tr Q / sigma_t^2] / d with
  tr Q = d - 2, and E[1/sigma_t^2] = d / (s2 (d-3)) (inverse chi-square with n = d-1):
  grad var = g2 (d-2) / ((d-3) s2), exact for eps -> 0 (the published g2/s2 is its limit).
* gradient token covariance: g2 rg E[tr(Q_t Q_u) / (sigma_t sigma_u)] / d with
  tr(Q_t Q_u) = d - 3 + cos^2(a_t, a_u) and E[1/(|a_t||a_u|)] =
  (1/2)(Gamma((n-1)/2)/Gamma(n/2))^2 2F1(1/2, 1/2; n/2; r^2) (bivariate chi moments), and
  n E[cos^2/(|a_t||a_u|)] = r^2 + (9r^4-7r^2+2)/(2n) + (225r^6-270r^4+65r^2+12)/(8n^2) + ...
  (delta method, moments from the cumulant generating function); in ratio to the gradient
  variance,
  grad corr = rg [1 - 3q/(2n) - 3q(1+15r^2)/(8n^2) - 3q(5r^2-1)(35r^2-3)/(16n^3) + O(n^-4)].
* eps: the per-token variance enters through harmonic means, E[1/s_t^2] = 1/s2_eff with
  s2_eff = s2 (d-3)/d; the output variance becomes s2_eff/(s2_eff + eps) and the gradient
  variance g2 (d-2)/(d (s2_eff + eps)).  The correlations are unchanged at first order in
  eps/s2 (the same factor multiplies covariance and variance).
* an upstream gradient whose per-token mean square depends on the token's own input variance
  s_t (in a stack of pre-norm residual units the gradient below any norm of a stream scales
  as 1/s_t of that stream, and the stream's per-token variance persists from layer to
  layer): with |g_t|^2 = G (1 + eta_t) and s_t = S (1 + e_t), E[|g_t|^2/(s_t + eps)] =
  (G/(S + eps)) (1 + E[e^2] + ... - E[eta e] S/(S + eps)) to first order, so the gradient
  variance is multiplied by 1 - lam Var(e) S/(S + eps), lam = cov(eta, e)/Var(e) the slope
  of the gradient's relative per-token mean square on the input's relative per-token
  variance (0 for a gradient independent of the input, -1 for one that scales as 1/s_t),
  Var(e) = 2 kappa/(d-1).  :func:`token_slope_below` carries lam down a stack.
"""

from sigprop import registry, symbols
from sigprop.rules.base import Param, Rule, register
from sigprop.state import Backward, Forward

symbols.register("eps", r"\epsilon", nonnegative=True)
symbols.register("centred", r"c_{\mathrm{LN}}", nonnegative=True)
symbols.register("kappa", r"\kappa_{\mathrm{LN}}", nonnegative=True)
symbols.register("g_generic", r"\gamma_{\mathrm{LN}}", nonnegative=True)
symbols.register("g_slope", r"\lambda_{\mathrm{LN}}", real=True)


def _n(p):
    """Dimension of the centred subspace."""
    return p.d - 1


def harmonic_token_var(var, d, centred, kappa):
    """Harmonic-mean per-token variance, E[1/s_t^2] = 1/harmonic_token_var, written as
    M (1 - delta): M = var (1 - (1 - c)/d) the mean per-token (centred) variance, c the
    fraction of the variance already centred per token, and delta = 2 kappa/(d - 1) the
    relative variance of the per-token variance (first order in delta).  For a Gaussian input
    (c = 0, kappa = 1) this is the exact inverse chi-square value var (d-3)/d.  Plain
    arithmetic: also evaluated per position (arrays) by sigprop.model.profile."""
    mean_tok = var * (1 - (1 - centred) / d)
    return mean_tok * (1 - 2 * kappa / (d - 1))


def _s2_eff(x, p):
    return harmonic_token_var(x.var, p.d, p.centred, p.kappa)


def corr_factor_forward(m, r, n):
    """E[cos] / r for two n-dimensional Gaussian vectors whose coordinates correlate with r."""
    q = 1 - r**2
    return (1 - q / (2 * n) + q * (1 - 9 * r**2) / (8 * n**2)
            - q * (75 * r**4 - 42 * r**2 - 1) / (16 * n**3))


def corr_factor_backward(m, r, n):
    """(gradient covariance / gradient variance) / rg after an LN of width n + 1."""
    q = 1 - r**2
    return (1 - 3 * q / (2 * n) - 3 * q * (1 + 15 * r**2) / (8 * n**2)
            - 3 * q * (5 * r**2 - 1) * (35 * r**2 - 3) / (16 * n**3))


def combine_token_stats(a2v1, c1, k1, a2v2, c2, k2):
    """Per-token variance statistics (centred fraction c, dispersion kappa; see the LayerNorm
    params) of the sum of two independent signals whose variance contributions are a2v1 and
    a2v2: c mixes linearly; the per-token variance of the sum has relative variance
    (v1^2 delta1 + v2^2 delta2 + 4 v1 v2/d) / (v1 + v2)^2 (the cross term x.y has variance
    d v1 v2 per token), i.e. in units of 2/(d-1), up to O(1/d):
    kappa = (v1^2 k1 + v2^2 k2 + 2 v1 v2)/(v1 + v2)^2.  Two Gaussians give a Gaussian
    (kappa 1) exactly.
    Elementwise for arrays (sigprop.model.profile: per position), whose sums must be > 0."""
    v = a2v1 + a2v2
    if getattr(v, "ndim", 0) == 0 and v <= 0:
        return 0.0, 1.0
    c = (a2v1 * c1 + a2v2 * c2) / v
    k = (a2v1**2 * k1 + a2v2**2 * k2 + 2 * a2v1 * a2v2) / v**2
    return c, k


def token_slope_factor(slope, rel_var, var, eps):
    """Factor on a norm's gradient variance from an upstream gradient whose per-token mean
    square has slope ``slope`` on the input's relative per-token variance (see the module
    docstring): 1 - slope rel_var var/(var + eps), rel_var the relative variance of the
    per-token variance (LayerNorm: 2 kappa/(d-1)), var the input's (harmonic) per-token
    variance.  First order in rel_var.  Plain arithmetic or sympy."""
    return 1 - slope * rel_var * var / (var + eps)


def token_slope_below(slope_out, skip_share, branch_share, var_in, eps):
    """One pre-norm residual unit x' = a x + b F(N(x)), top down: from the slope of the
    gradient's relative per-token mean square on the stream's relative per-token variance at
    the unit's output (``slope_out``; the value below a final norm of that stream is
    -var/(var + eps) of it, 0 for a gradient given independently of the stream), return
    (``slope_norm``, ``slope_in``): the slope the unit's input norm sees (its ``g_slope``
    parameter, in units of the stream at the unit's input) and the slope at the unit's input.

    ``skip_share`` = a^2 var_in / var_out, the skip path's share of the output's variance (the
    per-token variance's deviation at the output is a^2 times the input's plus a part that
    is independent of it: the branch sees its input through a norm); ``branch_share`` = the
    branch gradient's share of the gradient at the unit's input, gain/(a^2 + gain), whose
    per-token mean square scales as 1/(s_t + eps) of the input stream; ``var_in`` the input's
    (harmonic) per-token variance.  To first order in the relative per-token variances:
    slope_norm = slope_out skip_share, slope_in = slope_norm - branch_share var_in/(var_in + eps).
    Exact in its linear regression structure; assumes the branch output's per-token variance and
    the branch gradient's own per-token factor (the hidden units' and the weights' draws)
    independent of the input's per-token variance."""
    slope_norm = slope_out * skip_share
    return slope_norm, slope_norm - branch_share * var_in / (var_in + eps)


class LayerNorm(Rule):
    name = "layernorm"
    title = "LayerNorm (gain 1, bias 0)"
    params = (
        Param("d", "number of features normalised over (needs d >= 4: for d <= 3 the expected "
              "inverse per-token variance, hence the gradient variance, diverges as eps -> 0)",
              None, lo=4, integer=True),
        Param("eps", "variance floor added inside the square root", 1e-5, lo=0.0),
        Param("centred", "fraction of the input variance that is already centred per token "
              "(0 for a Gaussian input, 1 for the output of another LayerNorm)", 0.0, lo=0.0, hi=1.0),
        Param("kappa", "relative variance of the per-token variance in units of its Gaussian "
              "value 2/(d-1) (1 for a Gaussian input, 0 for a LayerNorm output, above 1 for a "
              "heavy-tailed one such as an FFN output; first order in 2 kappa/(d-1))", 1.0, lo=0.0),
        Param("g_generic", "share of the upstream gradient along the two directions the "
              "LayerNorm Jacobian removes (the all-ones vector and the output itself), relative "
              "to a gradient independent of the input (1); 0 for a gradient already in this "
              "LayerNorm's tangent space", 1.0, lo=0.0, hi=1.0),
        Param("g_slope", "slope of the upstream gradient's relative per-token mean square on the "
              "input's relative per-token variance (0: a gradient independent of the input; -1: "
              "one that scales as 1/s_t, as below another norm of the same stream); first order "
              "in 2 kappa/(d-1)", 0.0),
    )
    assumptions = (
        "Per feature, two different tokens are jointly Gaussian with correlation r (a component "
        "shared by all tokens carries it, as in the Monte Carlo sampler); the input mean is any "
        "constant (removed exactly by the per-token centring).",
        "Output mean 0: exact (every token is centred).",
        "Output variance s2_eff/(s2_eff + eps), s2_eff = s2 (d-3)/d for a Gaussian input: exact "
        "as eps -> 0 and to first order in eps/s2; for s2 comparable to eps or smaller its O(1/d) "
        "factors are approximate.",
        "Per-token variance statistics (params centred c, kappa): s2_eff = M (1 - delta), "
        "M = s2 (1 - (1-c)/d), delta = 2 kappa/(d-1), i.e. E[1/s_t^2] = 1/(M (1 - delta)): exact "
        "for a chi-square per-token variance (Gaussian input, c = 0, kappa = 1), first order in "
        "delta otherwise.  A Post-LN stream (LN output plus a small branch) has c near 1 and "
        "kappa near 0, and its gradient gain differs from the Gaussian one by about 1.5/d; "
        "Correlations with per-token statistics: the finite-d part of the forward factor "
        "(from norms fluctuating with the shared component) is scaled by kappa; the "
        "backward factor's leading -3q/(2n) splits into -q/n from the removed directions "
        "(scaled by g_generic) and -q/(2n) from the norms (scaled by kappa), and the whole "
        "finite-d part is scaled by (2 g_generic + kappa)/3.  Exact at leading order in 1/d for "
        "(kappa, g_generic) = (1, 1) (Gaussian) and for kappa = 0 (fixed norms); interpolated "
        "in between.",
        "Gradient variance factor (d - 2 g_generic)/d: the Jacobian removes the components along "
        "the all-ones vector and along the output, each 1/d of an isotropic gradient (g_generic "
        "1, exact for a gradient independent of the input); in a Post-LN stack the skip path "
        "delivers a gradient already orthogonal to both (g_generic near 0), see "
        "sigprop.model.predict.",
        "Output correlation r [1 - q/(2n) + q(1-9r^2)/(8n^2) - q(75r^4-42r^2-1)/(16n^3)], "
        "q = 1-r^2, n = d-1: the large-n series of the exact hypergeometric mean of the "
        "uncentred sample correlation; truncation error O(n^-4) (< 2e-5 absolute for d >= 16); "
        "eps effect O(eps/(s2 d)).",
        "Gradient variance g2 (d-2)/(d (s2_eff + eps)): exact for eps -> 0 (inverse chi-square "
        "with d-1 degrees of freedom), first order in eps/s2 otherwise; the upstream gradient "
        "is independent of the input.",
        "Upstream gradient with per-token slope g_slope on the input's per-token variance: the "
        "gradient variance is multiplied by 1 - g_slope (2 kappa/(d-1)) s2_eff/(s2_eff + eps) "
        "(first order in the relative per-token variance); the gradient correlation is left "
        "unchanged (the cross-token covariance taken to scale with the variance).",
        "Gradient correlation rg [1 - 3q/(2n) - 3q(1+15r^2)/(8n^2) - 3q(5r^2-1)(35r^2-3)/(16n^3)]: "
        "large-n series (exact bivariate-chi moment plus a delta-method cos^2 term), "
        "truncation error O(n^-4) (about 1e-4 relative at d = 16).",
        "The published forms are the d -> infinity limits of these, biased at finite d: "
        "r (1 - 1/d) is low by about r (1+r^2)/(2d), g2/s2 low by 1/(d-3) relative, and rg high "
        "by about 3 rg (1-r^2)/(2d); the naive large-sample corr r is high by r (1-r^2)/(2d).",
    )
    references = (
        "[TGS] Kedia et al. 2024, Table 1 (LayerNorm); finite-d corrections derived here",
        "Olkin & Pratt 1958 (mean of a sample correlation, hypergeometric form)",
    )

    def forward(self, m, x, p):
        s2e = _s2_eff(x, p)
        var = s2e / (s2e + p.eps)
        # the finite-d terms come from the per-token norms fluctuating with the shared
        # component: they scale with kappa (none for fixed norms)
        corr = x.corr * (1 + p.kappa * (corr_factor_forward(m, x.corr, _n(p)) - 1))
        return Forward(0 * x.mean, var, corr)

    def backward(self, m, x, g, p):
        s2e = _s2_eff(x, p)
        var = g.var * (p.d - 2 * p.g_generic) / (p.d * (s2e + p.eps))
        # a parameter set without the slope (rules.compose takes dicts as given): 0
        var = var * token_slope_factor(getattr(p, "g_slope", 0), 2 * p.kappa / (p.d - 1), s2e, p.eps)
        # leading term -3q/(2n): -q/n from the removed directions (scales with g_generic),
        # -q/(2n) from the norm fluctuations (scales with kappa)
        weight = (2 * p.g_generic + p.kappa) / 3
        corr = g.corr * (1 + weight * (corr_factor_backward(m, x.corr, _n(p)) - 1))
        return Backward(var, corr)


register(LayerNorm())


def branch_output_kappa(v_b, d):
    """``kappa`` (the per-token variance dispersion this rule takes) of a branch output
    F = W h normalised by a LayerNorm of width d, where h's per-token squared norm |h|^2 has
    relative variance ``v_b`` across tokens: given h, F's d entries are iid Gaussian, so F's
    centred per-token variance is |h|^2 times a chi-square of d - 1 degrees of freedom over d;
    its relative variance is 2/(d - 1) + v_b to first order (the product term 2 v_b/(d - 1) is
    dropped), i.e. 2 kappa/(d - 1) with kappa = 1 + (d - 1) v_b/2.  Gaussian h-norms (v_b = 0)
    give kappa 1.  Plain arithmetic on floats or arrays."""
    return 1.0 + (d - 1) * v_b / 2


def branch_output_terms(t, width, d, x, x_kappa, in_norm):
    """A norm N on a branch output F = W h (W the output projection, h the branch's hidden
    layer of width ``width`` over iid units with per-token statistics ``t``,
    rules.base.TokenMoments; F's per-token norm divided out; d the model width): (v_B, the
    factor on the gradient variance at the branch input), first order in 1/width and 1/d.
    ``x``: the branch input's state (mean, variance), ``x_kappa`` its per-token variance
    dispersion, ``in_norm``: a norm before the branch.  The norm kind enters only through
    its kappa of v_B (this module's and rules.rmsnorm's ``branch_output_kappa``; their
    ``branch_output_stats``).  Per token, with an upstream gradient independent of the
    input, the gradient at the branch input is J^T W^T P G / rms(F), P = I - F F^T/|F|^2 and
    J the hidden layer's Jacobian (A = |J|^2, B = |h|^2):

    * 1/rms(F)^2: given h, F is Gaussian over W (the norm rule at kappa 1); |h|^2 adds its
      relative variance v_B, and the Jacobian grows with it (relative covariance c_AB):
      E[A/B] = (E A/E B)(1 + v_B - c_AB).  The norm rule takes v_B through its kappa
      (``branch_output_kappa``: 1 + d v_B/2, LayerNorm (d - 1) v_B/2).
    * P removes the direction of F, which carries more than the isotropic 1/d of W J's
      energy: W^T W h ~ d h + (noise), so the extra share is |J^T h|^2/(A B), J^T h =
      sum_k h_k grad h_k: (1 + k_ab)/w from the units' own terms plus, along the input x,
      rho_x = beta_b^2 b_over_a/d (rules.base.TokenMoments).  After an input norm this
      rho_x is given back: the input norm removes the x direction, and W J x = dF/dlog|x|
      has lost its F part to P already, so the input norm removes |J x|^2/(|x|^2 A) - rho_x
      where the norm rule takes 1/d; net, the two norms remove 1/d + (1 + k_ab)/w +
      |J x|^2/(|x|^2 A) against the rules' 2/d, and with a pre-norm branch's |J x|^2/(|x|^2
      A) against 1/d unchanged the difference is (1 + k_ab)/w.  Without an input norm
      (output placement) P's extra share is (1 + k_ab)/w + rho_x.

    So the factor is 1 - c_AB - (1 + k_ab)/w (- rho_x without an input norm), with
    v_B = k_b/w + dq beta_b^2 and c_AB = k_ab/w + dq beta_a beta_b, dq the relative variance
    of the token's input mean square (0 after an input norm; 2 kappa_x/d (var/(var +
    mean^2))^2 for the stream).  First order: v_B is kept below a quarter (the norm's
    harmonic mean then stays positive) and the factor above a half.  Plain floats."""
    q = x.var + x.mean**2
    dq = 0.0 if in_norm or not q > 0 else 2 * x_kappa / d * (x.var / q) ** 2
    v_b = min(t.k_b / width + dq * t.beta_b**2, 0.25)
    c_ab = t.k_ab / width + dq * t.beta_a * t.beta_b
    removed = (1 + t.k_ab) / width + (0.0 if in_norm else t.beta_b**2 * t.b_over_a / d)
    return v_b, max(1.0 - c_ab - removed, 0.5)


def branch_output_stats(t, width, d, x, x_kappa, in_norm):
    """A LayerNorm on a branch output: (its ``kappa``, the factor on the gradient variance
    at the branch input), :func:`branch_output_terms` with this rule's
    :func:`branch_output_kappa`."""
    v_b, ratio = branch_output_terms(t, width, d, x, x_kappa, in_norm)
    return branch_output_kappa(v_b, d), ratio


registry.register(registry.Norm(
    "layernorm", "LayerNorm", short="LN", tag="LN", rule="layernorm", component="layernorm", torch="LayerNorm",
    qk_code=1,
    params=lambda d, eps, tok, g_generic: dict(d=d, eps=eps, centred=tok[0], kappa=tok[1], g_generic=g_generic),
    # its Jacobian removes the all-ones vector and the output's direction
    generic_key="g_generic", generic_share=lambda gen: 0.5 * (gen[0] + gen[1]), shares_below=(0.0, 0.0),
    slope_key="g_slope", branch_output_stats=branch_output_stats))
