"""Multi-head scaled dot-product attention: Monte Carlo component and published sweep.

Forward (docs/formats.md, attention F), per head h with width ``d_head``::

    Q = X Wq + bq,  K = X Wk + bk,  V = X Wv + bv          (d -> n_heads * d_head)
    S = Q K^T / sqrt(d_head)  (+ causal mask: key j > query i removed; a sliding window
                               ``window`` W: keys outside row i's W removed, sigprop.rules.windows)
    P = softmax(S) row-wise;  A = Dropout_p(P)  (keep 1-p, rescale 1/(1-p))
    O = A V;  Y = concat_h(O) Wo + bo                       (n_heads * d_head -> d)

The backward is written by hand through Wo, the value product, attention dropout, the
softmax (with its mask), and the query and key products back to X.  Arrays are
(B, H, L, d_head) and (B, H, L, L) so that every contraction is one batched ``matmul``
(written against the array API: :mod:`sigprop.mc.backend`).
:meth:`AttentionMC.backward_paths` returns the three contributions to dLoss/dX (through
V, Q and K) separately; :meth:`backward` is their sum (one fused GEMM).

Sample sizes (:func:`_sample_size`): the sweep's errors are dominated by Monte Carlo noise,
not by the rule (re-measuring the worst points with 4x the sequences brings them to ~1%).
Two regimes need many sequences: nearly uniform attention (all rows of a sequence carry one
vector: relative noise sqrt(2 / (sequences x min(H dh, d)))) and logits with a large
token-shared part (heavy-tailed key column sums).  ``BUDGET`` and ``HEAVY`` scale both; the
default 500-point sweep takes ~25 min on two busy cores (~10 min alone, single-threaded
BLAS: with OpenBLAS on an oversubscribed machine set OPENBLAS_NUM_THREADS=1).
"""

from __future__ import annotations

import numpy as np

from sigprop.mc.backend import backend_of, np_dtype
from sigprop.mc.component import Component
from sigprop.mc.components._util import grid_std
from sigprop.mc.sampling import keep_mask, standard_normal
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.rope import RopeFreqs
from sigprop.rope import thetas as rope_thetas
from sigprop.rules import windows
from sigprop.state import Backward, Forward

_NAMES = ("q", "k", "v")


#: logits beyond this size (either sign) send the softmax through the max-subtracting path;
#: within it exp(S) neither overflows nor underflows in float32 and the row sums are exact
#: to rounding, so the shift (a row reduction and a pass) is skipped
_EXP_SAFE = 60.0


def _mean_and_square(S, bk) -> tuple[float, float]:
    """Mean and mean square of all entries of S (B, H, L, L): partial sums in S's precision over
    each head's L x L block (pairwise / multi-accumulator, relative error ~1e-6), float64 across."""
    xp = bk.xp
    n = S.shape[0] * S.shape[1] * S.shape[2] * S.shape[3]
    rows = xp.reshape(S, (S.shape[0] * S.shape[1], S.shape[2] * S.shape[3]))
    first = float(xp.sum(xp.sum(rows, axis=1), dtype=xp.float64)) / n
    second = float(xp.sum(bk.rowdot(rows, rows), dtype=xp.float64)) / n
    return first, second



def _kv_heads(params) -> int:
    """Key/value heads (``kv_heads``; 0 or absent: one per query head)."""
    H = int(params.get("n_heads", 1))
    kv = int(params.get("kv_heads", 0) or H)
    if kv < 1 or H % kv:
        raise ValueError(f"attention: kv_heads {kv} must divide n_heads {H}")
    return kv


def _modern(params) -> bool:
    """Grouped-query heads, QK-norm, rotary positions or soft-capped logits: the general forward/backward (the
    plain one keeps its fused layout and, bit for bit, its earlier results)."""
    return (_kv_heads(params) != int(params.get("n_heads", 1)) or bool(params.get("qk_norm", 0))
            or bool(params.get("rope", 0.0)) or bool(params.get("softcap", 0.0)) or _window(params) is not None)


def _window(params):
    """The (L, L) keep-mask of an active sliding window (``window`` W > 0, fewer keys than the
    mask without it: sigprop.rules.windows), else None."""
    W = int(params.get("window", 0) or 0)
    if W <= 0:
        return None
    L, causal = int(params["L"]), bool(params.get("causal", 0))
    if not windows.active(L, W, causal):
        return None
    return windows.mask(L, W, causal)


def rope_tables(L: int, dh: int, base) -> tuple[np.ndarray, np.ndarray]:
    """cos(t theta) and sin(t theta), (L, dh) float64: theta_i = base^(-2i/dh) for i < dh/2
    (``base`` a number) or the frequencies of a :class:`sigprop.rope.RopeFreqs`, repeated for
    both halves, t = 0..L-1 (the rotate-half convention).  A RopeFreqs' attention factor
    multiplies the cos and sin of its rotated planes (theta_i != 0; the others pass through)."""
    if isinstance(base, RopeFreqs):
        theta, scale = rope_thetas(base, dh), np.concatenate([base.plane_scale()] * 2)
    else:
        theta, scale = float(base) ** (-2.0 * np.arange(dh // 2) / dh), None
    ang = np.arange(L)[:, None] * theta[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    if scale is None:
        return np.cos(ang), np.sin(ang)
    return np.cos(ang) * scale, np.sin(ang) * scale


def _rotate_half(xp, x, sign=1.0):
    """concat(-x2, x1) (sign 1) or its transpose concat(x2, -x1) (sign -1), halves of the last axis."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return xp.concat([-x2, x1], axis=-1) if sign > 0 else xp.concat([x2, -x1], axis=-1)


def _norm_forward(xp, x, kind: int, eps: float):
    """Per-vector norm over the last axis (1 LayerNorm, 2 RMSNorm, gain 1): (y, 1/scale)."""
    if kind == 1:
        x = x - xp.mean(x, axis=-1, keepdims=True)
    inv = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * inv, inv


def _norm_backward(xp, dy, y, inv, kind: int):
    """Gradient through :func:`_norm_forward` (exact Jacobian-transpose product)."""
    dx = dy - y * xp.mean(dy * y, axis=-1, keepdims=True)
    if kind == 1:
        dx = dx - xp.mean(dy, axis=-1, keepdims=True)
    return dx * inv


class AttentionMC(Component):
    name = "attention"
    rule = "attention"
    array_api = True

    def dims(self, params):
        return params["L"], params["d"], params["d"]

    def memory(self, params, batch):
        """The weights (4 d H dh, with copies), the (B, L, 3 H dh) projections and their
        gradients, and about four (B, H, L, L) arrays (logits/probabilities, dropout mask,
        dropped-out weights, their gradient)."""
        L, d, _ = self.dims(params)
        hd = params.get("n_heads", 1) * params["d_head"]
        return 8.0 * d * hd + batch * L * (4.0 * d + 8.0 * hd) + 4.0 * batch * params.get("n_heads", 1) * L * L

    def sample_weights(self, rng, params, dtype):
        """Wq, Wk, Wv side by side in one (d, (H + 2 kv) dh) matrix (one GEMM each way); kv
        the number of key/value heads (``kv_heads``, default H: then (d, 3 H dh))."""
        d, H, dh = params["d"], params.get("n_heads", 1), params["d_head"]
        kv = _kv_heads(params)
        if kv != H:
            return self._sample_weights_grouped(rng, params, dtype, d, H, kv, dh)
        hd = H * dh
        qkv = standard_normal(rng, (d, 3, hd), dtype)
        bk = backend_of(qkv)
        xp = bk.xp
        qkv *= bk.asarray(np.array([params[f"{nm}_std"] for nm in _NAMES], dtype=dtype)[:, None])
        bias, any_bias = None, False
        for i, nm in enumerate(_NAMES):
            bstd = params.get(f"{nm}_bias_std", 0.0)
            if bstd:
                if bias is None:
                    bias = bk.zeros((3, hd), dtype)
                bias[i, :] = standard_normal(rng, hd, dtype) * float(bstd)
                any_bias = True
        wo = standard_normal(rng, (hd, d), dtype)
        wo *= float(params["o_std"])
        bo_std = params.get("o_bias_std", 0.0)
        bo = standard_normal(rng, d, dtype) * float(bo_std) if bo_std else None
        return {"qkv": xp.reshape(qkv, (d, 3 * hd)), "bqkv": xp.reshape(bias, (3 * hd,)) if any_bias else None,
                "o": wo, "bo": bo}

    def _sample_weights_grouped(self, rng, params, dtype, d, H, kv, dh):
        """Grouped-query weights: Wq (d, H dh), Wk and Wv (d, kv dh), side by side."""
        widths = (H * dh, kv * dh, kv * dh)
        cols, biases, any_bias = [], [], False
        for nm, w in zip(_NAMES, widths):
            cols.append(standard_normal(rng, (d, w), dtype) * float(params[f"{nm}_std"]))
        bk = backend_of(cols[0])
        xp = bk.xp
        for nm, w in zip(_NAMES, widths):
            bstd = params.get(f"{nm}_bias_std", 0.0)
            if bstd:
                biases.append(standard_normal(rng, w, dtype) * float(bstd))
                any_bias = True
            else:
                biases.append(bk.zeros((w,), dtype))
        wo = standard_normal(rng, (H * dh, d), dtype)
        wo *= float(params["o_std"])
        bo_std = params.get("o_bias_std", 0.0)
        bo = standard_normal(rng, d, dtype) * float(bo_std) if bo_std else None
        return {"qkv": xp.concat(cols, axis=1), "bqkv": xp.concat(biases) if any_bias else None, "o": wo, "bo": bo}

    def forward(self, X, W, params, rng):
        """Returns Y and the cache (W_eff, Qs, K, V, P, keep, A, logit moments, O, H, dh).

        Two exact rewrites keep passes over the L x L arrays out: 1/sqrt(dh) is folded into
        the query weights (W_eff's Wq; Qs = X Wq / sqrt(dh) is what the softmax sees) and the
        dropout rescale 1/(1-p) into W_o (A = P * keep without it, Y = (A V) W_o / (1-p)); the
        backward differentiates exactly these effective maps.  The softmax is
        exp(S - max) / sum (the standard has none), the max shift skipped where no logit can
        overflow or underflow (|S| <= 60)."""
        if _modern({**params, "L": X.shape[1]}):
            return self._forward_modern(X, W, params, rng)
        bk = backend_of(X)
        xp = bk.xp
        B, L, d = X.shape
        H, dh = params.get("n_heads", 1), params["d_head"]
        hd = H * dh
        p = params.get("p", 0.0)
        causal = bool(params.get("causal", 0))
        s = float(np.float32(1.0 / np.sqrt(dh))) if X.dtype == xp.float32 else 1.0 / float(np.sqrt(dh))
        wqkv = xp.asarray(W["qkv"], copy=True)
        wqkv[:, :hd] *= s
        Z = xp.reshape(X, (B * L, d)) @ wqkv                      # (B L, 3 H dh)
        if W["bqkv"] is not None:
            b = xp.asarray(W["bqkv"], copy=True)
            b[:hd] *= s
            Z += b
        Z = xp.permute_dims(xp.reshape(Z, (B, L, 3, H, dh)), (2, 0, 3, 1, 4))   # (3, B, H, L, dh) views
        Qs, K, V = Z[0, ...], Z[1, ...], Z[2, ...]
        S = xp.matmul(Qs, xp.matrix_transpose(K))               # (B, H, L, L)
        logits = _mean_and_square(S, bk)                         # all L x L, mask aside
        keep_causal = bk.tri(L) if causal else None
        if -_EXP_SAFE <= float(xp.min(S)) and float(xp.max(S)) <= _EXP_SAFE:
            P = bk.exp_(S)
            if causal:
                P = bk.mul_(P, keep_causal)
        else:
            if causal:
                S = xp.where(keep_causal, S, -xp.inf)
            S -= xp.max(S, axis=-1, keepdims=True)
            P = bk.exp_(S)
        rs = 1.0 / xp.sum(P, axis=-1, keepdims=True)
        P *= rs
        wo = W["o"]
        if p > 0:
            keep = keep_mask(rng, P.shape, p)
            A = bk.mul(P, keep)
            wo = wo * float(np.float32(1.0 / (1.0 - p)) if X.dtype == xp.float32 else 1.0 / (1.0 - p))
        else:
            keep, A = None, P
        O = bk.empty((B, L, H, dh), np_dtype(X.dtype))
        bk.matmul(A, V, out=xp.permute_dims(O, (0, 2, 1, 3)))      # heads side by side
        Y = xp.reshape(O, (B * L, hd)) @ wo
        if W["bo"] is not None:
            Y += W["bo"]
        return xp.reshape(Y, (B, L, d)), ({"qkv": wqkv, "o": wo}, Qs, K, V, P, keep, A, logits, O, H, dh)

    def logit_moments(self, cache) -> tuple[float, float]:
        """Mean and second moment of all L x L pre-softmax logits (measured in the forward)."""
        return cache["logits"] if isinstance(cache, dict) else cache[7]

    def _core_backward(self, GY, cache, out=None):
        """Gradients with respect to Qs (the scaled queries), K and V, each (B, H, L, dh);
        written into ``out`` (B, L, 3, H, dh) when given."""
        W, Qs, K, V, P, keep, A, _, O, H, dh = cache
        bk = backend_of(GY)
        xp = bk.xp
        B, L, d = GY.shape
        if out is None:
            out = bk.empty((B, L, 3, H, dh), np_dtype(GY.dtype))
        dQ, dK, dV = (xp.permute_dims(out[:, :, i, ...], (0, 2, 1, 3)) for i in range(3))
        GO2 = xp.reshape(GY, (B * L, d)) @ W["o"].T               # (B L, H dh)
        GO = xp.permute_dims(xp.reshape(GO2, (B, L, H, dh)), (0, 2, 1, 3))
        bk.matmul(xp.matrix_transpose(A), GO, out=dV)           # A^T G
        dP = xp.matmul(GO, xp.matrix_transpose(V))              # G V^T, then through dropout
        if keep is not None:
            dP = bk.mul_(dP, keep)
        # sum_j P_ij dP_ij = G_i . sum_j A_ij V_j = G_i . O_i (O = A V from the forward)
        rowdot = xp.permute_dims(bk.rowdot(xp.reshape(GO2, (B, L, H, dh)), O), (0, 2, 1))
        dP -= xp.expand_dims(rowdot, axis=-1)
        dP *= P                                                  # dS = P (dP - rowdot)
        bk.matmul(dP, K, out=dQ)                                 # dL/dQs (1/sqrt(dh) is in W_eff)
        bk.matmul(xp.matrix_transpose(dP), Qs, out=dK)
        return dQ, dK, dV

    def backward(self, GY, cache):
        if isinstance(cache, dict):
            return sum(self._backward_modern(GY, cache).values())
        bk = backend_of(GY)
        xp = bk.xp
        B, L, d = GY.shape
        H, dh = cache[-2], cache[-1]
        Z = bk.empty((B, L, 3, H, dh), np_dtype(GY.dtype))
        self._core_backward(GY, cache, out=Z)
        return xp.reshape(xp.reshape(Z, (B * L, 3 * H * dh)) @ cache[0]["qkv"].T, (B, L, d))

    def backward_paths(self, GY, cache) -> dict:
        """dLoss/dX split into the query, key and value paths (for diagnostics and tests)."""
        if isinstance(cache, dict):
            return self._backward_modern(GY, cache)
        xp = backend_of(GY).xp
        B, L, d = GY.shape
        W, H, dh = cache[0], cache[-2], cache[-1]
        hd = H * dh
        out = {}
        for i, (nm, g) in enumerate(zip(_NAMES, self._core_backward(GY, cache))):
            Zc = xp.reshape(xp.permute_dims(g, (0, 2, 1, 3)), (B * L, hd))
            out[nm] = xp.reshape(Zc @ W["qkv"][:, i * hd:(i + 1) * hd].T, (B, L, d))
        return out

    # -- grouped-query heads, QK-norm, rotary positions ------------------------------------
    def _forward_modern(self, X, W, params, rng):
        """The general forward: Q, K, V projections (K and V with kv_heads heads); QK-norm over
        each head's d_head features (``qk_norm`` 1 LayerNorm, 2 RMSNorm, gain 1, ``qk_eps``);
        rotary positions (``rope`` the base or a RopeFreqs; position t = token index); soft-capped
        logits (``softcap`` c: S -> c tanh(S / c) after the scaling, before the mask); query head h uses
        key/value head floor(h kv / H); then the softmax, dropout, A V and W_o as in
        :meth:`forward`.  The cache is a dict (what :meth:`_backward_modern` needs)."""
        bk = backend_of(X)
        xp = bk.xp
        B, L, d = X.shape
        H, dh, kv = int(params.get("n_heads", 1)), int(params["d_head"]), _kv_heads(params)
        G = H // kv
        p = params.get("p", 0.0)
        causal = bool(params.get("causal", 0))
        norm, eps = int(params.get("qk_norm", 0)), float(params.get("qk_eps", 1e-5))
        base = params.get("rope", 0.0)
        base = base if isinstance(base, RopeFreqs) else float(base)
        f32 = X.dtype == xp.float32
        s = float(np.float32(1.0 / np.sqrt(dh))) if f32 else 1.0 / float(np.sqrt(dh))
        Z = xp.reshape(X, (B * L, d)) @ W["qkv"]
        if W["bqkv"] is not None:
            Z += W["bqkv"]
        wq, wk = H * dh, kv * dh

        def heads(a, n):                         # (B L, n dh) -> (B, n, L, dh)
            return xp.permute_dims(xp.reshape(a, (B, L, n, dh)), (0, 2, 1, 3))

        Q, K, V = heads(Z[:, :wq], H), heads(Z[:, wq:wq + wk], kv), heads(Z[:, wq + wk:], kv)
        cache = {"W": W, "H": H, "kv": kv, "dh": dh, "norm": norm, "s": s, "shape": (B, L, d)}
        if norm:
            Q, cache["inv_q"] = _norm_forward(xp, Q, norm, eps)
            K, cache["inv_k"] = _norm_forward(xp, K, norm, eps)
            cache["Qn"], cache["Kn"] = Q, K
        if base:
            cos, sin = rope_tables(L, dh, base)
            dt = np.float32 if f32 else np.float64
            cos, sin = bk.asarray(cos.astype(dt)), bk.asarray(sin.astype(dt))
            Q = Q * cos + _rotate_half(xp, Q) * sin
            K = K * cos + _rotate_half(xp, K) * sin
            cache["cos"], cache["sin"] = cos, sin
        Qs = Q * s
        Ke, Ve = self._expand(xp, K, G), self._expand(xp, V, G)
        S = xp.matmul(Qs, xp.matrix_transpose(Ke))              # (B, H, L, L)
        cache["logits"] = _mean_and_square(S, bk)
        cap = float(params.get("softcap", 0.0))
        if cap:                                                 # soft cap: S -> cap tanh(S / cap)
            T = xp.tanh(S * (1.0 / cap))
            S = T * cap
            cache["slope"] = 1.0 - T * T
        band = _window({**params, "L": L})
        if band is not None:                                    # a sliding window: its band
            S = xp.where(bk.asarray(band), S, -xp.inf)
        elif causal:
            S = xp.where(bk.tri(L), S, -xp.inf)
        S = S - xp.max(S, axis=-1, keepdims=True)
        P = xp.exp(S)
        P = P / xp.sum(P, axis=-1, keepdims=True)
        wo = W["o"]
        if p > 0:
            keep = keep_mask(rng, P.shape, p)
            A = bk.mul(P, keep)
            wo = wo * float(np.float32(1.0 / (1.0 - p)) if f32 else 1.0 / (1.0 - p))
        else:
            keep, A = None, P
        O = xp.matmul(A, Ve)                                    # (B, H, L, dh)
        O2 = xp.reshape(xp.permute_dims(O, (0, 2, 1, 3)), (B * L, H * dh))
        Y = O2 @ wo
        if W["bo"] is not None:
            Y += W["bo"]
        cache.update(wo=wo, Qs=Qs, Ke=Ke, Ve=Ve, P=P, keep=keep, A=A, O=O)
        return xp.reshape(Y, (B, L, d)), cache

    @staticmethod
    def _expand(xp, K, G):
        """(B, kv, L, dh) -> (B, kv G, L, dh): query head h reads key/value head h // G."""
        if G == 1:
            return K
        B, kv, L, dh = K.shape
        return xp.reshape(xp.broadcast_to(xp.expand_dims(K, axis=2), (B, kv, G, L, dh)), (B, kv * G, L, dh))

    @staticmethod
    def _group_sum(xp, dK, G):
        if G == 1:
            return dK
        B, H, L, dh = dK.shape
        return xp.sum(xp.reshape(dK, (B, H // G, G, L, dh)), axis=2)

    def _backward_modern(self, GY, cache) -> dict:
        """dLoss/dX by path (q, k, v), differentiating :meth:`_forward_modern` by hand."""
        xp = backend_of(GY).xp
        B, L, d = cache["shape"]
        H, kv, dh, norm, s = cache["H"], cache["kv"], cache["dh"], cache["norm"], cache["s"]
        G = H // kv
        P, keep, A, O, Qs, Ke, Ve = (cache[k] for k in ("P", "keep", "A", "O", "Qs", "Ke", "Ve"))
        GO = xp.permute_dims(xp.reshape(xp.reshape(GY, (B * L, d)) @ cache["wo"].T, (B, L, H, dh)),
                             (0, 2, 1, 3))                      # (B, H, L, dh)
        dV = self._group_sum(xp, xp.matmul(xp.matrix_transpose(A), GO), G)
        dP = xp.matmul(GO, xp.matrix_transpose(Ve))
        if keep is not None:
            dP = dP * keep
        rowdot = xp.sum(GO * O, axis=-1, keepdims=True)        # sum_j A_ij dP_ij = G_i . O_i
        dS = P * (dP - rowdot)
        if "slope" in cache:                                    # through the soft cap
            dS = dS * cache["slope"]
        dQ = xp.matmul(dS, Ke) * s
        dK = self._group_sum(xp, xp.matmul(xp.matrix_transpose(dS), Qs), G)
        if "cos" in cache:
            cos, sin = cache["cos"], cache["sin"]
            dQ = dQ * cos + _rotate_half(xp, dQ * sin, -1.0)
            dK = dK * cos + _rotate_half(xp, dK * sin, -1.0)
        if norm:
            dQ = _norm_backward(xp, dQ, cache["Qn"], cache["inv_q"], norm)
            dK = _norm_backward(xp, dK, cache["Kn"], cache["inv_k"], norm)
        Wm = cache["W"]["qkv"]
        wq, wk = H * dh, kv * dh
        out = {}
        for nm, g, lo, hi in (("q", dQ, 0, wq), ("k", dK, wq, wq + wk), ("v", dV, wq + wk, wq + 2 * wk)):
            n = g.shape[1]
            g2 = xp.reshape(xp.permute_dims(g, (0, 2, 1, 3)), (B * L, n * dh))
            out[nm] = xp.reshape(g2 @ Wm[:, lo:hi].T, (B, L, d))
        return out

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        hd = params.get("n_heads", 1) * params["d_head"]
        # projections: QKV and W_o forward, G W_o^T and [dQ dK dV] W_qkv^T backward (4 d x H dh
        # products each way); L x L products: Q K^T, A V forward, four backward
        return 2.0 * batch * (8 * L * d * hd + 6 * L * L * hd)


COMPONENT = AttentionMC()


#: sequences x effective head width per configuration (see _sample_size); the moments'
#: relative noise is ~ sqrt(2 / BUDGET) where attention is nearly uniform
BUDGET = 4096
#: sequences of 300 tokens wanted where the key logits share a large part across rows
HEAVY = 256
_MAX_SEQ = 512


def _sample_size(pt: dict) -> tuple[int, int]:
    """(runs, batch) for one grid point.

    Two noise regimes set the number of sequences.  (1) Small logits: every row attends
    nearly uniformly, all rows of a sequence carry the same vector, and a moment's relative
    noise is ~ sqrt(2 / (sequences x k)), k = 1/(1/(kv dh) + 1/d) the dimension that vector
    lives in (kv dh: the value heads): sequences = budget / k.  (2) Logits with a large
    token-shared part s = r (1-r) T^2 (T the logit scale: s2 wqk^2 at unit-std weights
    times sqrt(d), 1 with QK-norm; the logit variance a key carries into every row): a key's
    column sum is lognormal with log-variance s, the gradient variance is a heavy-tailed
    average over keys, and ~ HEAVY sqrt(300 / L) (e^s - 1)/(e^2.88 - 1) sequences are needed
    for ~5%.  ``budget`` (default BUDGET) is a grid point's own when it has one; a point with
    its own ``max_seq`` (the cap on sequences, default 512) also scales the heavy-tail count by
    budget / BUDGET, and ``min_runs`` (default 4) sets the fewest weight draws (the standard
    errors come from the spread over draws).  Batches are capped so that one (B, H, L, L)
    array stays near 64 MB."""
    H, dh = pt.get("n_heads", 1), pt["d_head"]
    kv = pt.get("kv_heads", 0) or H
    d = pt.get("d", H * dh)
    L = pt["L"]
    k = 1.0 / (1.0 / (kv * dh) + 1.0 / d)
    n_seq = pt.get("budget", BUDGET) / k
    s2 = grid_std(pt["x_std"]) ** 2
    r = pt["x_corr"]
    T = 1.0 if pt.get("qk_norm", 0) else s2 * pt["wqk_std_sqrt_d"] ** 2
    shared = r * (1 - r) * T**2
    heavy = HEAVY * pt.get("budget", BUDGET) / BUDGET if "max_seq" in pt else HEAVY
    n_seq = max(n_seq, heavy * np.sqrt(300.0 / L) * np.expm1(shared) / np.expm1(2.88))
    n_seq = int(min(pt.get("max_seq", _MAX_SEQ), max(8, round(n_seq))))
    bmax = max(2, int(16e6 / (H * L * L)))
    runs = max(pt.get("min_runs", 4), int(np.ceil(n_seq / bmax)))
    return runs, int(np.ceil(n_seq / runs))


def _case(pt: dict) -> Case:
    H, dk = pt.get("n_heads", 1), pt["d_head"]
    d = pt.get("d", H * dk)
    rule = {"d": d, "n_heads": H, "d_head": dk, "L": pt["L"],
            "q_std": pt["wqk_std_sqrt_d"] / np.sqrt(d), "k_std": pt["wqk_std_sqrt_d"] / np.sqrt(d),
            "v_std": pt["wv_std_sqrt_d"] / np.sqrt(d), "o_std": 1.0 / np.sqrt(d),
            "p": pt["p"], "causal": pt.get("causal", 0)}
    for key in ("kv_heads", "qk_norm", "rope", "softcap", "window"):     # the modern variants' parameters
        if key in pt:
            rule[key] = pt[key]
    if "rope_freqs" in pt:                          # a named frequency vector (ROPE_FREQS)
        rule["rope"] = rope_freqs(pt["rope_freqs"], dk, pt["L"])
    runs, batch = _sample_size(pt)
    return Case(rule, dict(rule),
                Forward(0.0, grid_std(pt["x_std"]) ** 2, pt["x_corr"]),
                Backward(grid_std(pt["g_std"]) ** 2, pt["g_corr"]), runs, batch)


_GRID = {
    "x_std": (0.316, 1.0, 3.16), "x_corr": (0.0, 1 / 3, 2 / 3),
    "g_std": (0.316, 1.0, 3.16), "g_corr": (0.0, 1 / 3, 2 / 3),
    "d": (100, 316, 1000), "L": (300, 547, 1000), "d_head": (32, 64, 128, 256),
    "wv_std_sqrt_d": (0.316, 1.0, 3.16), "wqk_std_sqrt_d": (0.1, 0.245, 0.6),
    "p": (0.0, 1 / 3, 2 / 3),
}

#: the modern variants' grids: smaller sizes than the published grid (d 128-512, L 16-256),
#: each sampled at 8x the published grid's budget (noise ~0.8% where attention is uniform, so
#: that the noise alone leaves p99 below 2%), at least 8 weight draws per point
_MODERN = {"g_std": (1.0,), "wv_std_sqrt_d": (1.0,), "budget": (8 * BUDGET,), "max_seq": (2048,),
           "min_runs": (8,)}
_GQA_GRID = {**_MODERN, "x_std": (1.0, 3.16), "x_corr": (0.0, 1 / 3, 2 / 3), "g_corr": (0.0, 1 / 3, 2 / 3),
             "d": (256,), "n_heads": (8,), "d_head": (32,), "kv_heads": (1, 2, 4), "L": (32, 128),
             "wqk_std_sqrt_d": (0.245, 0.6), "p": (0.0, 1 / 3), "causal": (0, 1)}
_QKNORM_GRID = {**_MODERN, "qk_norm": (1, 2), "x_std": (0.316, 1.0, 3.16), "x_corr": (0.0, 1 / 3, 2 / 3),
                "g_corr": (0.0, 1 / 3, 2 / 3), "d": (128, 512), "n_heads": (4,), "d_head": (32, 64),
                "L": (32, 128), "wqk_std_sqrt_d": (0.1, 0.6, 2.0), "p": (0.0, 1 / 3), "causal": (0, 1)}
_ROPE_GRID = {**_MODERN, "rope": (1e4, 5e5), "x_std": (1.0,), "x_corr": (0.0, 0.5, 0.9), "g_corr": (0.0, 0.5),
              "d": (256,), "n_heads": (4,), "d_head": (64,), "L": (16, 64, 256),
              "wqk_std_sqrt_d": (0.6, 1.0, 1.4), "qk_norm": (0, 2), "p": (0.0, 1 / 3), "causal": (0, 1)}

#: the frequency vectors of the ``rope_freqs`` grid, as sigprop.interop.hf computes them from
#: transformers' rope parameters for a rotary part of ``dim`` features (``prf`` of the head),
#: at ``seq_len`` positions: (rope_type, rope parameters, partial rotary factor, max_position_embeddings)
ROPE_FREQS = {
    # Llama 3.1 / 3.2 (base 5e5, factor 8, original context 8192)
    "llama3": ("llama3", {"rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}, 1.0, 131072),
    # Pythia: a quarter of each head rotated (rotary_pct 0.25), base 1e4
    "partial25": ("default", {"rope_theta": 1e4}, 0.25, 2048),
    # yarn, factor 4 over an original context of 64 (the ramp inside the grid's lengths), its
    # attention factor 0.1 ln 4 + 1 = 1.139 on every plane
    "yarn4": ("yarn", {"rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}, 1.0, 256),
    # longrope on three quarters of each head (Phi-4-mini's shape): the long factors (the grid's
    # lengths beyond 16) and the attention factor sqrt(1 + ln 16 / ln 16) = 1.414 on the rotated
    # planes only (the rule's one effective factor)
    "longrope75": ("longrope", {"rope_theta": 1e4, "original_max_position_embeddings": 16,
                                "short_factor": [1.0] * 24, "long_factor": list(np.linspace(1.0, 8.0, 24))}, 0.75, 256),
}


def rope_freqs(name: str, d_head: int, seq_len: int = 256):
    """The :class:`sigprop.rope.RopeFreqs` named in :data:`ROPE_FREQS` for a head of ``d_head``."""
    from sigprop.errors import DomainError
    from sigprop.interop.hf import rope_inv_freq

    def fail(msg):
        raise DomainError(msg)

    kind, prm, prf, max_pos = ROPE_FREQS[name]
    dim = int(int(d_head) * prf)
    inv, s = rope_inv_freq(kind, dict(prm), dim, seq_len, max_pos, fail)
    return RopeFreqs(list(inv) + [0.0] * ((int(d_head) - dim) // 2), s)


_ROPE_FREQS_GRID = {**{k: v for k, v in _ROPE_GRID.items() if k != "rope"}, "rope_freqs": tuple(ROPE_FREQS)}
#: soft-capped logits (Gemma 2's attn_logit_softcapping 50; 20 and 5 cap harder): pre-cap logit
#: variance ~1, ~3.8 and ~13 (Q/K scale 1, 1.4, 1.9 at unit input), input correlation 0 to 0.9
_SOFTCAP_GRID = {**_MODERN, "softcap": (5.0, 20.0, 50.0), "x_std": (1.0,), "x_corr": (0.0, 0.5, 0.9),
                 "g_corr": (0.5,), "d": (256,), "n_heads": (4,), "d_head": (64,), "L": (64,),
                 "wqk_std_sqrt_d": (1.0, 1.4, 1.9), "p": (0.0, 1 / 3), "causal": (0, 1)}

#: sliding windows: W = 1 (each row its own key), 5 (a few keys), 32 (L/2 at 64 tokens, more than
#: L at 16) and 300 (beyond L: causal, global; bidirectional, shorter rows at both ends at 256),
#: bidirectional and causal, without and with rotary positions
_WINDOW_GRID = {**_MODERN, "window": (1, 5, 32, 300), "x_std": (1.0,), "x_corr": (0.0, 0.5), "g_corr": (0.5,),
                "d": (256,), "n_heads": (4,), "d_head": (64,), "L": (16, 64, 256),
                "wqk_std_sqrt_d": (0.6, 1.4), "rope": (0.0, 1e4), "p": (0.0,), "causal": (0, 1)}

SWEEP = SweepSpec(
    component=COMPONENT,
    grid=_GRID,
    make_case=_case,
    published={"x_mean": (0.2, 1.0, 2.5), "x_var": (1.4, 4.1, 7.8), "g_var": (2.2, 13.3, 44.5),
               "x_corr": (1.3, 3.9, 7.4), "g_corr": (1.6, 4.5, 8.2)},
    note="Published grid, single head (n_heads=1, d_head=dk); Wo std 1/sqrt(d) so the "
         "gradient reaching the attention core has the grid's variance.",
    variants={
        "causal": {"grid": {**_GRID, "causal": (1,)}, "note": "published grid, causal mask"},
        "multihead": {"grid": {**{k: v for k, v in _GRID.items() if k not in ("d", "d_head")},
                               "n_heads": (2, 4, 8), "d_head": (32, 64, 128)},
                      "note": "multi-head, d = n_heads * d_head. Measured at the published grid's sampling "
                              "(BUDGET, at most 512 sequences: 8 to a few hundred per point), before per-point "
                              "standard errors were stored; not re-run (8x the sequences: ~4 h on two shared "
                              "cores). Its two worst gradient points re-measured with 8x the sequences "
                              "(heavy-tailed key column sums: r 2/3, Q/K scale 0.6, L 547 and 1000): -10.2% -> "
                              "-7.0% (SE 3.7%) and -10.1% -> -2.9% (SE 0.9%): mostly noise, with a possible "
                              "~3% bias left there."},
        "gqa": {"published_forms": False, "grid": _GQA_GRID, "note": "grouped-query and multi-query attention: 8 query heads of 32 "
                "sharing 1, 2 or 4 key/value heads (d 256), 32 and 128 tokens; bidirectional and causal. "
                "The rule's moments do not depend on kv_heads (exact in expectation). The errors are "
                "the Monte Carlo's noise: in standard errors they follow Student's t with 7 degrees of "
                "freedom (8 weight draws; p50 / p90 / p99 0.71 / 1.89 / 3.50 for pure noise), and the "
                "p99 is what the noise alone gives; below 2% would take ~1.7x the sequences."},
        "qknorm": {"published_forms": False, "grid": _QKNORM_GRID, "note": "QK-norm (LayerNorm and RMSNorm per head, eps 1e-5) over a 20x range of Q/K weight scales "
                 "and a 10x range of input scales, d 128 and 512, d_head 32 and 64, 32 and 128 tokens; "
                 "bidirectional and causal; 8x the published grid's sampling budget (at least 8 weight "
                 "draws), with per-point standard errors. The rule carries the normalised keys' "
                 "platykurtic logits by an Edgeworth term, the n/(n - 2) factor of each query's and key's "
                 "inverse squared scale in the backward, and the norm's projection off the attended keys. "
                 "The noise alone gives a p99 of 2.8% for both variances (table below), so a p99 below 2% "
                 "is out of this sweep's reach whatever the rule. Left: at d 128 (4 heads of 32 or 64, r "
                 "0) x var +1% .. +2% (1.5-3 SE), and at d_head 16 the query and key paths +3% (16 keys) "
                 "to +7.5% (64 keys) at d 128, +2% .. +3% at d 512: second order in 1/dh and the small "
                 "width's weight anisotropy, not in the rule."},
        "softcap": {"published_forms": False, "grid": _SOFTCAP_GRID, "note": "soft-capped logits (c tanh(s / c), c 5, 20 and 50) at pre-cap logit variances ~1, ~3.8 "
                 "and ~13, input correlation 0, 0.5 and 0.9, bidirectional and causal (d 256, 4 heads of "
                 "64, 64 tokens, gradient correlation 0.5), attention dropout 0 and 1/3; 108 points. "
                 "Noise: the per-point standard errors alone give a p99 of 2.4% (x var) and 3.0% (g var). "
                 "The uncapped rule scored on the same measurements: x var p50 / p90 / p99 1.10 / 15.6 / "
                 "372 %, g var 2.37 / 76.9 / 344 %."},
        "rope_freqs": {"published_forms": False, "grid": _ROPE_FREQS_GRID, "note": "rotary positions given by their frequencies (ROPE_FREQS: Llama 3.1's llama3 scaling, "
                 "Pythia's quarter of each head, yarn with its attention factor, longrope on three "
                 "quarters of each head with its factor on the rotated planes), on the rope grid's other "
                 "axes; 48 points, seed 2: x var p50 / p90 / p99 0.68 / 1.51 / 2.80 %, g var 0.84 / 5.69 / "
                 "11.99 %. By vector, max |g var error|: llama3 1.7%, yarn4 2.9%, partial25 5.7% (r 0.9, L "
                 "64, 10 SE: a quarter of the planes rotating is few active frequencies, as base 5e5 on "
                 "the rope grid), longrope75 13.8%: with RMS QK-norm the gradient is 7% to 14% high even "
                 "at r 0 (19 to 25 SE). That is QK-norm's backward at a logit variance of s^4 (the factor "
                 "multiplies the normalised queries and keys: ~3 to 4, where QK-norm alone gives ~1), not "
                 "the partial-rotary approximation: at r 0, L 64, causal, a fully rotated head with s = "
                 "sqrt 2 (exact in the rule) is +11.5% (SE 0.6%), longrope75 itself +8.1%, and without the "
                 "factor +0.1% (8 draws x 16 sequences). Without QK-norm longrope75 is +1.3% (r 0) and "
                 "+1.6% (r 0.5) at L 64 (2.4 SE)."},
        "window": {"published_forms": False, "grid": _WINDOW_GRID, "note": "sliding windows (window 1, 5, 32 and 300 keys) at 16, 64 and 256 "
                   "tokens, bidirectional (centred, shorter rows at the ends) and causal, without and with rotary "
                   "positions (base 1e4), input correlation 0 and 0.5, Q/K scale 0.6 and 1.4 (d 256, 4 heads of 64, "
                   "gradient correlation 0.5)."},
        "rope": {"published_forms": False, "grid": _ROPE_GRID, "note": "rotary positions (bases 1e4 and 5e5), input correlation up to 0.9, 16, 64 and 256 "
                 "tokens, logit variance up to ~4, without and with RMS QK-norm; bidirectional and causal "
                 "(d 256, 4 heads of 64); 120 points. Noise: the per-point standard errors (median 0.8%, "
                 "up to 2.4% at r 0.9 with large logits) alone give a p99 of 2.7% (x var) and 2.8% (g "
                 "var), see the table below, so a p99 below 2% is out of this sweep's reach whatever the "
                 "rule. The gradient points beyond the noise (Student's t(7): |error| > 3.5 SE) come from "
                 "three approximations, measured by path on single points (8 to 16 weight draws x 16 "
                 "sequences, seeds 1 and 2): (1) the query path's rotated shared key takes the attended "
                 "keys' positions as independent of the key-shared field, while attention follows the "
                 "field (r 0.9, base 5e5, L 64: the query path +14%, the point's gradient +7%); (2) the "
                 "two-row statistics take a row's logits as iid over the keys, while the field correlates "
                 "them (r 0.5, causal, L 256: the point's gradient -5%); (3) few active frequencies at r "
                 "0.9, base 5e5, L 256 (-2% to -6% in total over two seeds, within the noise). The QK-norm "
                 "points with dropout at L 256 are +2.4% to +2.9% (5 to 10 SE), a QK-norm term at long "
                 "rows."},
    },
)
