"""benchmarks/causal_profile_mc.py (the input gradient's position profile, predicted beside a
seeded Monte Carlo), small: it runs on the node grid (L > 64) and agrees where it should."""

import importlib.util
from pathlib import Path

import numpy as np

_spec = importlib.util.spec_from_file_location(
    "causal_profile_mc", Path(__file__).resolve().parents[1] / "benchmarks" / "causal_profile_mc.py")
cpm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cpm)


def test_profile_on_the_node_grid_against_monte_carlo():
    """DSLM, 2 layers, L 96 (beyond the exact position model): the gradient concentrates on
    the first positions in both the prediction and the simulation, and the late positions'
    profile agrees within 5 standard errors (plus 10%)."""
    r = cpm.measure("dslm", None, 2, 96, 16, trials=4, batch=2, seed=0, positions=[0, 1, 10, 95])
    pred, mc, se = map(np.asarray, (r["predicted"], r["mc"], r["se"]))
    assert np.all(np.isfinite(pred)) and pred[0] > 2 * pred[-1]
    assert mc[0] > 2 * mc[-1]
    assert np.all(np.abs(mc[2:] - pred[2:]) < 5 * se[2:] + 0.1 * pred[2:])
