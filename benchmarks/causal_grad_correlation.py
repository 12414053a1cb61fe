"""How the gradient's correlation over positions enters a causal attention branch: the Monte
Carlo's actual gradient against the prediction's covariance over positions, at chosen layers.

    python benchmarks/causal_grad_correlation.py [--arch preln] [--init normal] [--placement output]
        [--layers 48] [--d-model 256] [--heads 4] [--d-ff 1024] [--seq-len 128]
        [--dropout 0.1] [--trials 4] [--batch 4] [--seed 0] [--at 13,25,43] [--no-predict]

Monte Carlo (float64, sigprop.mc.model's sublayers, trial t from the t-th child of
SeedSequence(seed); the top gradient iid N(0, 1), seeded by (seed, trial)): a forward and a
backward pass of the whole model; at the attention sublayer of each layer in ``--at``, with G the
actual gradient at the sublayer's output, the branch's gradient energy (the sublayer's backward
minus the skip path) for G and for G with every (sequence, position) multiplied by an independent
random sign (the same per-position profile, the correlation between positions removed), in units
of G's mean square: their ratio ``real/resigned`` says how much the gradient's correlation over
positions changes the branch's gradient.  Also G's correlation between the first positions
(pairs (0, 1), (0, 2), (1, 2)), its mean correlation over pairs of positions and its variance
profile at positions 0 and 1 (over the mean).

Prediction (unless ``--no-predict``): the same quantities from the predictor's covariance over
positions of the gradient entering that sublayer (sigprop.model.predict, its position grid),
and its branch gain for that covariance against the same covariance with the off-diagonal
removed (``real/diag``), both for a unit gradient at the branch output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from sigprop.mc import model as mcm
from sigprop.model.presets import resolve

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the shared benchmark helpers
from _model_args import add_model_args, sampled_trials  # noqa: E402

PAIRS = ((0, 1), (0, 2), (1, 2))


def measure(m, trials: int, batch: int, seed: int, at: list) -> dict:
    """Per layer in ``at``: lists over the trials (keys (layer, name))."""
    d, L = m.d_model, m.seq_len
    kinds = mcm._kinds(m)
    out: dict = {}
    add = lambda l, k, v: out.setdefault((l, k), []).append(float(v))   # noqa: E731
    for t, rng, tr, X in sampled_trials(m, seed, trials, batch):
        backs = []
        for l in range(m.n_layers):
            for kind in kinds:
                X, back, _ = tr.step(kind, l, X)
                backs.append((l + 1, kind, back))
        X = None
        g0 = np.random.default_rng([seed, t])
        G = g0.standard_normal((batch, L, d))
        for l, kind, back in reversed(backs):
            if kind == "attention" and l in at:
                ms = float(np.mean(G * G))
                K = np.einsum("bif,bjf->ij", G, G) / (batch * d)
                dg = np.sqrt(np.diag(K))
                C = K / np.outer(dg, dg)
                add(l, "mean_corr", (K.sum() - np.trace(K)) / (L * (L - 1)) / (np.trace(K) / L))
                for i, j in PAIRS:
                    add(l, f"corr_{i}{j}", C[i, j])
                add(l, "prof_0", K[0, 0] / np.mean(np.diag(K)))
                add(l, "prof_1", K[1, 1] / np.mean(np.diag(K)))
                real = float(np.mean((back(G.copy()) - G) ** 2)) / ms
                Gs = G * np.where(g0.random((batch, L, 1)) < 0.5, -1.0, 1.0)
                resigned = float(np.mean((back(Gs.copy()) - Gs) ** 2)) / ms
                add(l, "real/resigned", real / resigned)
            G = back(G)
    return out


def predicted(m, at: list) -> dict:
    """Per layer in ``at``: the predictor's gradient covariance over positions entering that
    attention sublayer (correlations of the first positions, profile, mean correlation) and its
    branch gain for it against the diagonal-only covariance."""
    from sigprop.model import predict as P
    from sigprop.state import Backward

    pr = P.Predictor(m)
    recs = pr.forward()
    grid = pr.grid
    got = {}
    orig = pr._branch_backward

    def spy(rec, g, w):
        if rec.kind == "attention" and rec.layer in at and w is not None and rec.layer not in got:
            xs = list(np.asarray(grid.x)) if grid is not None else list(range(m.seq_len))
            dg = np.sqrt(np.diag(w))
            C = w / np.outer(dg, dg)
            mean_d = grid.mean_diag(w) if grid is not None else float(np.mean(np.diag(w)))
            row = {"mean_corr": grid.mean_off(w) / mean_d if grid is not None
                   else (w.sum() - np.trace(w)) / (len(w) * (len(w) - 1)) / mean_d}
            for i, j in PAIRS:
                row[f"corr_{i}{j}"] = float(C[xs.index(i), xs.index(j)]) if i in xs and j in xs else None
            row["prof_0"] = float(w[xs.index(0), xs.index(0)] / mean_d) if 0 in xs else None
            row["prof_1"] = float(w[xs.index(1), xs.index(1)] / mean_d) if 1 in xs else None
            wd = np.zeros_like(w)
            np.fill_diagonal(wd, np.diag(w))
            g1, _, k1, _ = orig(rec, Backward(1.0, g.corr), w)
            g2, _, k2, _ = orig(rec, Backward(1.0, g.corr), wd)
            row["real/diag"] = float(g1.var * k1 / (g2.var * k2))
            got[rec.layer] = row
        return orig(rec, g, w)

    pr._branch_backward = spy
    pr.backward(recs)
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap, dropout=0.1)
    ap.add_argument("--at", default="13,25,43", help="comma list of layers (1-based)")
    ap.add_argument("--no-predict", action="store_true")
    a = ap.parse_args()
    at = sorted({int(x) for x in a.at.split(",")})
    if a.trials < 2 or not at or at[0] < 1 or at[-1] > a.layers:
        raise SystemExit("causal_grad_correlation: --trials >= 2 and layers in 1..--layers")
    kw = {} if a.placement in ("", "preset") else {"placement": a.placement}
    m = resolve(a.arch, a.init, n_layers=a.layers, d_model=a.d_model, n_heads=a.heads, d_ff=a.d_ff,
                seq_len=a.seq_len, dropout=a.dropout, causal=True, **kw)
    res = measure(m, a.trials, a.batch, a.seed, at)
    pred = {} if a.no_predict else predicted(m, at)
    print(json.dumps(dict(arch=a.arch, init=a.init, placement=a.placement, layers=a.layers, d_model=a.d_model,
                          heads=a.heads, d_ff=a.d_ff, seq_len=a.seq_len, dropout=a.dropout, trials=a.trials,
                          batch=a.batch, seed=a.seed)))
    for l in at:
        row = {"layer": l}
        for (ll, k), v in sorted(res.items()):
            if ll == l:
                v = np.array(v)
                row[k] = [round(float(v.mean()), 4), round(float(v.std(ddof=1) / np.sqrt(len(v))), 4)]
        if l in pred:
            row["predicted"] = {k: (None if v is None else round(v, 4)) for k, v in pred[l].items()}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
