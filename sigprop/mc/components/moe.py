"""Mixture-of-experts FFN: Monte Carlo components ``moe_reglu``, ``moe_geglu``, ``moe_swiglu``
and their sweep grid (sigprop's own; none is published).

Simulated (docs/formats.md; the rules' module sigprop.rules.moe), for a token h:

* router logits r = h W_r (W_r: d_in x E, iid N(0, router_std^2)); scores pi = softmax(r)
  over all E experts (``router`` 0) or pi_e = sigmoid(r_e) (``router`` 1);
* selection S: the ``top_k`` experts by pi; with group-limited routing (``n_group`` > 1 and
  ``topk_group`` < ``n_group``) the experts are split into n_group consecutive groups, a
  group scored by the sum of its two largest pi (its only one where a group has one
  expert), and only the topk_group best groups' experts compete;
* weights w_e = pi_e on S (0 elsewhere), divided by sum_{j in S} pi_j where ``norm_topk``,
  times ``route_scale``;
* y = sum_{e in S} w_e E_e(h) + m(h) E_sh(h), every expert E(h) = (act(h W_g) * (h W_u)) W_d
  (the GLU component's own core, then the down projection; no biases), the shared expert of
  width ``shared_d_ff`` (none where 0), m(h) = sigmoid(h w_mix) where ``shared_mix`` (w_mix iid
  N(0, shared_mix_std^2)), else 1.

Every expert runs only on its routed tokens (gathered, and its output scattered back), so
hundreds of experts cost what top_k dense FFNs cost.  The hand-written backward sends the
gradient G through the experts (each GLU core's own backward), through the router
(dL/dr_j = route_scale sum_{e in S} (G . E_e(h)) dw_e/dr_j; the selection is piecewise
constant, its derivative 0):

* softmax, unnormalised: u = q pi on S; dL/dr = u - pi sum(u);
* softmax, normalised: w restricted to S is a softmax over S: u = q w; dL/dr = u - w sum(u);
* sigmoid, unnormalised: dL/dr = q s(1 - s) on S;
* sigmoid, normalised (Z = sum_S s): dL/dr_j = s'_j (q_j - sum_e q_e w_e) / Z on S,

(q_e = G . E_e(h)), then dh += dL/dr W_r^T; and through the shared mix gate,
dh += (G . E_sh(h)) m (1 - m) w_mix.  The router runs in float64 whatever the simulation's
dtype (it is T x E, cheap).  NumPy arrays only.

Grid (240 points per expert core): (n_experts, top_k) {(8, 1), (8, 2), (64, 1), (64, 2),
(64, 8)} x router {softmax, sigmoid} x norm_topk {0, 1} x router_std sqrt(d_in) {0.3, 1, 3}
x input token correlation {0, 0.5} x shared expert {none, width 256}; d_in 256, d_ff
(every expert) 256, gate and up std 1/sqrt(d_in), down std 1/sqrt(d_ff), the shared expert
likewise; input mean 0, variance 1; grad variance 1, token correlation 0.5 (every moment is
linear in the gradient variance).  L = 2 tokens, 8 weight draws of 1024 sequences (16384
tokens a point; the routing of a sequence pair is one sample of the router's averages).
Variant "groups" (48 points): 64 experts in 8 groups, 4 kept, top_k {2, 8}, route scale 2.5,
router, norm_topk, router std and input correlation as above, no shared expert.
"""

from __future__ import annotations

import math

import numpy as np

from sigprop.mc.component import SEQ, Component
from sigprop.mc.sampling import standard_normal
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward

#: the rule's parameters that are widths or counts (read as ints)
_INTS = ("d_in", "d_ff", "n_experts", "top_k", "router", "norm_topk", "n_group", "topk_group", "shared_d_ff",
         "shared_mix")


def _p(params: dict) -> dict:
    """The rule's parameters with their defaults (sigprop.rules.moe) filled in."""
    out = {"router": 0, "norm_topk": 0, "route_scale": 1.0, "n_group": 1, "topk_group": 1, "shared_d_ff": 0,
           "shared_gate_std": 0.0, "shared_up_std": 0.0, "shared_down_std": 0.0, "shared_mix": 0,
           "shared_mix_std": 0.0, **params}
    for k in _INTS:
        out[k] = int(out[k])
    return out


def select(pi: np.ndarray, top_k: int, n_group: int = 1, topk_group: int = 1) -> np.ndarray:
    """(T, top_k) indices of the chosen experts of every row of the scores ``pi`` (T, E):
    the top_k by pi, among the topk_group best of n_group consecutive groups (a group's score
    the sum of its two largest pi) where n_group > 1 and topk_group < n_group.  Ties go to
    the lower index (a zero router: every token takes the first top_k experts, as the rule
    and torch.topk have it)."""
    T, E = pi.shape
    score = pi
    if n_group > 1 and topk_group < n_group:
        g = pi.reshape(T, n_group, E // n_group)
        if E // n_group >= 2:
            gs = np.partition(g, E // n_group - 2, axis=2)[:, :, -2:].sum(axis=2)
        else:
            gs = g[:, :, 0]
        keep = np.argsort(-gs, axis=1, kind="stable")[:, :topk_group]
        kept = np.zeros((T, n_group), bool)
        np.put_along_axis(kept, keep, True, axis=1)
        score = np.where(np.repeat(kept, E // n_group, axis=1), pi, -np.inf)
    return np.argsort(-score, axis=1, kind="stable")[:, :top_k]


def route(r: np.ndarray, p: dict):
    """Router of logits ``r`` (T, E), float64: (chosen expert indices (T, k), their weights
    w (T, k) with the route scale, what the backward needs)."""
    if p["router"] == 0:
        z = np.exp(r - r.max(axis=1, keepdims=True))
        pi = z / z.sum(axis=1, keepdims=True)
    else:
        pi = 0.5 * (1.0 + np.tanh(0.5 * r))               # sigmoid, without overflow
    sel = select(pi, p["top_k"], p["n_group"], p["topk_group"])
    ps = np.take_along_axis(pi, sel, axis=1)                # the chosen experts' scores
    wt = ps / ps.sum(axis=1, keepdims=True) if p["norm_topk"] else ps
    return sel, wt * p["route_scale"], (pi, ps, wt)


def router_grad(q: np.ndarray, sel: np.ndarray, saved, p: dict) -> np.ndarray:
    """dL/dr (T, E) from q (T, k) = G . E_e(h) of every chosen expert (module docstring)."""
    pi, ps, wt = saved
    T, E = pi.shape
    rs = p["route_scale"]
    out = np.zeros((T, E))
    if p["router"] == 0:
        u = q * wt                                          # wt: pi, or the softmax over S
        su = u.sum(axis=1, keepdims=True)
        if p["norm_topk"]:
            np.put_along_axis(out, sel, u - wt * su, axis=1)
        else:
            out -= pi * su
            gathered = np.take_along_axis(out, sel, axis=1) + u
            np.put_along_axis(out, sel, gathered, axis=1)
    else:
        ds = ps * (1.0 - ps)
        if p["norm_topk"]:
            z = ps.sum(axis=1, keepdims=True)
            g = ds * (q - (q * wt).sum(axis=1, keepdims=True)) / z
        else:
            g = ds * q
        np.put_along_axis(out, sel, g, axis=1)
    return out * rs


class MoEMC(Component):
    """params: the rule's (sigprop.rules.moe: d_in, d_ff, n_experts, top_k, router, norm_topk,
    route_scale, n_group, topk_group, router_std, gate_std, up_std, down_std, shared_d_ff,
    shared_gate_std, shared_up_std, shared_down_std, shared_mix, shared_mix_std) and L."""

    array_api = False
    sim_params = (SEQ,)

    def __init__(self, name: str, core: str):
        self.name = self.rule = name
        self.core = core

    def _glu(self):
        """The GLU component of the experts' core (its forward and backward)."""
        from sigprop.mc.components import get

        return get(self.core)

    def dims(self, params):
        return params.get("L", SEQ.default), params["d_in"], params["d_in"]

    def sample_weights(self, rng, params, dtype):
        """router (d_in, E); experts: a list of E dicts {gate: (W, None), up: (W, None), down:
        W} (the GLU component's form); shared: the same dict or None; mix: (d_in,) or None.
        Drawn in that order (expert by expert: gate, up, down)."""
        p = _p(params)
        d, E = p["d_in"], p["n_experts"]

        def normal(shape, s):
            w = standard_normal(rng, shape, dtype)
            w *= float(np.dtype(dtype).type(s))
            return w

        def expert(dff, prefix):
            return {"gate": (normal((d, dff), p[prefix + "gate_std"]), None),
                    "up": (normal((d, dff), p[prefix + "up_std"]), None),
                    "down": normal((dff, d), p[prefix + "down_std"])}

        W = {"router": normal((d, E), p["router_std"]),
             "experts": [expert(p["d_ff"], "") for _ in range(E)], "shared": None, "mix": None}
        if p["shared_d_ff"]:
            W["shared"] = expert(p["shared_d_ff"], "shared_")
            if p["shared_mix"]:
                W["mix"] = normal((d,), p["shared_mix_std"])
        return W

    @staticmethod
    def fold(W: dict, n_in: float, c_out: float, dtype) -> None:
        """Fold a factor ``n_in`` on the input (every matrix that reads h: the router, the
        gates and ups, the mix vector) and ``c_out`` on the output (every down projection)
        into the weights ``W`` in place (the whole-model simulation's branch scales)."""
        t = np.dtype(dtype).type

        def scale(a, f):
            if a is not None and f != 1.0:
                a *= float(t(f))
        scale(W["router"], n_in)
        scale(W["mix"], n_in)
        for ex in W["experts"] + ([W["shared"]] if W["shared"] is not None else []):
            scale(ex["gate"][0], n_in)
            scale(ex["up"][0], n_in)
            scale(ex["down"], c_out)

    def _expert_forward(self, glu, Xe, ex, dff, rng):
        """E(h) of the rows ``Xe`` (n, d) and the cache of its backward."""
        H, cache = glu.forward(Xe[None], ex, {"d_in": Xe.shape[1], "d_ff": dff}, rng)
        return H[0] @ ex["down"], cache

    @staticmethod
    def _expert_backward(glu, GO, ex, cache):
        """dL/dh of one expert's rows from dL/dE(h) (n, d)."""
        return glu.backward((GO @ ex["down"].T)[None], cache)[0]

    def forward(self, X, W, params, rng):
        p = _p(params)
        glu = self._glu()
        B, L, d = X.shape
        T, E, k = B * L, p["n_experts"], p["top_k"]
        Xf = X.reshape(T, d)
        r = (Xf @ W["router"]).astype(np.float64)
        sel, w, saved = route(r, p)
        wd = w.astype(X.dtype)
        # tokens sorted by expert: expert e's routed (token, slot) pairs are a contiguous run
        flat = sel.reshape(-1)
        order = np.argsort(flat, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=E))])
        Y = np.zeros((T, d), X.dtype)
        routed = []
        for e in range(E):
            idx = order[bounds[e]:bounds[e + 1]]
            if idx.size == 0:
                continue
            tok, slot = idx // k, idx % k
            O, cache = self._expert_forward(glu, Xf[tok], W["experts"][e], p["d_ff"], rng)
            Y[tok] += wd[tok, slot][:, None] * O          # a token meets an expert at most once
            routed.append((e, tok, slot, O, cache))
        shared = None
        if W["shared"] is not None:
            Os, cs = self._expert_forward(glu, Xf, W["shared"], p["shared_d_ff"], rng)
            m = None
            if W["mix"] is not None:
                m = 1.0 / (1.0 + np.exp(-(Xf @ W["mix"]).astype(np.float64)))
                Y += m.astype(X.dtype)[:, None] * Os
            else:
                Y += Os
            shared = (Os, cs, m)
        return Y.reshape(B, L, d), (p, W, sel, wd, saved, routed, shared, X.shape)

    def backward(self, GY, cache):
        p, W, sel, wd, saved, routed, shared, shape = cache
        glu = self._glu()
        B, L, d = shape
        T = B * L
        G = GY.reshape(T, d)
        GX = np.zeros((T, d), GY.dtype)
        q = np.zeros(sel.shape)                                   # G . E_e(h), float64
        for e, tok, slot, O, c in routed:
            Ge = G[tok]
            q[tok, slot] = np.einsum("nd,nd->n", Ge, O, dtype=np.float64)
            GX[tok] += self._expert_backward(glu, wd[tok, slot][:, None] * Ge, W["experts"][e], c)
        dr = router_grad(q, sel, saved, p)
        GX += dr.astype(GY.dtype) @ W["router"].T
        if shared is not None:
            Os, cs, m = shared
            Gs = G if m is None else m.astype(GY.dtype)[:, None] * G
            GX += self._expert_backward(glu, Gs, W["shared"], cs)
            if m is not None:
                ds = np.einsum("nd,nd->n", G, Os, dtype=np.float64) * m * (1.0 - m)
                GX += ds.astype(GY.dtype)[:, None] * W["mix"][None, :]
        return GX.reshape(B, L, d)

    def flops(self, params, batch):
        """Matrix-multiply work, forward and input-gradient backward: per token the router
        (d_in x E), its top_k experts and the shared expert (three d_in x d_ff products each),
        the mix vector."""
        p = _p(params)
        L, d, _ = self.dims(params)
        per_token = 4.0 * d * p["n_experts"] + 12.0 * d * (p["top_k"] * p["d_ff"] + p["shared_d_ff"])
        return batch * L * (per_token + (4.0 * d if p["shared_mix"] else 0.0))

    def memory(self, params, batch):
        """The weights (router, every expert, the shared expert), and per token its routed
        copies (input and output of each chosen expert, the GLU core's three hidden arrays),
        the shared expert's, and the input, output and both gradients."""
        p = _p(params)
        L, d, _ = self.dims(params)
        E, k, f, fs = p["n_experts"], p["top_k"], p["d_ff"], p["shared_d_ff"]
        weights = d * E + 3.0 * d * (E * f + fs)
        per_token = k * (2.0 * d + 3.0 * f) + (d + 3.0 * fs) + 4.0 * d + 2.0 * E
        return weights + batch * L * per_token


COMPONENTS = [MoEMC("moe_reglu", "reglu"), MoEMC("moe_geglu", "geglu"), MoEMC("moe_swiglu", "swiglu")]

D_IN, D_FF, TOKENS, RUNS, BATCH = 256, 256, 2, 8, 1024


def _case(pt: dict) -> Case:
    E, k = pt["experts"]
    s = 1.0 / math.sqrt(D_IN)
    rule = {"d_in": D_IN, "d_ff": D_FF, "n_experts": E, "top_k": k, "router": pt["router"],
            "norm_topk": pt["norm_topk"], "route_scale": 1.0, "n_group": 1, "topk_group": 1,
            "router_std": pt["router_std_sqrt_din"] * s, "gate_std": s, "up_std": s, "down_std": 1.0 / math.sqrt(D_FF)}
    G, kg = pt.get("groups", (1, 1))
    rule.update(n_group=G, topk_group=kg, route_scale=pt.get("route_scale", 1.0))
    if pt["shared"]:
        rule.update(shared_d_ff=pt["shared"], shared_gate_std=s, shared_up_std=s,
                    shared_down_std=1.0 / math.sqrt(pt["shared"]))
    return Case(rule, {**rule, "L": TOKENS}, Forward(0.0, 1.0, pt["x_corr"]), Backward(1.0, pt["g_corr"]),
                RUNS, BATCH)


GRID = {
    "experts": ((8, 1), (8, 2), (64, 1), (64, 2), (64, 8)), "router": (0, 1), "norm_topk": (0, 1),
    "router_std_sqrt_din": (0.3, 1.0, 3.0), "x_corr": (0.0, 0.5), "g_corr": (0.5,), "shared": (0, D_FF),
}

#: group-limited routing (DeepSeek-V3's 8 groups, 4 kept) with a route scale, 48 points
GROUPS_GRID = {
    "experts": ((64, 2), (64, 8)), "groups": ((8, 4),), "route_scale": (2.5,), "router": (0, 1), "norm_topk": (0, 1),
    "router_std_sqrt_din": (0.3, 1.0, 3.0), "x_corr": (0.0, 0.5), "g_corr": (0.5,), "shared": (0,),
}

SWEEPS = {c.name: SweepSpec(
    component=c, grid=GRID, make_case=_case,
    published={m: None for m in ("x_mean", "x_var", "x_corr", "g_var", "g_corr")},
    note=("Own grid (no published one): (n_experts, top_k) {(8, 1), (8, 2), (64, 1), (64, 2), (64, 8)}, "
          "softmax and sigmoid routers, with and without renormalisation, router std sqrt(d_in) {0.3, 1, 3}, "
          "input token correlation {0, 0.5}, without and with a shared expert; d_in = d_ff = 256, L = 2 "
          "tokens, 8 weight draws of 1024 sequences (see sigprop.mc.components.moe). The rule is the wide "
          "limit in d_in: its 1/d_in terms are inside these errors."),
    variants={"groups": {"grid": GROUPS_GRID, "note": (
        "Group-limited routing: 64 experts in 8 groups of 8, the 4 best groups kept (a group scored by "
        "its two largest scores), top_k {2, 8}, route scale 2.5, softmax and sigmoid, with and without "
        "renormalisation, router std sqrt(d_in) {0.3, 1, 3}, input token correlation {0, 0.5}; sizes as "
        "the published grid's.")}},
) for c in COMPONENTS}
