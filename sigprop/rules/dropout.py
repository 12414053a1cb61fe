"""Dropout (keep 1-p, rescale 1/(1-p)), training mode ([TGS] Table 1)."""

from sigprop.rules.base import Rule, TokenMoments, probability, register
from sigprop.state import Backward, Forward


class Dropout(Rule):
    name = "dropout"
    title = "Dropout"
    params = (probability("p", "drop probability, in [0, 1)"),)
    assumptions = (
        "Masks iid Bernoulli(1-p) per entry, independent of the input; exact.",
        "Different tokens get independent masks, so the token covariance is unchanged.",
    )
    references = ("[TGS] Kedia et al. 2024, Table 1 (dropout)",)

    def token_moments_after(self, t: TokenMoments, p) -> TokenMoments:
        """Per-token statistics (rules.base.TokenMoments) of a hidden unit after this dropout:
        the mask z/(1-p) multiplies the unit and its input gradient alike, and
        E[z^4]/E[z^2]^2 = 1/(1-p), so 1 + k_b and 1 + k_ab are divided by 1 - p; the log slopes
        and E[B]/E[A] are unchanged."""
        return t._replace(k_b=(1 + t.k_b) / (1 - p.p) - 1, k_ab=(1 + t.k_ab) / (1 - p.p) - 1)

    def forward(self, m, x, p):
        var = (x.var + p.p * x.mean**2) / (1 - p.p)
        return Forward(x.mean, var, x.cov / var)

    def backward(self, m, x, g, p):
        var = g.var / (1 - p.p)
        return Backward(var, g.cov / var)


register(Dropout())
