"""Whole-model Monte Carlo with exactly the contract's semantics (contract.md):

    pre:  x' = a x + b * Dropout_hidden(F(n * LN(x)))
    post: x' = LN(a x + b * Dropout_hidden(F(x)))

written here from the contract, independently of the predictor's rule chains, but built from
the Monte Carlo components (each with a hand-written backward checked against finite
differences).  Weights are drawn independently for every layer and every trial; the
upstream gradient at the top is sampled with the model's ``grad`` variance and token
correlation, independent of everything else.

Per trace point it records the forward stream's mean/variance/cross-token moment and the
gradient's second moments, plus the attention logits' variance; trials are pooled with
standard errors from their spread (trial-to-trial variation of the weights is real and, at
finite width, large: the SE says how much).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from sigprop.mc.components import get as component
from sigprop.mc.sampling import correlated
from sigprop.mc.stats import Moments, pool, raw_moments


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


def _ln_params(m):
    return {"d": m.d_model, "eps": 1e-5}


def _attention_params(m, l):
    s = m.attention
    p = dict(d=m.d_model, n_heads=m.n_heads, d_head=m.d_head, L=m.seq_len, p=m.dropout.attention,
             causal=int(bool(m.causal)))
    for w in ("q", "k", "v", "o"):
        p[f"{w}_std"] = float(s.std[w][l])
        p[f"{w}_bias_std"] = float(s.bias_std[w][l])
    return p


def _ffn_params(m, l):
    s = m.ffn
    return (dict(d_in=m.d_model, d_out=m.d_ff, w_std=float(s.std["in"][l]), b_std=float(s.bias_std["in"][l])),
            dict(d_in=m.d_ff, d_out=m.d_model, w_std=float(s.std["out"][l]), b_std=float(s.bias_std["out"][l])))


def _logit_moments(component, cache) -> tuple[float, float]:
    """Mean and second moment of all L x L pre-softmax logits (causal mask aside), from the
    scaled queries Qs = Q / sqrt(dh) and the keys without forming the L x L matrix:
    sum_ij (qs_i . k_j)^2 = <Qs^T Qs, K^T K>_F (two dh x dh Gram matrices)."""
    if hasattr(component, "logit_moments"):
        return component.logit_moments(cache)
    Qs, K = cache[1], cache[2]
    B, H, L, _ = Qs.shape
    Q64, K64 = Qs.astype(np.float64), K.astype(np.float64)
    gram_q = np.matmul(Q64.transpose(0, 1, 3, 2), Q64)
    gram_k = np.matmul(K64.transpose(0, 1, 3, 2), K64)
    second = np.sum(gram_q * gram_k) / (B * H * L * L)
    first = np.sum(Qs.sum(axis=-2, dtype=np.float64) * K.sum(axis=-2, dtype=np.float64)) / (B * H * L * L)
    return first, second


class _Trial:
    def __init__(self, model, rng, dtype):
        self.m, self.rng, self.dtype = model, rng, dtype
        self.attn = component("attention")
        self.ln = component("layernorm")
        self.lin = component("linear")
        self.act = component(model.activation)
        self.drop = component("dropout")

    def _dropout(self, X, p):
        return self.drop.forward(X, {}, {"p": p}, self.rng)

    def branch_forward(self, kind, l, X):
        """F then hidden dropout; returns (Y, backward closure, logit moments)."""
        m, rng, dt = self.m, self.rng, self.dtype
        logits = None
        if kind == "attention":
            prm = _attention_params(m, l)
            W = self.attn.sample_weights(rng, prm, dt)
            Y, c_attn = self.attn.forward(X, W, prm, rng)
            logits = _logit_moments(self.attn, c_attn)
            chain = [(self.attn, c_attn)]
        else:
            p_in, p_out = _ffn_params(m, l)
            W1 = self.lin.sample_weights(rng, p_in, dt)
            W2 = self.lin.sample_weights(rng, p_out, dt)
            H, c1 = self.lin.forward(X, W1, p_in, rng)
            H, c2 = self.act.forward(H, {}, {}, rng)
            H, c3 = self._dropout(H, m.dropout.ffn_inner)
            Y, c4 = self.lin.forward(H, W2, p_out, rng)
            chain = [(self.lin, c1), (self.act, c2), (self.drop, c3), (self.lin, c4)]
        Y, c5 = self._dropout(Y, m.dropout.hidden)
        chain.append((self.drop, c5))

        def backward(G):
            for comp, cache in reversed(chain):
                G = comp.backward(G, cache)
            return G

        return Y, backward, logits


def simulate(model, *, batch: int = 8, trials: int = 8, seed: int = 0, dtype=np.float32,
             progress=None) -> ModelMeasurement:
    m = model
    rng = np.random.default_rng(seed)
    n_points = 1 + 2 * m.n_layers
    fw = np.zeros((trials, n_points, 3))
    bw = np.zeros((trials, n_points, 3))
    lg = np.full((trials, n_points, 2), np.nan)
    gflop = 0.0
    t0 = time.perf_counter()
    for t in range(trials):
        tr = _Trial(m, rng, dtype)
        X = correlated(rng, (batch, m.seq_len, m.d_model), m.input.mean, m.input.var, m.input.corr, dtype)
        fw[t, 0] = raw_moments(X)
        backs = []
        i = 0
        for l in range(m.n_layers):
            for kind in ("attention", "ffn"):
                i += 1
                cols = getattr(m, kind)
                a, b, n = float(cols.skip_scale[l]), float(cols.branch_scale[l]), float(cols.norm_scale[l])
                ln_p = _ln_params(m)
                if cols.post[l]:
                    Y, bwd, logits = tr.branch_forward(kind, l, X)
                    Z = a * X + b * Y
                    X, c_ln = tr.ln.forward(Z, {}, ln_p, rng)

                    def back(G, a=a, b=b, bwd=bwd, c_ln=c_ln):
                        Gz = tr.ln.backward(G, c_ln)
                        return a * Gz + bwd(b * Gz)
                else:
                    Hn, c_ln = tr.ln.forward(X, {}, ln_p, rng)
                    Y, bwd, logits = tr.branch_forward(kind, l, n * Hn)
                    X = a * X + b * Y

                    def back(G, a=a, b=b, n=n, bwd=bwd, c_ln=c_ln):
                        return a * G + tr.ln.backward(n * bwd(b * G), c_ln)
                fw[t, i] = raw_moments(X)
                if logits is not None:
                    lg[t, i] = logits
                backs.append(back)
        G = correlated(rng, X.shape, 0.0, m.grad.var, m.grad.corr, dtype)
        bw[t, n_points - 1] = raw_moments(G)
        for j in range(len(backs) - 1, -1, -1):
            G = backs[j](G)
            bw[t, j] = raw_moments(G)
        if progress:
            progress(t + 1, trials)
    sim_s = time.perf_counter() - t0
    gflop = trials * _flops(m, batch) / 1e9
    forward = [pool(fw[:, k]) for k in range(n_points)]
    backward = [pool(bw[:, k], centred=False) for k in range(n_points)]
    logit = []
    for k in range(n_points):
        if np.isnan(lg[0, k, 0]):
            logit.append(None)
            continue
        v = lg[:, k, 1] - lg[:, k, 0] ** 2
        logit.append((float(v.mean()), float(v.std(ddof=1) / np.sqrt(trials)) if trials > 1 else float("nan")))
    return ModelMeasurement(forward, backward, logit, trials, batch, seed, np.dtype(dtype).name, sim_s, gflop)


def _flops(m, batch: int) -> float:
    """Matrix-multiply work of one forward + backward (input gradients only) of the model."""
    B, L, d, hd, dff = batch, m.seq_len, m.d_model, m.n_heads * m.d_head, m.d_ff
    attn = 2 * B * L * d * hd * 4 + 2 * B * m.n_heads * L * L * m.d_head * 2   # projections, QK^T, AV
    attn_bwd = 2 * attn                                                       # roughly twice the forward
    ffn = 2 * B * L * d * dff * 2
    return m.n_layers * (attn + attn_bwd + 3 * ffn)
