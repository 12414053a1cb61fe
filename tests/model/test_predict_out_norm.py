"""A norm on a branch output (peri and output placements): the per-token statistics of the
branch's hidden layer (rules' token_moments) and the backward they correct."""

import math

import numpy as np
import pytest

import sigprop.mc.model as model_module
import sigprop.rules  # noqa: F401  (registers the rules)
from sigprop.model.options import build_model
from sigprop.model.predict import predict
from sigprop.rules.base import REGISTRY
from sigprop.state import Forward


def _act(name, t):
    from math import erf
    if name == "relu":
        return np.maximum(t, 0), (t > 0).astype(float)
    if name == "gelu":
        Phi = 0.5 * (1 + np.vectorize(erf)(t / math.sqrt(2)))
        phi = np.exp(-t * t / 2) / math.sqrt(2 * math.pi)
        return t * Phi, Phi + t * phi
    s = 1 / (1 + np.exp(-t))
    return t * s, s * (1 + t * (1 - s))


@pytest.mark.parametrize("name", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("var", [0.05, 1.0])
def test_unit_moments_match_sampling(name, var):
    """E[f^2], E[f^4], E[f'^2], E[f'^2 f^2] (closed form or quadrature) against 400k
    Gaussian samples (seed 0), within 5 standard errors."""
    z = np.random.default_rng(0).standard_normal(400_000) * math.sqrt(var)
    f, fp = _act(name, z)
    samples = (f**2, f**4, fp**2, fp**2 * f**2)
    got = REGISTRY[name].unit_moments(var)
    for g, s in zip(got, samples):
        assert abs(g - s.mean()) <= 5 * s.std() / math.sqrt(s.size), (name, var, g, s.mean())


@pytest.mark.parametrize("rule", ["reglu", "geglu", "swiglu"])
def test_glu_token_moments_match_weight_draws(rule):
    """One token x (|x|^2 = d), 200000 hidden units with their own gate and up weight rows
    (seed 1): B = h^2 and A = |dh/dx|^2 from the sampled weights; the rule's k_b, k_ab
    (sampling error of these fourth- and eighth-moment ratios: ~10%), beta_b (from E[B] at a
    rescaled x) and b_over_a agree (the A formula's neglected terms are O(1/d_in))."""
    d, n, s = 128, 200_000, 0.09
    rng = np.random.default_rng(1)
    x = rng.standard_normal(d)
    x *= math.sqrt(d) / np.linalg.norm(x)
    Wg = rng.standard_normal((n, d), dtype=np.float32) * s
    Wu = rng.standard_normal((n, d), dtype=np.float32) * s
    act = rule.replace("reglu", "relu").replace("geglu", "gelu").replace("swiglu", "silu")

    def units(scale):
        g, u = Wg @ (x * scale), Wu @ (x * scale)
        f, fp = _act(act, g)
        h = f * u
        A = ((fp * u) ** 2 * (Wg**2).sum(axis=1) + f**2 * (Wu**2).sum(axis=1)
             + 2 * fp * u * f * (Wg * Wu).sum(axis=1))
        return h**2, A

    B, A = units(1.0)
    p = REGISTRY[rule].param_values(dict(d_in=d, d_ff=n, gate_std=s, up_std=s))
    t = REGISTRY[rule].token_moments(None, Forward(0.0, 1.0, 0.0), p)
    k_b = (B**2).mean() / B.mean() ** 2 - 1
    k_ab = (A * B).mean() / (A.mean() * B.mean()) - 1
    assert t.k_b == pytest.approx(k_b, rel=0.2)
    assert t.k_ab == pytest.approx(k_ab, rel=0.2)
    assert t.b_over_a == pytest.approx(B.mean() / A.mean(), rel=0.05)
    # beta_b: the same weights at x (1 +- 5%), E[B] in log Q
    b_hi, _ = units(1.05)
    b_lo, _ = units(1 / 1.05)
    assert t.beta_b == pytest.approx(math.log(b_hi.mean() / b_lo.mean()) / (4 * math.log(1.05)), rel=0.05)


@pytest.mark.parametrize("placement", ["peri", "output"])
def test_branch_gradient_through_output_norm(placement):
    """ReLU MLP branch (d 64, d_ff 64) under a norm on its output, 1 layer, Monte Carlo 800
    draws x 4 sequences of 8 tokens (seed 11): the gradient at the FFN sublayer's input is
    predicted within 3 standard errors.  Taking the branch output as Gaussian per token
    (kappa 1, no ratio correction) predicts it 5.4 (peri) and 6.6 (output) standard errors
    low: E[1/|h|^2] of the hidden layer (relative variance 5/d_ff) less the Jacobian's
    covariance with |h|^2 (1/d_ff) and the extra energy along the output's direction
    (2/d_ff; without an input norm also 1/d along the input's direction)."""
    m = build_model(dict(arch="llama", ffn="mlp", activation="relu", rope=False, causal=False,
                         placement=placement, final_norm=False, layers=1, d_model=64, heads=2, d_ff=64,
                         seq_len=8, dropout=0.0, init="normal", input_var=1.0))
    meas = model_module.simulate(m, batch=4, trials=800, seed=11, dtype=np.float64)
    got = math.exp(predict(m)[1].log_gvar)
    b = meas.backward[1]
    assert abs(got - b.var) <= 3 * b.var_se, (got, b.var, b.var_se)
