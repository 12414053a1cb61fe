"""Whole-model Monte Carlo with exactly the specified semantics (docs/formats.md), N the
model's norm (LayerNorm or RMSNorm over d_model, gain 1, the model's ``norm_eps``):

    pre:    x' = a x + b * Dropout_hidden(F(n * N(x)))
    post:   x' = N(a x + b * Dropout_hidden(F(x)))
    peri:   x' = a x + b * N(Dropout_hidden(F(n * N(x))))
    output: x' = a x + b * N(Dropout_hidden(F(x)))
    parallel block: x' = a x + b_att * Dropout_hidden(Att(n * N(x))) + b_ffn * Dropout_hidden(FFN(n * N(x)))

A layer given as a list of sublayers (``model.slots()``) runs them in that order, each by its
placement as above; a norm sublayer is x' = n * N(x); a parallel list sums every branch on one
norm of the stream.  F is the attention or the FFN (``ffn_kind`` "mlp": W_in, activation, Dropout_ffn_inner,
W_out; "glu": (act(h W_gate + b_gate) * (h W_up + b_up)), Dropout_ffn_inner, W_down; a
mixture of experts, the model's ``moe``: the router, top-k routed gated experts and the shared
expert of sigprop.mc.components.moe, its weights from the sublayer's router, gate, up, down and
shared_* stds), and,
with ``final_norm``, one more N after the last sublayer.  Written here from the specified
semantics, independently of the predictor's rule chains, but built from the Monte Carlo
components (each with a hand-written backward checked against finite differences).  Weights
are drawn independently for every layer and every trial; the upstream gradient at the top (at
the final norm's output where there is one) is sampled with the model's ``grad`` variance and
token correlation, independent of everything else.

Per trace point (:func:`point_labels`: the input, then every sublayer, or every layer of a
parallel model) it records the residual stream's mean/variance/cross-token moment (before a
final norm) and its gradient's second moments, plus the attention logits' variance; trials are
pooled with standard errors from their spread (trial-to-trial variation of the weights is real
and, at finite width, large: the SE says how much).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np

from sigprop import progress as _progress
from sigprop import registry
from sigprop.errors import DomainError
from sigprop.mc.backend import Backend, Rng, as_rng, backend_of, get_backend, np_dtype, numpy_backend
from sigprop.mc.components import get as component
from sigprop.mc.sampling import correlated, keep_mask
from sigprop.mc.stats import Moments, pool, raw_moments
from sigprop.model.spec import PLACEMENTS, pointwise_norm, require
from sigprop.rope import RopeFreqs

#: the modern-block features (:meth:`sigprop.model.spec.Model.features`) simulated here
BLOCK_FEATURES = frozenset({"norm rmsnorm", "activation silu", "placement peri", "placement output",
                            "block parallel", "ffn_kind glu", "final_norm", "sublayers",
                            "ffn_kind moe"})
#: attention features, passed to the attention component as its parameters kv_heads, rope,
#: qk_norm and qk_eps, softcap (:func:`_attention_params`); simulated where that component has them
ATTENTION_FEATURES = frozenset({"n_kv_heads", "rope", "qk_norm", "attn_softcap", "window", "local_rope"})
#: what a model may use: the others are refused (DomainError), never ignored
SUPPORTED_FEATURES = BLOCK_FEATURES | ATTENTION_FEATURES

_PRE, _POST, _PERI, _OUTPUT = (PLACEMENTS.index(p) for p in ("pre", "post", "peri", "output"))


def check_supported(model, backend: Backend | None = None, extra: frozenset = frozenset()) -> None:
    """Refuse (DomainError) a model with a feature this simulation does not implement, or one
    whose components have no array-API simulation when ``backend`` is not NumPy.  ``extra``:
    features a subclass of the trial simulates (sigprop.mc.encdec: cross_attention)."""
    require(model, SUPPORTED_FEATURES | pointwise_norm(model) | extra, "the Monte Carlo")
    bk = backend or numpy_backend()
    if bk.is_numpy:
        return
    names = ["attention", "linear", "dropout", registry.norm(model.norm).component]
    act = registry.activation(model.activation)
    names.append(act.glu if model.ffn_kind == "glu" else act.component)
    if model.moe is not None:
        names.append(_moe_component_name(model))
    for name in names:
        if not component(name).array_api:
            raise DomainError(f"the Monte Carlo component {name} runs on the numpy backend only "
                              f"(--backend numpy simulates this model)")


def point_labels(model) -> list[tuple[int, str]]:
    """(layer, sublayer) of every trace point, in order: (0, "input"), then one point per
    sublayer of the layer's list ((l, "attention"), (l, "ffn") for the ordinary layer) for
    every layer l = 1..n_layers, or (l, "block") for a parallel model."""
    kinds = _kinds(model)
    return [(0, "input")] + [(l + 1, k) for l in range(model.n_layers) for k in kinds]


def _kinds(model) -> tuple[str, ...]:
    return ("block",) if model.block == "parallel" else tuple(s.kind for s in model.slots())


def _steps(model) -> tuple:
    """What :meth:`_Trial.step` takes for each trace point of a layer: "block" (a parallel
    layer), or the sublayer's columns (``model.slots()``)."""
    return ("block",) if model.block == "parallel" else model.slots()


@dataclass
class ModelMeasurement:
    forward: list[Moments]        # per trace point (input, then each sublayer)
    backward: list[Moments]
    logit_var: list[tuple[float, float] | None]   # (mean, SE) per point, attention points only
    trials: int
    batch: int
    seed: int
    dtype: str
    simulate_s: float
    gflop: float
    #: per draw and point, (mean, second moment) of the attention logits (NaN at points
    #: without attention): what logit_var was computed from, kept for re-analysis
    logit_draws: np.ndarray | None = None
    #: where it ran: array library, device, random stream (sigprop.mc.backend), Dask workers
    backend: str = "numpy"
    device: str = "cpu"
    rng: str = "host"
    workers: int | None = None
    #: (layer, sublayer) per point (:func:`point_labels`)
    points: list[tuple[int, str]] | None = None


def _norm_params(m):
    return {"d": m.d_model, "eps": m.norm_eps}


_ln_params = _norm_params          # the older name


def _attention_params(m, l, s=None):
    s = m.attention if s is None else s
    p = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len, p=m.dropout.attention,
             causal=int(bool(m.causal)))
    for w in ("q", "k", "v", "o"):
        p[f"{w}_std"] = float(s.std[w][l])
        p[f"{w}_bias_std"] = float(s.bias_std[w][l])
    # the modern attention features, only where the model uses them
    if m.n_kv_heads != m.n_heads:
        p["kv_heads"] = m.n_kv_heads
    rope = m.rope_of(l)
    if rope is not None:
        p["rope"] = rope if isinstance(rope, RopeFreqs) else float(rope)
    if m.qk_norm is not None:
        p["qk_norm"] = registry.norm(m.qk_norm).qk_code
        p["qk_eps"] = m.norm_eps
    if m.attn_softcap is not None:
        p["softcap"] = m.attn_softcap
    if m.window_of(l):                  # a sliding window: the component applies its band mask
        p["window"] = m.window_of(l)
    return p


def _ffn_params(m, l, s=None):
    """(first, last) linear maps' params of an "mlp" FFN; for "glu", the gated core's params
    (the GLU component's) and the down projection's (``s``: the FFN's columns, default the
    layer's first FFN)."""
    s = m.ffn if s is None else s
    if m.ffn_kind == "glu":
        return (dict(d_in=m.d_model, d_ff=m.d_ff, gate_std=float(s.std["gate"][l]), up_std=float(s.std["up"][l]),
                     gate_b_std=float(s.bias_std["gate"][l]), up_b_std=float(s.bias_std["up"][l])),
                dict(d_in=m.d_ff, d_out=m.d_model, w_std=float(s.std["down"][l]), b_std=float(s.bias_std["down"][l])))
    return (dict(d_in=m.d_model, d_out=m.d_ff, w_std=float(s.std["in"][l]), b_std=float(s.bias_std["in"][l])),
            dict(d_in=m.d_ff, d_out=m.d_model, w_std=float(s.std["out"][l]), b_std=float(s.bias_std["out"][l])))


def _moe_component_name(m) -> str:
    """The mixture-of-experts component of the model's activation ("moe_swiglu" for SiLU)."""
    return "moe_" + registry.activation(m.activation).glu


def _is_moe(m, cols) -> bool:
    """Whether the sublayer with columns ``cols`` is a mixture of experts: an FFN of a model
    whose ``ffn_kind`` is "moe"."""
    return cols.kind == "ffn" and m.ffn_kind == "moe"


def _moe_params(m, l, s):
    """The MoE component's (and rule's) parameters of layer ``l``'s mixture-of-experts
    sublayer with columns ``s``: the model's ``moe`` fields and the sublayer's stds."""
    e = m.moe
    p = dict(d_in=m.d_model, d_ff=e.d_ff_expert, n_experts=e.n_experts, top_k=e.top_k,
             router=("softmax", "sigmoid").index(e.router), norm_topk=int(bool(e.norm_topk_prob)),
             route_scale=float(e.route_scale), n_group=e.n_group, topk_group=e.topk_group,
             router_std=float(s.std["router"][l]), gate_std=float(s.std["gate"][l]), up_std=float(s.std["up"][l]),
             down_std=float(s.std["down"][l]), shared_d_ff=e.d_ff_shared, shared_mix=int(bool(e.shared_mix)),
             L=m.seq_len)
    if e.d_ff_shared:
        for w in ("gate", "up", "down"):
            p[f"shared_{w}_std"] = float(s.std[f"shared_{w}"][l])
        if e.shared_mix:
            p["shared_mix_std"] = float(s.std["shared_mix"][l])
    return p


def _logit_moments(component, cache) -> tuple[float, float]:
    """Mean and second moment of all L x L pre-softmax logits (causal mask aside), from the
    scaled queries Qs = Q / sqrt(dh) and the keys without forming the L x L matrix:
    sum_ij (qs_i . k_j)^2 = <Qs^T Qs, K^T K>_F (two dh x dh Gram matrices)."""
    if hasattr(component, "logit_moments"):
        return component.logit_moments(cache)
    Qs, K = cache[1], cache[2]
    xp = backend_of(Qs).xp
    B, H, L, _ = Qs.shape
    Q64, K64 = xp.astype(Qs, xp.float64), xp.astype(K, xp.float64)
    gram_q = xp.matmul(xp.matrix_transpose(Q64), Q64)
    gram_k = xp.matmul(xp.matrix_transpose(K64), K64)
    second = float(xp.sum(gram_q * gram_k)) / (B * H * L * L)
    first = float(xp.sum(xp.sum(Q64, axis=-2) * xp.sum(K64, axis=-2))) / (B * H * L * L)
    return first, second


#: an attention layer whose backward cache (the probabilities, the dropout mask and the dropped
#: probabilities: 3 x batch x heads x L x L) would exceed this many bytes keeps only its input,
#: its weights and its random stream's state, and recomputes the cache in its backward pass
#: (at L 4096, batch 2, 2 heads, float32: 600 MB a layer)
RECOMPUTE_BYTES = 16 << 20


def _rng_copy(rng):
    """An independent Rng at ``rng``'s current state (its draws from here on are the same as
    rng's), or None where that cannot be had (a device stream: the backend's own generator)."""
    if getattr(rng, "_dev", None) is not None or getattr(rng, "stream", "host") != "host":
        return None
    return Rng(rng.seed, rng.backend, "host", gen=copy.deepcopy(rng.gen))


class _Trial:
    """One weight draw of the whole model: :meth:`step` runs one trace point's part of the
    residual stream forward (a sublayer, or a parallel layer), drawing its weights and dropout
    masks, and returns its backward closure; :meth:`final` applies the final norm.

    Constant factors are folded into the freshly drawn weights (exact: every one of them
    multiplies a linear map): the norm scale n into the branch's first weight matrices (those
    that read n N(x); not their biases), and b / (1 - p_hidden) into the branch's output matrix
    and bias (only 1 / (1 - p_hidden) where a norm follows the branch, "peri" and "output":
    b then multiplies the norm's output), so the hidden dropout is a 0/1 mask applied in place.
    The FFN's inner dropout is a 0/1 mask too, its 1/(1 - p) folded into W_out (W_down).  With
    ReLU the plain FFN's activation and inner dropout are one in-place step h = relu(u) * keep,
    whose derivative is the indicator h > 0 (h > 0 exactly where u > 0 and the unit is kept),
    so no mask is stored."""

    #: features beyond SUPPORTED_FEATURES that a subclass simulates
    EXTRA_FEATURES: frozenset = frozenset()

    def __init__(self, model, rng, dtype):
        self.rng = as_rng(rng)                 # an Rng, or a NumPy Generator (NumPy backend)
        self.m, self.dtype = model, np_dtype(dtype)
        self.bk = self.rng.backend
        check_supported(model, self.bk, self.EXTRA_FEATURES)
        self.attn = component("attention")
        self.norm = self.ln = component(registry.norm(model.norm).component)    # ln: the same component, by its older name
        self.norm_p = _norm_params(model)
        self.lin = component("linear")
        self.act = component(registry.activation(model.activation).component)
        self.glu = component(registry.activation(model.activation).glu) if model.ffn_kind == "glu" else None
        self.drop = component("dropout")
        self.moe = component(_moe_component_name(model)) if model.moe is not None else None
        self.fused_relu = model.activation == "relu" and self.glu is None

    def _scale(self, arr, f):
        # f rounded to the simulation's dtype first, on every backend alike
        if arr is not None and f != 1.0:
            arr *= float(self.dtype(f))

    def branch_forward(self, cols, l, X, n_in, c_out):
        """c_out * F(n_in * X) for the sublayer with columns ``cols``, weights drawn here;
        returns (Y, backward closure, logits).  ``cols`` may be "attention" or "ffn": the
        layer's first sublayer of that kind."""
        m, rng, dt = self.m, self.rng, self.dtype
        if isinstance(cols, str):
            cols = getattr(m, cols)
        if cols.kind == "attention":
            prm = _attention_params(m, l, cols)
            W = self.attn.sample_weights(rng, prm, dt)
            self._scale(W["qkv"], n_in)
            self._scale(W["o"], c_out)
            self._scale(W["bo"], c_out)
            B, L = int(X.shape[0]), int(X.shape[1])
            big = 3.0 * B * int(prm.get("n_heads", 1)) * L * L * np.dtype(dt).itemsize > RECOMPUTE_BYTES
            again = _rng_copy(rng) if big else None
            Y, c_attn = self.attn.forward(X, W, prm, rng)
            logits = _logit_moments(self.attn, c_attn)
            if again is None:
                return Y, (lambda G: self.attn.backward(G, c_attn)), logits
            c_attn = None
            attn = self.attn

            def recomputed(G):
                # the same forward from the same input, weights and random state: the same
                # probabilities and dropout masks, bit for bit; its cache lives for this
                # layer's backward only
                _, cache = attn.forward(X, W, prm, again)
                return attn.backward(G, cache)
            return Y, recomputed, logits
        if _is_moe(m, cols):
            return self._moe_forward(cols, l, X, n_in, c_out)
        if self.glu is not None:
            return self._glu_forward(cols, l, X, n_in, c_out)
        p_in, p_out = _ffn_params(m, l, cols)
        W1 = self.lin.sample_weights(rng, p_in, dt)
        W2 = self.lin.sample_weights(rng, p_out, dt)
        self._scale(W1["W"], n_in)
        self._scale(W2["W"], c_out)
        self._scale(W2["b"], c_out)
        p = m.dropout.ffn_inner
        H, c1 = self.lin.forward(X, W1, p_in, rng)
        bk = self.bk
        if self.fused_relu:
            H = bk.mul_(H, H > 0)                        # relu in place
            if p > 0:
                H = bk.mul_(H, keep_mask(rng, H.shape, p))   # inner dropout; 1/(1 - p) goes into W_out
                self._scale(W2["W"], 1.0 / (1.0 - p))
            Y, c4 = self.lin.forward(H, W2, p_out, rng)

            def backward(G):
                GH = self.lin.backward(G, c4)
                GH = bk.mul_(GH, H > 0)
                return self.lin.backward(GH, c1)
            return Y, backward, None
        H, c2 = self.act.forward(H, {}, {}, rng)
        H, c3 = self.drop.forward(H, {}, {"p": p}, rng)
        Y, c4 = self.lin.forward(H, W2, p_out, rng)
        chain = [(self.lin, c1), (self.act, c2), (self.drop, c3), (self.lin, c4)]

        def backward(G):
            for comp, cache in reversed(chain):
                G = comp.backward(G, cache)
            return G
        return Y, backward, None

    def _glu_forward(self, cols, l, X, n_in, c_out):
        """The gated FFN c_out * F(n_in * X): the GLU component's core act(X W_gate + b_gate) *
        (X W_up + b_up) (n_in folded into both matrices), the inner dropout's 0/1 mask, W_down."""
        m, rng, dt, bk = self.m, self.rng, self.dtype, self.bk
        p_core, p_down = _ffn_params(m, l, cols)
        W = self.glu.sample_weights(rng, p_core, dt)
        Wd = self.lin.sample_weights(rng, p_down, dt)
        for k in ("gate", "up"):
            self._scale(W[k][0], n_in)
        self._scale(Wd["W"], c_out)
        self._scale(Wd["b"], c_out)
        H, c_core = self.glu.forward(X, W, p_core, rng)
        p = m.dropout.ffn_inner
        keep = None
        if p > 0:
            keep = keep_mask(rng, H.shape, p)
            H = bk.mul_(H, keep)
            self._scale(Wd["W"], 1.0 / (1.0 - p))
        Y, c_down = self.lin.forward(H, Wd, p_down, rng)
        H = None

        def backward(G):
            GH = self.lin.backward(G, c_down)
            if keep is not None:
                GH = bk.mul_(GH, keep)
            return self.glu.backward(GH, c_core)
        return Y, backward, None

    def _moe_forward(self, cols, l, X, n_in, c_out):
        """The mixture of experts c_out * F(n_in * X) (the MoE component, sigprop.mc.components.moe):
        n_in folded into every matrix that reads the input (router, gates, ups, mix vector),
        c_out into every down projection."""
        prm = _moe_params(self.m, l, cols)
        W = self.moe.sample_weights(self.rng, prm, self.dtype)
        self.moe.fold(W, n_in, c_out, self.dtype)
        Y, cache = self.moe.forward(X, W, prm, self.rng)
        moe = self.moe
        return Y, (lambda G: moe.backward(G, cache)), None

    def step(self, what, l, X):
        """One trace point of layer ``l`` (``what``: "block" for a parallel layer, or a
        sublayer's columns from ``model.slots()``; "attention" and "ffn" name the layer's first
        of those): (x', backward closure, logit moments)."""
        if isinstance(what, str):
            if what == "block":
                return self.parallel(l, X)
            what = getattr(self.m, what)
        if what.kind == "norm":
            return self.stream_norm(float(what.norm_scale[l]), X)
        return self.sublayer(what, l, X)

    def stream_norm(self, n, X):
        """A norm sublayer: x' = n N(x), no residual."""
        Y, cache = self.norm.forward(X, {}, self.norm_p, self.rng)
        n_dt = float(self.dtype(n))
        out = Y * n_dt if n != 1.0 else Y + 0.0          # a new array: Y is the norm's cache

        def back(G):
            return self.norm.backward(G * n_dt if n != 1.0 else G, cache)
        return out, back, None

    def sublayer(self, cols, l, X):
        """One sublayer of the specified semantics (its columns ``cols``); returns (x', backward
        closure, logit moments); "attention" or "ffn" name the layer's first of those."""
        m = self.m
        if isinstance(cols, str):
            cols = getattr(m, cols)
        a, b, n = float(cols.skip_scale[l]), float(cols.branch_scale[l]), float(cols.norm_scale[l])
        place = int(cols.placement[l])
        if place in (_PERI, _OUTPUT):
            return self._normed_branch(cols, l, X, a, b, n, place == _PERI)
        p = m.dropout.hidden
        c = b / (1.0 - p) if p > 0 else b
        ln_p = self.norm_p
        post = place == _POST
        if post:
            Y, bwd, logits = self.branch_forward(cols, l, X, 1.0, c)
        else:
            Hn, c_ln = self.norm.forward(X, {}, ln_p, self.rng)
            Y, bwd, logits = self.branch_forward(cols, l, Hn, n, c)
        bk = self.bk
        a_dt = float(self.dtype(a))
        keep = keep_mask(self.rng, Y.shape, p) if p > 0 else None
        if keep is not None:
            Y = bk.mul_(Y, keep)
        Y += X if a == 1.0 else a_dt * X               # a x + b Dropout(F(.)), in Y's buffer
        if post:
            Xn, c_ln = self.norm.forward(Y, {}, ln_p, self.rng)

            def back(G):
                Gz = self.norm.backward(G, c_ln)
                Gx = bwd(bk.mul(Gz, keep) if keep is not None else Gz)
                Gx += Gz if a == 1.0 else a_dt * Gz
                return Gx
            return Xn, back, logits

        def back(G):
            Gx = self.norm.backward(bwd(bk.mul(G, keep) if keep is not None else G), c_ln)
            Gx += G if a == 1.0 else a_dt * G
            return Gx
        return Y, back, logits

    def _normed_branch(self, cols, l, X, a, b, n, norm_in):
        """Placements "peri" (``norm_in``: x' = a x + b N(Dropout(F(n N(x))))) and "output"
        (x' = a x + b N(Dropout(F(x))))."""
        bk, rng, ln_p = self.bk, self.rng, self.norm_p
        p = self.m.dropout.hidden
        c = 1.0 / (1.0 - p) if p > 0 else 1.0
        if norm_in:
            Hn, c_in = self.norm.forward(X, {}, ln_p, rng)
            Y, bwd, logits = self.branch_forward(cols, l, Hn, n, c)
            Hn = None
        else:
            Y, bwd, logits = self.branch_forward(cols, l, X, 1.0, c)
        keep = keep_mask(rng, Y.shape, p) if p > 0 else None
        if keep is not None:
            Y = bk.mul_(Y, keep)
        Z, c_out = self.norm.forward(Y, {}, ln_p, rng)
        Y = None
        a_dt, b_dt = float(self.dtype(a)), float(self.dtype(b))
        out = Z * b_dt if b != 1.0 else Z + 0.0        # a new array: Z is the norm's cache
        out += X if a == 1.0 else a_dt * X
        Z = None

        def back(G):
            Gz = self.norm.backward(G * b_dt if b != 1.0 else G, c_out)
            Gx = bwd(bk.mul_(Gz, keep) if keep is not None else Gz)
            if norm_in:
                Gx = self.norm.backward(Gx, c_in)
            Gx += G if a == 1.0 else a_dt * G
            return Gx
        return out, back, logits

    def parallel(self, l, X):
        """Layer ``l`` of a parallel model: x' = a x + sum_k b_k Dropout(F_k(n N(x))) over the
        layer's sublayers (attention and FFN for the ordinary layer), one norm, an independent
        hidden-dropout mask per branch (drawn in the list's order); a the first sublayer's skip
        scale."""
        m, bk, rng = self.m, self.bk, self.rng
        slots = m.slots()
        a, n = float(slots[0].skip_scale[l]), float(slots[0].norm_scale[l])
        p = m.dropout.hidden
        Hn, c_in = self.norm.forward(X, {}, self.norm_p, rng)
        outs = []
        logits = None
        for cols in slots:
            b = float(cols.branch_scale[l])
            Y, bwd, lg = self.branch_forward(cols, l, Hn, n, b / (1.0 - p) if p > 0 else b)
            keep = keep_mask(rng, Y.shape, p) if p > 0 else None
            if keep is not None:
                Y = bk.mul_(Y, keep)
            outs.append((Y, bwd, keep))
            if lg is not None and logits is None:
                logits = lg
        Hn = None
        Y = outs[0][0]
        for other in outs[1:]:
            Y += other[0]
        a_dt = float(self.dtype(a))
        Y += X if a == 1.0 else a_dt * X
        branches = [(bwd, keep) for _, bwd, keep in outs]
        outs = None

        def back(G):
            Gh = None
            for bwd, keep in branches:
                g = bwd(bk.mul(G, keep) if keep is not None else G)
                if Gh is None:
                    Gh = g
                else:
                    Gh += g
            Gx = self.norm.backward(Gh, c_in)
            Gx += G if a == 1.0 else a_dt * G
            return Gx
        return Y, back, logits

    def final(self, X):
        """The final norm N(X) (the model's top) and its backward; X itself and None without one."""
        if not self.m.final_norm:
            return X, None
        Y, cache = self.norm.forward(X, {}, self.norm_p, self.rng)
        return Y, (lambda G: self.norm.backward(G, cache))


def trial_memory(model, batch: int, dtype=np.float32) -> float:
    """Bytes one weight draw (:func:`run_trial`) holds at its peak, estimated from the shapes
    before anything is allocated: every sublayer's backward cache, kept until the backward
    reaches it (its weights, the (batch, L, width) activations, the (batch, heads, L, L)
    probabilities and dropout masks of an attention layer that keeps them, see
    :data:`RECOMPUTE_BYTES`), plus one layer's temporaries.  Within a factor ~1.5 above the
    peak measured by tracemalloc (tests/mc/test_model.py)."""
    m = model
    item = float(np.dtype(np_dtype(dtype)).itemsize)
    B, L, d, H, kv, dh, dff = batch, m.seq_len, m.d_model, m.n_heads, m.n_kv_heads, m.d_head, m.d_ff
    T, hd = float(B) * L, float(H) * dh
    qkv = (H + 2.0 * kv) * dh
    modern = kv != H or m.rope is not None or m.qk_norm is not None or m.attn_softcap is not None \
        or m.window is not None
    if modern:                                   # (keys and values expanded to every head, normed copies)
        qkv += 2.0 * H * dh + (2.0 * hd if m.qk_norm is not None else 0.0)
    LL = float(B) * H * L * L
    p_att, p_hid, p_ffn = m.dropout.attention > 0, m.dropout.hidden > 0, m.dropout.ffn_inner > 0
    weights = 2.0 * d * qkv + 2.0 * hd * d           # (the scaled copies)
    att_ll = (1.0 + (1.0 + 1.0 / item) * p_att) * LL  # P, and with dropout A and the 0/1 mask
    if m.attn_softcap is not None:                   # the soft cap's slopes, kept for the backward
        att_ll += LL
    keeps = 3.0 * LL * item <= RECOMPUTE_BYTES
    att = weights + T * (qkv + hd) + (att_ll if keeps else 0.0)
    glu = m.ffn_kind == "glu"
    # (the activation's derivative, or ReLU's output; a GLU's gate, up, act and derivative)
    ffn = (3.0 if glu else 2.0) * d * dff + T * (3.0 if glu else 1.0) * dff + (T * dff / item) * p_ffn
    norms = T * d                                     # a norm's output (its scales are T numbers)
    kinds = ["moe" if _is_moe(m, s) else s.kind for s in m.slots()]
    n_att, n_ffn, n_norm, n_moe = kinds.count("attention"), kinds.count("ffn"), kinds.count("norm"), kinds.count("moe")
    moe = 0.0
    if n_moe:                          # the MoE component's own estimate (its weights and caches), elements
        cols = next(s for s in m.slots() if _is_moe(m, s))
        moe = component(_moe_component_name(m)).memory(_moe_params(m, 0, cols), B)
        dff = max(dff, m.moe.top_k * m.moe.d_ff_expert + m.moe.d_ff_shared)     # (the temporaries)
    n_br = n_att + n_ffn + n_moe
    layer = n_att * att + n_ffn * ffn + n_moe * moe + (n_br + n_norm) * norms + n_br * (T * d / item) * p_hid
    # one layer's temporaries: the logits, their exponentials and the backward's dP and dS
    # (and a recomputed cache), the FFN's hidden activations, the stream and its gradient
    temp = 3.0 * LL + (0.0 if keeps else att_ll) + 2.0 * T * dff + 4.0 * T * d + weights
    return item * (m.n_layers * layer + temp)


def check_memory(model, batch: int, dtype=np.float32, backend: Backend | None = None, parallel: int = 1) -> None:
    """DomainError, naming the sizes, when ``parallel`` weight draws at once (a local
    cluster's workers) would need more memory than is available on the simulation's device
    (:func:`trial_memory`; the host's MemAvailable, a GPU's free memory), before anything is
    allocated.  Nothing is refused where the available memory is unknown."""
    from sigprop.mc.component import available_memory

    bk = backend or numpy_backend()
    need = parallel * trial_memory(model, batch, dtype)
    have = available_memory() if bk.device_name == "cpu" else _device_memory(bk)
    if have is None or need <= have:
        return
    m = model
    sizes = (f"{m.n_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, {m.n_heads} heads, seq_len {m.seq_len}, "
             f"batch {batch}, {np.dtype(np_dtype(dtype)).name}")
    shown = f"{need / 2**30:.3g} GiB" if need < 2.0**90 else "beyond any machine"
    where = "" if parallel == 1 else f" ({parallel} draws at once)"
    raise DomainError(f"the Monte Carlo of this model ({sizes}) needs about {shown} of memory{where}, more than "
                      f"the {have / 2**30:.3g} GiB available on {bk.device_name}: a smaller batch, model or "
                      "sequence")


def _device_memory(bk) -> float | None:
    """Free bytes on a GPU backend's device (torch or CuPy), None where unknown."""
    try:
        if bk.name == "torch":
            import torch

            return float(torch.cuda.mem_get_info()[0])
        if bk.name == "cupy":
            import cupy

            return float(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:                             # no device, no library: the run will say so
        return None
    return None


def trial_seeds(seed: int, trials: int) -> list:
    """One independent seed per trial: ``SeedSequence(seed).spawn(trials)`` (trial t's child
    does not depend on the number of trials), so that trials can run anywhere, in any order."""
    return np.random.SeedSequence(seed).spawn(trials)


def run_trial(model, batch: int, rng, dtype=np.float32):
    """One weight draw of the whole model from ``rng`` (an :class:`Rng`, or a NumPy Generator):
    per trace point (:func:`point_labels`) the raw moments forward and backward, and the logit
    moments (NaN where there is no attention), as host arrays (n_points, 3), (n_points, 3),
    (n_points, 2)."""
    m = model
    rng = as_rng(rng)
    kinds = _steps(m)
    n_points = 1 + len(kinds) * m.n_layers
    fw = np.zeros((n_points, 3))
    bw = np.zeros((n_points, 3))
    lg = np.full((n_points, 2), np.nan)
    tr = _Trial(m, rng, dtype)
    X = correlated(rng, (batch, m.seq_len, m.d_model), m.input.mean, m.input.var, m.input.corr, dtype)
    fw[0] = raw_moments(X)
    backs = []
    i = 0
    with _progress.task("sigprop: simulating one weight draw (forward and backward)",
                        total=2 * (n_points - 1)) as bar:
        for l in range(m.n_layers):
            for kind in kinds:
                i += 1
                X, back, logits = tr.step(kind, l, X)
                fw[i] = raw_moments(X)
                if logits is not None:
                    lg[i] = logits
                backs.append(back)
                bar.advance()
        X, top = tr.final(X)
        G = correlated(rng, X.shape, 0.0, m.grad.var, m.grad.corr, dtype)
        X = None                                       # the caches hold what the backward needs
        if top is not None:
            G = top(G)                                 # the gradient at the final norm's input
        bw[n_points - 1] = raw_moments(G)
        for j in range(len(backs) - 1, -1, -1):
            G = backs[j](G)
            backs[j] = None                            # free that sublayer's cache
            bw[j] = raw_moments(G)
            bar.advance()
    return fw, bw, lg


def input_gradient_profile(model, batch: int, rng, dtype=np.float32) -> np.ndarray:
    """One weight draw from the NumPy Generator ``rng``: the input gradient's mean square at
    each position (over batch and width), shape (seq_len,), after backpropagating a gradient of
    the model's upstream statistics through every sublayer."""
    m = model
    tr = _Trial(m, rng, dtype)
    X = correlated(rng, (batch, m.seq_len, m.d_model), m.input.mean, m.input.var, m.input.corr, dtype)
    backs = []
    for l in range(m.n_layers):
        for kind in _steps(m):
            X, back, _ = tr.step(kind, l, X)
            backs.append(back)
    X, top = tr.final(X)
    G = correlated(rng, X.shape, 0.0, m.grad.var, m.grad.corr, dtype)
    if top is not None:
        G = top(G)
    for back in reversed(backs):
        G = back(G)
    return (G.astype(np.float64) ** 2).mean(axis=(0, 2))


def _trial_task(model, batch: int, seed, dtype, backend: str, device: str, stream: str):
    """One trial from its own seed on a named backend (what a Dask worker runs)."""
    bk = get_backend(backend, device)
    return run_trial(model, batch, Rng(seed, bk, stream), dtype)


def simulate(model, *, batch: int = 8, trials: int = 8, seed: int = 0, dtype=np.float32,
             progress=None, backend: Backend | None = None, stream: str = "host",
             distributor=None) -> ModelMeasurement:
    """``trials`` independent weight draws of the whole model, trial t from the t-th child of
    ``SeedSequence(seed)`` (:func:`trial_seeds`), pooled.  ``backend``: where the arrays live
    (default NumPy on the CPU); ``stream``: 'host' (NumPy's numbers, the same on every backend)
    or 'device' (the backend's own generator); ``distributor``: a
    :class:`sigprop.mc.distributed.Distributor` that runs the trials on a Dask cluster (the
    same numbers as the serial run: each trial depends on its seed alone).  Sizes whose draw
    needs more memory than is available are refused before anything is allocated
    (:func:`check_memory`)."""
    m = model
    bk = backend or numpy_backend()
    check_supported(m, bk)
    if distributor is None:
        check_memory(m, batch, dtype, bk)
    elif getattr(distributor, "cluster", None) is not None:      # a local cluster: draws at once
        check_memory(m, batch, dtype, bk, parallel=max(1, min(distributor.n_workers, trials)))
    seeds = trial_seeds(seed, trials)
    t0 = time.perf_counter()
    if distributor is None:
        out = []
        for t in range(trials):
            out.append(run_trial(m, batch, Rng(seeds[t], bk, stream), dtype))
            if progress:
                progress(t + 1, trials)
    else:
        out = distributor.map(_trial_task, trial_tasks(m, batch, seed, trials, dtype, bk, stream),
                              progress=progress, what="trials")
    return pooled(m, out, batch=batch, seed=seed, dtype=dtype, backend=bk, stream=stream,
                  seconds=time.perf_counter() - t0,
                  workers=distributor.n_workers if distributor is not None else None)


def trial_tasks(model, batch: int, seed: int, trials: int, dtype=np.float32, backend: Backend | None = None,
                stream: str = "host") -> list:
    """The argument tuples of :func:`_trial_task` for ``trials`` draws from ``seed`` (what a
    distributor maps; the results pool with :func:`pooled` to :func:`simulate`'s answer)."""
    bk = backend or numpy_backend()
    return [(model, batch, s, np_dtype(dtype), bk.name, bk.device_name, stream) for s in trial_seeds(seed, trials)]


def pooled(model, out: list, *, batch: int, seed: int, dtype=np.float32, backend: Backend | None = None,
           stream: str = "host", seconds: float = 0.0, workers: int | None = None) -> ModelMeasurement:
    """The measurement from the trials' raw moments ``out`` (:func:`run_trial`'s results, in
    trial order): every point's moments pooled over the trials."""
    m = model
    bk = backend or numpy_backend()
    labels = point_labels(m)
    n_points = len(labels)
    trials = len(out)
    fw = np.stack([o[0] for o in out]) if out else np.zeros((0, n_points, 3))
    bw = np.stack([o[1] for o in out]) if out else np.zeros((0, n_points, 3))
    lg = np.stack([o[2] for o in out]) if out else np.full((0, n_points, 2), np.nan)
    gflop = trials * _flops(m, batch) / 1e9
    forward = [pool(fw[:, k]) for k in range(n_points)]
    backward = [pool(bw[:, k], centred=False) for k in range(n_points)]
    logit = logit_stats(lg)
    return ModelMeasurement(forward, backward, logit, trials, batch, seed, np.dtype(np_dtype(dtype)).name, seconds,
                            gflop, lg, bk.name, bk.device_name, "host" if bk.is_numpy else stream, workers, labels)


#: logit-variance SE: the relative spread of the draws is pooled over this many attention
#: points on each side of a point (its own included)
LOGIT_POOL_HALF_WIDTH = 6


def logit_stats(lg: np.ndarray) -> list:
    """(mean, SE) of the logit variance per point (None where the point has no attention) from
    ``lg[t, k] = (mean, second moment)`` of the logits of draw t at point k.

    Estimator: the mean over draws of the second moment.  Every weight and bias is zero-mean, so
    the logit's expected mean is exactly 0 and this is unbiased for the variance the rule
    predicts (over weights and inputs).  Each draw's mean logit (the token-shared parts of q and
    k, a different constant in every draw) belongs to that variance; subtracting the grand mean
    of 8 draws instead, as this function did before, biased the estimate low by the variance of
    the draw means over 8, i.e. by about r^2/8 of it: 12% at a stream correlation of 0.99.
    Measured on Mix-LN `torch-default`, 96 layers: block averages of measured/predicted fell to
    0.91-0.94 in the deep layers with that estimator.

    SE: the per-draw value is heavy-tailed (per head the shared part is ~ a chi-square with one
    degree of freedom times r^2 of the variance), and 8 draws misjudge its spread: in a Post-LN
    DeepScaleLM model (d 256, 48 layers) the per-layer relative SD of the draws ranged from 0.02
    to 0.43 although every layer's weights are drawn alike.  The spread grows with the stream
    correlation, i.e. with depth (Mix-LN `torch-default`, 96 layers: median relative SD 0.10 in
    layers 1-12, 0.31-0.35 beyond layer 25; Post-LN 0.05 and 0.27-0.34).  The SE is therefore the
    larger of the point's own and a pooled one: the relative per-draw spread pooled over the
    neighbouring attention points (LOGIT_POOL_HALF_WIDTH on each side), times the mean level of
    the same neighbourhood, over sqrt(trials)."""
    trials = lg.shape[0]
    keep = [k for k in range(lg.shape[1]) if not np.isnan(lg[0, k, 0])]
    out: list = [None] * lg.shape[1]
    if not keep:
        return out
    v = lg[:, keep, 1]                                              # (trials, points)
    mean = v.mean(axis=0)
    if trials < 2:
        for j, k in enumerate(keep):
            out[k] = (float(mean[j]), float("nan"))
        return out
    own = v.std(axis=0, ddof=1) / np.sqrt(trials)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(mean > 0, v / mean - 1.0, 0.0)
    ss = np.sum(rel**2, axis=0)                                     # per point
    w = LOGIT_POOL_HALF_WIDTH
    csum = np.concatenate([[0.0], np.cumsum(ss)])
    idx = np.arange(len(keep))
    lo, hi = np.maximum(idx - w, 0), np.minimum(idx + w + 1, len(keep))
    pooled_var = (csum[hi] - csum[lo]) / ((hi - lo) * (trials - 1))
    # the spread is relative to the expected level, estimated by the same neighbourhood's mean:
    # scaled by the point's own mean, a draw set that happens to fall low (the likely way for
    # a right-skewed quantity) would also get a small SE
    msum = np.concatenate([[0.0], np.cumsum(mean)])
    level = (msum[hi] - msum[lo]) / (hi - lo)
    se = np.maximum(own, np.sqrt(pooled_var) * level / np.sqrt(trials))
    for j, k in enumerate(keep):
        out[k] = (float(mean[j]), float(se[j]))
    return out


def _flops(m, batch: int) -> float:
    """Matrix-multiply work of one forward + backward (input gradients only) of the model, as
    performed (a causal mask does not skip the masked half of the L x L products).

    Attention, forward: the fused QKV projection (d -> H dh for the queries, d -> H_kv dh for
    the keys and the values), Q K^T and A V (H heads, L x L x dh each), W_o; backward: G W_o^T,
    then A^T G_O, G_O V^T, dS K and dS^T Q (four L x L x dh products per head), and
    [dQ dK dV] W_qkv^T.  FFN: two products each way ("glu": three; no weight gradients).  A
    mixture of experts: the router (d x E) and, per token, its top_k routed experts and the
    shared expert, three products each way (sigprop.mc.components.moe; routed tokens only)."""
    B, L, d, H, dh, dff = batch, m.seq_len, m.d_model, m.n_heads, m.d_head, m.d_ff
    T, hd = B * L, H * dh
    proj = 2.0 * T * d * hd                  # one d x (H dh) projection of every token
    proj_kv = 2.0 * T * d * m.n_kv_heads * dh
    ll = 2.0 * B * H * L * L * dh            # one L x L x dh product of every head
    attn = (2 * proj + 2 * proj_kv + 2 * ll) + (2 * proj + 2 * proj_kv + 4 * ll)
    ffn = (3 if m.ffn_kind == "glu" else 2) * (2.0 * T * d * dff) * 2
    kinds = ["moe" if _is_moe(m, s) else s.kind for s in m.slots()]
    moe = 0.0
    if "moe" in kinds:
        e = m.moe
        per_token = 4.0 * d * e.n_experts + 12.0 * d * (e.top_k * e.d_ff_expert + e.d_ff_shared)
        moe = T * (per_token + (4.0 * d if e.shared_mix else 0.0))
    return m.n_layers * (kinds.count("attention") * attn + kinds.count("ffn") * ffn + kinds.count("moe") * moe)
