"""Shared by the benchmark scripts that simulate one floor-sized model: its command-line options."""

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
