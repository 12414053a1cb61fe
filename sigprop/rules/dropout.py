"""Dropout (keep 1-p, rescale 1/(1-p)), training mode ([TGS] Table 1)."""

from sigprop.rules.base import Rule, probability, register
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

    def forward(self, m, x, p):
        var = (x.var + p.p * x.mean**2) / (1 - p.p)
        return Forward(x.mean, var, x.cov / var)

    def backward(self, m, x, g, p):
        var = g.var / (1 - p.p)
        return Backward(var, g.cov / var)


register(Dropout())
