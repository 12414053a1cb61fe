"""Softmax over a row of L logits: the exact rule and the two published forms.

Input: a row of L logits z_j with mean mu, variance s2 and token correlation r (any mean:
softmax is unchanged when the same constant is added to every logit of a row, and the mean
is such a constant; likewise the part of the logits shared by the whole row).  In law,
for r >= -1/(L-1), z = (row-shared part) + e with e_j iid N(0, v), v = (1 - r) s2: the
pairwise differences z_i - z_j, which are all that softmax sees, have variance 2 v either
way.  So every softmax moment is a function of (v, L) alone.

Forward (P = softmax(z), rows sum to 1):
- mean: exactly 1/L.
- var:  E[P_1^2] - 1/L^2 = ((L-1)/L) E[P_1 (P_1 - P_2)], one exact integral
  (:mod:`sigprop.rules.softmax_moments`).
- token correlation: exactly -1/(L-1) (sum_j P_j = 1 has zero variance).

Backward, dz = P * (g - sum_k P_k g_k) for an upstream gradient g independent of z with
variance g2 and token correlation rg: the row-shared part of g cancels, and given P,
E[(f_i - sum_k P_k f_k)^2] = (1-rg) g2 (1 - 2 P_i + sum_k P_k^2) for the iid part f, so
- grad var = g2 (1-rg) E[P_1^2 (1 - 2 P_1 + sum_k P_k^2)]
           = g2 (1-rg) (E P_1^2 - 2 E P_1^3 + E P_1^4 + (L-1) E P_1^2 P_2^2);
- grad token correlation: exactly -1/(L-1) (gradient rows sum to 0).

The published forms ([TGS-code]) are registered as "softmax-approx"
and "softmax-full" for comparison; both are small-logit-variance approximations and are
off by ~1.8x at logit std 2.
"""

from __future__ import annotations

import numpy as np

from sigprop.errors import DomainError
from sigprop.rules.base import Param, Rule, _show, register
from sigprop.rules.softmax_moments import softmax_expect_sum
from sigprop.state import Backward, Forward

_L = Param("L", "row length: number of logits the softmax normalises over", lo=2, integer=True)
_REFS = ("[TGS] Kedia et al. 2024, softmax rule (published forms: authors' verification code)",)


def _v(x):
    """Variance of the iid part of the logits (what softmax sees)."""
    return (1 - x.corr) * x.var


class _SoftmaxBase(Rule):
    params = (_L,)
    references = _REFS

    def evaluate(self, x, g=None, **params):
        L = np.asarray(self.param_values(params).L, dtype=float)
        floor = -1.0 / (L - 1) - 1e-12
        for name, corr in (("x_corr", x.corr), ("g_corr", None if g is None else g.corr)):
            if corr is not None and np.any(np.asarray(corr, dtype=float) < floor):
                raise DomainError(f"{self.name}: {name} below -1/(L-1) is impossible for L "
                                  f"exchangeable tokens (L = {_show(L)}, {name} = {_show(corr)})")
        return super().evaluate(x, g, **params)

    def _mean_corr(self, m, x, p):
        return 0 * x.var + 1 / p.L, 0 * x.var - 1 / (p.L - 1)


class Softmax(_SoftmaxBase):
    name = "softmax"
    title = "Softmax over L logits (exact)"
    assumptions = (
        "The L logits of a row are exchangeable Gaussians (mean mu, variance s2, token "
        "correlation r >= -1/(L-1)); only v = (1-r) s2 matters: the mean and the row-shared "
        "part cancel in softmax, so any input mean is allowed.",
        "Exact for every L and v: one integral over u = log t of Gaussian expectations "
        "(1/S^n = int t^(n-1) e^(-tS) dt / Gamma(n)); numerically by quadrature, relative "
        "accuracy ~1e-9 (and ~1e-16/v for the variance, computed as one integral of a "
        "difference, so it stays accurate as v -> 0).",
        "Backward: the upstream gradient is independent of the logits (its row-shared part "
        "cancels); only its second moments enter (no Gaussianity needed).",
        "Output and gradient token correlations are exactly -1/(L-1) (rows sum to 1 and "
        "gradient rows to 0).",
    )

    def forward(self, m, x, p):
        mean, corr = self._mean_corr(m, x, p)
        L = p.L
        var = softmax_expect_sum(m, _v(x), L, [((L - 1) / L, ((2, 0),)),
                                               (-(L - 1) / L, ((1, 0), (1, 0)))])
        return Forward(mean, var, corr)

    def backward(self, m, x, g, p):
        _, corr = self._mean_corr(m, x, p)
        L = p.L
        e = softmax_expect_sum(m, _v(x), L, [(1, ((2, 0),)), (-2, ((3, 0),)), (1, ((4, 0),)),
                                             (L - 1, ((2, 0), (2, 0)))])
        return Backward(g.var * (1 - g.corr) * e, corr)


class SoftmaxApprox(_SoftmaxBase):
    name = "softmax-approx"
    title = "Softmax, published approximate form"
    assumptions = (
        "Published small-variance form [TGS-code]: var = (exp(v) - 1)/L^2, grad var = "
        "g2 exp(v)/L^2 with v = (1-r) s2; ignores the upstream gradient correlation. "
        "Accurate only for small logit variance: ~1.8x too large at logit std 2 (L = 300, "
        "r = 0.2).",
        "Mean 1/L and token correlations -1/(L-1) (not published) are the exact values.",
    )

    def forward(self, m, x, p):
        mean, corr = self._mean_corr(m, x, p)
        return Forward(mean, (m.exp(_v(x)) - 1) / p.L**2, corr)

    def backward(self, m, x, g, p):
        _, corr = self._mean_corr(m, x, p)
        return Backward(g.var * m.exp(_v(x)) / p.L**2, corr)


class SoftmaxFull(_SoftmaxBase):
    name = "softmax-full"
    title = "Softmax, published full form"
    assumptions = (
        "Published form [TGS-code]: with E = exp(v L/(L-1)), var = (E-1) E^2 / ((L-1) exp(v) "
        "+ 1)^2, grad var = g2 (var + 1/L^2), v = (1-r) s2; ignores the upstream gradient "
        "correlation.  Accurate only for small logit variance: ~1.9x too large at logit "
        "std 2 (L = 300, r = 0.2).",
        "Mean 1/L and token correlations -1/(L-1) (not published) are the exact values.",
    )

    def _var(self, m, x, p):
        v = _v(x)
        E = m.exp(v * p.L / (p.L - 1))
        return (E - 1) * E**2 / ((p.L - 1) * m.exp(v) + 1) ** 2

    def forward(self, m, x, p):
        mean, corr = self._mean_corr(m, x, p)
        return Forward(mean, self._var(m, x, p), corr)

    def backward(self, m, x, g, p):
        _, corr = self._mean_corr(m, x, p)
        return Backward(g.var * (self._var(m, x, p) + 1 / p.L**2), corr)


register(Softmax())
register(SoftmaxApprox())
register(SoftmaxFull())
