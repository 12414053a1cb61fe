"""Component formulas the whole-model predictor hands its quantities to, held to seeded Monte
Carlo of their definitions: the norms' kappa of a normalised branch output
(rules.layernorm / rules.rmsnorm ``branch_output_kappa``) and the skip path's share along the
stream below a Post-LN unit (rules.residual.post_norm_skip_share)."""

import math

import numpy as np
import pytest

from sigprop.rules import layernorm, residual, rmsnorm


def _token_spread(centre: bool, d: int, v_b: float, tokens: int, seed: int):
    """(relative variance across tokens of the per-token variance (``centre``) or mean square
    of F = sqrt(B) z, z ~ N(0, I_d), B of mean 1 and relative variance v_b (a Gamma), and its
    standard error from 10 independent batches."""
    rng = np.random.default_rng(seed)
    k = 1.0 / v_b
    est = []
    for _ in range(10):
        B = rng.gamma(k, 1.0 / k, size=(tokens // 10, 1))
        F = np.sqrt(B) * rng.normal(size=(tokens // 10, d))
        s = F.var(axis=1) if centre else (F ** 2).mean(axis=1)
        est.append(s.var() / s.mean() ** 2)
    return float(np.mean(est)), float(np.std(est, ddof=1) / math.sqrt(len(est)))


@pytest.mark.parametrize("norm, centre, n_of", [(layernorm, True, lambda d: d - 1), (rmsnorm, False, lambda d: d)])
def test_branch_output_kappa_matches_monte_carlo(norm, centre, n_of):
    # kappa is the per-token spread in units of a Gaussian's, 2/n (n = d - 1 centred
    # dimensions for LayerNorm, d for RMSNorm); exact for this F: (1 + v_b)(1 + 2/n) - 1,
    # i.e. kappa + v_b, the term the first-order function drops
    d, v_b = 64, 0.05
    n = n_of(d)
    rel, se = _token_spread(centre, d, v_b, 400_000, seed=3)
    kappa_mc = rel * n / 2
    kappa = norm.branch_output_kappa(v_b, d)
    assert abs(kappa_mc - (kappa + v_b)) < 4 * se * n / 2, (kappa_mc, kappa, se * n / 2)
    # a factor 2 too many or too few in the v_b term is far outside
    assert abs(kappa_mc - (1 + n * v_b)) > 0.5 and abs(kappa_mc - (1 + n * v_b / 4)) > 0.5
    # Gaussian norms: kappa 1 exactly; arrays elementwise
    assert norm.branch_output_kappa(0.0, d) == 1.0
    assert np.allclose(norm.branch_output_kappa(np.array([0.0, v_b]), d), [1.0, kappa])


def _skip_share_mc(a: float, b: float, vx: float, vf: float, d: int, tokens: int, seed: int):
    """Monte Carlo of the share along x of a J^T g below z = a x + b F, y = LN(z): g ~ N(0, I),
    x and F independent Gaussian tokens (variances vx, vf).  Returns (share, standard error)."""
    rng = np.random.default_rng(seed)
    est = []
    for _ in range(8):
        X = rng.normal(0.0, math.sqrt(vx), (tokens // 8, d))
        F = rng.normal(0.0, math.sqrt(vf), (tokens // 8, d))
        Z = a * X + b * F
        Zc = Z - Z.mean(1, keepdims=True)
        sig = Zc.std(1, keepdims=True)
        Y = Zc / sig
        G = rng.normal(size=Z.shape)
        # LayerNorm's Jacobian transposed: (1/sigma) (P - y y^T / d), P the centring projector
        Gc = G - G.mean(1, keepdims=True)
        JG = (Gc - Y * (Y * G).sum(1, keepdims=True) / d) / sig
        S = a * JG
        xh = X / np.linalg.norm(X, axis=1, keepdims=True)
        est.append(((S * xh).sum(1) ** 2).mean() / ((S ** 2).sum(1).mean() / d))
    return float(np.mean(est)), float(np.std(est, ddof=1) / math.sqrt(len(est)))


@pytest.mark.parametrize("a, b, vx, vf", [(0.9, 0.5, 1.0, 0.0324), (1.2, 0.7, 2.0, 0.6)])
def test_post_norm_skip_share_matches_monte_carlo(a, b, vx, vf):
    # the ratio b^2 v_F / (a^2 v_x) is 0.01 and 0.1 here: the function is first order in it,
    # high by a factor 1 + ratio (its docstring); O(1/d) besides
    d = 1024
    mc, se = _skip_share_mc(a, b, vx, vf, d, 16_000, seed=7)
    share = residual.post_norm_skip_share(2 * math.log(a), 2 * math.log(b), math.log(vx), vf)
    ratio = b * b * vf / (a * a * vx)
    assert share == pytest.approx(ratio, rel=1e-12)
    assert abs(share / (1 + ratio) - mc) < 4 * se + 3.0 / d, (share, mc, se)
    assert abs(share - mc) < share * (ratio + 3.0 / d) + 4 * se
    # without b^2 (or with the variances the wrong way round) it would be far off
    assert abs(vf / (a * a * vx) - mc) > 0.5 * mc and abs(b * b * vx / (a * a * vf) - mc) > 0.5 * mc


def test_post_norm_skip_share_limits():
    # no branch (b = 0 or a zero branch output): nothing along x; no skip: the rule's 1;
    # a branch far larger than the skip: capped at 1
    assert residual.post_norm_skip_share(0.0, -math.inf, 0.0, 1.0) == 0.0
    assert residual.post_norm_skip_share(0.0, 0.0, 0.0, 0.0) == 0.0
    assert residual.post_norm_skip_share(-math.inf, 0.0, 0.0, 1.0) == 1.0
    assert residual.post_norm_skip_share(0.0, 800.0, 0.0, 1.0) == 1.0
