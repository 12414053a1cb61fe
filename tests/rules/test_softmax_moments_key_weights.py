"""Causal rows whose keys' logits have variances of their own (the first positions of a causal
stream stay less correlated with the others): the softmax moments of independent logits with
per-key variances (sigprop.rules.softmax_moments.independent_row_moments), the per-key logit
scales from the stream's pair-correlation deviation S (sigprop.model.profile.key_logit_scales)
and the key weights (sigprop.rules.attention.key_weights).  Expected values come from sampled
softmax rows (seeded NumPy) or from the exchangeable rule's exact integrals, never from the code
under test."""

import math

import numpy as np
import pytest

from sigprop.backend import numeric
from sigprop.model import profile
from sigprop.model.positions import grid_for
from sigprop.rules.attention import key_weights
from sigprop.rules.softmax_moments import (distinguished_key_moments, independent_row_moments,
                                           softmax_expect)
from sigprop.state import Backward, Forward


def _softmax_rows(z):
    z = z - z.max(axis=1, keepdims=True)
    P = np.exp(z)
    return P / P.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("n,v", [(1, 1.0), (2, 1e-4), (8, 0.5), (64, 2.0), (64, 20.0), (1000, 80.0)])
def test_equal_variances_give_the_exchangeable_row(n, v):
    """Every key at the same variance: E[P] = 1/n and the exchangeable row's E[P_1^2] (its
    exact integral, softmax_expect)."""
    e1, e2 = distinguished_key_moments(n, v, 0.0)
    a2 = float(softmax_expect(numeric, v, n, ((2, 0),)))
    assert abs(float(e1) * n - 1) < 1e-5
    assert abs(float(e2) / a2 - 1) < 1e-5


def test_row_weights_sum_to_one():
    rng = np.random.default_rng(1)
    s = rng.uniform(0.1, 6.0, size=(3, 12))
    e1, _ = independent_row_moments(s, np.ones_like(s))
    assert np.allclose(e1.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("n,v,w", [(32, 1.0, 3.0), (16, 0.3, 1.5), (128, 0.7, 3.5)])
def test_distinguished_key_against_sampled_rows(n, v, w):
    """Key 0's logit N(0, v + w), the other n - 1 keys' N(0, v), independent: n E[P_0] and
    E[P_0^2] against 40000 sampled rows (seed 0), within 4 standard errors; the exchangeable
    value (n E[P_0] = 1, what the rule assumes) is rejected by the same samples."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((40000, n)) * math.sqrt(v)
    z[:, 0] *= math.sqrt((v + w) / v)
    P0 = _softmax_rows(z)[:, 0]
    e1, e2 = distinguished_key_moments(n, v, w)
    m1, s1 = n * P0.mean(), n * P0.std() / math.sqrt(len(P0))
    m2, s2 = (P0**2).mean(), (P0**2).std() / math.sqrt(len(P0))
    assert abs(float(e1) * n - m1) < 4 * s1, (float(e1) * n, m1, s1)
    assert abs(float(e2) - m2) < 4 * s2, (float(e2), m2, s2)
    assert abs(m1 - 1) > 10 * s1


def _stream(L):
    """The normalised covariance over positions of a causal-like stream: position i averages
    the iid parts of positions 0..i (so the first positions share the least with the rest),
    plus a shared part and an own part: (mean correlation r, deviation S, the matrix)."""
    B = np.tril(np.ones((L, L))) / np.sqrt(np.arange(1, L + 1))[:, None] * 0.6
    K = B @ B.T + 0.5 * np.eye(L) + 1.0
    C = K / np.sqrt(np.outer(np.diag(K), np.diag(K)))
    r, S = profile.deviation(C)
    return r, S, C


def _params(L, v, r, d=64, dh=16):
    """Attention parameters whose mean row logit variance at a unit-variance zero-mean input of
    correlation r is v: (1 - r) d^2 sq^2 sk^2 = v."""
    s = (v / (1 - r)) ** 0.25
    return dict(d=d, n_heads=1, d_head=dh, L=L, q_std=s / math.sqrt(d), k_std=s / math.sqrt(d),
                v_std=1 / math.sqrt(d), o_std=1 / math.sqrt(dh), p=0.0, causal=1)


@pytest.mark.parametrize("v", [0.7, 1.5])
def test_key_weights_against_sampled_correlated_rows(v):
    """Rows of a causal attention over a stream whose positions are correlated r + S_jk: row
    i's logits are N(0, v/(1 - r) C[:n, :n]) (a fixed query norm: the row logit variance at
    its mean).  The predicted n_i E[P_ij] (w1) and E[P_ij^2] (w2 times the exchangeable
    E[P^2]) against 30000 sampled rows per row (seed 0): within 4 standard errors plus 3%
    (w1) and 6% (E[P^2]) for the additive fit of S; the exchangeable rule's 1 is rejected at
    key 0 of the last row."""
    L = 24
    r, S, C = _stream(L)
    x = Forward(0.0, 1.0, r)
    p = _params(L, v, r)
    w1, w2 = profile.key_weights(p, x, S)
    rng = np.random.default_rng(0)
    for i in (11, L - 1):
        n = i + 1
        z = rng.multivariate_normal(np.zeros(n), v / (1 - r) * C[:n, :n], size=30000)
        P = _softmax_rows(z)
        a2 = float(softmax_expect(numeric, v, n, ((2, 0),)))     # E[P_1^2], one key
        for j in (0, 1, 2, n - 1):
            m1, s1 = n * P[:, j].mean(), n * P[:, j].std() / math.sqrt(len(P))
            m2, s2 = (P[:, j]**2).mean(), (P[:, j]**2).std() / math.sqrt(len(P))
            assert abs(w1[i, j] - m1) < 4 * s1 + 0.03 * m1, (i, j, w1[i, j], m1, s1)
            assert abs(w2[i, j] * a2 - m2) < 4 * s2 + 0.06 * m2, (i, j, w2[i, j] * a2, m2, s2)
        if i == L - 1:
            assert n * P[:, 0].mean() - 1 > 0.1


@pytest.mark.parametrize("L", [24, 128])
def test_zero_deviation_is_exact(L):
    """S = 0 (exchangeable keys): the weights are exactly 1 and the attention's gradient
    kernels are those without them (exact positions and the node grid)."""
    grid = grid_for(L)
    nb = L if grid is None else grid.size
    r = 0.6
    p = _params(L, 2.0, r)
    x = Forward(0.0, 1.0, r)
    w1, w2 = profile.key_weights(p, x, np.zeros((nb, nb)), grid)
    low = np.tril(np.ones((nb, nb)), 0).astype(bool)
    assert np.all(np.abs(w1[low] - 1) < 1e-12) and np.all(np.abs(w2[low] - 1) < 1e-12)
    rng = np.random.default_rng(3)
    A = rng.standard_normal((nb, nb)) * 0.1
    C = 0.8 * np.eye(nb) + 0.2 + (A + A.T) / 2
    np.fill_diagonal(C, 1.0)
    g = Backward(1.0, 0.2)
    ref = profile.attention_backward(p, x, g, C, None, grid)
    got = profile.attention_backward(p, x, g, C, None, grid, kw=(w1, w2))
    assert abs(got[0] / ref[0] - 1) < 1e-12 and abs(got[1] / ref[1] - 1) < 1e-12
    assert np.max(np.abs(got[2] - ref[2])) < 1e-12 * np.max(np.abs(ref[2]))


def test_key_logit_scales_on_the_node_grid():
    """The node grid's per-key scales (row and key at nodes, the row sums as the grid's
    quadratures) against the exact ones at the same positions, L 256."""
    L = 256
    r, S, _ = _stream(L)
    grid = grid_for(L)
    ix = grid.x
    Sg = S[np.ix_(ix, ix)]
    rel_g, counts = profile.key_logit_scales(Sg, r, grid)
    rel, _ = profile.key_logit_scales(S, r)
    ref = rel[np.ix_(ix, ix)]
    low = np.tril(np.ones(rel_g.shape), 0).astype(bool)
    assert np.max(np.abs(rel_g - ref)[low]) < 2e-3 * np.max(np.abs(ref[low] - 1))
    # the quadrature weights of row i count its n_i keys
    assert np.allclose(counts.sum(axis=1), grid.n, rtol=1e-9)


def test_node_grid_with_every_position_a_node_is_the_exact_model():
    """With every position a node the grid's quadratures are the exact sums: the per-key
    weights and the weighted attention kernels on such a grid equal the exact position
    model's (L 40, a structured deviation, logit variance 3)."""
    from sigprop.model.positions import NodeGrid
    L = 40
    r, S, _ = _stream(L)
    grid = NodeGrid(L, head=L)
    p = _params(L, 3.0, r)
    x = Forward(0.0, 1.0, r)
    kw_e = profile.key_weights(p, x, S)
    kw_g = profile.key_weights(p, x, S, grid)
    low = np.tril(np.ones((L, L)), 0).astype(bool)
    for a, b in zip(kw_e, kw_g):
        assert np.max(np.abs(a - b)[low]) < 1e-9
    rng = np.random.default_rng(4)
    A = rng.standard_normal((L, L)) * 0.05
    C = 0.7 * np.eye(L) + 0.3 + (A + A.T) / 2
    np.fill_diagonal(C, 1.0 + np.linspace(2.0, 0.0, L))
    C /= np.mean(np.diag(C))
    g = Backward(1.0, 0.3)
    e = profile.attention_backward(p, x, g, C, None, None, kw=kw_e)
    gg = profile.attention_backward(p, x, g, C, None, grid, kw=kw_g)
    assert abs(e[0] / gg[0] - 1) < 1e-9 and abs(e[1] / gg[1] - 1) < 1e-9
    assert np.max(np.abs(e[2] - gg[2])) < 1e-9 * np.max(np.abs(e[2]))
    # and the weights matter here: against exchangeable keys the variance factor moves
    assert abs(e[0] / profile.attention_backward(p, x, g, C, None, None)[0] - 1) > 0.01


def test_smoothing_table_interpolation_order_and_nodes():
    """The smoothing tables' cubic interpolation in log s (done per group of variances that
    share their four nodes): at a tabulated variance it gives that variance's row, and the
    result does not depend on the order of the variances asked for."""
    from sigprop.rules import softmax_moments as sm
    sub = slice(100, 124)
    u, ls, lphi, lchi1, _ = sm._het_tables(sub)
    table = np.ascontiguousarray(lchi1[sub][:, ::50])
    at_nodes = sm._het_interp(table, ls[sub], np.exp(ls[sub][2:-2]), ls[0])
    assert np.allclose(at_nodes, table[2:-2], rtol=1e-9, atol=1e-9)
    rng = np.random.default_rng(3)
    s = np.exp(rng.uniform(ls[sub][1], ls[sub][-2], size=(7, 9)))
    whole = sm._het_interp(table, ls[sub], s, ls[0])
    assert whole.shape == (7, 9, table.shape[1])
    perm = rng.permutation(s.size)
    shuffled = sm._het_interp(table, ls[sub], s.ravel()[perm], ls[0])
    assert np.array_equal(shuffled, whole.reshape(s.size, -1)[perm])
    # between the nodes, against chi_1(u; s) = E[G_1(u + e)], e ~ N(0, s), G_1(w) = exp(w - e^w),
    # by Gauss-Hermite quadrature (not the tables' FFT)
    keep = (u[::50] > -20) & (u[::50] < 3)
    s_mid = math.exp((ls[sub][5] + ls[sub][6]) / 2)
    mid = sm._het_interp(table, ls[sub], s_mid, ls[0])[keep]
    x, w = np.polynomial.hermite_e.hermegauss(80)
    z = u[::50][keep][:, None] + math.sqrt(s_mid) * x[None, :]
    direct = np.log((np.exp(z - np.exp(z)) * w).sum(axis=1) / w.sum())
    assert np.allclose(np.exp(mid - direct), 1.0, atol=1e-4)


def test_row_moments_converged_in_the_u_step(monkeypatch):
    """The trapezoid in u at the tables' step 0.2 against step 0.05 (the smoothing tables
    rebuilt on every w node, in fresh memos): within 1e-6 relative over variances 1e-3 to 60
    and rows of 8 to ~400 keys (measured ~1e-7), far inside the stated accuracy (1e-4)."""
    from sigprop import memo
    from sigprop.rules import softmax_moments as sm
    rng = np.random.default_rng(5)
    cases = []
    for sc in (1e-3, 0.2, 3.0, 60.0):
        s = sc * np.exp(rng.uniform(-0.7, 0.7, size=(5, 8)))
        c = np.ones_like(s)
        c[:, 6:] = rng.uniform(1.0, 200.0, size=(5, 2))
        cases.append((s, c))
    coarse = [sm.independent_row_moments(s, c) for s, c in cases]
    monkeypatch.setattr(sm, "_HU_EVERY", 1)
    with memo.using(memo.Memos()):
        assert sm._het_base()[0][1] - sm._het_base()[0][0] == pytest.approx(0.05)
        fine = [sm.independent_row_moments(s, c) for s, c in cases]
    for a, b in zip(coarse, fine):
        for x, y in zip(a, b):
            assert np.allclose(x, y, rtol=1e-6, atol=0.0)


@pytest.mark.parametrize("v", [0.05, 1.5])
def test_key_weights_carry_the_layers_offset(v):
    """The per-key logit offset v max|rel - 1| that chooses the weights' regime comes with
    them (series below KEY_SERIES_MAX, the independent-key moments above); 0 for S = 0."""
    from sigprop.rules.attention import KEY_REL_MIN, mean_row_logit_var
    L = 24
    r, S, _ = _stream(L)
    x = Forward(0.0, 1.0, r)
    p = _params(L, v, r)
    kw = profile.key_weights(p, x, S)
    rel, counts = profile.key_logit_scales(S, r)
    want = mean_row_logit_var(p, x) * np.abs(np.maximum(rel, KEY_REL_MIN) - 1.0).max()
    assert kw.offset == pytest.approx(want, rel=1e-12) and kw.offset > 0.0
    w1, w2 = kw
    assert w1.shape == w2.shape == (L, L)
    assert profile.key_weights(p, x, np.zeros((L, L))).offset == 0.0


def test_approximation_notes_name_the_layers_beyond_the_measured_offsets(monkeypatch):
    """Causal attentions whose offset exceeds KEY_OFFSET_NOTE get one note naming their
    layers and the largest offset; a model below it (or bidirectional) gets none."""
    from types import SimpleNamespace

    from sigprop.model import predict as PR
    from sigprop.model.presets import resolve
    from sigprop.model.trace import summary

    def rec(layer, off, parts=None):
        kw = None if off is None else profile.KeyWeights(np.ones(1), np.ones(1), off)
        return SimpleNamespace(layer=layer, key_w=kw, parts=parts)

    lim = PR.KEY_OFFSET_NOTE
    assert PR.approximation_notes([rec(1, None), rec(2, lim), rec(3, 0.5 * lim)]) == ()
    notes = PR.approximation_notes([rec(1, None), rec(2, 2 * lim), rec(4, 5 * lim), rec(5, 1.5 * lim)])
    assert len(notes) == 1 and notes[0].startswith("layers 2-5:") and f"{5 * lim:.3g}, layer 4" in notes[0]
    # a parallel block's attention keeps its weights in its parts
    part = SimpleNamespace(key_w=profile.KeyWeights(np.ones(1), np.ones(1), 2 * lim))
    assert PR.approximation_notes([rec(7, None, parts=(part,))])[0].startswith("layer 7:")
    # a whole prediction: with the threshold lowered, the causal model's attentions are named
    m = resolve("preln", "normal", n_layers=3, d_model=32, n_heads=2, d_ff=64, seq_len=16, causal=True,
                placement="output", init_std=0.05)
    assert PR.predict(m).approximation_notes == ()
    monkeypatch.setattr(PR, "KEY_OFFSET_NOTE", 1e-9)
    pts = PR.predict(m)
    assert len(pts.approximation_notes) == 1 and pts.approximation_notes[0].startswith("layers ")
    assert summary(pts)["approximation_notes"] == list(pts.approximation_notes)
    bi = resolve("preln", "normal", n_layers=3, d_model=32, n_heads=2, d_ff=64, seq_len=16, causal=False,
                 placement="output", init_std=0.05)
    assert PR.predict(bi).approximation_notes == ()


def test_check_carries_the_approximation_notes(monkeypatch, capsys):
    """`check`'s comparison, its JSON object and its text report carry the prediction's notes."""
    from sigprop.cli._render_model import render_check
    from sigprop.model import predict as PR
    from sigprop.model.checking import DEFAULT_TOL, check_model, check_object
    from sigprop.model.presets import resolve

    m = resolve("preln", "normal", n_layers=2, d_model=32, n_heads=2, d_ff=64, seq_len=16, causal=True,
                placement="output", init_std=0.05)
    monkeypatch.setattr(PR, "KEY_OFFSET_NOTE", 1e-9)
    points, meas, res = check_model(m, dict(DEFAULT_TOL), trials=2, batch=2, seed=0)
    assert res.approximation_notes == points.approximation_notes and len(res.approximation_notes) == 1
    assert check_object(m, res, meas, 0, 2, 2)["approximation_notes"] == list(res.approximation_notes)
    render_check(m, res, meas, 1)
    assert "approximate:" in capsys.readouterr().out
