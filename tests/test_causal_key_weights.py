"""benchmarks/causal_key_weights.py's measurement (the Monte Carlo's attention weight on the
first keys of a causal model, and position 0's correlation with the rest), seeded and small."""

import importlib.util
from pathlib import Path

import numpy as np

from sigprop.model.presets import resolve

_spec = importlib.util.spec_from_file_location(
    "causal_key_weights", Path(__file__).resolve().parents[1] / "benchmarks" / "causal_key_weights.py")
ckw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ckw)


def _model(std, layers, placement="output"):
    return resolve("preln", "normal", n_layers=layers, d_model=32, n_heads=2, d_ff=64, seq_len=16,
                   dropout=0.0, causal=True, placement=placement, init_std=std)


def test_exchangeable_input_gives_uniform_key_weights():
    """Layer 1 sees exchangeable positions (the sampled input), so n_i E[P_ij] = 1 for every
    key up to the noise, and position 0 correlates like any other pair."""
    w, c, _ = ckw.measure(_model(0.1, 1), trials=4, batch=8, seed=0)
    assert np.all(np.abs(w[:, 0].mean(axis=0) - 1.0) < 0.15)
    assert abs(c[:, 0, 0].mean() - c[:, 0, 1].mean()) < 0.05


def test_first_keys_draw_weight_once_logits_are_large():
    """Deeper in a causal stack position 0 is less correlated with the rest; with small
    logits (init std 0.02) the weights stay near uniform, with large ones (0.3, no norm
    before the attention) the rows attend to key 0 well beyond its uniform weight."""
    w_small, c, _ = ckw.measure(_model(0.02, 6), trials=4, batch=4, seed=0)
    assert c[:, -1, 0].mean() < c[:, -1, 1].mean() - 0.05
    assert abs(w_small[:, -1, 0].mean() - 1.0) < 0.1
    w, _, z = ckw.measure(_model(0.3, 6), trials=4, batch=4, seed=0)
    assert w[:, -1, 0].mean() > 1.3
    assert z[:, -1, 0].mean() > z[:, -1, 1].mean()
