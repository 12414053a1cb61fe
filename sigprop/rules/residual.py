"""Residual combination x' = a x + b y with a branch y independent of the stream x."""

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
