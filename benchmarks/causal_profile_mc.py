"""The input gradient's position profile (variance at a position over the mean over positions)
predicted (on the position node grid beyond 64 positions) against a seeded Monte Carlo, at positions 0, 1, 2, 10, 100, L-1.

    python benchmarks/causal_profile_mc.py [--arch dslm] [--layers 4] [--seq-len 1024]
        [--d-model 32] [--trials 8] [--batch 2] [--seed 0]

The Monte Carlo runs `sigprop check`'s own sublayers (sigprop.mc.model) and backpropagates a
gradient of the model's upstream statistics through them; the standard error is over trials."""

from __future__ import annotations

import argparse
import json

import numpy as np

from sigprop.mc.model import input_gradient_profile
from sigprop.model.predict import Predictor, with_gains
from sigprop.model.presets import resolve


def measure(arch: str, init: str | None, layers: int, L: int, d_model: int, trials: int, batch: int,
            seed: int, positions: list[int] | None = None) -> dict:
    """The predicted input-gradient profile at ``positions`` (default 0, 1, 2, 10, 100, L-1)
    and the Monte Carlo's mean and standard error over ``trials`` (seeded)."""
    m = resolve(arch, init, n_layers=layers, causal=True, seq_len=L, d_model=d_model, n_heads=2,
                d_ff=4 * d_model, dropout=0.0)
    pr = Predictor(m)
    recs = pr.forward()
    recs = with_gains(recs, pr.backward(recs)[1])
    pos = positions if positions is not None else [0, 1, 2, 10, 100, L - 1]
    prof = recs[0].g_prof
    if pr.grid is not None:   # the node grid's profile, interpolated to each position
        pred = [float(v) for v in pr.grid.at(prof, pos)]
    else:
        pred = [float(prof[i]) for i in pos]
    rng = np.random.default_rng(seed)
    per = []
    for _ in range(trials):
        v = input_gradient_profile(m, batch, rng)
        per.append(v[pos] / v.mean())
    per = np.array(per)
    mc, se = per.mean(axis=0), per.std(axis=0, ddof=1) / np.sqrt(trials)
    return dict(arch=arch, init=init, layers=layers, L=L, d_model=d_model, trials=trials, batch=batch,
                seed=seed, positions=pos, predicted=pred, mc=mc.tolist(), se=se.tolist())


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
    print(json.dumps(measure(a.arch, a.init, a.layers, a.seq_len, a.d_model, a.trials, a.batch, a.seed)))


if __name__ == "__main__":
    main()
