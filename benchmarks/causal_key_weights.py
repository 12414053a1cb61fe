"""How far a causal model's attention is from exchangeable keys: the Monte Carlo's mean attention
weight on the first keys, n_i E[P_ij] (1 for exchangeable keys, what the attention rule and the
causal position model assume), and the first position's token correlation with the others
against the mean over pairs, at every attention layer.

    python benchmarks/causal_key_weights.py [--arch preln] [--init normal] [--placement output]
        [--layers 48] [--d-model 256] [--heads 4] [--d-ff 1024] [--seq-len 128]
        [--dropout 0] [--trials 4] [--batch 4] [--seed 0] [--every 6]

Forward passes only, through `sigprop check`'s own sublayers (sigprop.mc.model): the weights are
the softmax probabilities of the simulation itself (before attention dropout), averaged over the
draws, the batch, the heads and the rows of the second half of the sequence; standard errors
over the draws.  Printed per reported layer: the row logit scale the prediction uses (its mean
logit variance), n_i E[P_ij] for keys j = 0, 1, 2, 3, corr(position 0, others) against the
mean correlation over pairs of positions at the attention's input, and, in the last row, the
variance of key 0's logit about the row's mean logit against the median over the other keys."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sigprop.mc import model as mcm
from sigprop.mc.backend import Rng, as_rng, numpy_backend
from sigprop.mc.sampling import correlated
from sigprop.model.predict import Predictor, predict
from sigprop.model.presets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the shared benchmark helpers
from _model_args import add_model_args  # noqa: E402

KEYS = (0, 1, 2, 3)


def _probs(cache):
    return cache["P"] if isinstance(cache, dict) else cache[4]


def _logits(cache):
    """The pre-softmax logits Qs K^T (B, H, L, L) of a forward's cache."""
    Qs, K = (cache["Qs"], cache["Ke"]) if isinstance(cache, dict) else (cache[1], cache[2])
    return np.asarray(Qs) @ np.swapaxes(np.asarray(K), -1, -2)


def measure(m, trials: int, batch: int, seed: int):
    """Forward passes of the causal model ``m`` through the Monte Carlo's sublayers, trial t
    from the t-th child of SeedSequence(seed), float64: per trial and attention layer, (the
    mean n_i P_ij over the batch, the heads and the rows i >= L/2, for the keys j in KEYS;
    (corr(position 0, the others), the mean correlation over pairs) at the attention's input;
    (key 0's, the median other key's) variance of the last row's logit about its row mean)."""
    L = m.seq_len
    kinds = mcm._kinds(m)
    n = np.arange(1.0, L + 1)
    rows = slice(L // 2, L)
    weights = np.zeros((trials, m.n_layers, len(KEYS)))
    corr0 = np.zeros((trials, m.n_layers, 2))
    zvar = np.zeros((trials, m.n_layers, 2))
    for t, ts in enumerate(mcm.trial_seeds(seed, trials)):
        rng = as_rng(Rng(ts, numpy_backend(), "host"))
        tr = mcm._Trial(m, rng, np.float64)
        fwd = tr.attn.forward
        got = {}

        def recording(X, W, params, r, _fwd=fwd, _got=got):
            Y, cache = _fwd(X, W, params, r)
            P = np.asarray(_probs(cache))                          # (B, H, L, L)
            _got["w"] = [float(np.mean(P[:, :, rows, j] * n[rows])) for j in KEYS]
            z = _logits(cache)[:, :, -1, :]                        # the last row's logits
            z = z - z.mean(axis=-1, keepdims=True)
            zv = np.mean(z * z, axis=(0, 1))
            _got["z"] = (float(zv[0]), float(np.median(zv[1:])))
            K = np.einsum("bif,bjf->ij", X, X) / (X.shape[0] * X.shape[2])
            C = K / np.sqrt(np.outer(np.diag(K), np.diag(K)))
            off = ~np.eye(L, dtype=bool)
            _got["c"] = (float(C[0, 1:].mean()), float(C[off].mean()))
            return Y, cache

        tr.attn.forward = recording                 # this trial's component instance only
        try:
            X = correlated(rng, (batch, L, m.d_model), m.input.mean, m.input.var, m.input.corr, np.float64)
            for l in range(m.n_layers):
                for kind in kinds:
                    X, _, _ = tr.step(kind, l, X)
                    if kind == "attention":
                        weights[t, l], corr0[t, l], zvar[t, l] = got["w"], got["c"], got["z"]
        finally:
            del tr.attn.forward
    return weights, corr0, zvar


def predicted_weights(m) -> list:
    """Per attention layer, the prediction's n_i E[P_ij] for the keys in KEYS averaged over the
    rows i >= L/2 (None where the layer has no per-key weights)."""
    pr = Predictor(m)
    recs = pr.forward()
    L = m.seq_len
    out = []
    for rec in recs:
        if rec.kind != "attention":
            continue
        kw = rec.key_w
        if kw is None:
            out.append(None)
            continue
        w1 = kw[0]
        if pr.grid is None:
            rows = np.arange(L // 2, L)
            out.append([float(np.mean(w1[rows, j])) for j in KEYS])
        else:
            G = pr.grid
            sel = G.x >= L // 2
            wt = G.q[sel] / G.q[sel].sum()
            col = [int(np.nonzero(G.x == j)[0][0]) for j in KEYS]
            out.append([float(wt @ w1[sel, c]) for c in col])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap, dropout=0.0)
    ap.add_argument("--every", type=int, default=6)
    ap.add_argument("--no-predict", action="store_true", help="skip the prediction's logit variances")
    a = ap.parse_args()
    L = a.seq_len
    kw = {} if a.placement in ("", "preset") else {"placement": a.placement}
    m = resolve(a.arch, a.init, n_layers=a.layers, d_model=a.d_model, n_heads=a.heads, d_ff=a.d_ff,
                seq_len=L, dropout=a.dropout, causal=True, **kw)
    weights, corr0, zvar = measure(m, a.trials, a.batch, a.seed)
    lv = pw = None
    if not a.no_predict:
        pts = predict(m)
        lv = [p.logit_var for p in pts if p.sublayer == "attention"]
        pw = predicted_weights(m)
    se = lambda x: x.std(axis=0, ddof=1) / np.sqrt(a.trials)      # noqa: E731
    out = []
    for l in range(0, a.layers, a.every):
        out.append(dict(layer=l + 1, logit_var=None if lv is None else round(lv[l], 3),
                        key_weight=np.round(weights[:, l].mean(axis=0), 3).tolist(),
                        key_weight_se=np.round(se(weights[:, l]), 3).tolist(),
                        pred_key_weight=None if pw is None or pw[l] is None else np.round(pw[l], 3).tolist(),
                        corr_pos0=round(float(corr0[:, l, 0].mean()), 3), corr_mean=round(float(corr0[:, l, 1].mean()), 3),
                        last_row_logit_var_key0=round(float(zvar[:, l, 0].mean()), 3),
                        last_row_logit_var_median=round(float(zvar[:, l, 1].mean()), 3)))
    print(json.dumps(dict(arch=a.arch, init=a.init, placement=a.placement, layers=a.layers, d_model=a.d_model,
                          heads=a.heads, seq_len=L, dropout=a.dropout, trials=a.trials, batch=a.batch, seed=a.seed, keys=list(KEYS),
                          rows=f"{L // 2}..{L - 1}")))
    for row in out:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
