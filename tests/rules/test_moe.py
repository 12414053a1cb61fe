"""The mixture-of-experts rule (sigprop.rules.moe): its router averages against limits that
are known in closed form and against an independent loop over sampled routers, and its
domain checks.  The whole rule against sampled mixtures is the Monte Carlo sweep's
(sigprop.mc.components.moe)."""

import math

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.rules import REGISTRY
from sigprop.rules.moe import DRAWS, direct_stats, router_stats
from sigprop.state import Backward, Forward


@pytest.mark.parametrize("k", [1, 2, 4])
def test_uniform_router_limits(k):
    """v -> 0: every logit equal, so the chosen weights are 1/k (renormalised softmax), 1/E
    (softmax over all), 1/2 (sigmoid), and the Jacobians are those of a uniform point."""
    E, v = 8, 1e-16          # (the chosen logits sit sqrt(v) above the rest: O(sqrt v) offsets)
    s = router_stats(E, k, 0, 1, 1, 1, v, 0.3)
    assert s["S2"] == pytest.approx(1 / k, rel=1e-7)
    # the selection goes by rank, whatever the scale: at rho 0 two tokens' chosen sets are
    # independent random k-subsets, sharing k^2/E experts on average
    # (hypergeometric overlap: its variance over DRAWS draws sets the tolerance)
    var = k * (k / E) * (1 - k / E) * (E - k) / (E - 1) / k**4
    assert abs(router_stats(E, k, 0, 1, 1, 1, v, 0.0)["R2"] - 1 / E) < 4 * math.sqrt(var / DRAWS)
    # J = p (I - p 1^T) on the chosen set, p = 1/k: |J|_F^2 = (1/k)(1 - 1/k)
    assert s["J2"] == pytest.approx((1 / k) * (1 - 1 / k), rel=1e-6, abs=1e-12)
    s = router_stats(E, k, 0, 0, 1, 1, v, 0.3)
    assert s["S2"] == pytest.approx(k / E**2, rel=1e-7)
    # dpi_e/dr_j = pi_e (delta_ej - pi_j) for e chosen, every j: k (1/E^2)(1 - 2/E + 1/E)
    assert s["J2"] == pytest.approx(k / E**2 * (1 - 1 / E), rel=1e-7)
    s = router_stats(E, k, 1, 0, 1, 1, v, 0.3)
    assert s["S2"] == pytest.approx(k / 4, rel=1e-7)
    assert s["J2"] == pytest.approx(k / 16, rel=1e-7)


def test_all_experts_chosen_is_the_softmax_average():
    """k = E, softmax over all: S2 = E[sum pi^2], against a direct mean over fresh draws
    (another seed, 200,000 of them), within four joint standard errors."""
    E, v = 4, 2.0
    s = router_stats(E, E, 0, 0, 1, 1, v, 0.0)
    rng = np.random.default_rng(7)
    r = rng.standard_normal((200_000, E)) * math.sqrt(v)
    p = np.exp(r) / np.exp(r).sum(axis=1, keepdims=True)
    x = (p**2).sum(axis=1)
    assert abs(s["S2"] - x.mean()) < 4 * math.hypot(s["se"]["S2"], x.std() / math.sqrt(x.size))


@pytest.mark.parametrize("router,norm,G,kg", [(0, 1, 1, 1), (0, 0, 1, 1), (1, 1, 4, 2), (1, 0, 1, 1)])
def test_pair_averages_meet_the_single_token_ones_at_rho_1(router, norm, G, kg):
    s = router_stats(16, 4, router, norm, G, kg, 1.7, 1.0)
    assert s["R2"] == pytest.approx(s["S2"], rel=1e-12)
    assert s["RJ"] == pytest.approx(s["J2"], rel=1e-12)


def _loop_stats(E, k, router, norm, G, kg, v, rho, n, seed):
    """The router averages by an independent per-draw loop: the weights, the full Jacobian
    by central finite differences of the weight map at a fixed selection."""
    rng = np.random.default_rng(seed)

    def weights(r, chosen):
        pi = np.exp(r - r.max()) / np.exp(r - r.max()).sum() if router == 0 else 1 / (1 + np.exp(-r))
        w = np.where(chosen, pi, 0.0)
        return w / w.sum() if norm else w

    def select(r):
        pi = np.exp(r - r.max()) / np.exp(r - r.max()).sum() if router == 0 else 1 / (1 + np.exp(-r))
        score = pi.copy()
        if G > 1:
            gs = [np.sort(pi[i * (E // G):(i + 1) * (E // G)])[-2:].sum() for i in range(G)]
            keep = np.argsort(gs)[-kg:]
            for i in range(G):
                if i not in keep:
                    score[i * (E // G):(i + 1) * (E // G)] = -np.inf
        chosen = np.zeros(E, bool)
        chosen[np.argsort(score)[-k:]] = True
        return chosen

    def jac(r, chosen, h=1e-6):
        return np.stack([(weights(r + h * e, chosen) - weights(r - h * e, chosen)) / (2 * h) for e in np.eye(E)], 1)

    acc = np.zeros(4)
    for _ in range(n):
        z1, z2 = rng.standard_normal(E), rng.standard_normal(E)
        r1 = math.sqrt(v) * z1
        r2 = math.sqrt(v) * (rho * z1 + math.sqrt(1 - rho**2) * z2)
        c1, c2 = select(r1), select(r2)
        w1, w2 = weights(r1, c1), weights(r2, c2)
        j1, j2 = jac(r1, c1), jac(r2, c2)
        acc += [w1 @ w1, w1 @ w2, (j1 * j1).sum(), (j1 * j2).sum()]
    return acc / n


@pytest.mark.parametrize("router,norm,G,kg", [(0, 1, 1, 1), (0, 0, 1, 1), (1, 1, 4, 2), (1, 0, 1, 1)])
def test_router_averages_against_an_independent_loop(router, norm, G, kg):
    E, k, v, rho = 8, 2, 1.5, 0.6
    s = router_stats(E, k, router, norm, G, kg, v, rho)
    loop = _loop_stats(E, k, router, norm, G, kg, v, rho, 4000, seed=11)
    # 4,000 draws: relative standard errors of a few percent at most on these averages
    for got, want in zip((s["S2"], s["R2"], s["J2"], s["RJ"]), loop):
        assert got == pytest.approx(want, rel=0.05)


def _moe(**kw):
    base = dict(d_in=256, d_ff=256, n_experts=8, top_k=2, router_std=0.0625, gate_std=0.0625, up_std=0.0625,
                down_std=0.0625)
    return {**base, **kw}


def test_domain_checks():
    r = REGISTRY["moe_swiglu"]
    x, g = Forward(0, 1, 0.2), Backward(1, 0.1)
    for bad, msg in ((dict(top_k=9), "exceeds n_experts"), (dict(n_group=3), "must divide"),
                     (dict(n_group=4, topk_group=5), "topk_group"),
                     (dict(n_group=4, topk_group=1, top_k=3), "kept groups"),
                     (dict(shared_d_ff=64), "shared expert needs")):
        with pytest.raises(DomainError, match=msg):
            r.evaluate(x, g, **_moe(**bad))


def test_zero_router_std_is_the_uniform_mixture():
    """router_std 0: every token weights its k experts 1/k (renormalised), so the output
    variance is (1/k) of one expert's, the gradient variance likewise (no router path)."""
    r, x, g = REGISTRY["moe_swiglu"], Forward(0, 1, 0.2), Backward(1, 0.1)
    y, gb = r.evaluate(x, g, **_moe(router_std=0.0, norm_topk=1))
    e = REGISTRY["swiglu"].evaluate(x, None, d_in=256, d_ff=256, gate_std=0.0625, up_std=0.0625)[0]
    f = REGISTRY["linear"].evaluate(e, None, d_in=256, d_out=256, w_std=0.0625)[0]
    assert y.var == pytest.approx(f.var / 2, rel=1e-7)
    assert y.corr == pytest.approx(f.corr, rel=1e-7)


def test_symbolic_form_names_the_router_averages():
    out = REGISTRY["moe_swiglu"].symbolic()
    text = str(out["x_var"])
    assert "S2(" in text and "R2(" not in text
    assert "J2(" in str(out["g_var"]) and "RJ(" in str(out["g_corr"])


@pytest.mark.parametrize("cfg", [(8, 2, 0, 1, 1, 1), (8, 2, 0, 0, 1, 1), (64, 8, 0, 0, 1, 1), (16, 4, 1, 1, 4, 2),
                                 (8, 1, 1, 0, 1, 1)])
@pytest.mark.parametrize("v", [0.05, 1.0, 6.0])
def test_pair_averages_interpolated_in_the_angle(cfg, v):
    """R2 and RJ interpolated in arccos(rho) stay within 5e-3 of S2 (J2) of the direct means
    at random correlations (measured at most 3.4e-3 over this grid: the scale of the draws'
    own standard error)."""
    rng = np.random.default_rng(3)
    for rho in rng.uniform(-0.99, 0.999, 5):
        a, b = router_stats(*cfg, v, rho), direct_stats(*cfg, v, rho)
        assert abs(a["R2"] - b["R2"]) < 5e-3 * b["S2"]
        assert abs(a["RJ"] - b["RJ"]) < 5e-3 * b["J2"]
