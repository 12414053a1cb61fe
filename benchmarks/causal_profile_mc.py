"""The input gradient's position profile (variance at a position over the mean over positions)
predicted on the graded grid against a seeded Monte Carlo, at positions 0, 1, 2, 10, 100, L-1.

    python benchmarks/causal_profile_mc.py [--arch dslm] [--layers 4] [--seq-len 1024]
        [--d-model 32] [--trials 8] [--batch 2] [--seed 0]

The Monte Carlo runs `sigprop check`'s own sublayers (sigprop.mc.model) and backpropagates a
gradient of the model's upstream statistics through them; the standard error is over trials."""

from __future__ import annotations

import argparse
import json

import numpy as np

from sigprop.mc.model import input_gradient_profile
from sigprop.model.predict import Predictor
from sigprop.model.presets import resolve


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="dslm")
    ap.add_argument("--init", default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    L = a.seq_len
    m = resolve(a.arch, a.init, n_layers=a.layers, causal=True, seq_len=L, d_model=a.d_model, n_heads=2,
                d_ff=4 * a.d_model, dropout=0.0)
    pr = Predictor(m)
    recs = pr.forward()
    pr.backward(recs)
    pos = [0, 1, 2, 10, 100, L - 1]
    prof = recs[0].g_prof
    if pr.grid is not None:
        pred = [float(prof[int(np.searchsorted(pr.grid.end, i, side="right"))]) for i in pos]
    else:
        pred = [float(prof[i]) for i in pos]
    rng = np.random.default_rng(a.seed)
    per = []
    for _ in range(a.trials):
        v = input_gradient_profile(m, a.batch, rng)
        per.append(v[pos] / v.mean())
    per = np.array(per)
    mc, se = per.mean(axis=0), per.std(axis=0, ddof=1) / np.sqrt(a.trials)
    print(json.dumps(dict(arch=a.arch, init=a.init, layers=a.layers, L=L, d_model=a.d_model, trials=a.trials,
                          batch=a.batch, seed=a.seed, positions=pos, predicted=pred, mc=mc.tolist(), se=se.tolist())))


if __name__ == "__main__":
    main()
