"""Cross-attention (encoder-decoder): Monte Carlo components and their sweep grids.

Forward (docs/formats.md, encoder-decoder models), per head h of width ``d_head``::

    Q = X Wq + bq   (X: the decoder stream, Lq = L tokens)
    K = E Wk + bk,  V = E Wv + bv   (E: the encoder output, Lk = L_enc tokens)
    (QK-norm per head over d_head on Q and K, ``qk_norm`` 1 LayerNorm, 2 RMSNorm)
    P = softmax(Q K^T / sqrt(d_head)) row-wise, no mask;  A = Dropout_p(P)
    O = A V;  Y = concat_h(O) Wo + bo

Two components, one per input: ``cross_attention`` takes X as its input (E drawn inside, from
the parameters enc_mean, enc_var, enc_corr, independently for every sequence) and its backward is
dLoss/dX (the query path); ``cross_attention_kv`` takes E (X drawn from dec_mean, dec_var, dec_corr)
and its backward is dLoss/dE (the value and key paths, collected over the Lq query rows).
The backward is written by hand (checked against central differences in
tests/rules/test_cross_attention.py).  NumPy arrays.
"""

from __future__ import annotations

import numpy as np

from sigprop.mc.backend import np_dtype
from sigprop.mc.component import Component
from sigprop.mc.components.attention import _norm_backward, _norm_forward
from sigprop.mc.components._util import grid_std
from sigprop.mc.sampling import correlated, keep_mask, standard_normal
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward


class CrossAttentionMC(Component):
    array_api = False

    def __init__(self, side: str):
        self.side = side
        self.name = "cross_attention" if side == "q" else "cross_attention_kv"
        self.rule = self.name

    def dims(self, params):
        L = params["L"] if self.side == "q" else params["L_enc"]
        return L, params["d"], params["d"]

    def memory(self, params, batch):
        d, hd = params["d"], params.get("n_heads", 1) * params["d_head"]
        Lq, Lk = params["L"], params["L_enc"]
        return (4.0 * d * hd + batch * (Lq + Lk) * (4.0 * d + 6.0 * hd)
                + 4.0 * batch * params.get("n_heads", 1) * Lq * Lk)

    def flops(self, params, batch):
        d, hd = params["d"], params.get("n_heads", 1) * params["d_head"]
        Lq, Lk = params["L"], params["L_enc"]
        return 2.0 * batch * (4 * Lq * d * hd + 4 * Lk * d * hd + 6 * Lq * Lk * hd)

    def sample_weights(self, rng, params, dtype):
        d, H, dh = params["d"], params.get("n_heads", 1), params["d_head"]
        hd = H * dh
        f = np.dtype(np_dtype(dtype)).type
        W = {}
        for nm, shape in (("q", (d, hd)), ("k", (d, hd)), ("v", (d, hd)), ("o", (hd, d))):
            W[nm] = standard_normal(rng, shape, dtype) * f(params[f"{nm}_std"])
            bstd = params.get(f"{nm}_bias_std", 0.0)
            W["b" + nm] = standard_normal(rng, shape[1], dtype) * f(bstd) if bstd else None
        return W

    def forward(self, X, W, params, rng):
        B = X.shape[0]
        d, H, dh = params["d"], params.get("n_heads", 1), params["d_head"]
        Lq, Lk = params["L"], params["L_enc"]
        if self.side == "q":
            Xq = X
            E = correlated(rng, (B, Lk, d), params.get("enc_mean", 0.0), params["enc_var"],
                           params.get("enc_corr", 0.0), X.dtype)
        else:
            E = X
            Xq = correlated(rng, (B, Lq, d), params.get("dec_mean", 0.0), params["dec_var"],
                            params.get("dec_corr", 0.0), X.dtype)
        return self.forward_pair(Xq, E, W, params, rng)

    def forward_pair(self, Xq, E, W, params, rng):
        """Y and the cache from both inputs: ``Xq`` (B, Lq, d), ``E`` (B, Lk, d)."""
        B, Lq, d = Xq.shape
        Lk = E.shape[1]
        H, dh = params.get("n_heads", 1), params["d_head"]
        p = params.get("p", 0.0)
        norm, eps = int(params.get("qk_norm", 0)), float(params.get("qk_eps", 1e-5))

        def proj(x, nm, L):
            y = x.reshape(B * L, d) @ W[nm]
            if W["b" + nm] is not None:
                y += W["b" + nm]
            return y.reshape(B, L, H, dh).transpose(0, 2, 1, 3)         # (B, H, L, dh)

        Q, K, V = proj(Xq, "q", Lq), proj(E, "k", Lk), proj(E, "v", Lk)
        cache = {"W": W, "shape": (B, Lq, Lk, d), "H": H, "dh": dh, "norm": norm}
        if norm:
            Q, cache["inv_q"] = _norm_forward(np, Q, norm, eps)
            K, cache["inv_k"] = _norm_forward(np, K, norm, eps)
            cache["Qn"], cache["Kn"] = Q, K
        s = Q.dtype.type(1.0 / np.sqrt(dh))
        S = np.matmul(Q, K.transpose(0, 1, 3, 2)) * s                  # (B, H, Lq, Lk)
        cache["logits"] = (float(np.mean(S, dtype=np.float64)), float(np.mean(S * S, dtype=np.float64)))
        S -= S.max(axis=-1, keepdims=True)
        P = np.exp(S)
        P /= P.sum(axis=-1, keepdims=True)
        if p > 0:
            keep = keep_mask(rng, P.shape, p).astype(P.dtype) * P.dtype.type(1.0 / (1.0 - p))
            A = P * keep
        else:
            keep, A = None, P
        O = np.matmul(A, V)                                             # (B, H, Lq, dh)
        Y = O.transpose(0, 2, 1, 3).reshape(B * Lq, H * dh) @ W["o"]
        if W["bo"] is not None:
            Y += W["bo"]
        cache.update(Q=Q, K=K, V=V, P=P, keep=keep, A=A, O=O, s=s)
        return Y.reshape(B, Lq, d), cache

    def logit_moments(self, cache):
        return cache["logits"]

    def backward_pair(self, GY, cache):
        """(dLoss/dX, dLoss/dE) by hand."""
        B, Lq, Lk, d = cache["shape"]
        H, dh, norm, s = cache["H"], cache["dh"], cache["norm"], cache["s"]
        W = cache["W"]
        Q, K, V, P, keep, A, O = (cache[k] for k in ("Q", "K", "V", "P", "keep", "A", "O"))
        GO = (GY.reshape(B * Lq, d) @ W["o"].T).reshape(B, Lq, H, dh).transpose(0, 2, 1, 3)
        dV = np.matmul(A.transpose(0, 1, 3, 2), GO)                     # (B, H, Lk, dh)
        dA = np.matmul(GO, V.transpose(0, 1, 3, 2))                     # (B, H, Lq, Lk)
        if keep is not None:
            dA *= keep
        dS = P * (dA - np.sum(P * dA, axis=-1, keepdims=True))
        dQ = np.matmul(dS, K) * s
        dK = np.matmul(dS.transpose(0, 1, 3, 2), Q) * s
        if norm:
            dQ = _norm_backward(np, dQ, cache["Qn"], cache["inv_q"], norm)
            dK = _norm_backward(np, dK, cache["Kn"], cache["inv_k"], norm)

        def back(g, nm, L):
            return (g.transpose(0, 2, 1, 3).reshape(B * L, H * dh) @ W[nm].T).reshape(B, L, d)

        return back(dQ, "q", Lq), back(dK, "k", Lk) + back(dV, "v", Lk)

    def backward(self, GY, cache):
        gx, ge = self.backward_pair(GY, cache)
        return gx if self.side == "q" else ge


COMPONENT = CrossAttentionMC("q")
COMPONENT_KV = CrossAttentionMC("kv")
COMPONENTS = (COMPONENT, COMPONENT_KV)

#: sequences x effective head width per configuration (the attention grids' modern budget)
BUDGET = 8 * 4096


def _sample_size(pt: dict) -> tuple[int, int]:
    """(runs, batch): at least 8 weight draws; sequences as the attention component's modern
    grids (relative noise ~ sqrt(2 / (sequences x k)) where attention is nearly uniform,
    k = 1/(1/(H dh) + 1/d)), capped at 1024 and at ~16M entries per (B, H, Lq, Lk) array."""
    H, dh, d = pt["n_heads"], pt["d_head"], pt["d"]
    k = 1.0 / (1.0 / (H * dh) + 1.0 / d)
    n_seq = int(min(1024, max(64, round(BUDGET / k))))
    bmax = max(2, int(16e6 / (H * pt["L"] * pt["L_enc"])))
    runs = max(8, int(np.ceil(n_seq / bmax)))
    return runs, int(np.ceil(n_seq / runs))


def _case_for(side: str):
    def case(pt: dict) -> Case:
        d = pt["d"]
        rule = {"d": d, "n_heads": pt["n_heads"], "d_head": pt["d_head"], "L": pt["L"], "L_enc": pt["L_enc"],
                "q_std": pt["wqk_std_sqrt_d"] / np.sqrt(d), "k_std": pt["wqk_std_sqrt_d"] / np.sqrt(d),
                "v_std": 1.0 / np.sqrt(d), "o_std": 1.0 / np.sqrt(d), "p": pt["p"],
                "qk_norm": pt.get("qk_norm", 0)}
        xq = Forward(0.0, grid_std(pt["x_std"]) ** 2, pt["x_corr"])
        xe = Forward(0.0, grid_std(pt["e_std"]) ** 2, pt["enc_corr"])
        if side == "q":
            rule.update(enc_mean=0.0, enc_var=xe.var, enc_corr=xe.corr)
            x = xq
        else:
            rule.update(dec_mean=0.0, dec_var=xq.var, dec_corr=xq.corr)
            x = xe
        runs, batch = _sample_size(pt)
        return Case(rule, dict(rule), x, Backward(1.0, pt["g_corr"]), runs, batch)
    return case


#: decoder and encoder lengths that differ (16 queries on 64 or 128 keys, 128 on 16), input scales
#: and correlations of both sides apart, Q/K scales to logit variance ~4, dropout, QK-norm
GRID = {"x_std": (1.0, 3.16), "x_corr": (0.0, 0.5), "e_std": (1.0, 3.16), "enc_corr": (0.0, 0.5),
        "g_corr": (0.0, 0.5), "d": (256,), "n_heads": (4,), "d_head": (64,),
        "L": (16, 128), "L_enc": (16, 64), "wqk_std_sqrt_d": (0.245, 0.6), "p": (0.0, 1 / 3)}
QKNORM_GRID = {**{k: v for k, v in GRID.items() if k not in ("wqk_std_sqrt_d",)},
               "wqk_std_sqrt_d": (1.0,), "qk_norm": (1, 2), "p": (0.0,)}

_NOTE = ("decoder length L and encoder length L_enc apart (16 or 128 queries on 16 or 64 keys), both inputs' "
         "scales and correlations apart, d 256, 4 heads of 64, upstream gradient variance 1; at least 8 weight "
         "draws, 8x the published attention grid's sequence budget")

SWEEPS = {
    "cross_attention": SweepSpec(component=COMPONENT, grid=GRID, make_case=_case_for("q"), published={},
                                 note="query side (the gradient into the decoder stream): " + _NOTE,
                                 variants={"qknorm": {"published_forms": False, "grid": QKNORM_GRID,
                                                      "note": "QK-norm (LayerNorm, RMSNorm) on queries and keys"}}),
    "cross_attention_kv": SweepSpec(component=COMPONENT_KV, grid=GRID, make_case=_case_for("kv"), published={},
                                    note="key/value side (the gradient into the encoder output): " + _NOTE,
                                    variants={"qknorm": {"published_forms": False, "grid": QKNORM_GRID,
                                                         "note": "QK-norm (LayerNorm, RMSNorm) on queries and keys"}}),
}
