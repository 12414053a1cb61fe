"""benchmarks/dropout_output_norm.py and benchmarks/causal_grad_correlation.py: their direct
measurements on small seeded models."""

import importlib.util
from pathlib import Path

import numpy as np

from sigprop.model.presets import resolve


def _load(name):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


don = _load("dropout_output_norm")
cgc = _load("causal_grad_correlation")


def _model(p, layers=3, std=0.3):
    return resolve("preln", "normal", n_layers=layers, d_model=32, n_heads=2, d_ff=64, seq_len=16,
                   dropout=p, causal=True, placement="output", init_std=std)


def test_attention_dropout_amplifies_the_logit_paths():
    """Without dropout the two backward passes are the same computation (ratio 1 to rounding);
    with attention dropout and large logits the masks' uncancelled terms raise the key and query
    paths' gradient well above the value path's."""
    r0 = don.measure(_model(0.0), trials=2, batch=2, seed=0, at=[2])
    for k in ("amp_q", "amp_k", "amp_v", "amp"):
        assert np.allclose(r0[(2, k)], 1.0, rtol=1e-12)
    r = don.measure(_model(0.1), trials=4, batch=4, seed=0, at=[3])
    assert np.mean(r[(3, "amp_k")]) > 1.1
    assert np.mean(r[(3, "amp_k")]) > np.mean(r[(3, "amp_v")])
    # the projection off each token's output removes at least the isotropic 2/d
    assert np.mean(r[(3, "proj/iso_all")]) < 1.0


def test_key_path_anticorrelates_the_positions():
    """Every causal row's key-path gradient sums to zero over its keys, so with large logits
    (the key path's share large) the gradient below a causal attention is anticorrelated over
    positions on average; the first positions carry more than their share of it; the re-signed
    gradient keeps the profile, so the branch ratio stays near 1."""
    r = cgc.measure(_model(0.1), trials=4, batch=4, seed=0, at=[2])
    assert np.mean(r[(2, "mean_corr")]) < -0.005
    assert 0.5 < np.mean(r[(2, "real/resigned")]) < 2.0
    assert np.mean(r[(2, "prof_0")]) > 1.0
