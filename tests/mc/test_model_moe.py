"""Whole-model Monte Carlo (sigprop.mc.model) with a mixture-of-experts FFN (ffn_kind "moe"):
the trial simulates, finite and deterministic by seed; its FFN point is x + b * MoE(n N(x))
with the MoE component at the drawn weights (the branch scale and norm scale folded
correctly); its backward is the gradient of its forward (central differences through the
attention, the norms, the router, the experts and the shared-expert gate); the work counts
routed tokens only; the memory estimate bounds the measured peak."""

import copy

import numpy as np
import pytest

import sigprop.mc.model as model_module
from sigprop.mc.components import get as component
from sigprop.model.spec import Model

B, L, D = 2, 5, 16


def _obj(n_layers=2, shared=12, mix=True, b=0.8, n=1.3, hidden=0.1, placement="pre", **moe):
    names = ["router", "gate", "up", "down"] + (["shared_gate", "shared_up", "shared_down"] if shared else []) \
        + (["shared_mix"] if mix else [])
    att = {"placement": "pre", "skip_scale": 1.0, "branch_scale": 1.0, "norm_scale": 1.0,
           "init": {w: {"std": 0.3, "bias_std": 0.0} for w in "qkvo"}}
    ffn = {"placement": placement, "skip_scale": 1.0, "branch_scale": b, "norm_scale": n,
           "init": {w: {"std": 0.35, "bias_std": 0.0} for w in names}}
    spec = {"n_experts": 8, "top_k": 2, "d_ff_expert": 12, "d_ff_shared": shared, "shared_mix": mix,
            "router": "sigmoid", "norm_topk_prob": True, "route_scale": 2.5, "n_group": 4, "topk_group": 2}
    spec.update(moe)
    return {"arch": "moe", "n_layers": n_layers, "d_model": D, "n_heads": 2, "d_head": 8, "d_ff": 24, "seq_len": L,
            "activation": "silu", "norm": "rmsnorm", "causal": True,
            "dropout": {"attention": 0.0, "hidden": hidden, "ffn_inner": 0.0},
            "input": {"mean": 0.0, "var": 1.0, "corr": 0.2}, "grad": {"var": 1.0, "corr": 0.0},
            "ffn_kind": "moe", "moe": spec,
            "layers": [{"attention": copy.deepcopy(att), "ffn": copy.deepcopy(ffn)} for _ in range(n_layers)]}


def _model(**kw):
    return Model.from_json(_obj(**kw))


def test_simulates_finite_and_deterministic_by_seed():
    m = _model()
    a = model_module.simulate(m, batch=B, trials=2, seed=3)
    again = model_module.simulate(m, batch=B, trials=2, seed=3)
    other = model_module.simulate(m, batch=B, trials=2, seed=4)
    assert model_module.point_labels(m) == [(0, "input"), (1, "attention"), (1, "ffn"), (2, "attention"), (2, "ffn")]
    for pts in (a.forward, a.backward):
        assert len(pts) == 5
        assert all(np.isfinite([p.mean, p.var, p.cov]).all() for p in pts)
    assert [p.var for p in a.forward] == [p.var for p in again.forward]
    assert [p.var for p in a.backward] == [p.var for p in again.backward]
    assert [p.var for p in a.forward][1:] != [p.var for p in other.forward][1:]
    assert a.forward[2].var != a.forward[1].var                    # the MoE point changes the stream


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_the_ffn_point_is_the_moe_component(monkeypatch, placement):
    """x' = x + b Dropout(MoE(n N(x))) (pre) or N(x + b Dropout(MoE(x))) (post), MoE the
    component at the weights as drawn (recorded before the simulation folds n and b into
    them); no hidden dropout here, so the mask is all ones."""
    m = _model(n_layers=1, hidden=0.0, placement=placement)
    comp = component("moe_swiglu")
    drawn = []
    orig = comp.sample_weights

    def record(rng, params, dtype):
        W = orig(rng, params, dtype)
        drawn.append((copy.deepcopy(W), dict(params)))
        return W
    monkeypatch.setattr(comp, "sample_weights", record)
    X = np.random.default_rng(1).standard_normal((B, L, D)) * 1.3
    tr = model_module._Trial(m, np.random.default_rng(2), np.float64)
    out, _, _ = tr.sublayer(m.ffn, 0, X)
    (W, params), = drawn
    assert params["n_experts"] == 8 and params["top_k"] == 2 and params["router"] == 1 and params["norm_topk"] == 1
    assert params["route_scale"] == 2.5 and (params["n_group"], params["topk_group"]) == (4, 2)
    assert params["shared_d_ff"] == 12 and params["shared_mix"] == 1 and params["shared_mix_std"] == 0.35

    def rms(x):
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + m.norm_eps)
    if placement == "pre":
        want = X + 0.8 * comp.forward(1.3 * rms(X), W, params, None)[0]
    else:
        want = rms(X + 0.8 * comp.forward(X, W, params, None)[0])
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("moe", [dict(), dict(router="softmax", norm_topk_prob=False, n_group=1, topk_group=1)])
def test_trial_backward_is_the_gradient_of_its_forward(moe):
    m = _model(**moe)

    def trial(X, G=None):
        tr = model_module._Trial(m, np.random.default_rng(7), np.float64)    # the same draws every call
        backs = []
        for l in range(m.n_layers):
            for what in m.slots():
                X, back, _ = tr.step(what, l, X)
                backs.append(back)
        if G is None:
            return X
        for back in reversed(backs):
            G = back(G)
        return X, G

    rng = np.random.default_rng(0)
    X, G = rng.standard_normal((B, L, D)), rng.standard_normal((B, L, D))
    _, GX = trial(X, G)
    h = 1e-6
    for k in range(2):
        V = np.random.default_rng(10 + k).standard_normal(X.shape)
        numeric = float(np.sum(G * (trial(X + h * V) - trial(X - h * V)))) / (2 * h)
        assert float(np.sum(GX * V)) == pytest.approx(numeric, rel=1e-7)


def test_flops_count_routed_tokens_only():
    """More experts add only the router's products; a larger top_k adds three d x d_ff_expert
    products each way per token per extra expert; the shared expert three of its own."""
    T, layers = B * L, 2
    base = model_module._flops(_model(), B)
    more_experts = model_module._flops(_model(n_experts=16), B)
    assert more_experts - base == pytest.approx(layers * T * 4 * D * 8)
    wider_k = model_module._flops(_model(top_k=3), B)
    assert wider_k - base == pytest.approx(layers * T * 12 * D * 12)
    no_shared = model_module._flops(_model(shared=0, mix=False), B)
    assert base - no_shared == pytest.approx(layers * T * (12 * D * 12 + 4 * D))


def test_trial_memory_bounds_the_measured_peak():
    import tracemalloc

    from sigprop.mc.backend import Rng, numpy_backend

    obj = _obj(n_layers=2, hidden=0.0)
    obj.update(d_model=64, seq_len=16, n_heads=4, d_head=16)
    obj["moe"].update(n_experts=32, top_k=4, d_ff_expert=64, d_ff_shared=64, n_group=8, topk_group=4)
    m = Model.from_json(obj)
    model_module.run_trial(m, 1, Rng(np.random.SeedSequence(1), numpy_backend(), "host"))   # (first-call allocations)
    tracemalloc.start()
    try:
        model_module.run_trial(m, 8, Rng(np.random.SeedSequence(0), numpy_backend(), "host"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 1.0 <= model_module.trial_memory(m, 8) / peak <= 2.0
