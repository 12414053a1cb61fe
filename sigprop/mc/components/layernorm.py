"""LayerNorm (gain 1, bias 0): Monte Carlo component and published sweep."""

from __future__ import annotations

import math


from sigprop.mc.backend import backend_of
from sigprop.mc.component import Component
from sigprop.mc.components._util import grid_states
from sigprop.mc.sweep import Case, SweepSpec


class LayerNormMC(Component):
    """y = (x - mean_f x) / sqrt(var_f x + eps) per token (biased variance over the d
    features, as torch.nn.LayerNorm), no affine part; params: d, eps (default 1e-5), L."""

    name = "layernorm"
    rule = "layernorm"
    array_api = True
    weights = False

    def dims(self, params):
        return params.get("L", 16), params["d"], params["d"]

    def forward(self, X, W, params, rng):
        bk = backend_of(X)
        xp = bk.xp
        eps = params.get("eps", 1e-5)
        Z = X - xp.mean(X, axis=-1, keepdims=True)
        inv = inverse_rms(bk, Z, eps)                  # 1 / sigma_t, one per token
        Z *= inv                                       # Z is now the output Y
        return Z, (Z, inv)

    def backward(self, GY, cache):
        # dy/dx = (1/sigma) (P - y y^T / d):  gx = (g - mean_f g - y mean_f(y g)) / sigma
        return norm_backward(GY, cache, centred=True)


def inverse_rms(bk, Z, eps: float):
    """1 / sqrt(mean_f Z^2 + eps) per token, shape (..., 1), in Z's dtype (LayerNorm after
    centring, RMSNorm as is)."""
    xp = bk.xp
    inv = 1.0 / xp.sqrt(bk.rowdot(Z, Z) / Z.shape[-1] + eps)
    return xp.expand_dims(xp.astype(inv, Z.dtype, copy=False), axis=-1)


def norm_backward(GY, cache, centred: bool):
    """Backward of y = z / rho (z = x centred per token or x itself, rho = its rms with eps):
    gx = (g - [mean_f g] - y mean_f(y g)) / rho, the bracket only for a centring norm."""
    Y, inv = cache
    bk = backend_of(Y)
    xp = bk.xp
    yg = xp.expand_dims(xp.astype(bk.rowdot(Y, GY) / Y.shape[-1], Y.dtype, copy=False), axis=-1)
    GX = Y * -yg
    GX += GY
    if centred:
        GX -= xp.mean(GY, axis=-1, keepdims=True)
    GX *= inv
    return GX

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        return 15.0 * batch * L * d


COMPONENT = LayerNormMC()


# --- sample sizes -------------------------------------------------------------------------
# Per sequence (L tokens sharing one correlated component), the estimates fluctuate mostly
# through the shared components: |c|^2/d and |h|^2/d have relative std sqrt(2/d).  To first
# order (checked against the pooled standard errors at d = 100, 1000 and L = 100, 1000,
# within about 10%) the per-sequence standard deviations, in the units of the error metric:
#   output cov  ~ sqrt(2/d) r (1-r)              (the normalisation cancels most of |c|^2)
#   grad var    ~ sqrt(2/d) sqrt(r^2 + rg^2)     (relative)
#   grad cov    ~ sqrt(2/d) rg sqrt(1 + r^2)     (over the gradient variance)
# plus per-token noise sqrt(2/d) sqrt(2/L) (grad var) and pair noise sqrt(2/d)/L
# (covariances).  The number of sequences makes every moment's standard error at most
# TARGET_SE (fractions): about 2.5 TARGET_SE at p99, below the published figures.  The
# shared-component noise does not shrink with L, so L = 1000 points cost 10x L = 100 ones.
TARGET_SE = {"x_corr": 0.004, "g_var": 0.015, "g_corr": 0.0078}
MIN_RUNS = 4
#: largest array of one run, in elements: keeps the float64 copies the estimators make under
#: glibc's 32 MiB mmap threshold, so buffers are reused instead of page-faulted afresh
MAX_RUN_ELEMENTS = 4_000_000


def _sequences(d: int, L: int, r: float, rg: float) -> int:
    base = 2.0 / d
    pair = (1.0 / L) ** 2 + 1.0 / (L * d)
    need = max(
        (base * (r * (1 - r)) ** 2 + base * pair) / TARGET_SE["x_corr"] ** 2,
        (base * (r**2 + rg**2) + base * 2.0 / L) / TARGET_SE["g_var"] ** 2,
        (base * rg**2 * (1 + r**2) + base * pair) / TARGET_SE["g_corr"] ** 2,
    )
    return max(2 * MIN_RUNS, int(math.ceil(need)))


def norm_case(pt: dict, eps: float, nseq: int) -> Case:
    """The Case of a norm grid point (d, L and the states) with ``nseq`` sequences, in at
    least MIN_RUNS runs of at most MAX_RUN_ELEMENTS elements."""
    d, L = pt["d"], pt["L"]
    rule = {"d": d, "eps": eps}
    batch = max(1, min(nseq // MIN_RUNS, MAX_RUN_ELEMENTS // (L * d)))
    runs = int(math.ceil(nseq / batch))
    return Case(rule, {**rule, "L": L}, *grid_states(pt), runs, batch)


def _case(pt: dict) -> Case:
    return norm_case(pt, 1e-5, _sequences(pt["d"], pt["L"], pt["x_corr"], pt["g_corr"]))


SWEEP = SweepSpec(
    component=COMPONENT,
    grid={
        "x_std": (0.316, 1.0, 3.16), "x_mean": (-10.0, -3.33, 3.33), "x_corr": (0.0, 1 / 3, 2 / 3),
        "g_corr": (0.0, 1 / 3, 2 / 3), "g_std": (0.316, 1.0, 3.16),
        "d": (100, 316, 1000), "L": (100, 1000),
    },
    make_case=_case,
    # published "~0" for the mean is written as 0
    published={"x_mean": (0.0, 0.0, 0.0), "x_var": (0.0, 0.0, 0.0), "g_var": (0.4, 1.5, 3.2),
               "x_corr": (0.1, 0.5, 1.0), "g_corr": (0.2, 0.9, 2.2)},
    note="Sample sizes adapt to the predicted noise of each point (see TARGET_SE).",
)
