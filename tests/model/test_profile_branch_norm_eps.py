"""A causal model's branch-output norm near its eps, and a position-wise branch on a stream
whose variance and correlations differ over positions (sigprop.model.profile.branch_norm_eps,
Predictor._chain_log_slopes; the backward's dependence on a pair's correlation, measured in
docs/design.md, "Branch-output norms near eps")."""

import math

import numpy as np

from sigprop.model.predict import Predictor, _gains
from sigprop.model.presets import resolve
from sigprop.model.profile import branch_norm_eps
from sigprop.rules.base import REGISTRY
from sigprop.state import Forward


def test_branch_norm_eps_against_sampled_rmsnorm():
    """An RMSNorm (d 256, eps 1e-6) on Gaussian tokens whose variance at position t is Q q_t,
    Q = eps: per position, the output's mean square and the gradient gain E|J^T g|^2 / E|g|^2
    (g iid) from 4000 sampled tokens each (seed 0) against q_t / (q_t + eps/Qh) and, over the
    rule's flat gain (d - 1) / (d (Qh + eps)), 1 / f_t (Qh = Q (d - 2) / d, the harmonic mean
    square of a Gaussian token); within 1.5% (sampling ~0.3%, the norm's O(1/d) terms)."""
    d, eps, n = 256, 1e-6, 4000
    q = np.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.25])
    q /= q.mean()
    Q = eps
    Qh = Q * (d - 2) / d
    e = eps / Qh
    gain, oprof, f = branch_norm_eps(q, e)
    rng = np.random.default_rng(0)
    flat = (d - 1) / (d * (Qh + eps))
    for t in range(len(q)):
        x = rng.standard_normal((n, d)) * math.sqrt(Q * q[t])
        s2 = (x * x).mean(axis=1, keepdims=True) + eps
        y = x / np.sqrt(s2)
        out = float((y * y).mean())
        assert abs(out / (q[t] / (q[t] + e)) - 1) < 0.015, (t, out)
        # the model's output variance at t: the rule's 1/(1 + e) times gain times oprof_t
        assert abs(gain * oprof[t] / (1 + e) - q[t] / (q[t] + e)) < 1e-12
        g = rng.standard_normal((n, d))
        jg = (g - y * (y * g).sum(axis=1, keepdims=True) / d) / np.sqrt(s2)
        got = float((jg * jg).mean()) / float((g * g).mean())
        assert abs(got / flat * f[t] - 1) < 0.015, (t, got / flat, 1 / f[t])


def test_branch_norm_eps_without_eps_is_the_plain_profile():
    q = np.array([3.0, 1.0, 0.5, 0.5])
    gain, oprof, f = branch_norm_eps(q / q.mean(), 0.0)
    assert abs(gain - 1) < 1e-15 and np.allclose(oprof, 1.0, rtol=0, atol=1e-15)
    assert np.allclose(f, q / q.mean(), rtol=1e-15)
    jac = np.array([2.0, 1.0, 0.5, 0.5])
    assert np.allclose(branch_norm_eps(q, 0.0, jac)[2], q / jac, rtol=1e-15)


def _olmo2_ffn_chain():
    m = resolve("olmo2", "normal", n_layers=2, d_model=256, n_heads=4, d_ff=1024, seq_len=16,
                dropout=0.1, causal=True)
    pr = Predictor(m)
    return pr._chain(1, 0, False, 1.0)      # (the ordinary layer's sublayer 1: its FFN)


def _sampled_swiglu_cov_gain(r: float, rng, d=256, dff=1024, draws=24, tokens=64) -> float:
    """Covariance gain of a SwiGLU FFN's backward (N(0, 0.02^2) weights, no dropout) for two
    inputs of unit variance and correlation r and one shared upstream gradient: E[(J_1^T g) .
    (J_2^T g)] / d per unit E[g^2], over weight draws and token pairs."""
    acc = []
    for _ in range(draws):
        Wg, Wu = (rng.standard_normal((d, dff)) * 0.02 for _ in range(2))
        Wd = rng.standard_normal((dff, d)) * 0.02
        c = rng.standard_normal((tokens, d))
        x1 = math.sqrt(r) * c + math.sqrt(1 - r) * rng.standard_normal((tokens, d))
        x2 = math.sqrt(r) * c + math.sqrt(1 - r) * rng.standard_normal((tokens, d))
        g = rng.standard_normal((tokens, d))

        def back(x):
            u, v = x @ Wg, x @ Wu
            s = 1 / (1 + np.exp(-u))
            gh = g @ Wd.T
            return (gh * v * s * (1 + u * (1 - s))) @ Wg.T + (gh * u * s) @ Wu.T
        acc.append(float((back(x1) * back(x2)).sum(axis=1).mean()) / d)
    return float(np.mean(acc))


def test_swiglu_backward_covariance_follows_the_pair_correlation():
    """A gated FFN's backward covariance gain depends on the pair's input correlation: sampled
    (24 weight draws x 64 token pairs, seed 0), at input correlation 0.3 over that at 0.8,
    against the rules' chain (olmo2's FFN without dropout) within 0.02 (measured 0.371 against 0.372): 0.3 passes about
    0.37 of the covariance of 0.8."""
    chain = tuple((rule, p) for rule, p in _olmo2_ffn_chain() if rule != "dropout")

    def cg(r):
        x, xs = Forward(0.0, 1.0, r), []
        for rule, params in chain:
            xs.append(x)
            x = REGISTRY[rule].fast(x, None, params)[0]

        def bwd(g):
            for (rule, params), xi in zip(reversed(chain), reversed(xs)):
                g = REGISTRY[rule].fast(xi, g, params, need_forward=False)[1]
            return g
        return _gains(bwd)[1]
    rng = np.random.default_rng(0)
    sampled = _sampled_swiglu_cov_gain(0.3, rng) / _sampled_swiglu_cov_gain(0.8, rng)
    rules = cg(0.3) / cg(0.8)
    assert rules < 0.7
    assert abs(sampled - rules) < 0.02, (sampled, rules)


def test_chain_log_slopes_of_a_gated_ffn():
    """A SwiGLU FFN with small pre-activations (olmo2's own init on a unit stream: variance
    ~0.1) is nearly quadratic: output variance ~ v^2, backward gain ~ v (slopes 2 and 1
    within 0.1)."""
    s_f, s_b = Predictor._chain_log_slopes(_olmo2_ffn_chain(), Forward(0.0, 1.0, 0.5))
    assert abs(s_f - 2) < 0.1 and abs(s_b - 1) < 0.1, (s_f, s_b)
