"""Linear layer y = x W + b ([TGS] Table 1)."""

from sigprop.rules.base import Rule, positive_int, register, std
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

    def forward(self, m, x, p):
        w2, b2 = p.w_std**2, p.b_std**2
        var = p.d_in * w2 * x.second_moment + b2
        cov = p.d_in * w2 * (x.cov + x.mean**2) + b2
        return Forward(0 * x.mean, var, cov / var)

    def backward(self, m, x, g, p):
        return Backward(p.d_out * p.w_std**2 * g.var, g.corr)


register(Linear())
