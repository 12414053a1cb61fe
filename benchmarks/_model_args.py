"""Shared by the benchmark scripts that simulate one floor-sized model: its command-line
options and its sampled weight draws."""

from __future__ import annotations

import argparse


def add_model_args(ap: argparse.ArgumentParser, dropout: float) -> None:
    """The model's options (architecture, init, block placement, sizes, dropout) and the
    sampling's (weight draws, batch, seed), with the accuracy floor's sizes as defaults."""
    ap.add_argument("--arch", default="preln")
    ap.add_argument("--init", default="normal")
    ap.add_argument("--placement", default="output", help="'preset': the preset's own")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=dropout)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)


def sampled_trials(m, seed: int, trials: int, batch: int):
    """Yields (t, rng, trial, X) for each weight draw of the whole-model Monte Carlo: the draw's
    own random stream (``sigprop.mc.model.trial_seeds``), its sampled model (float64) and an input
    batch (batch, seq, d_model) with the model's input moments, drawn from that stream."""
    import numpy as np

    from sigprop.mc import model as mcm
    from sigprop.mc.backend import Rng, as_rng, numpy_backend
    from sigprop.mc.sampling import correlated

    for t, ts in enumerate(mcm.trial_seeds(seed, trials)):
        rng = as_rng(Rng(ts, numpy_backend(), "host"))
        tr = mcm._Trial(m, rng, np.float64)
        X = correlated(rng, (batch, m.seq_len, m.d_model), m.input.mean, m.input.var, m.input.corr,
                       np.float64)
        yield t, rng, tr, X
