"""One causal attention layer: the input gradient's covariance over the first positions, sampled
and by path (query, key, value), against the position model's (sigprop.model.profile).

    python benchmarks/causal_layer_cov.py [--d 64] [--heads 2] [--seq-len 16] [--dropout 0]
        [--corr 0.3] [--qk 1] [--upstream first|flat] [--rho 0.5] [--amp 10]
        [--qk-norm 0|1|2] [--rope BASE] [--trials 100] [--batch 8] [--seed 0]

The input stream is exchangeable (shared-component Gaussian tokens, variance 1, correlation
``--corr``); W_q and W_k have std qk/sqrt(d) (row logit variance ~ qk^4 (1 - corr)), W_v and W_o
1/sqrt(d).  The upstream gradient is Gaussian with covariance over positions C (mean diagonal 1):
``first``: variance profile 1 + amp/(i + 1)^1.5 and correlation rho exp(-(i + k)/3) between
positions i != k (a deep causal stack's shape: the first positions carry the gradient and are
correlated); ``flat``: correlation rho everywhere.  Monte Carlo (float64, NumPy Generator seeded
with ``--seed``; new weights, inputs, dropout masks and gradients per trial):
sigprop.mc's attention component, its backward split by path.  Prediction: the position model's
covariance (profile._attention_cov) for the whole layer (``pred all``: with the value path's pair-of-rows
weights at the two rows' lengths, sigprop.model.pair_rows; ``pred all1``: with their first-order
form 1 - 1/min) and for each path alone (the rule's per-row terms by path, first-order weights).  Printed: entries (0,0) (1,1) (2,2) (3,3) (0,1) (0,2) (1,2) (0,5), the mean
diagonal and off-diagonal, and the standard errors over trials under each measured row."""

from __future__ import annotations

import argparse

import numpy as np

from sigprop.backend import numeric
from sigprop.mc.components.attention import AttentionMC
from sigprop.model import pair_rows
from sigprop.model import profile as PF
from sigprop.rules import attention as AT
from sigprop.rules import get
from sigprop.state import Backward, Forward

NAMES = ("q", "k", "v")
ENTRIES = ((0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (0, 2), (1, 2), (0, 5))


def upstream(kind: str, L: int, rho: float, amp: float) -> np.ndarray:
    i = np.arange(L)
    if kind == "flat":
        C = np.full((L, L), rho)
    else:
        C = rho * np.exp(-np.add.outer(i, i) / 3.0)
    np.fill_diagonal(C, 1.0)
    f = 1 + amp / (i + 1.0) ** 1.5
    C = C * np.sqrt(np.outer(f, f))
    return C / np.mean(np.diag(C))


def sampled(params: dict, C: np.ndarray, corr: float, trials: int, batch: int, seed: int) -> dict:
    """Per trial, the covariance over positions of each path's input gradient and of their sum."""
    comp = AttentionMC()
    rng = np.random.default_rng(seed)
    d, L = params["d"], params["L"]
    w, V = np.linalg.eigh(C)
    Lc = V * np.sqrt(np.clip(w, 0.0, None))
    out: dict = {}
    for _ in range(trials):
        W = comp.sample_weights(rng, params, np.float64)
        X = (np.sqrt(corr) * rng.standard_normal((batch, 1, d))
             + np.sqrt(1 - corr) * rng.standard_normal((batch, L, d)))
        _, cache = comp.forward(X, W, params, rng)
        G = np.einsum("ij,bjf->bif", Lc, rng.standard_normal((batch, L, d)))
        paths = comp.backward_paths(G, cache)
        tot = sum(paths.values())
        for nm, g in list(paths.items()) + [("all", tot)]:
            out.setdefault(nm, []).append(np.einsum("bif,bjf->ij", g, g) / (batch * d))
    return {k: np.array(v) for k, v in out.items()}


def path_rows(params: dict, x: Forward, full: dict) -> dict:
    """The per-row terms of each path alone (the rule's backward terms by path)."""
    p = get("attention").param_values(params)
    L = int(params["L"])
    n = np.arange(1.0, L + 1)
    c = AT._Ctx(numeric, x, p, bool(params.get("rope", 0)))
    bst = AT._backward_row_stats(numeric, c, lambda fn: c.at_n(fn, n))
    bst.update(C2=0 * n, T2x=0 * n, PP=0 * n, rvT2x=0 * n)
    t = AT._backward_terms(numeric, c, p, Backward(1.0, 0.0), bst)
    avg = AT._backward_stats(numeric, c, p)
    t0 = AT._backward_terms(numeric, c, p, Backward(1.0, 0.0), avg)
    t1 = AT._backward_terms(numeric, c, p, Backward(1.0, 1.0), avg)
    z = 0 * n
    out = {}
    for nm in NAMES:
        v, k, q = (nm == "v"), (nm == "k"), (nm == "q")
        out[nm] = {"var": z, "spread": t["val"] * v + t["key"] * k + z, "local": t["qry"] * q + z,
                   "same_c": (L - 1) * (t["val_c"] * v + t["key_c"] * k) + z, "same_k": (L - 1) * t["key_c"] * k + z,
                   "cross": float(t1["val_x"] * v + t1["key_x"] * k), "cross_k": float(t1["key_x"] * k),
                   "cross_u": float(full["cross_u"]) * v,
                   "cross_c": float((t1["val_c"] - t0["val_c"]) * v + (t1["key_c"] - t0["key_c"]) * k),
                   "qry_c": float(t1["qry_c"] * q)}
    return out


def show(name: str, M: np.ndarray, draws: np.ndarray | None = None) -> None:
    L = len(M)
    md, mo = np.mean(np.diag(M)), (M.sum() - np.trace(M)) / (L * (L - 1))
    print(f"{name:10s} " + " ".join(f"{M[i, j]:8.4f}" for i, j in ENTRIES) + f"  meandiag {md:8.4f} meanoff {mo:8.4f}")
    if draws is not None:
        se = draws.std(0, ddof=1) / np.sqrt(len(draws))
        print(" " * 11 + " ".join(f"{se[i, j]:8.4f}" for i, j in ENTRIES))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--corr", type=float, default=0.3)
    ap.add_argument("--qk", type=float, default=1.0)
    ap.add_argument("--upstream", default="first", choices=["first", "flat"])
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--amp", type=float, default=10.0)
    ap.add_argument("--qk-norm", type=int, default=0, choices=[0, 1, 2])
    ap.add_argument("--rope", type=float, default=0.0)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.trials < 2 or a.seq_len < 6 or a.d % a.heads:
        raise SystemExit("causal_layer_cov: --trials >= 2, --seq-len >= 6, --heads dividing --d")
    d, L = a.d, a.seq_len
    s = a.qk / np.sqrt(d)
    params = dict(d=d, n_heads=a.heads, d_head=d // a.heads, L=L, p=a.dropout, causal=1, q_std=s, k_std=s,
                  v_std=1 / np.sqrt(d), o_std=1 / np.sqrt(d), q_bias_std=0.0, k_bias_std=0.0, v_bias_std=0.0,
                  o_bias_std=0.0)
    if a.qk_norm:
        params.update(qk_norm=a.qk_norm, qk_eps=1e-6)
    if a.rope:
        params["rope"] = a.rope
    C = upstream(a.upstream, L, a.rho, a.amp)
    meas = sampled(params, C, a.corr, a.trials, a.batch, a.seed)
    x = Forward(np.float64(0.0), np.float64(1.0), np.float64(a.corr))
    full = PF._rows_direct(params, x)
    kap = PF._offset_kernel(params, None, L)
    rows = path_rows(params, x, full)
    print(f"seed {a.seed}, {a.trials} trials x batch {a.batch}; entries " + " ".join(map(str, ENTRIES)))
    for nm in NAMES:
        show("pred " + nm, PF._attention_cov(rows[nm], C, None, kap))
        show("meas " + nm, meas[nm].mean(0), meas[nm])
    # the position model with the first-order pair weights 1 - 1/min(n_i, n_i'), then with pair_rows'
    show("pred 1st-o", PF._attention_cov(full, C, None, kap))
    show("pred all", PF._attention_cov(full, C, None, kap, pair_rows.pair_weights(params, x, np.arange(1.0, L + 1))))
    show("meas all", meas["all"].mean(0), meas["all"])


if __name__ == "__main__":
    main()
