"""Whole-model Monte Carlo (sigprop.mc.model) on the modern blocks: placements peri and output,
the parallel block, RMSNorm and norm_eps, the gated FFN, SiLU and the final norm.

Independent checks: a plain float64 forward of the specified semantics written here, line by
line, with the weights and dropout masks the simulation draws (recorded as drawn), against the
simulation's per-point streams; its gradient by central differences against the simulation's
backward; exact identities between models that share every random draw; moments that a norm
fixes exactly.  And the numbers of models without modern fields, pinned from the code before
the modern blocks were added."""

import copy

import numpy as np
import pytest

import sigprop.mc.components._util as util_module
import sigprop.mc.components.attention as attention_module
import sigprop.mc.model as model_module
from sigprop.errors import DomainError
from sigprop.mc.components import get as component
from sigprop.model import resolve
from sigprop.model.spec import Model

B, L, D, H, DH, DFF = 2, 5, 16, 2, 4, 24


def _sub(placement, a, b, n, names, std, bias_std):
    return {"placement": placement, "skip_scale": a, "branch_scale": b, "norm_scale": n,
            "init": {w: {"std": std, "bias_std": bias_std} for w in names}}


def _model(att=(("pre", 0.9, 1.3, 1.7), ("post", 1.2, 0.7, 1.0)), ffn=(("pre", 1.0, 0.8, 0.6), ("post", 0.5, 1.1, 1.0)),
           activation="relu", ffn_kind="mlp", causal=False, p=0.3, d=D, seq=L, **modern):
    """A small model, one entry of ``att`` and ``ffn`` per layer: (placement, a, b, n)."""
    names = ("gate", "up", "down") if ffn_kind == "glu" else ("in", "out")
    layers = [{"attention": _sub(*sa, "qkvo", 0.6, 0.2), "ffn": _sub(*sf, names, 0.5, 0.3)}
              for sa, sf in zip(att, ffn, strict=True)]
    obj = {"arch": "test", "n_layers": len(layers), "d_model": d, "n_heads": H, "d_head": DH, "d_ff": DFF,
           "seq_len": seq, "activation": activation, "norm": modern.pop("norm", "layernorm"), "causal": causal,
           "dropout": {"attention": p, "hidden": p, "ffn_inner": p},
           "input": {"mean": 0.0, "var": 1.0, "corr": 0.2}, "grad": {"var": 1.0, "corr": 0.0},
           "layers": layers, "ffn_kind": ffn_kind, **modern}
    return Model.from_json(obj)


class _Recorder:
    """Copies of every weight draw (before the simulation folds constants into them) and every
    dropout mask, in the order drawn."""

    def __init__(self, monkeypatch):
        self.weights, self.masks, self.attn_masks = [], [], []
        for name in ("attention", "linear", "reglu", "geglu", "swiglu"):
            comp = component(name)
            orig = comp.sample_weights

            def wrapped(rng, params, dtype, orig=orig):
                W = orig(rng, params, dtype)
                self.weights.append(copy.deepcopy(W))
                return W
            monkeypatch.setattr(comp, "sample_weights", wrapped)
        for module, store in ((model_module, self.masks), (attention_module, self.attn_masks),
                              (util_module, self.masks)):
            orig = module.keep_mask

            def wrapped_mask(rng, shape, p, orig=orig, store=store):
                k = orig(rng, shape, p)
                store.append(k.copy())
                return k
            monkeypatch.setattr(module, "keep_mask", wrapped_mask)


def _norm(kind, eps):
    if kind == "layernorm":
        def f(x):
            mu = x.mean(-1, keepdims=True)
            return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    else:
        def f(x):
            return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)
    return f


def _act(name):
    from math import erf

    if name == "relu":
        return lambda u: np.maximum(u, 0.0)
    if name == "silu":
        return lambda u: u / (1.0 + np.exp(-u))
    # GeLU: the exact erf; the simulation's Phi has a fractional error < 1.2e-7, hence the
    # looser tolerance for gelu models below
    verf = np.vectorize(erf)
    return lambda u: u * 0.5 * (1.0 + verf(u / np.sqrt(2.0)))


def _rope(x, base):
    """x (..., L, d_head) rotated at each position t: x cos(t theta) + rotate_half(x) sin(t theta),
    theta_i = base^(-2i/d_head) for i < d_head/2, repeated for both halves."""
    dh = x.shape[-1]
    theta = base ** (-2.0 * np.arange(dh // 2) / dh)
    ang = np.arange(x.shape[-2])[:, None] * np.concatenate([theta, theta])[None, :]
    half = np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], axis=-1)
    return x * np.cos(ang) + half * np.sin(ang)


def _plain(m, X, weights, masks, attn_masks, top=True):
    """The specified semantics, line by line, in float64 (no folding, no fused steps): the
    stream at every trace point and, with ``top``, the model's output (after a final norm)."""
    weights, masks, attn_masks = list(weights), list(masks), list(attn_masks)
    p_att, p_hid, p_in = m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner
    N = _norm(m.norm, m.norm_eps)
    act = _act(m.activation)
    hd = H * DH

    def attention(h):
        W = weights.pop(0)
        kv = m.n_kv_heads
        z = h.reshape(B * L, D) @ W["qkv"]
        if W["bqkv"] is not None:
            z = z + W["bqkv"]
        # columns: the H query heads, then the kv key heads, then the kv value heads
        q, k, v = (z[:, a:e].reshape(B, L, -1, DH).transpose(0, 2, 1, 3)
                   for a, e in ((0, hd), (hd, hd + kv * DH), (hd + kv * DH, hd + 2 * kv * DH)))
        if m.qk_norm is not None:
            q, k = _norm(m.qk_norm, m.norm_eps)(q), _norm(m.qk_norm, m.norm_eps)(k)
        if m.rope is not None:
            q, k = _rope(q, m.rope), _rope(k, m.rope)
        group = [i * kv // H for i in range(H)]            # the key/value head of query head i
        k, v = k[:, group], v[:, group]
        S = q @ k.transpose(0, 1, 3, 2) / np.sqrt(DH)
        if m.causal:
            S = np.where(np.tri(L, dtype=bool), S, -np.inf)
        P = np.exp(S - S.max(-1, keepdims=True))
        P = P / P.sum(-1, keepdims=True)
        if p_att > 0:
            P = P * attn_masks.pop(0) / (1 - p_att)
        y = (P @ v).transpose(0, 2, 1, 3).reshape(B * L, hd) @ W["o"]
        if W["bo"] is not None:
            y = y + W["bo"]
        return y.reshape(B, L, D)

    def lin(h, W):
        return h @ W["W"] + (W["b"] if W["b"] is not None else 0.0)

    def ffn(h):
        if m.ffn_kind == "glu":
            W = weights.pop(0)
            (wg, bg), (wu, bu) = W["gate"], W["up"]
            u = act(h @ wg + (bg if bg is not None else 0.0)) * (h @ wu + (bu if bu is not None else 0.0))
        else:
            u = act(lin(h, weights.pop(0)))
        if p_in > 0:
            u = u * masks.pop(0) / (1 - p_in)
        return lin(u, weights.pop(0))

    def drop(y):
        return y * masks.pop(0) / (1 - p_hid) if p_hid > 0 else y

    F = {"attention": attention, "ffn": ffn}
    out = [X]
    x = X
    for l in range(m.n_layers):
        if m.block == "parallel":
            a, n = m.attention.skip_scale[l], m.attention.norm_scale[l]
            h = n * N(x)
            ya = m.attention.branch_scale[l] * drop(attention(h))
            yf = m.ffn.branch_scale[l] * drop(ffn(h))
            x = a * x + ya + yf
            out.append(x)
            continue
        for kind in ("attention", "ffn"):
            cols = getattr(m, kind)
            a, b, n = cols.skip_scale[l], cols.branch_scale[l], cols.norm_scale[l]
            place = cols.placement_of(l)
            if place == "pre":
                x = a * x + b * drop(F[kind](n * N(x)))
            elif place == "post":
                x = N(a * x + b * drop(F[kind](x)))
            elif place == "peri":
                x = a * x + b * N(drop(F[kind](n * N(x))))
            else:                                   # output
                x = a * x + b * N(drop(F[kind](x)))
            out.append(x)
    assert not weights and not masks and not attn_masks    # everything drawn was used
    if top:
        out.append(N(x) if m.final_norm else x)
    return out


def _run(m, X, G, seed):
    """The simulation's streams at every point, its top, and its gradients at every point."""
    tr = model_module._Trial(m, np.random.default_rng(seed), np.float64)
    xs, backs = [X], []
    x = X
    for l in range(m.n_layers):
        for kind in model_module._kinds(m):
            x, back, _ = tr.step(kind, l, x)
            xs.append(x)
            backs.append(back)
    y, top = tr.final(x)
    gs = [G if top is None else top(G)]
    for back in reversed(backs):
        gs.append(back(gs[-1]))
    return xs, y, gs[::-1]


def _check_against_plain(monkeypatch, m, rtol=1e-10, grad_rel=1e-6):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((B, L, D)) * 1.5 + 0.3
    G = rng.standard_normal((B, L, D))
    X_in, G_in = X.copy(), G.copy()
    rec = _Recorder(monkeypatch)
    xs, y, gs = _run(m, X, G, seed=11)
    np.testing.assert_array_equal(X, X_in)                  # inputs are left alone
    np.testing.assert_array_equal(G, G_in)
    plain = _plain(m, X, rec.weights, rec.masks, rec.attn_masks)
    assert len(plain) == len(xs) + 1 == len(model_module.point_labels(m)) + 1
    for got, want in zip([*xs, y], plain):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())

    # d <G, top(X)> / dX along random directions, by central differences of the plain forward
    def loss(Xv):
        return float(np.sum(G * _plain(m, Xv, rec.weights, rec.masks, rec.attn_masks)[-1]))
    def central(V, h):
        return (loss(X + h * V) - loss(X - h * V)) / (2 * h)

    h = 1e-5
    for k in range(3):
        V = np.random.default_rng(100 + k).standard_normal(X.shape)
        # Richardson's extrapolation of the central difference: error O(h^4) (the plain
        # central difference's O(h^2) reached 3e-6 relative with grouped-query attention)
        numeric = (4 * central(V, h / 2) - central(V, h)) / 3
        assert float(np.sum(gs[0] * V)) == pytest.approx(numeric, rel=grad_rel, abs=1e-9)
    if m.final_norm:
        # the last point's gradient is the one at the final norm's input
        N = _norm(m.norm, m.norm_eps)
        V = np.random.default_rng(7).standard_normal(X.shape)
        x = xs[-1]
        numeric = (np.sum(G * N(x + h * V)) - np.sum(G * N(x - h * V))) / (2 * h)
        assert float(np.sum(gs[-1] * V)) == pytest.approx(numeric, rel=1e-7, abs=1e-10)
    return xs, gs


# --- every new feature against the plain forward and its finite differences ---------------
PLACEMENT_CASES = [
    (("peri", 0.9, 1.3, 1.7), ("peri", 1.0, 0.8, 0.6)),
    (("output", 1.2, 0.7, 1.0), ("output", 0.5, 1.1, 1.0)),
    (("peri", 1.0, 1.0, 1.0), ("output", 1.0, 1.0, 1.0)),     # a = b = 1: the unscaled paths
]


@pytest.mark.parametrize("first", PLACEMENT_CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_peri_and_output_placements(monkeypatch, first, causal):
    m = _model(att=(first[0], ("pre", 0.9, 1.2, 1.1)), ffn=(first[1], ("post", 0.8, 0.9, 1.0)), causal=causal)
    _check_against_plain(monkeypatch, m)


@pytest.mark.parametrize("norm,eps", [("rmsnorm", 1e-6), ("rmsnorm", 0.3), ("layernorm", 0.3)])
def test_norm_kind_and_eps_in_every_norm(monkeypatch, norm, eps):
    """eps 0.3 on a stream of variance ~1 changes every norm's output by ~15%: a norm that
    ignored norm_eps would fail by far."""
    m = _model(att=(("pre", 0.9, 1.3, 1.7), ("peri", 1.1, 0.9, 1.2)), ffn=(("post", 1.0, 0.8, 0.6), ("output", 0.5, 1.1, 1.0)),
               norm=norm, norm_eps=eps, final_norm=True)
    _check_against_plain(monkeypatch, m)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_gated_ffn(monkeypatch, activation, p):
    m = _model(ffn_kind="glu", activation=activation, p=p)
    _check_against_plain(monkeypatch, m, rtol=1e-6 if activation == "gelu" else 1e-10,
                         grad_rel=1e-4 if activation == "gelu" else 1e-6)


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_silu_mlp(monkeypatch, p):
    m = _model(activation="silu", p=p, causal=True)
    _check_against_plain(monkeypatch, m)


@pytest.mark.parametrize("ffn_kind,activation", [("mlp", "relu"), ("glu", "silu"), ("mlp", "gelu")])
def test_parallel_block(monkeypatch, ffn_kind, activation):
    pre = (("pre", 0.9, 1.3, 1.7), ("pre", 1.2, 0.7, 0.8))
    m = _model(att=pre, ffn=(("pre", 1.0, 0.8, 1.7), ("pre", 1.0, 1.1, 0.8)), ffn_kind=ffn_kind,
               activation=activation, block="parallel", final_norm=True, norm="rmsnorm", causal=True)
    gelu = activation == "gelu"
    xs, _ = _check_against_plain(monkeypatch, m, rtol=1e-6 if gelu else 1e-10, grad_rel=1e-4 if gelu else 1e-6)
    assert len(xs) == 1 + m.n_layers


def test_final_norm(monkeypatch):
    m = _model(final_norm=True)
    _check_against_plain(monkeypatch, m)


def test_rope_helper_is_the_specified_rotation():
    """The plain forward's rotation: by hand at d_head 4 (theta = 1, 1/100), norms kept, and
    q_t . k_s a function of t - s only."""
    x = np.zeros((3, 4))
    x[:, 0] = 1.0                                   # e_0 at positions 0, 1, 2
    r = _rope(x, 1e4)
    np.testing.assert_allclose(r[1], [np.cos(1.0), 0.0, np.sin(1.0), 0.0], atol=1e-15)
    np.testing.assert_allclose(r[2], [np.cos(2.0), 0.0, np.sin(2.0), 0.0], atol=1e-15)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal(8), rng.standard_normal(8)
    Q, K = _rope(np.tile(q, (6, 1)), 500.0), _rope(np.tile(k, (6, 1)), 500.0)
    np.testing.assert_allclose(np.linalg.norm(Q, axis=1), np.linalg.norm(q), rtol=1e-13)
    assert Q[4] @ K[1] == pytest.approx(Q[5] @ K[2], rel=1e-12)
    assert Q[0] @ K[0] == pytest.approx(q @ k, rel=1e-12)


@pytest.mark.parametrize("changes", [dict(n_kv_heads=1), dict(rope={"base": 100.0}), dict(qk_norm="layernorm"),
                                     dict(qk_norm="rmsnorm", norm_eps=0.05),
                                     dict(n_kv_heads=1, rope={"base": 1e4}, qk_norm="rmsnorm", norm="rmsnorm", causal=True)])
def test_attention_features_against_the_plain_forward(monkeypatch, changes):
    """Grouped-query attention, RoPE and QK-norm through the simulation (runs where the
    simulation supports them: SUPPORTED_FEATURES)."""
    m = _model(**changes)
    missing = [f for f in m.features() if f not in model_module.SUPPORTED_FEATURES]
    if missing:
        pytest.skip(f"the Monte Carlo does not simulate {', '.join(missing)}")
    _check_against_plain(monkeypatch, m)


# --- identities between models sharing every random draw ---------------------------------
def _sim(m, **kw):
    return model_module.simulate(m, **{"batch": 2, "trials": 3, "seed": 3, "dtype": np.float64, **kw})


def _same(m1, m2, idx1, idx2, rel=1e-12, backward=True):
    for k1, k2 in zip(idx1, idx2, strict=True):
        for attr in ("mean", "var", "cov"):
            assert getattr(m1.forward[k1], attr) == pytest.approx(getattr(m2.forward[k2], attr), rel=rel, abs=1e-14)
        if backward:
            for attr in ("var", "cov"):
                assert getattr(m1.backward[k1], attr) == pytest.approx(getattr(m2.backward[k2], attr), rel=rel)


@pytest.mark.parametrize("ffn_kind", ["mlp", "glu"])
def test_parallel_with_silent_ffn_is_sequential_attention(ffn_kind):
    """b_ffn = 0: a parallel layer is the sequential attention sublayer followed by an FFN
    sublayer of branch scale 0 (the same draws, in the same order): the same stream, gradient
    and logits, each parallel point at the sequential layer's FFN point."""
    att = (("pre", 0.9, 1.3, 1.7), ("pre", 1.1, 0.7, 0.8))
    ffn = (("pre", 1.0, 0.0, 1.7), ("pre", 1.0, 0.0, 0.8))
    par = _sim(_model(att=att, ffn=ffn, ffn_kind=ffn_kind, block="parallel"))
    seq = _sim(_model(att=att, ffn=ffn, ffn_kind=ffn_kind))
    assert par.points == [(0, "input"), (1, "block"), (2, "block")]
    assert [lab[1] for lab in seq.points] == ["input", "attention", "ffn", "attention", "ffn"]
    _same(par, seq, [0, 1, 2], [0, 2, 4])
    for k1, k2 in ((1, 1), (2, 3)):
        assert par.logit_var[k1][0] == pytest.approx(seq.logit_var[k2][0], rel=1e-12)
    assert par.logit_var[0] is None


def test_final_norm_leaves_the_forward_points_alone():
    """The forward points are the residual stream before the final norm: a model with and
    without it gives the same forward moments for the same seed; only the backward differs."""
    d = 64
    m = _model(att=(("pre", 1.0, 1.0, 1.0),) * 2, ffn=(("pre", 1.0, 1.0, 1.0),) * 2, p=0.1, d=d, seq=8)
    with_norm = _sim(m.replace(final_norm=True))
    without = _sim(m)
    _same(with_norm, without, range(5), range(5), backward=False)
    assert with_norm.backward[-1].var != pytest.approx(without.backward[-1].var, rel=1e-3)
    # through a LayerNorm a gradient of variance g loses 2 of d directions and is divided by
    # the token's variance s: g (1 - 2/d) E[1/s], about g (1 - 2/d) / E[s] (9% above it here, as
    # s varies between tokens; checked within 15%)
    v = with_norm.forward[-1].var
    assert v > 100.0
    assert with_norm.backward[-1].var == pytest.approx((1 - 2 / d) / v, rel=0.15)


def test_peri_without_skip_is_the_norms_output():
    """a = 0 in a peri sublayer: x' = b N(.), whose per-token mean square is exactly
    b^2 s / (s + eps) with s the mean square of N's input about its mean (LayerNorm): the
    measured variance is b^2 to within eps / s."""
    b = 1.7
    m = _model(att=(("pre", 1.0, 1.0, 1.0),), ffn=(("peri", 0.0, b, 1.0),), p=0.1)
    meas = _sim(m, batch=4)
    f = meas.forward[2]
    assert f.mean == pytest.approx(0.0, abs=1e-12)            # LayerNorm: every token's mean is 0
    assert f.var == pytest.approx(b**2, rel=1e-3)


def test_peri_stream_variance_grows_by_b_squared_per_sublayer():
    """peri, a = 1, norm_eps 0: x' = x + b N(.), every token of N(.) of mean square exactly 1
    and, by the sign symmetry of the output weights, uncorrelated with x in expectation: the
    stream variance after k sublayers is v0 + k b^2 (within 4 standard errors; 12 draws)."""
    b = 0.7
    base = resolve("preln", n_layers=3, d_model=64, n_heads=2, d_ff=128, seq_len=16, dropout=0.1)
    obj = base.to_json()
    for layer in obj["layers"]:
        for sub in layer.values():
            sub["placement"], sub["branch_scale"] = "peri", b
    obj["norm_eps"] = 0.0
    meas = model_module.simulate(Model.from_json(obj), batch=4, trials=12, seed=1, dtype=np.float64)
    v0 = meas.forward[0].var
    for k, f in enumerate(meas.forward):
        assert abs(f.var - (v0 + k * b**2)) <= 4 * f.var_se + 1e-12, (k, f.var, v0 + k * b**2, f.var_se)


def test_output_placement_forward_variance():
    """output: x' = a x + b N(.), N(.) of mean square ~1 and uncorrelated with x at
    initialisation: variance a^2 v + b^2 (within 4 standard errors; 16 draws)."""
    a, b = 0.8, 1.5
    m = _model(att=(("output", a, b, 1.0),), ffn=(("pre", 1.0, 0.0, 1.0),), p=0.0, d=64, seq=16)
    meas = model_module.simulate(m, batch=8, trials=16, seed=2, dtype=np.float64)
    v0, v1 = meas.forward[0], meas.forward[1]
    want = a**2 * v0.var + b**2
    assert abs(v1.var - want) <= 4 * v1.var_se + 1e-3, (v1.var, want, v1.var_se)


def test_rmsnorm_keeps_the_mean_layernorm_removes_it():
    """post placement, input mean 2: after RMSNorm every token's mean square is s / (s + eps)
    < 1 (s its mean square before the norm) and the mean survives; after LayerNorm every
    token's mean is 0 exactly."""
    eps = 0.05
    base = _model(att=(("post", 1.0, 1.0, 1.0),), ffn=(("post", 1.0, 1.0, 1.0),), p=0.0, norm_eps=eps)
    base = base.replace(input=type(base.input)(2.0, 1.0, 0.2))
    rms, ln = _sim(base.replace(norm="rmsnorm"), batch=4), _sim(base, batch=4)
    for k in (1, 2):
        f = rms.forward[k]
        assert 0.9 < f.var + f.mean**2 < 1.0
        assert f.mean > 0.1
        assert ln.forward[k].mean == pytest.approx(0.0, abs=1e-12)
        assert ln.forward[k].var == pytest.approx(1.0, rel=0.1)


# --- refusals ---------------------------------------------------------------------------
def test_every_model_feature_is_simulated_or_refused_by_name(monkeypatch):
    """The simulation implements every feature of the model object; one it did not would be
    refused by name, never ignored."""
    m = _model().replace(n_kv_heads=1, rope=10000.0, qk_norm="rmsnorm")
    assert set(m.features()) <= model_module.SUPPORTED_FEATURES
    monkeypatch.setattr(model_module, "SUPPORTED_FEATURES", model_module.BLOCK_FEATURES)
    with pytest.raises(DomainError, match="the Monte Carlo does not implement n_kv_heads, rope, qk_norm"):
        model_module.simulate(m, batch=1, trials=1)


def test_attention_features_reach_the_component_as_its_parameters():
    m = _model().replace(n_kv_heads=1, rope=5e5, qk_norm="layernorm", norm_eps=1e-6)
    p = model_module._attention_params(m, 0)
    assert (p["kv_heads"], p["rope"], p["qk_norm"], p["qk_eps"]) == (1, 5e5, 1, 1e-6)
    assert model_module._attention_params(m.replace(qk_norm="rmsnorm"), 0)["qk_norm"] == 2
    old = model_module._attention_params(_model(), 0)
    assert not {"kv_heads", "rope", "qk_norm", "qk_eps"} & set(old)     # absent unless used


def test_flops_count_the_gated_ffn_and_shared_key_value_heads():
    m = _model(ffn_kind="glu").replace(n_kv_heads=1)
    T, hd, kvd = B * L, H * DH, DH
    products = [(T, D, hd + 2 * kvd), (T, hd, D), (T, D, hd), (T, hd + 2 * kvd, D)]
    products += [(T, D, DFF), (T, D, DFF), (T, DFF, D)] * 2
    per_head = [(L, DH, L), (L, L, DH)] + [(L, L, DH), (L, DH, L), (L, L, DH), (L, L, DH)]
    flop = sum(2 * a * b_ * c for a, b_, c in products) + B * H * sum(2 * a * b_ * c for a, b_, c in per_head)
    assert model_module._flops(m, B) == pytest.approx(m.n_layers * flop, rel=1e-12)


# --- old models: the numbers of the code before the modern blocks ---------------------------
DIMS = dict(d_model=32, n_heads=2, d_ff=64, seq_len=8)
#: produced by sigprop.mc.model as it was before the modern blocks were added (commit 0637127),
#: simulate(resolve(arch, n_layers=3, dropout=p, causal=causal, activation=act, **DIMS),
#: batch=2, trials=2, seed=7, dtype): per point k, forward (mean, var, corr), backward (var,
#: corr) and the logit variance
PINNED = {
    ("preln", "relu", False, 0.1, "float32"): {
        0: (0.01954970878432505, 1.0218955142936088, 0.23142979745477457, 0.9765729676997476, -0.014129481112320905, None),
        3: (0.021528127341298386, 1.0201002682516338, 0.23026831336251977, 0.9761562192672485, -0.013961416919347236,
            0.00019630420865723863),
        6: (0.02280484829680063, 1.0196728203298715, 0.2303915247451039, 0.9766896991124997, -0.013571389164765007, None),
    },
    ("postln", "gelu", True, 0.1, "float64"): {
        0: (0.027564986761511735, 0.9523086196676189, 0.17991878409532042, 0.9885824857724161, 0.01547101660523637, None),
        3: (-7.806255641895632e-18, 0.9999900177559705, 0.1814313960689384, 0.844909986610144, 0.014109972385604266,
            0.00018935919708761348),
        6: (-1.214306433183765e-17, 0.9999900033480436, 0.18114381422474654, 0.8970577165501679, 0.00878787943747295, None),
    },
    ("mixln", "relu", True, 0.0, "float64"): {
        0: (0.027828641936688048, 0.9512037275339772, 0.20161611535535637, 1.0323552635093836, -0.013442982491496934, None),
        3: (0.02521610174031917, 0.9540908035253771, 0.2011528358999808, 1.031131232745103, -0.014310871432414406,
            0.00014895518382343053),
        6: (0.024711692176754965, 0.9536293531911986, 0.20126586588000922, 1.0312738096431684, -0.014689417989387466, None),
    },
}
#: input_gradient_profile(resolve("preln", n_layers=2, dropout=0.1, **DIMS), 2, default_rng(3), float64),
#: from the same code
PINNED_PROFILE = [0.9967762984081092, 1.0312335864249231, 0.7358717347696738, 1.4690447281007892,
                  1.0072068536677758, 1.3446982690286722, 1.2918248444509122, 1.0712989070892536]


@pytest.mark.parametrize("key", sorted(PINNED))
def test_old_models_measure_as_before(key):
    """Models without modern fields give the numbers the simulation gave before the modern
    blocks were added (pinned above; equal to the last digit on the machine that pinned them;
    the tolerance allows only a different BLAS's summation order: 1e-10 relative in float64,
    1e-5 in float32)."""
    arch, act, causal, p, dt = key
    m = resolve(arch, n_layers=3, dropout=p, causal=causal, activation=act, **DIMS)
    meas = model_module.simulate(m, batch=2, trials=2, seed=7, dtype=getattr(np, dt))
    rel = 1e-10 if dt == "float64" else 1e-5
    for k, (mean, var, corr, gvar, gcorr, lv) in PINNED[key].items():
        f, b = meas.forward[k], meas.backward[k]
        assert f.mean == pytest.approx(mean, rel=rel, abs=1e-15)
        for got, want in ((f.var, var), (f.corr, corr), (b.var, gvar), (b.corr, gcorr)):
            assert got == pytest.approx(want, rel=rel)
        assert (meas.logit_var[k] is None) == (lv is None)
        if lv is not None:
            assert meas.logit_var[k][0] == pytest.approx(lv, rel=rel)
    assert meas.points == [(0, "input")] + [(l, s) for l in (1, 2, 3) for s in ("attention", "ffn")]


def test_old_model_gradient_profile_as_before():
    m = resolve("preln", n_layers=2, dropout=0.1, **DIMS)
    got = model_module.input_gradient_profile(m, 2, np.random.default_rng(3), np.float64)
    np.testing.assert_allclose(got, PINNED_PROFILE, rtol=1e-10)


# --- other array backends: the same numbers as NumPy for the same seed ---------------------
def _other_backend(name):
    import importlib

    from sigprop.mc.backend import get_backend

    try:
        importlib.import_module(name)
    except ImportError:
        import os

        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail(f"{name} is not installed but SIGPROP_REQUIRE_TORCH=1")
        pytest.skip(f"{name} not installed")
    return get_backend(name, "cpu")


@pytest.mark.parametrize("backend", ["torch", "array_api_strict"])
@pytest.mark.parametrize("changes", [
    dict(norm="rmsnorm", ffn_kind="glu", activation="silu", final_norm=True, norm_eps=1e-6),
    dict(block="parallel", ffn_kind="glu", activation="relu", att=(("pre", 1.0, 0.9, 1.0),) * 2,
         ffn=(("pre", 1.0, 0.7, 1.0),) * 2),
    dict(activation="silu", att=(("peri", 0.9, 1.3, 1.7), ("output", 1.0, 0.8, 1.0)), causal=True),
])
def test_modern_model_float64_matches_numpy(backend, changes):
    """float64, host random stream: every moment at every point within 1e-12 of NumPy's
    (relative to its variance; what differs is the libraries' order of summation)."""
    bk = _other_backend(backend)
    m = _model(**changes)
    ref = _sim(m)
    got = _sim(m, backend=bk)
    assert got.points == ref.points
    for r, g in zip(ref.forward + ref.backward, got.forward + got.backward):
        for attr in ("mean", "var", "cov"):
            assert abs(getattr(r, attr) - getattr(g, attr)) <= 1e-12 * r.var
    for r, g in zip(ref.logit_var, got.logit_var):
        assert (r is None) == (g is None)
        if r is not None:
            assert g[0] == pytest.approx(r[0], rel=1e-12)


@pytest.mark.parametrize("backend", ["torch", "array_api_strict"])
@pytest.mark.parametrize("name,prm", [
    ("rmsnorm", {"d": 16, "eps": 1e-6, "L": 6}),
    ("silu", {"d": 16, "L": 6}),
    ("swiglu", {"d_in": 16, "d_ff": 24, "gate_std": 0.3, "up_std": 0.2, "gate_b_std": 0.1, "up_b_std": 0.2, "L": 6}),
    ("reglu", {"d_in": 16, "d_ff": 24, "gate_std": 0.3, "up_std": 0.2, "L": 6}),
])
def test_modern_components_float64_match_numpy(backend, name, prm):
    from sigprop.mc.component import measure
    from sigprop.state import Backward, Forward

    bk = _other_backend(backend)
    comp = component(name)
    x, g = Forward(0.3, 1.2, 0.25), Backward(0.8, 0.2)
    ref = measure(comp, prm, x, g, runs=3, batch=4, seed=5, dtype=np.float64)
    got = measure(comp, prm, x, g, runs=3, batch=4, seed=5, dtype=np.float64, backend=bk)
    for r, o in ((ref.x, got.x), (ref.g, got.g)):
        for attr in ("mean", "var", "cov"):
            assert abs(getattr(r, attr) - getattr(o, attr)) <= 1e-12 * r.var


def test_numpy_only_component_refused_on_other_backends(monkeypatch):
    bk = _other_backend("torch")
    monkeypatch.setattr(component("rmsnorm"), "array_api", False)
    m = _model(norm="rmsnorm")
    with pytest.raises(DomainError, match="component rmsnorm runs on the numpy backend only"):
        _sim(m, backend=bk)
    _sim(_model(), backend=bk)                # a model without it still runs there


def test_comparison_pairs_points_by_layer_and_sublayer():
    """check compares point k of the prediction with point k of the measurement: the labels
    must agree (a parallel model's measurement has one "block" point per layer)."""
    from sigprop.model.checking import compare
    from sigprop.model.predict import predict

    m = _model(att=(("pre", 1.0, 1.0, 1.0),) * 2, ffn=(("pre", 1.0, 1.0, 1.0),) * 2, p=0.0)
    meas = _sim(m)
    assert compare(predict(m), meas).measured[3]["sublayer"] == "attention"
    par = _sim(m.replace(block="parallel"))
    with pytest.raises(DomainError, match="do not pair"):
        compare(predict(m), par)                      # 5 sequential points against 3 block points
    meas.points = meas.points[:3] + [(2, "block"), (2, "ffn")]
    with pytest.raises(DomainError, match="do not pair"):
        compare(predict(m), meas)


def test_modern_model_on_dask_workers_equals_the_serial_run():
    """The trials of a modern model (parallel, gated SiLU FFN, RMSNorm, final norm) on a
    2-worker LocalCluster: the serial run's numbers exactly."""
    try:
        __import__("distributed")
    except ImportError:
        import os

        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail("distributed is not installed but SIGPROP_REQUIRE_TORCH=1")
        pytest.skip("distributed not installed")
    from sigprop.mc.distributed import connect

    m = _model(att=(("pre", 1.0, 0.9, 1.0),) * 2, ffn=(("pre", 1.0, 0.7, 1.0),) * 2, block="parallel",
               ffn_kind="glu", activation="silu", norm="rmsnorm", final_norm=True)
    d = connect("local", 2)
    try:
        a = model_module.simulate(m, batch=2, trials=4, seed=9, distributor=d)
    finally:
        d.close()
    b = model_module.simulate(m, batch=2, trials=4, seed=9)
    assert a.points == b.points and len(a.forward) == 3
    assert [(f.mean, f.var, f.cov) for f in a.forward] == [(f.mean, f.var, f.cov) for f in b.forward]
    assert [(f.var, f.cov) for f in a.backward] == [(f.var, f.cov) for f in b.backward]
    np.testing.assert_array_equal(a.logit_draws, b.logit_draws)
