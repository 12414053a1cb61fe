"""The mixture-of-experts Monte Carlo components (sigprop.mc.components.moe): the hand-written
backward against central finite differences in float64 (softmax and sigmoid routers, with and
without renormalisation, group-limited routing, route scale, shared expert and its sigmoid
gate), the forward against a slow per-token loop written here from the specification, and
the sweep grid."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.conftest import finite_difference_check
from sigprop.mc import components as C
from sigprop.rules import REGISTRY

MOES = ("moe_reglu", "moe_geglu", "moe_swiglu")
ACT = {"moe_reglu": lambda x: max(x, 0.0),
       "moe_geglu": lambda x: 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0))),
       "moe_swiglu": lambda x: x / (1.0 + math.exp(-x))}


def _params(**kw):
    p = dict(d_in=6, d_ff=5, n_experts=8, top_k=3, router=0, norm_topk=0, route_scale=1.0, n_group=1,
             topk_group=1, router_std=0.8, gate_std=0.5, up_std=0.4, down_std=0.3, L=3)
    p.update(kw)
    return p


SHARED = dict(shared_d_ff=4, shared_gate_std=0.5, shared_up_std=0.45, shared_down_std=0.5)
CASES = {
    "softmax, normalised": _params(norm_topk=1),
    "softmax, unnormalised, route scale": _params(route_scale=2.5),
    "sigmoid, normalised, groups": _params(router=1, norm_topk=1, n_group=4, topk_group=2, route_scale=2.5),
    "sigmoid, unnormalised": _params(router=1, top_k=2),
    "softmax, groups, shared expert": _params(n_group=2, topk_group=1, **SHARED),
    "sigmoid, normalised, shared expert and mix": _params(router=1, norm_topk=1, **SHARED, shared_mix=1,
                                                         shared_mix_std=0.7),
    "top_k = E": _params(top_k=8, norm_topk=1),
}


# ------------------------------------------------------------------------ backward
@pytest.mark.parametrize("name", MOES)
@pytest.mark.parametrize("case", list(CASES))
def test_backward_finite_differences(name, case):
    a, n = finite_difference_check(C.get(name), CASES[case], (2, 3, 6), seed=4)
    # (GeLU's erfc approximation has fractional error ~1e-7: its finite differences see it)
    assert a == pytest.approx(n, rel=1e-6 if name == "moe_geglu" else 1e-8)


@pytest.mark.parametrize("case", ["softmax, normalised", "softmax, unnormalised, route scale",
                                  "sigmoid, normalised, groups", "sigmoid, unnormalised"])
def test_the_router_path_is_needed(case, monkeypatch):
    """Without the gradient through the router weights the finite differences disagree: the
    test above sees that path."""
    import sigprop.mc.components.moe as M

    monkeypatch.setattr(M, "router_grad", lambda q, sel, saved, p: np.zeros(saved[0].shape))
    a, n = finite_difference_check(C.get("moe_swiglu"), CASES[case], (2, 3, 6), seed=4)
    assert abs(a - n) > 1e-2 * abs(n)


def test_the_mix_gate_path_is_needed(monkeypatch):
    comp = C.get("moe_swiglu")
    p = CASES["sigmoid, normalised, shared expert and mix"]
    a, n = finite_difference_check(comp, p, (2, 3, 6), seed=5)
    assert a == pytest.approx(n, rel=1e-8)
    orig = comp.backward

    def without_mix(GY, cache):       # the mix vector zeroed in the backward only
        W = dict(cache[1], mix=np.zeros_like(cache[1]["mix"]))
        return orig(GY, (cache[0], W, *cache[2:]))
    monkeypatch.setattr(comp, "backward", without_mix)
    a0, _ = finite_difference_check(comp, p, (2, 3, 6), seed=5)
    assert abs(a0 - n) > 1e-3 * abs(n)


# ------------------------------------------------------------------------- forward
def _reference(name, X, W, p):
    """y of every token by a plain loop over tokens and experts, from the specification."""
    act = ACT[name]
    E, k, G, kg = p["n_experts"], p["top_k"], p.get("n_group", 1), p.get("topk_group", 1)
    B, L, d = X.shape
    Y = np.zeros_like(X)
    chosen = []

    def expert(h, ex):
        g, u = h @ ex["gate"][0], h @ ex["up"][0]
        return np.array([act(a) * b for a, b in zip(g, u)]) @ ex["down"]

    for b in range(B):
        for t in range(L):
            h = X[b, t]
            r = [float(h @ W["router"][:, e]) for e in range(E)]
            if p.get("router", 0) == 0:
                mx = max(r)
                z = [math.exp(v - mx) for v in r]
                pi = [v / sum(z) for v in z]
            else:
                pi = [1.0 / (1.0 + math.exp(-v)) for v in r]
            allowed = list(range(E))
            if G > 1 and kg < G:
                size = E // G
                scores = []
                for gi in range(G):
                    members = sorted(pi[gi * size:(gi + 1) * size], reverse=True)
                    scores.append(sum(members[:2]))
                best = sorted(range(G), key=lambda gi: -scores[gi])[:kg]
                allowed = [e for e in range(E) if e // size in best]
            S = sorted(allowed, key=lambda e: -pi[e])[:k]
            chosen.append(sorted(S))
            total = sum(pi[e] for e in S)
            y = np.zeros(d)
            for e in S:
                w = pi[e] / total if p.get("norm_topk", 0) else pi[e]
                y += p.get("route_scale", 1.0) * w * expert(h, W["experts"][e])
            if p.get("shared_d_ff", 0):
                m = 1.0 / (1.0 + math.exp(-float(h @ W["mix"]))) if p.get("shared_mix", 0) else 1.0
                y += m * expert(h, W["shared"])
            Y[b, t] = y
    return Y, chosen


@pytest.mark.parametrize("name", MOES)
@pytest.mark.parametrize("case", list(CASES))
def test_forward_is_the_definition(name, case):
    comp = C.get(name)
    p = CASES[case]
    rng = np.random.default_rng(7)
    W = comp.sample_weights(rng, p, np.float64)
    X = rng.standard_normal((2, 4, 6))
    Y, cache = comp.forward(X, W, p, rng)
    ref, chosen = _reference(name, X, W, p)
    # (GeLU: the erfc approximation's ~1e-7 of the values)
    tol = 1e-7 * np.abs(ref).max() if name == "moe_geglu" else 1e-12
    np.testing.assert_allclose(Y, ref, rtol=1e-10, atol=tol)
    assert [sorted(s) for s in cache[2].tolist()] == chosen


def test_group_limited_routing_changes_the_choice():
    """At these weights group-limited routing picks other experts than plain top-k for some
    tokens, so the forward test above sees the group step."""
    comp = C.get("moe_swiglu")
    p = CASES["sigmoid, normalised, groups"]
    rng = np.random.default_rng(7)
    W = comp.sample_weights(rng, p, np.float64)
    X = rng.standard_normal((2, 4, 6))
    _, grouped = _reference("moe_swiglu", X, W, p)
    _, plain = _reference("moe_swiglu", X, W, {**p, "n_group": 1, "topk_group": 1})
    assert grouped != plain


def test_float32_forward_and_backward():
    comp = C.get("moe_reglu")
    p = CASES["sigmoid, normalised, shared expert and mix"]
    rng = np.random.default_rng(3)
    W = comp.sample_weights(rng, p, np.float32)
    X = rng.standard_normal((2, 3, 6)).astype(np.float32)
    Y, cache = comp.forward(X, W, p, rng)
    GX = comp.backward(np.ones_like(Y), cache)
    assert Y.dtype == np.float32 and GX.dtype == np.float32 and np.isfinite(GX).all()


def test_an_unrouted_expert_is_not_run():
    """Experts run on their routed tokens only: with one token and top-1 exactly one expert
    calls the GLU core (and the output is that expert's)."""
    comp = C.get("moe_swiglu")
    p = _params(n_experts=16, top_k=1, L=1)
    rng = np.random.default_rng(2)
    W = comp.sample_weights(rng, p, np.float64)
    X = rng.standard_normal((1, 1, 6))
    Y, cache = comp.forward(X, W, p, rng)
    routed = cache[5]
    assert len(routed) == 1 and routed[0][1].tolist() == [0]


# --------------------------------------------------------------------------- sweep
def test_registered_with_their_rules_and_sweeps():
    for name in MOES:
        comp = C.get(name)
        assert comp.rule == name and name in REGISTRY and name in C.SWEEPS
        assert {q.name for q in REGISTRY[name].params} <= set(CASES["sigmoid, normalised, shared expert and mix"]) \
            | {"shared_d_ff"}
        spec = C.SWEEPS[name]
        assert len(spec.points()) == 240 and len(spec.points(spec.variants["groups"]["grid"])) == 48
        case = spec.make_case(spec.points(spec.variants["groups"]["grid"])[0])
        assert (case.rule_params["n_group"], case.rule_params["topk_group"], case.rule_params["route_scale"]) == (8, 4, 2.5)


def test_flops_count_routed_tokens_only():
    comp = C.get("moe_swiglu")
    base = dict(d_in=256, d_ff=256, n_experts=64, top_k=2, router_std=0.1, gate_std=0.1, up_std=0.1, down_std=0.1,
                L=2)
    f1, f2 = comp.flops(base, 4), comp.flops({**base, "n_experts": 256}, 4)
    assert f1 == pytest.approx(4 * 2 * (4 * 256 * 64 + 12 * 256 * 2 * 256))
    assert f2 - f1 == pytest.approx(4 * 2 * 4 * 256 * 192)     # more experts: only the router grows


def test_one_grid_point_agrees_with_the_rule():
    """Seeded: a shared-expert, top-8-of-64 softmax point at 2 weight draws (SE about 1%)."""
    from sigprop.mc.component import measure
    from sigprop.mc.sweep import errors

    spec = C.SWEEPS["moe_swiglu"]
    pt = dict(experts=(64, 8), router=0, norm_topk=1, router_std_sqrt_din=1.0, x_corr=0.5, g_corr=0.5, shared=256)
    case = spec.make_case(pt)
    meas = measure(spec.component, case.sim_params, case.x, case.g, runs=2, batch=256, seed=3)
    px, pg = REGISTRY["moe_swiglu"].evaluate(case.x, case.g, **case.rule_params)
    for k, e in errors(px, pg, meas).items():
        assert e < 0.04, (k, e)


@pytest.mark.parametrize("router,groups", [(0, (1, 1)), (1, (1, 1)), (1, (4, 2))])
def test_a_zero_router_takes_the_first_experts(router, groups):
    """All scores tie: every token takes experts 0 .. top_k - 1 (the rule's reading, torch.topk's)."""
    comp = C.get("moe_swiglu")
    p = _params(router=router, router_std=0.0, n_group=groups[0], topk_group=groups[1])
    rng = np.random.default_rng(0)
    W = comp.sample_weights(rng, p, np.float64)
    _, cache = comp.forward(rng.standard_normal((2, 3, 6)), W, p, rng)
    assert all(sorted(s) == [0, 1, 2] for s in cache[2].tolist())
