"""benchmarks/causal_deviation_paths.py's pieces: the stream state it takes from the predictor
and the sampled layer, seeded and small."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sigprop.mc.model import _attention_params
from sigprop.model import positions
from sigprop.model import predict as PR
from sigprop.model.presets import resolve

_spec = importlib.util.spec_from_file_location(
    "causal_deviation_paths", Path(__file__).resolve().parents[1] / "benchmarks" / "causal_deviation_paths.py")
cdp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cdp)


def _model():
    # 80 positions: beyond positions.EXACT_MAX, so the state must come from the exact model
    return resolve("preln", "normal", n_layers=3, d_model=32, n_heads=2, d_ff=64, seq_len=80,
                   dropout=0.0, causal=True, placement="output", init_std=0.05)


def test_states_over_every_position_and_restored():
    m = _model()
    assert m.seq_len > positions.EXACT_MAX
    keep_max, keep_unit = positions.EXACT_MAX, PR.Predictor._unit
    got = cdp.states(m, {2, 3})
    assert positions.EXACT_MAX == keep_max and PR.Predictor._unit is keep_unit
    assert sorted(got) == [2, 3]
    for v, r, prof, S in got.values():
        assert S.shape == (80, 80) and prof.shape == (80,)
        assert np.all(np.diag(S) == 0.0)
        off = S[~np.eye(80, dtype=bool)]
        assert abs(off.mean()) < 1e-12 and np.abs(off).max() > 1e-4       # a real deviation
        assert abs(prof.mean() - 1.0) < 1e-9 and v > 1.0 and 0.0 < r < 1.0
        # position 0 mixes with fewer positions: less correlated with the rest than the mean
        assert S[0, 1:].mean() < 0.0
        K = cdp.input_cov(v, r, prof, S)
        assert np.allclose(np.diag(K), v * prof) and np.linalg.eigvalsh(K).min() > 0.0


def test_sampled_layer_is_seeded_and_exchangeable_reference_uniform():
    m = _model()
    v, r, prof, S = cdp.states(m, {3})[3]
    params = _attention_params(m, 2)
    flat = cdp.input_cov(v, r, np.ones(80), 0.0 * S)
    a = cdp.sample(params, flat, 3, 2, np.random.default_rng(5))
    b = cdp.sample(params, flat, 3, 2, np.random.default_rng(5))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    # the pooled probabilities are causal rows: each sums to 1 over keys 0..i, nothing beyond
    assert a["P1"].shape == (3, 80, 80)
    assert np.allclose(np.tril(a["P1"]).sum(axis=2), 1.0) and np.all(np.triu(a["P1"], 1) == 0.0)
    assert np.all(a["P2"] <= a["P1"] + 1e-15)
    assert np.all(a["all"] > 0.0) and np.all(np.isfinite(a["all"]))


def test_factor_fit_recovers_an_additive_plus_rank_two_deviation():
    """A stream whose correlation matrix is r + additive parts + F F^T + a diagonal: the fit's
    independent variances and factors give the same logit contrasts."""
    rng = np.random.default_rng(3)
    n, r = 12, 0.6
    m = rng.normal(0, 0.02, n)
    F = np.stack([np.exp(-np.arange(n) / 3.0) * 0.3, np.cos(np.arange(n)) * 0.1], axis=1)
    d = 1 - r - (F ** 2).sum(axis=1) - 2 * m
    assert np.all(d > 0)
    K = r + m[:, None] + m[None, :] + F @ F.T + np.diag(d)        # a correlation matrix
    assert np.allclose(np.diag(K), 1.0) and np.linalg.eigvalsh(K).min() > 0
    S = K - r
    np.fill_diagonal(S, 0.0)
    D, G = cdp.factor_fit(S, r, n, nf=2, iters=300)
    J = np.eye(n) - 1.0 / n
    # the logits' contrasts: (1 - r) I + S against diag(D) + G G^T
    a = J @ ((1 - r) * np.eye(n) + S) @ J
    b = J @ (np.diag(D) + G @ G.T) @ J
    assert np.allclose(a, b, atol=1e-3)
    assert np.allclose(D, d, atol=1e-2)
    # one factor cannot: the second factor's share is left out
    D1, G1 = cdp.factor_fit(S, r, n, nf=1, iters=300)
    assert not np.allclose(a, J @ (np.diag(D1) + G1 @ G1.T) @ J, atol=1e-3)


def test_factor_law_moments_without_factors_is_the_independent_row():
    """No loadings: the quadrature is the independent keys' identity, as the package's
    independent_row_moments evaluates it from its tables."""
    from sigprop.rules.softmax_moments import independent_row_moments

    s = np.array([0.3, 1.0, 2.5, 2.5, 6.0])
    e1, e2 = cdp.factor_law_moments(s, np.zeros((5, 1)), nodes=1)
    r1, r2 = independent_row_moments(s[None, :], np.ones((1, 5)))
    assert np.allclose(e1, r1[0], rtol=1e-3) and np.allclose(e2, r2[0], rtol=1e-3)
    assert e1.sum() == pytest.approx(1.0, abs=1e-3)


def test_factor_law_moments_against_sampled_rows():
    """Two shared factors on the first keys: the quadrature against 200,000 sampled rows."""
    rng = np.random.default_rng(6)
    n = 8
    s = np.full(n, 2.0)
    L = np.zeros((n, 2))
    L[:3, 0] = [1.5, 1.2, 1.0]
    L[:4, 1] = [0.0, 0.8, -0.6, 0.5]
    e1, e2 = cdp.factor_law_moments(s, L, nodes=8)
    z = rng.standard_normal((200_000, n)) * np.sqrt(s) + rng.standard_normal((200_000, 2)) @ L.T
    P = cdp._softmax(z)
    se1 = P.std(axis=0) / np.sqrt(len(P))
    se2 = (P * P).std(axis=0) / np.sqrt(len(P))
    assert np.all(np.abs(e1 - P.mean(axis=0)) < 4 * se1 + 2e-3 * e1)
    assert np.all(np.abs(e2 - (P * P).mean(axis=0)) < 4 * se2 + 2e-3 * e2)
    # the factors matter here: the independent row of the same variances is far off for key 0
    r1 = cdp.factor_law_moments(s + (L ** 2).sum(axis=1), np.zeros((n, 1)), nodes=1)[0]
    assert abs(r1[0] - P[:, 0].mean()) > 10 * se1[0]
