"""Linear layer y = x W + b ([TGS] Table 1)."""

from sigprop.rules.base import Rule, TokenMoments, positive_int, register, std
from sigprop.state import Backward, Forward


class Linear(Rule):
    name = "linear"
    title = "Linear y = xW + b"
    params = (
        positive_int("d_in", "input width"),
        positive_int("d_out", "output width"),
        std("w_std", "std of the iid N(0, w_std^2) weight entries"),
        std("b_std", "std of the iid bias entries (shared by all tokens)", default=0.0),
    )
    assumptions = (
        "W and b are independent of x and of each other, zero-mean, iid entries.",
        "Exact in expectation over the weights for any input law: no width limit needed.",
        "The bias is the same for every token, so it adds to the token covariance.",
    )
    references = ("[TGS] Kedia et al. 2024, Table 1 (linear)",)

    def token_moments(self, m, x, p):
        """Per-token statistics of an output unit h = w.x + b for one token
        (rules.base.TokenMoments): over the weights h is a zero-mean Gaussian, so B = h^2 has
        relative variance 2; its input gradient w has a fixed squared norm (to relative order
        1/d_in), so k_ab = 0; E[B] = d_in w_std^2 Q + b^2 moves with the input's mean square Q
        by the weight share of the variance, E[A] not at all; E[B]/(Q E[A]) is that share too."""
        var = p.d_in * p.w_std**2 * x.second_moment + p.b_std**2
        share = float((var - p.b_std**2) / var) if var > 0 else 0.0
        return TokenMoments(2.0, 0.0, share, 0.0, share)

    def forward(self, m, x, p):
        w2, b2 = p.w_std**2, p.b_std**2
        var = p.d_in * w2 * x.second_moment + b2
        cov = p.d_in * w2 * (x.cov + x.mean**2) + b2
        return Forward(0 * x.mean, var, cov / var)

    def backward(self, m, x, g, p):
        return Backward(p.d_out * p.w_std**2 * g.var, g.corr)


register(Linear())
