"""The component maths of the Post-LN gradient split, as rule-side functions: the value path's
gain (rules.attention.value_gain), the ReLU MLP's departure from Euler's identity
(rules.activation.relu_ffn_euler_var), the residual unit's split under a norm
(rules.residual.post_norm_*) and the attention's Euler terms (rules.attention.euler_terms),
each against a seeded Monte Carlo of its definition or an identity it must satisfy."""

import math

import numpy as np
import pytest

from sigprop.model import positions
from sigprop.rules import attention, residual
from sigprop.rules.activation import relu_ffn_euler_var
from sigprop.state import Forward


def test_value_gain_matches_monte_carlo_of_wo_wv_x():
    # one feature of W_o W_v x over weight draws, per unit mean square of x's features
    rng = np.random.default_rng(11)
    d, H, dh, sv, so = 12, 3, 4, 0.7, 0.45
    p = dict(d=d, n_heads=H, d_head=dh, v_std=sv, o_std=so)
    x = rng.normal(0.5, 1.3, size=d)                    # a token with a non-zero mean
    trials = 20000
    Wv = rng.normal(0.0, sv, size=(trials, H * dh, d))
    Wo = rng.normal(0.0, so, size=(trials, d, H * dh))
    y = np.einsum("tij,tj->ti", Wo, np.einsum("tij,j->ti", Wv, x))
    per = (y ** 2).mean(1) / np.mean(x ** 2)           # every output feature alike
    mc, se = per.mean(), per.std() / math.sqrt(trials)
    assert abs(attention.value_gain(p) - mc) < 4 * se, (attention.value_gain(p), mc, se)
    # a wrong exponent or a missing factor is far outside that band
    assert abs(attention.value_gain(p) / d - mc) > 20 * se


def _relu_ffn(rng, X, d_ff, w1, w2, b1, b2, p_inner=0.0, p_hidden=0.0):
    """One weight draw of F(x) = Dropout_h(W2 Dropout_i(relu(W1 x + b1)) + b2) at the tokens
    ``X`` (rows): (F, J_F x, and a function g -> J_F^T g per token)."""
    tokens, d = X.shape
    W1 = rng.normal(0, w1, (d_ff, d))
    W2 = rng.normal(0, w2, (d, d_ff))
    c1, c2 = rng.normal(0, b1, d_ff), rng.normal(0, b2, d)
    mi = (rng.random((tokens, d_ff)) >= p_inner) / (1 - p_inner)
    mh = (rng.random((tokens, d)) >= p_hidden) / (1 - p_hidden)
    lin = X @ W1.T
    U = lin + c1
    on = (U > 0) * mi
    F = mh * ((np.maximum(U, 0) * mi) @ W2.T + c2)
    JX = mh * ((on * lin) @ W2.T)
    return F, JX, lambda G: ((mh * G) @ W2 * on) @ W1


@pytest.mark.parametrize("p_inner, p_hidden", [(0.0, 0.0), (0.2, 0.1)])
def test_relu_ffn_euler_var_matches_monte_carlo(p_inner, p_hidden):
    rng = np.random.default_rng(3)
    d, d_ff, w1, w2, b1, b2 = 16, 32, 0.25, 0.18, 0.6, 0.4
    ds, fj, vf = [], [], []
    for _ in range(400):
        F, JX, _ = _relu_ffn(rng, rng.normal(size=(8, d)), d_ff, w1, w2, b1, b2, p_inner, p_hidden)
        D = F - JX
        ds.append((D ** 2).mean())
        fj.append((F * JX).mean())
        vf.append((F ** 2).mean())
    vd, se = np.mean(ds), np.std(ds) / math.sqrt(len(ds))
    pred = relu_ffn_euler_var(d_ff, w2, b1, b2, p_inner, p_hidden)
    assert abs(pred - vd) < 4 * se, (pred, vd, se)
    # D uncorrelated with J_F x: E[F . J_F x] = v_F - v_D
    assert np.mean(fj) == pytest.approx(np.mean(vf) - vd, rel=0.03)
    # homogeneous without biases: no departure at all
    assert relu_ffn_euler_var(d_ff, w2, 0.0, 0.0, p_inner, p_hidden) == 0.0


def _ln_backward(Z, G):
    """The gradient below a LayerNorm (no eps, no gain) of the tokens ``Z``."""
    mu = Z.mean(1, keepdims=True)
    s = Z.std(1, keepdims=True)
    Y = (Z - mu) / s
    d = Z.shape[1]
    return (G - G.mean(1, keepdims=True) - Y * (Y * G).sum(1, keepdims=True) / d) / s


def test_post_norm_split_of_a_relu_ffn_matches_monte_carlo():
    # x' = LN(a x + b F(x)), F a ReLU MLP with biases, x a LayerNorm output (v_x = 1): the
    # share of the gradient below along x and the skip-branch cross term, measured, against
    # post_norm_euler_share and post_norm_cross_log_factor fed with the measured branch gain
    rng = np.random.default_rng(7)
    d, d_ff, a, b = 64, 128, 1.0, 0.8
    w1, w2, b1, b2 = 1 / math.sqrt(d), 1 / math.sqrt(d_ff), 0.6, 0.3
    along, gg, jj, cr, vf = [], [], [], [], []
    for _ in range(300):
        X = rng.normal(size=(64, d))
        X = (X - X.mean(1, keepdims=True)) / X.std(1, keepdims=True)
        F, _, jt = _relu_ffn(rng, X, d_ff, w1, w2, b1, b2)
        Gz = _ln_backward(a * X + b * F, rng.normal(size=X.shape))
        Jg = jt(Gz)
        Gx = a * Gz + b * Jg
        xh = X / np.linalg.norm(X, axis=1, keepdims=True)
        along.append(((Gx * xh).sum(1) ** 2).mean())
        gg.append((Gz ** 2).mean())
        jj.append((Jg ** 2).mean())
        cr.append((Gz * Jg).mean())
        vf.append((F ** 2).mean())
    g2, j2 = np.mean(gg), np.mean(jj)
    total = a * a + b * b * j2 / g2                       # a^2 + branch gain
    ev = relu_ffn_euler_var(d_ff, w2, b1, b2)
    la2, lb2, lgain = math.log(a * a), math.log(b * b), math.log(b * b * j2 / g2)
    share_mc = np.mean(along) / (g2 * total)
    share = residual.post_norm_euler_share(la2, lb2, lgain, 0.0, ev)
    # the function leaves in D its own component along z = a x + b F (F contains D), a
    # fraction b^2 v_D / v_z of it (documented there): here 0.12, which the measurement shows
    vz = a * a + b * b * np.mean(vf)
    along_z = b * b * ev / vz
    assert share * (1 - along_z) == pytest.approx(share_mc, rel=0.04), (share, along_z, share_mc)
    assert share_mc < share
    # the skip/branch split that ignores Euler's identity (v_F in place of v_D) is far off
    assert abs(residual.post_norm_euler_share(la2, lb2, lgain, 0.0, np.mean(vf)) - share_mc) > 0.5 * share_mc
    # cross term 2 a b E[g . J^T g] over a^2 E|g|^2 + b^2 E|J^T g|^2
    per = 2 * a * b * np.asarray(cr) / (g2 * total)
    cross_mc, se = per.mean(), per.std() / math.sqrt(len(per))
    cross = math.expm1(residual.post_norm_cross_log_factor(lb2, 0.0, math.log(total), float(np.mean(vf)), ev, d))
    assert cross_mc < -3 * se                              # measurably negative
    # first order in 1/d: at d 64 the measured term is 0.53 (this seed; 0.71-0.74 +- 0.09 with
    # 600 draws, with and without biases) of the predicted one, -0.0077
    assert 0.4 < cross_mc / cross < 1.1, (cross, cross_mc, se)


def test_log_space_helpers():
    big = 2 * math.log(1e200)                             # (1e200)^2: beyond float64
    assert residual.log_add(big, big) == pytest.approx(big + math.log(2), rel=1e-15)
    assert residual.log_add(-math.inf, 1.5) == 1.5
    assert residual.log_share(big, big) == pytest.approx(0.5)
    assert residual.log_share(-math.inf, 0.0) == 0.0
    assert residual.log_share(0.0, -math.inf) == 1.0
    assert residual.log_share(math.log(3.0), math.log(1.0)) == pytest.approx(0.75, rel=1e-15)
    assert residual.exp_or_inf(800.0) == math.inf
    # up to the largest double itself (the bound was 709, which wrote a variance of 1e308 as inf)
    assert residual.exp_or_inf(math.log(1e308)) == pytest.approx(1e308, rel=1e-13)
    assert residual.exp_or_inf(math.log(1.7e308)) < math.inf and residual.exp_or_inf(709.79) == math.inf


def _attention_params(L, causal):
    return dict(d=64, n_heads=2, d_head=32, L=L, p=0.1, causal=int(causal), q_std=0.12, k_std=0.15,
                v_std=0.13, o_std=0.11, q_bias_std=0.05, k_bias_std=0.0, v_bias_std=0.04, o_bias_std=0.03)


def test_euler_terms_on_a_singleton_grid_equal_the_exact_sums():
    # the graded-grid sums with every block one position are the exact per-position sums
    L = 24
    p = _attention_params(L, True)
    x = Forward(0.0, 1.3, 0.6)
    rows = attention.row_moments(p, x)
    rng = np.random.default_rng(2)
    A = rng.normal(size=(L, L))
    W = A @ A.T / L + 0.4
    W /= np.mean(np.diag(W))
    exact = attention.euler_terms(p, x, rows, 0.3, W, None, 0.1)
    for grid in (positions.Grid(L, p0=L), positions.NodeGrid(L, head=L)):
        assert np.all(grid.n == np.arange(1.0, L + 1))
        on_grid = attention.euler_terms(p, x, rows, 0.3, W, grid, 0.1)
        for a_, b_ in zip(exact, on_grid):
            assert np.allclose(a_, b_, rtol=1e-12, atol=0), (a_, b_)


def test_euler_terms_scale_with_the_value_gain_and_the_split_collapses():
    # without value/output biases every term is the value gain times a function of the
    # softmax and the gradient alone: doubling v_std multiplies each by 4
    p = {**_attention_params(16, False), "v_bias_std": 0.0, "o_bias_std": 0.0}
    x = Forward(0.0, 1.0, 0.5)
    rows = attention.row_moments(p, x)
    t1 = attention.euler_terms(p, x, rows, 0.4)
    t2 = attention.euler_terms({**p, "v_std": 2 * p["v_std"]}, x, rows, 0.4)
    for a_, b_ in zip(t1, t2):
        assert b_ == pytest.approx(4 * a_, rel=1e-13)
    # a stream and a gradient both collapsed (r = rg = 1, no dropout): the attention averages
    # one shared value, homogeneous of degree 1 in it, so the share along x is O(1/L) of the
    # independent-gradient one (rg = 0)
    p0 = {**p, "p": 0.0}
    xc = Forward(0.0, 1.0, 1.0 - 1e-9)
    rows = attention.row_moments(p0, xc)
    t0, tc = attention.euler_terms(p0, xc, rows, 0.0), attention.euler_terms(p0, xc, rows, 1.0)
    assert abs(tc.shared + tc.own) < 0.1 * (t0.shared + t0.own)
