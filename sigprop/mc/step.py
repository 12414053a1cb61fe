"""Monte Carlo of one optimizer step from the initialisation (the update analysis).

For each weight draw of the model (the same specified semantics as :mod:`sigprop.mc.model`,
dropout off, every scale a constant multiplier, not a parameter) this module

1. draws every parameter explicitly: each linear map's weight (d_in, d_out) and bias (every
   bias exists, initialised N(0, bias_std^2), 0 when bias_std is 0, unless ``bias`` is False:
   then none does), each norm's gain (initialised 1) and, for LayerNorm, its bias (initialised
   0), QK-norm's included (one gain and bias over d_head, shared by the heads);
2. runs the forward pass on a batch x of ``batch_size`` sequences from the model's input law,
   keeping what a hand-written backward needs;
3. takes the loss L = (1 / (B seq_len)) sum over the batch's tokens of <y_bt, u_bt>, y the
   model's output (after the final norm, if any), u a sample of the model's upstream
   gradient law (``grad``: its variance, its token correlation within a sequence, independent
   across sequences), and computes dL/dtheta for every parameter;
4. takes one step of SGD, Adam or AdamW from the initial values (torch.optim's semantics for
   the first step, bias-corrected; ``weight_decay`` coupled L2 for sgd and adam, decoupled for
   adamw), see :func:`optimizer_step`;
5. runs the forward again under the new parameters on the same batch and on an independent
   batch x~ from the same input law.

Per trace point (:func:`sigprop.mc.model.point_labels`: the input, then every sublayer; the
stream before a final norm) and at the model's output it records the variance, over all
entries with the global mean removed, of the change F(x; theta') - F(x; theta) ("var"), the
same on the fresh batch ("fresh_var"), and each over that batch's own stream variance
("rel", "fresh_rel"); per linear map its output's change relative to its output on the step's
batch, per parameter ||theta' - theta|| / ||theta||, its gradient's RMS and the share of its
entries where Adam's eps is at least |g|, and per attention sublayer the logit variance before
and after the step (:class:`StepMeasurement`).  Trials (independent weight draws) are pooled
with standard errors from their spread; :mod:`sigprop.mc.step_check` makes the
``sigprop check --step`` object of them.

Covered: pre, post, peri and output placements (per layer), sequential and parallel blocks,
MLP and gated FFNs with every registered activation, LayerNorm and RMSNorm, the final norm,
causal and bidirectional multi-head attention (scale 1/sqrt(d_head)) with grouped key/value
heads, rotary positions (a base or a :class:`sigprop.rope.RopeFreqs`) and QK-norm.  Not
covered: per-weight learning-rate or eps multipliers and other attention scales (the model
object has no such fields yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sigprop import registry
from sigprop.errors import DomainError
from sigprop.mc.components import get as component
from sigprop.mc.components.attention import _rotate_half, rope_tables
from sigprop.mc.model import point_labels
from sigprop.mc.sampling import correlated
from sigprop.model.spec import PLACEMENTS, require

#: the modern-block features this simulation implements (the others are refused)
SUPPORTED_FEATURES = frozenset({"norm rmsnorm", "activation silu", "placement peri", "placement output",
                                "block parallel", "ffn_kind glu", "final_norm", "n_kv_heads", "rope", "qk_norm"})
OPTIMIZERS = ("sgd", "adam", "adamw")
_NORM_COMPONENTS = ("layernorm", "rmsnorm")
_PRE, _POST, _PERI, _OUTPUT = (PLACEMENTS.index(p) for p in ("pre", "post", "peri", "output"))
_SHORT = {"attention": "attn", "ffn": "ffn"}


def check_supported(model) -> None:
    """DomainError for a model this simulation does not implement."""
    require(model, SUPPORTED_FEATURES, "the one-step Monte Carlo")
    for kind in {model.norm, model.qk_norm} - {None}:
        if registry.norm(kind).component not in _NORM_COMPONENTS:
            raise DomainError(f"the one-step Monte Carlo implements LayerNorm and RMSNorm, not {kind}")


# -- parameters ---------------------------------------------------------------------------

def _norm_slots(model, l: int) -> list[str]:
    """The norms layer ``l`` uses, named as in the plain layout (``attention_in`` ...)."""
    if model.block == "parallel":
        return ["attention_in"]
    out = []
    for kind in ("attention", "ffn"):
        place = int(model.sublayer_columns(kind).placement[l])
        if place in (_PRE, _PERI):
            out.append(f"{kind}_in")
        if place in (_POST, _PERI, _OUTPUT):
            out.append(f"{kind}_out")
    return out


def _has_norm_bias(kind: str) -> bool:
    return registry.norm(kind).component == "layernorm"


def init_params(model, rng: np.random.Generator, dtype=np.float64, bias: bool = True) -> dict[str, np.ndarray]:
    """Every parameter of one draw, by name: ``layers.{l}.attn.{q,k,v,o}.weight`` (d_in, d_out)
    and ``.bias``, ``layers.{l}.ffn.{in,out | gate,up,down}.weight`` and ``.bias``,
    ``layers.{l}.norms.{attention,ffn}_{in,out}.weight`` (and ``.bias`` for LayerNorm) for the
    norms the layer uses, ``layers.{l}.attn.{q,k}_norm.weight`` (``.bias``) of QK-norm (over one
    head's d_head features, shared by the heads), ``norm.weight`` (``.bias``) for a final norm.
    Weights N(0, std^2), biases N(0, bias_std^2), gains 1, norm biases 0.  ``bias`` False: the
    linear maps have no biases (their bias_std must then be 0)."""
    check_supported(model)
    dt = np.dtype(dtype)
    P: dict[str, np.ndarray] = {}
    d = model.d_model
    nb = _has_norm_bias(model.norm)
    for l in range(model.n_layers):
        for kind in ("attention", "ffn"):
            s = model.sublayer_columns(kind)
            for w in s.names:
                fi, fo = model.fans(kind, w)
                key = f"layers.{l}.{_SHORT[kind]}.{w}"
                P[key + ".weight"] = rng.standard_normal((fi, fo)).astype(dt) * dt.type(s.std[w][l])
                bstd = float(s.bias_std[w][l])
                if not bias:
                    if bstd:
                        raise DomainError(f"layers[{l}].{kind}.init.{w}.bias_std is {bstd:g} in a model "
                                          "without biases")
                    continue
                P[key + ".bias"] = (rng.standard_normal(fo).astype(dt) * dt.type(bstd) if bstd
                                    else np.zeros(fo, dt))
        if model.qk_norm is not None:
            for w in ("q", "k"):
                P[f"layers.{l}.attn.{w}_norm.weight"] = np.ones(model.d_head, dt)
                if _has_norm_bias(model.qk_norm):
                    P[f"layers.{l}.attn.{w}_norm.bias"] = np.zeros(model.d_head, dt)
        for slot in _norm_slots(model, l):
            P[f"layers.{l}.norms.{slot}.weight"] = np.ones(d, dt)
            if nb:
                P[f"layers.{l}.norms.{slot}.bias"] = np.zeros(d, dt)
    if model.final_norm:
        P["norm.weight"] = np.ones(d, dt)
        if nb:
            P["norm.bias"] = np.zeros(d, dt)
    return P


# -- forward with a tape --------------------------------------------------------------------

class _Net:
    """The forward pass of ``model`` under parameters ``P``; with ``tape`` every operation
    records its backward closure, which adds its parameters' gradients into ``self.grads``
    and returns the gradient at its input."""

    def __init__(self, model, P, tape: bool, rec=None):
        self.m, self.P, self.tape, self.rec = model, P, tape, rec
        self.grads = {k: np.zeros_like(v) for k, v in P.items()} if tape else None
        self.act = component(registry.activation(model.activation).component)
        self.centred = _has_norm_bias(model.norm)
        self.qk_centred = model.qk_norm is not None and _has_norm_bias(model.qk_norm)

    # primitives: each returns (output, backward or None)
    def linear(self, X, key):
        W, b = self.P[key + ".weight"], self.P.get(key + ".bias")
        B, L, d = X.shape
        X2 = X.reshape(B * L, d)
        Y = X2 @ W
        if b is not None:
            Y += b
        Y = Y.reshape(B, L, W.shape[1])
        if self.rec is not None:
            self.rec.module(key, Y)
        if not self.tape:
            return Y, None
        g = self.grads

        def back(G):
            G2 = G.reshape(B * L, G.shape[-1])
            g[key + ".weight"] += X2.T @ G2
            if b is not None:
                g[key + ".bias"] += G2.sum(axis=0)
            return (G2 @ W.T).reshape(B, L, d)
        return Y, back

    def norm(self, X, key, centred=None):
        """The norm over the last axis with its gain (and bias), parameters summed over every
        other axis in the backward."""
        eps = self.m.norm_eps
        centred = self.centred if centred is None else centred
        gain = self.P[key + ".weight"]
        bias = self.P.get(key + ".bias")
        Z = X - X.mean(axis=-1, keepdims=True) if centred else X
        inv = 1.0 / np.sqrt((Z * Z).mean(axis=-1, keepdims=True) + eps)
        Xh = Z * inv
        Y = Xh * gain
        if bias is not None:
            Y = Y + bias
        if not self.tape:
            return Y, None
        g = self.grads
        axes = tuple(range(X.ndim - 1))

        def back(G):
            g[key + ".weight"] += (G * Xh).sum(axis=axes)
            if bias is not None:
                g[key + ".bias"] += G.sum(axis=axes)
            Gh = G * gain
            Gx = Gh - Xh * (Gh * Xh).mean(axis=-1, keepdims=True)
            if centred:
                Gx -= Gh.mean(axis=-1, keepdims=True)
            return Gx * inv
        return Y, back

    def attention(self, X, pre):
        """Multi-head attention: Q, K, V projections (K and V with n_kv_heads heads, query head h
        reading key/value head h // (n_heads / n_kv_heads)), QK-norm over each head's d_head
        features (gain and bias shared by the heads), rotary positions after it (the
        rotate-half convention, position = token index), scale 1/sqrt(d_head), the softmax (with
        the causal mask), A V and W_o."""
        m = self.m
        B, L, _ = X.shape
        H, kv, dh = m.n_heads, m.n_kv_heads, m.d_head
        G = H // kv
        (Q, bq), (K, bk), (V, bv) = (self.linear(X, f"{pre}.{w}") for w in "qkv")
        Qh = Q.reshape(B, L, H, dh).transpose(0, 2, 1, 3)
        Kh, Vh = (t.reshape(B, L, kv, dh).transpose(0, 2, 1, 3) for t in (K, V))
        nq = nk = None
        if m.qk_norm is not None:
            Qh, nq = self.norm(Qh, f"{pre}.q_norm", self.qk_centred)
            Kh, nk = self.norm(Kh, f"{pre}.k_norm", self.qk_centred)
        if m.rope is not None:
            cos, sin = rope_tables(L, dh, m.rope)
            Qh = Qh * cos + _rotate_half(np, Qh) * sin
            Kh = Kh * cos + _rotate_half(np, Kh) * sin
        Ke = np.repeat(Kh, G, axis=1) if G > 1 else Kh
        Ve = np.repeat(Vh, G, axis=1) if G > 1 else Vh
        s = 1.0 / np.sqrt(dh)
        S = (Qh @ Ke.transpose(0, 1, 3, 2)) * s
        if self.rec is not None:
            self.rec.logits(pre, S)
        if m.causal:
            S = np.where(np.tril(np.ones((L, L), dtype=bool)), S, -np.inf)
        S = S - S.max(axis=-1, keepdims=True)
        Pm = np.exp(S)
        Pm /= Pm.sum(axis=-1, keepdims=True)
        O = (Pm @ Ve).transpose(0, 2, 1, 3).reshape(B, L, H * dh)
        Y, bo = self.linear(O, f"{pre}.o")
        if not self.tape:
            return Y, None

        def group(a):                                      # (B, H, L, dh) -> (B, kv, L, dh)
            return a.reshape(B, kv, G, L, dh).sum(axis=2) if G > 1 else a

        def back(Gy):
            dO = bo(Gy).reshape(B, L, H, dh).transpose(0, 2, 1, 3)
            dV = group(Pm.transpose(0, 1, 3, 2) @ dO)
            dP = dO @ Ve.transpose(0, 1, 3, 2)
            dS = Pm * (dP - (dP * Pm).sum(axis=-1, keepdims=True))
            dQ = (dS @ Ke) * s
            dK = group((dS.transpose(0, 1, 3, 2) @ Qh) * s)
            if m.rope is not None:
                dQ = dQ * cos + _rotate_half(np, dQ * sin, -1.0)
                dK = dK * cos + _rotate_half(np, dK * sin, -1.0)
            if nq is not None:
                dQ, dK = nq(dQ), nk(dK)
            flat = [t.transpose(0, 2, 1, 3).reshape(B, L, -1) for t in (dQ, dK, dV)]
            return bq(flat[0]) + bk(flat[1]) + bv(flat[2])
        return Y, back

    def ffn(self, X, pre):
        if self.m.ffn_kind == "glu":
            Gt, bg = self.linear(X, f"{pre}.gate")
            U, bu = self.linear(X, f"{pre}.up")
            A, c = self.act.forward(Gt, {}, {}, None)
            Y, bd = self.linear(A * U, f"{pre}.down")
            if not self.tape:
                return Y, None

            def back(G):
                dH = bd(G)
                return bg(self.act.backward(dH * U, c)) + bu(dH * A)
            return Y, back
        Hh, b1 = self.linear(X, f"{pre}.in")
        A, c = self.act.forward(Hh, {}, {}, None)
        Y, b2 = self.linear(A, f"{pre}.out")
        if not self.tape:
            return Y, None
        return Y, (lambda G: b1(self.act.backward(b2(G), c)))

    def branch(self, kind, X, l):
        pre = f"layers.{l}.{_SHORT[kind]}"
        return self.attention(X, pre) if kind == "attention" else self.ffn(X, pre)

    def sublayer(self, kind, l, X):
        """x' of one sublayer (the placements of sigprop.mc.model), and its backward."""
        cols = self.m.sublayer_columns(kind)
        a, b, n = float(cols.skip_scale[l]), float(cols.branch_scale[l]), float(cols.norm_scale[l])
        place = int(cols.placement[l])
        nk = f"layers.{l}.norms.{kind}"
        if place in (_PRE, _PERI):
            Hn, b_in = self.norm(X, nk + "_in")
            Y, b_f = self.branch(kind, n * Hn, l)
        else:
            b_in = None
            Y, b_f = self.branch(kind, X, l)
        if place == _PRE:
            out, b_out = a * X + b * Y, None
        elif place == _POST:
            out, b_out = self.norm(a * X + b * Y, nk + "_out")
        else:                                              # peri, output: a x + b N(F)
            Z, b_out = self.norm(Y, nk + "_out")
            out = a * X + b * Z
        if not self.tape:
            return out, None

        def back(G):
            if place == _POST:
                Gs = b_out(G)                               # gradient at a x + b F
                Gx = a * Gs
                Gy = b * Gs
            else:
                Gx = a * G
                Gy = b_out(b * G) if place in (_PERI, _OUTPUT) else b * G
            Gh = b_f(Gy)
            if b_in is not None:
                Gx = Gx + b_in(n * Gh)
            else:
                Gx = Gx + Gh
            return Gx
        return out, back

    def parallel(self, l, X):
        att, ffn = self.m.attention, self.m.ffn
        a, n = float(att.skip_scale[l]), float(att.norm_scale[l])
        ba, bf = float(att.branch_scale[l]), float(ffn.branch_scale[l])
        Hn, b_in = self.norm(X, f"layers.{l}.norms.attention_in")
        Ya, b_a = self.branch("attention", n * Hn, l)
        Yf, b_f = self.branch("ffn", n * Hn, l)
        out = a * X + ba * Ya + bf * Yf
        if not self.tape:
            return out, None
        return out, (lambda G: a * G + b_in(n * (b_a(ba * G) + b_f(bf * G))))

    def run(self, X):
        """(streams per trace point, the output, the backward closures in order)."""
        kinds = ("block",) if self.m.block == "parallel" else ("attention", "ffn")
        streams, backs = [X], []
        for l in range(self.m.n_layers):
            for kind in kinds:
                X, back = self.parallel(l, X) if kind == "block" else self.sublayer(kind, l, X)
                streams.append(X)
                backs.append(back)
        top = None
        if self.m.final_norm:
            out, top = self.norm(X, "norm")
        else:
            out = X
        return streams, out, (backs, top)


def forward(model, P, X, rec=None) -> tuple[list[np.ndarray], np.ndarray]:
    """(the stream at every trace point, the model's output) of batch ``X`` (B, seq_len,
    d_model) under parameters ``P`` (:func:`init_params`); ``rec`` (a :class:`_Recorder`)
    sees every module's output and every attention sublayer's logits."""
    streams, out, _ = _Net(model, P, tape=False, rec=rec).run(X)
    return streams, out


def gradients(model, P, X, U) -> dict[str, np.ndarray]:
    """dL/dtheta for every parameter of ``P``, L = (1 / (B seq_len)) sum_bt <y_bt, U_bt>, y the
    model's output on ``X``."""
    net = _Net(model, P, tape=True)
    _, out, (backs, top) = net.run(X)
    B, L, _ = out.shape
    G = U / (B * L)
    if top is not None:
        G = top(G)
    for back in reversed(backs):
        G = back(G)
    return net.grads


def optimizer_step(P, grads, optimizer: str = "adam", lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                   weight_decay: float = 0.0) -> dict[str, np.ndarray]:
    """The parameters after one step from ``P`` with gradients ``grads``, as torch.optim's
    first step computes it (its operations in its order; the same value in exact arithmetic):

    * sgd: g' = g + wd theta (coupled L2), theta' = theta - lr g';
    * adam: g' = g + wd theta, m = (1 - b1) g', v = (1 - b2) g'^2, theta' = theta -
      (lr / (1 - b1)) m / (sqrt(v) / sqrt(1 - b2) + eps) = theta - lr g' / (|g'| + eps);
    * adamw: theta <- theta (1 - lr wd) (decoupled decay), then adam's step with g.
    """
    if optimizer not in OPTIMIZERS:
        raise DomainError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    b1, b2 = (float(b) for b in betas)
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        raise DomainError(f"Adam's betas must lie in [0, 1), got {b1:g}, {b2:g}")
    if not lr > 0 or not eps >= 0 or not weight_decay >= 0:
        raise DomainError("the step needs lr > 0, eps >= 0 and weight_decay >= 0")
    out = {}
    for k, theta in P.items():
        g = grads[k]
        if optimizer == "sgd":
            if weight_decay:
                g = g + weight_decay * theta
            out[k] = theta - lr * g
            continue
        if optimizer == "adamw":
            theta = theta * (1.0 - lr * weight_decay)
        elif weight_decay:
            g = g + weight_decay * theta
        m = (1.0 - b1) * g
        v = (1.0 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1.0 - b2) + eps
        out[k] = theta - (lr / (1.0 - b1)) * (m / denom)
    return out


# -- the measurement ----------------------------------------------------------------------

def _var(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.mean(x * x) - np.mean(x) ** 2)


class _Recorder:
    """What the forward passes before and after the step see besides the streams: every
    module's output (each linear map, by its parameter prefix ``layers.{l}.attn.q`` ...; a
    branch's output is its last map's, ``attn.o``, ``ffn.out`` or ``ffn.down``) and every
    attention sublayer's logits (all L x L entries of Q K^T / sqrt(d_head), the causal mask
    aside, as :mod:`sigprop.mc.model` measures them).  The
    first pass stores the outputs; the second (:meth:`compare`) turns each into (var before,
    var of the change) and drops the stored array."""

    def __init__(self):
        self.stored: dict[str, np.ndarray] = {}
        self.modules: dict[str, tuple[float, float]] = {}
        self.logit_var: dict[str, list[float]] = {}
        self.second = False

    def module(self, key, Y):
        if not self.second:
            self.stored[key] = Y
            return
        Y0 = self.stored.pop(key)
        self.modules[key] = (_var(Y0), _var(Y - Y0))

    def logits(self, key, S):
        self.logit_var.setdefault(key, []).append(_var(S))

    def compare(self) -> "_Recorder":
        self.second = True
        return self


def _zero_gradient(model, key: str) -> bool:
    """A parameter whose gradient is zero in exact arithmetic: the key bias without QK-norm and
    rotary positions (it adds the same q_i . b_k to every logit of row i, which the softmax
    ignores).  Its computed gradient is rounding noise, which Adam's eps sees."""
    return model.qk_norm is None and model.rope is None and key.endswith(".attn.k.bias")


def _trial(model, rng, *, optimizer, lr, batch_size, betas, eps, weight_decay, dtype, bias, select):
    m = model
    shape = (batch_size, m.seq_len, m.d_model)
    P = init_params(m, rng, dtype, bias)
    X = correlated(rng, shape, m.input.mean, m.input.var, m.input.corr, dtype)
    U = correlated(rng, shape, 0.0, m.grad.var, m.grad.corr, dtype)
    Xf = correlated(rng, shape, m.input.mean, m.input.var, m.input.corr, dtype)
    grads = gradients(m, P, X, U)
    P2 = optimizer_step(P, grads, optimizer, lr, betas, eps, weight_decay)
    if select is not None:
        P2 = {k: (v if select(k) else P[k]) for k, v in P2.items()}
    rec = _Recorder()
    parts = []
    for batch, r in ((X, rec), (Xf, None)):
        s0, o0 = forward(m, P, batch, r)
        s1, o1 = forward(m, P2, batch, r and r.compare())
        parts.append([(_var(a), _var(b - a)) for a, b in zip(s0 + [o0], s1 + [o1])])
    rows = np.array([(vf, vd, wf, wd) for (vf, vd), (wf, wd) in zip(*parts)])
    weights = {}
    for k, theta in P.items():
        g = grads[k]
        if optimizer == "adam" and weight_decay:
            g = g + weight_decay * theta
        small = np.nan if optimizer == "sgd" or _zero_gradient(m, k) else float(np.mean(np.abs(g) <= eps))
        weights[k] = (float(np.linalg.norm(P2[k] - theta)), float(np.linalg.norm(theta)),
                      float(np.sqrt(np.mean(g * g))), small)
    logits = {k: tuple(v) for k, v in rec.logit_var.items()}       # (before, after) on the step's batch
    return rows, {"modules": rec.modules, "weights": weights, "logits": logits}


def step_trial(model, rng: np.random.Generator, *, optimizer="adam", lr=1e-3, batch_size=8, betas=(0.9, 0.999),
               eps=1e-8, weight_decay=0.0, dtype=np.float64, bias: bool = True, select=None) -> np.ndarray:
    """One weight draw: array (n_points + 1, 4) of [var F, var dF, fresh var F, fresh var dF]
    at every trace point and, last, at the model's output.  ``select``: a predicate on the
    parameter names (:func:`init_params`); only those take the step, the others keep their
    initial values (a diagnostic: which parameters the change comes from)."""
    return _trial(model, rng, optimizer=optimizer, lr=lr, batch_size=batch_size, betas=betas, eps=eps,
                  weight_decay=weight_decay, dtype=dtype, bias=bias, select=select)[0]


def _mean_se(a) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the first axis (trials) and its standard error (NaN from one trial)."""
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    se = a.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(a.shape[1:], np.nan)
    return a.mean(axis=0), se


@dataclass
class Pooled:
    """One quantity over the trials: its mean and standard error (NaN from one trial)."""
    mean: float
    se: float


@dataclass
class StepMeasurement:
    """Per trace point (``points``, then ("output") last): the stream's variance, the update's
    variance and its ratio to the stream's, on the step's batch and on a fresh one; each the
    mean over trials with its standard error (``*_se``).

    Per module and parameter (names as :func:`init_params`'s, without ``.weight``; attention
    sublayers as ``layers.{l}.attn``), pooled over trials (:class:`Pooled`):

    * ``modules[key]``: the module output's change relative to it on the step's batch,
      var(Y' - Y) / var(Y) (Y' under the new parameters, its input changed by the layers below
      too: muP's coordinate check);
    * ``weights[name]``: ``"rel"`` ||theta' - theta|| / ||theta|| (NaN where theta starts at 0:
      biases, LayerNorm biases), ``"abs"`` ||theta' - theta||, ``"grad_rms"`` the RMS of the
      gradient the optimizer took, and ``"eps_share"`` (Adam, AdamW) the fraction of its entries
      with |g| <= eps, where eps at least halves the step (NaN under SGD and for the key bias
      without QK-norm or rotary positions, whose gradient is 0 in exact arithmetic);
    * ``logits[key]``: ``"before"`` and ``"after"``, the attention logit variance on the step's
      batch under the initial and the new parameters.
    """
    points: list
    stream_var: np.ndarray
    var: np.ndarray
    rel: np.ndarray
    fresh_var: np.ndarray
    fresh_rel: np.ndarray
    stream_var_se: np.ndarray
    var_se: np.ndarray
    rel_se: np.ndarray
    fresh_var_se: np.ndarray
    fresh_rel_se: np.ndarray
    trials: int
    seed: int
    settings: dict = field(default_factory=dict)
    seconds: float = 0.0
    modules: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    logits: dict = field(default_factory=dict)

    @property
    def rel_top(self) -> float:
        """rel at the last trace point (the stream before a final norm)."""
        return float(self.rel[-2])

    @property
    def fresh_rel_top(self) -> float:
        return float(self.fresh_rel[-2])

    def update(self, k: int) -> dict:
        """The "update" entry of point ``k`` (negative: from the end; -1 the output)."""
        return {"var": float(self.var[k]), "rel": float(self.rel[k]), "fresh_var": float(self.fresh_var[k]),
                "fresh_rel": float(self.fresh_rel[k]), "var_se": float(self.var_se[k]),
                "rel_se": float(self.rel_se[k]), "fresh_var_se": float(self.fresh_var_se[k]),
                "fresh_rel_se": float(self.fresh_rel_se[k])}


def _pool_details(details: list[dict]) -> tuple[dict, dict, dict]:
    def pooled(values) -> Pooled:
        mean, se = _mean_se(np.array(values, dtype=np.float64))
        return Pooled(float(mean), float(se))

    modules, weights, logits = {}, {}, {}
    first = details[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in first["modules"]:
            modules[k] = pooled([d["modules"][k][1] / d["modules"][k][0] for d in details])
        for k in first["weights"]:
            rows = np.array([d["weights"][k] for d in details], dtype=np.float64)       # (trials, 4)
            name = k[:-len(".weight")] if k.endswith(".weight") else k
            rel = rows[:, 0] / rows[:, 1] if (rows[:, 1] > 0).all() else np.full(len(rows), np.nan)
            weights[name] = {"rel": pooled(rel), "abs": pooled(rows[:, 0]), "grad_rms": pooled(rows[:, 2]),
                             "eps_share": pooled(rows[:, 3])}
        for k in first["logits"]:
            v = np.array([d["logits"][k] for d in details], dtype=np.float64)            # (trials, 2)
            logits[k] = {"before": pooled(v[:, 0]), "after": pooled(v[:, 1])}
    return modules, weights, logits


def simulate_step(model, optimizer: str = "adam", lr: float = 1e-3, batch_size: int = 8,
                  betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, trials: int = 4,
                  seed: int = 0, dtype=np.float64, bias: bool = True, select=None) -> StepMeasurement:
    """``trials`` independent draws of one optimizer step (:func:`step_trial`), trial t from
    the t-th child of ``SeedSequence(seed)``.  Dropout is off (the model in eval mode).  rel is
    the mean over trials of each trial's var dF / var F (fresh_rel likewise on the fresh batch).
    ``bias`` False: the linear maps have no biases (:func:`init_params`); ``select``: only
    the parameters whose names it accepts take the step (:func:`step_trial`).  Also per
    module, parameter and attention sublayer (:class:`StepMeasurement`)."""
    check_supported(model)
    optimizer_step({}, {}, optimizer, lr, betas, eps, weight_decay)          # validates the settings
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DomainError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise DomainError(f"trials must be a positive integer, got {trials!r}")
    t0 = time.perf_counter()
    out = [_trial(model, np.random.default_rng(s), optimizer=optimizer, lr=lr, batch_size=int(batch_size),
                  betas=betas, eps=eps, weight_decay=weight_decay, dtype=dtype, bias=bias, select=select)
           for s in np.random.SeedSequence(seed).spawn(trials)]
    raw = np.stack([o[0] for o in out])                                   # (trials, points, 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.stack([raw[..., 1] / raw[..., 0], raw[..., 3] / raw[..., 2]], axis=-1)

    (vf, vf_se), (vd, vd_se), (wd, wd_se) = _mean_se(raw[..., 0]), _mean_se(raw[..., 1]), _mean_se(raw[..., 3])
    (rel, rel_se), (frel, frel_se) = _mean_se(ratios[..., 0]), _mean_se(ratios[..., 1])
    modules, weights, logits = _pool_details([o[1] for o in out])
    settings = {"optimizer": optimizer, "lr": lr, "batch_size": int(batch_size), "betas": tuple(betas),
                "eps": eps, "weight_decay": weight_decay, "dtype": np.dtype(dtype).name, "dropout": "off",
                "bias": bool(bias)}
    return StepMeasurement(point_labels(model) + [(model.n_layers, "output")], vf, vd, rel, wd, frel,
                           vf_se, vd_se, rel_se, wd_se, frel_se, trials, seed, settings,
                           time.perf_counter() - t0, modules, weights, logits)
