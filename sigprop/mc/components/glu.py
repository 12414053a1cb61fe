"""Gated FFN core act(x W_gate + b_gate) * (x W_up + b_up): Monte Carlo components ``reglu``,
``geglu``, ``swiglu`` and their sweep grid (sigprop's own; none is published).

The simulation draws real weight matrices W_gate, W_up (d_in x d_ff, iid normal) and bias
vectors, forms both projections, applies the activation (the ReLU, GeLU and SiLU components'
own forward code) and multiplies; the hand-written backward sends the gradient through both
paths: dg = G act'(g) u, du = G act(g), dx = dg W_gate^T + du W_up^T.

Grid (864 points per activation): input std {0.316, 1, 3.16} x input mean {0, 1} x r
{0, 0.4, 0.8} x rg {0, 0.5} x gate std sqrt(d_in) {0.316, 1, 3.16} x up std sqrt(d_in)
{0.316, 3.16} x bias std (both projections) {0, 0.3} x d_in {256, 1024}, d_ff = round(8 d_in/3)
(LLaMA's ratio); grad std 1 (every moment is linear in the gradient variance).  L = 2 tokens,
at least 8 weight draws (more where an input mean or a bias puts a per-feature offset,
shared by every token of a draw, into the projections: see ``_case``), and
runs * batch * d_in >= 6e5: the per-sequence noise from the input's fluctuating norms is
about sqrt(2/(d_in batch runs)), 0.2%.
"""

from __future__ import annotations

import math

from sigprop.mc.backend import backend_of
from sigprop.mc.component import SEQ, Component
from sigprop.mc.components._util import grid_std
from sigprop.mc.sampling import standard_normal
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward

class GLUMC(Component):
    """params: d_in, d_ff, gate_std, up_std, gate_b_std, up_b_std (default 0), L."""

    @property
    def array_api(self) -> bool:
        """As its activation's component (a plugin's runs on NumPy only)."""
        return self._act().array_api

    def __init__(self, name: str, activation: str):
        self.name = self.rule = name
        self.activation = activation

    def _act(self):
        """The Monte Carlo component of the activation on the gate (sigprop.registry)."""
        from sigprop import registry
        from sigprop.mc.components import get

        return get(registry.activation(self.activation).component)

    def dims(self, params):
        return params.get("L", SEQ.default), params["d_in"], params["d_ff"]

    def sample_weights(self, rng, params, dtype):
        din, dff = params["d_in"], params["d_ff"]
        W = {}
        for k in ("gate", "up"):
            w = standard_normal(rng, (din, dff), dtype)
            w *= float(dtype(params[f"{k}_std"]))
            b_std = params.get(f"{k}_b_std", 0.0)
            W[k] = (w, standard_normal(rng, dff, dtype) * float(dtype(b_std)) if b_std else None)
        return W

    def forward(self, X, W, params, rng):
        xp = backend_of(X).xp
        B, L, d = X.shape
        Xf = xp.reshape(X, (B * L, d))
        proj = []
        for k in ("gate", "up"):
            w, b = W[k]
            P = Xf @ w
            if b is not None:
                P += b
            proj.append(xp.reshape(P, (B, L, P.shape[-1])))
        Gt, U = proj
        A, dA = self._act().forward(Gt, {}, {}, rng)     # act(g) and act'(g) (or mask)
        return A * U, (A, dA, U, W["gate"][0], W["up"][0])

    def backward(self, GY, cache):
        A, dA, U, Wg, Wu = cache
        bk = backend_of(GY)
        xp = bk.xp
        B, L, e = GY.shape
        dG = bk.mul(GY, dA)
        dG *= U
        dU = GY * A
        GX = xp.reshape(dG, (B * L, e)) @ Wg.T
        GX += xp.reshape(dU, (B * L, e)) @ Wu.T
        return xp.reshape(GX, (B, L, GX.shape[-1]))

    def flops(self, params, batch):
        L, din, dff = self.dims(params)
        return 8.0 * batch * L * din * dff


COMPONENTS = [GLUMC("reglu", "relu"), GLUMC("geglu", "gelu"), GLUMC("swiglu", "silu")]

RUNS, TOKENS, SHARED = 8, 2, 600_000
OFFSET_SE, MAX_RUNS = 0.01, 400


def _case(pt: dict) -> Case:
    din = pt["d_in"]
    dff = int(round(8 * din / 3))
    s = math.sqrt(din)
    rule = {"d_in": din, "d_ff": dff, "gate_std": grid_std(pt["gate_std_sqrt_din"]) / s,
            "up_std": grid_std(pt["up_std_sqrt_din"]) / s, "gate_b_std": pt["b_std"], "up_b_std": pt["b_std"]}
    # A non-zero input mean (mu sum_i W_ik) and a bias are per-feature offsets shared by every
    # token of a weight draw: only d_ff independent (gate, up) offset pairs per draw, and the
    # product act(b) b' is heavy-tailed (E[y^4]/E[y^2]^2 up to ~18 for ReLU).  Draws such that
    # the offsets' share f of the product's second moment has standard error <= OFFSET_SE:
    # runs >= 17 f / (OFFSET_SE^2 d_ff); the batch then keeps runs * batch * d_in >= SHARED.
    x2 = grid_std(pt["x_std"]) ** 2 + pt["x_mean"] ** 2
    f = max((rule[f"{k}_std"] ** 2 * din * pt["x_mean"] ** 2 + pt["b_std"] ** 2)
            / (rule[f"{k}_std"] ** 2 * din * x2 + pt["b_std"] ** 2) for k in ("gate", "up"))
    runs = int(min(MAX_RUNS, max(RUNS, math.ceil(17 * f / (OFFSET_SE**2 * dff)))))
    batch = int(math.ceil(SHARED / (runs * din)))
    return Case(rule, {**rule, "L": TOKENS}, Forward(pt["x_mean"], grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                Backward(1.0, pt["g_corr"]), runs, batch)


GRID = {
    "x_std": (0.316, 1.0, 3.16), "x_mean": (0.0, 1.0), "x_corr": (0.0, 0.4, 0.8), "g_corr": (0.0, 0.5),
    "gate_std_sqrt_din": (0.316, 1.0, 3.16), "up_std_sqrt_din": (0.316, 3.16), "b_std": (0.0, 0.3),
    "d_in": (256, 1024),
}

SWEEPS = {c.name: SweepSpec(
    component=c, grid=GRID, make_case=_case,
    published={m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")},
    note=("Own grid (no published one); d_ff = round(8 d_in/3), L = 2 tokens; weight draws sized for "
          "the per-feature offsets of an input mean or bias (see sigprop.mc.components.glu). The rule "
          "is the wide limit in d_in: its 1/d_in terms (about 2/d_in on the second moments of this "
          "Gaussian input) are inside these errors."),
) for c in COMPONENTS}
