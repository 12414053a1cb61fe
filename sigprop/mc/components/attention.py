"""Multi-head scaled dot-product attention: Monte Carlo component and published sweep.

Forward (contract.md, attention F), per head h with width ``d_head``::

    Q = X Wq + bq,  K = X Wk + bk,  V = X Wv + bv          (d -> n_heads * d_head)
    S = Q K^T / sqrt(d_head)  (+ causal mask: key j > query i removed)
    P = softmax(S) row-wise;  A = Dropout_p(P)  (keep 1-p, rescale 1/(1-p))
    O = A V;  Y = concat_h(O) Wo + bo                       (n_heads * d_head -> d)

The backward is written by hand through Wo, the value product, attention dropout, the
softmax (with its mask), and the query and key products back to X.  Arrays are
(B, H, L, d_head) and (B, H, L, L) so that every contraction is one batched ``np.matmul``.
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

from sigprop.mc.component import Component
from sigprop.mc.components._util import grid_std
from sigprop.mc.sweep import Case, SweepSpec
from sigprop.state import Backward, Forward

_NAMES = ("q", "k", "v")


class AttentionMC(Component):
    name = "attention"
    rule = "attention"

    def dims(self, params):
        return params["L"], params["d"], params["d"]

    def sample_weights(self, rng, params, dtype):
        """Wq, Wk, Wv side by side in one (d, 3 H dh) matrix (one GEMM each way)."""
        d, H, dh = params["d"], params.get("n_heads", 1), params["d_head"]
        hd = H * dh
        qkv = np.empty((d, 3 * hd), dtype=dtype)
        bias = np.zeros(3 * hd, dtype=dtype)
        for i, nm in enumerate(_NAMES):
            blk = rng.standard_normal((d, hd), dtype=dtype)
            blk *= dtype(params[f"{nm}_std"])
            qkv[:, i * hd:(i + 1) * hd] = blk
            bstd = params.get(f"{nm}_bias_std", 0.0)
            if bstd:
                bias[i * hd:(i + 1) * hd] = rng.standard_normal(hd, dtype=dtype) * dtype(bstd)
        wo = rng.standard_normal((hd, d), dtype=dtype)
        wo *= dtype(params["o_std"])
        bo_std = params.get("o_bias_std", 0.0)
        bo = rng.standard_normal(d, dtype=dtype) * dtype(bo_std) if bo_std else None
        return {"qkv": qkv, "qkvT": np.ascontiguousarray(qkv.T), "bqkv": bias if bias.any() else None,
                "o": wo, "oT": np.ascontiguousarray(wo.T), "bo": bo}

    def forward(self, X, W, params, rng):
        dtype = X.dtype.type
        B, L, d = X.shape
        H, dh = params.get("n_heads", 1), params["d_head"]
        p = params.get("p", 0.0)
        Z = X.reshape(B * L, d) @ W["qkv"]                       # (B L, 3 H dh)
        if W["bqkv"] is not None:
            Z += W["bqkv"]
        Z = Z.reshape(B, L, 3, H, dh).transpose(2, 0, 3, 1, 4)   # (3, B, H, L, dh)
        Qs = Z[0] * dtype(1.0 / np.sqrt(dh))                     # scaled queries
        K, V = Z[1], Z[2]
        S = np.matmul(Qs, K.transpose(0, 1, 3, 2))              # (B, H, L, L)
        if params.get("causal", 0):
            S += np.triu(np.full((L, L), -np.inf, dtype=dtype), 1)
        S -= S.max(axis=-1, keepdims=True)
        P = np.exp(S, out=S)
        P /= P.sum(axis=-1, keepdims=True)
        if p > 0:
            mask = (rng.random(P.shape, dtype=np.float32) >= p).astype(dtype)
            mask *= dtype(1.0 / (1.0 - p))
            A = P * mask
        else:
            mask, A = None, P
        O = np.matmul(A, V)                                      # (B, H, L, dh)
        Y = O.transpose(0, 2, 1, 3).reshape(B * L, H * dh) @ W["o"]
        if W["bo"] is not None:
            Y += W["bo"]
        return Y.reshape(B, L, d), (W, Qs, K, V, P, mask, A, H, dh)

    def _core_backward(self, GY, cache):
        """Gradients with respect to Q, K and V, each (B, H, L, dh)."""
        W, Qs, K, V, P, mask, A, H, dh = cache
        dtype = GY.dtype.type
        B, L, d = GY.shape
        GO = (GY.reshape(B * L, d) @ W["oT"]).reshape(B, L, H, dh).transpose(0, 2, 1, 3)
        dV = np.matmul(A.transpose(0, 1, 3, 2), GO)              # A^T G
        dP = np.matmul(GO, V.transpose(0, 1, 3, 2))              # G V^T, then through dropout
        if mask is not None:
            dP *= mask
        rowdot = np.einsum("bhij,bhij->bhi", P, dP)[..., None]    # sum_j P_ij dP_ij
        dP -= rowdot
        dP *= P                                                  # dS = P (dP - rowdot)
        s = dtype(1.0 / np.sqrt(dh))
        dQ = np.matmul(dP, K)
        dQ *= s
        dK = np.matmul(dP.transpose(0, 1, 3, 2), Qs)             # Qs carries the 1/sqrt(dh)
        return dQ, dK, dV

    def backward(self, GY, cache):
        B, L, d = GY.shape
        H, dh = cache[-2], cache[-1]
        grads = self._core_backward(GY, cache)
        Z = np.empty((B, L, 3, H, dh), dtype=GY.dtype)
        for i, g in enumerate(grads):
            Z[:, :, i] = g.transpose(0, 2, 1, 3)
        return (Z.reshape(B * L, 3 * H * dh) @ cache[0]["qkvT"]).reshape(B, L, d)

    def backward_paths(self, GY, cache) -> dict:
        """dLoss/dX split into the query, key and value paths (for diagnostics and tests)."""
        B, L, d = GY.shape
        W, H, dh = cache[0], cache[-2], cache[-1]
        hd = H * dh
        out = {}
        for i, (nm, g) in enumerate(zip(_NAMES, self._core_backward(GY, cache))):
            Zc = g.transpose(0, 2, 1, 3).reshape(B * L, hd)
            out[nm] = (Zc @ W["qkvT"][i * hd:(i + 1) * hd]).reshape(B, L, d)
        return out

    def flops(self, params, batch):
        L, d, _ = self.dims(params)
        hd = params.get("n_heads", 1) * params["d_head"]
        # projections (3 fwd + 1 out; backward twice that) and the four L x L products
        return 2.0 * batch * (12 * L * d * hd + 6 * L * L * hd)


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
    noise is ~ sqrt(2 / (sequences x k)), k = 1/(1/(H dh) + 1/d) the dimension that vector
    lives in: sequences = BUDGET / k.  (2) Logits with a large token-shared part
    s = r (1-r) s2^2 wqk^4 (the logit variance a key carries into every row): a key's column
    sum is lognormal with log-variance s, the gradient variance is a heavy-tailed average
    over keys, and ~ HEAVY sqrt(300 / L) (e^s - 1)/(e^2.88 - 1) sequences are needed for ~5%.
    Batches are capped so that one (B, H, L, L) array stays near 64 MB; at least 4 weight draws."""
    H, dh = pt.get("n_heads", 1), pt["d_head"]
    d = pt.get("d", H * dh)
    L = pt["L"]
    k = 1.0 / (1.0 / (H * dh) + 1.0 / d)
    n_seq = BUDGET / k
    s2 = grid_std(pt["x_std"]) ** 2
    r = pt["x_corr"]
    shared = r * (1 - r) * s2**2 * pt["wqk_std_sqrt_d"] ** 4
    n_seq = max(n_seq, HEAVY * np.sqrt(300.0 / L) * np.expm1(shared) / np.expm1(2.88))
    n_seq = int(min(_MAX_SEQ, max(8, round(n_seq))))
    bmax = max(2, int(16e6 / (H * L * L)))
    runs = max(4, int(np.ceil(n_seq / bmax)))
    return runs, int(np.ceil(n_seq / runs))


def _case(pt: dict) -> Case:
    H, dk = pt.get("n_heads", 1), pt["d_head"]
    d = pt.get("d", H * dk)
    rule = {"d": d, "n_heads": H, "d_head": dk, "L": pt["L"],
            "q_std": pt["wqk_std_sqrt_d"] / np.sqrt(d), "k_std": pt["wqk_std_sqrt_d"] / np.sqrt(d),
            "v_std": pt["wv_std_sqrt_d"] / np.sqrt(d), "o_std": 1.0 / np.sqrt(d),
            "p": pt["p"], "causal": pt.get("causal", 0)}
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
                      "note": "multi-head, d = n_heads * d_head"},
    },
)
