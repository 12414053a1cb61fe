"""One optimizer step in the Monte Carlo (sigprop.mc.step) against PyTorch: the same model built
as sigprop.torch.plain.PlainTransformer in float64 with the simulation's initial parameters, the
same batch and upstream sample, the loss (1 / (B seq_len)) sum <y, u>, one real torch.optim
step (SGD, Adam, AdamW, with and without weight decay); the gradients, the new parameters and
the outputs on the step's batch and on a fresh one must agree to float64 rounding.  Grouped
key/value heads, rotary positions and QK-norm: the gradients against central differences, and
one step against the transformers LLaMA and Qwen3 models.  Then the measurement's own
bookkeeping: the trace points, an lr -> 0 limit, refusals."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.mc import step as st
from sigprop.mc.sampling import correlated
from sigprop.model.presets import resolve
from sigprop.model.spec import Model

B, L, D, H, DH, DFF = 2, 6, 32, 4, 8, 48


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError:
        if os.environ.get("SIGPROP_REQUIRE_TORCH") == "1":
            pytest.fail("torch is not installed but SIGPROP_REQUIRE_TORCH=1")
        pytest.skip("torch not installed")


def _sub(placement, a, b, n, names, std, bias_std):
    return {"placement": placement, "skip_scale": a, "branch_scale": b, "norm_scale": n,
            "init": {w: {"std": std, "bias_std": bias_std} for w in names}}


def _mixed(**over):
    """4 layers, one per placement (pre, post, peri, output), scales away from 1, biases
    drawn non-zero, LayerNorm, SiLU MLP, causal, a final norm."""
    places = ("pre", "post", "peri", "output")
    layers = [{"attention": _sub(p, 0.9 + 0.1 * i, 1.2 - 0.1 * i, 1.3, "qkvo", 0.25, 0.1),
               "ffn": _sub(places[(i + 1) % 4], 1.1, 0.7 + 0.1 * i, 0.8, ("in", "out"), 0.2, 0.05)}
              for i, p in enumerate(places)]
    obj = {"arch": "test", "n_layers": 4, "d_model": D, "n_heads": H, "d_head": DH, "d_ff": DFF, "seq_len": L,
           "activation": "silu", "norm": "layernorm", "causal": True,
           "dropout": {"attention": 0.1, "hidden": 0.1, "ffn_inner": 0.0},
           "input": {"mean": 0.2, "var": 1.5, "corr": 0.3}, "grad": {"var": 2.0, "corr": 0.2},
           "layers": layers, "final_norm": True}
    obj.update(over)
    return Model.from_json(obj)


def _parallel_glu():
    """3 parallel layers (pre), RMSNorm, SwiGLU, bidirectional, no final norm."""
    layers = [{"attention": _sub("pre", 1.0, 0.9, 1.1, "qkvo", 0.3, 0.1),
               "ffn": _sub("pre", 1.0, 0.6, 1.1, ("gate", "up", "down"), 0.2, 0.1)} for _ in range(3)]
    return Model.from_json({
        "arch": "test", "n_layers": 3, "d_model": D, "n_heads": H, "d_head": DH, "d_ff": DFF, "seq_len": L,
        "activation": "silu", "norm": "rmsnorm", "causal": False,
        "dropout": {"attention": 0.0, "hidden": 0.0, "ffn_inner": 0.0},
        "input": {"mean": 0.0, "var": 1.0, "corr": 0.5}, "grad": {"var": 1.0, "corr": 0.0},
        "layers": layers, "block": "parallel", "ffn_kind": "glu"})


MODELS = {
    "mixed": _mixed,
    "mixed-gelu": lambda: _mixed(activation="gelu"),
    "parallel-glu": _parallel_glu,
    "sequential-glu-rms": lambda: _mixed(norm="rmsnorm", activation="relu", causal=False, final_norm=False,
                                         ffn_kind="glu", layers=[
                                             {"attention": _sub(p, 1.0, 1.0, 1.0, "qkvo", 0.2, 0.0),
                                              "ffn": _sub(p, 1.0, 1.0, 1.0, ("gate", "up", "down"), 0.2, 0.0)}
                                             for p in ("post", "pre")], n_layers=2),
}


def _torch_param(net, key):
    """The torch parameter holding the simulation's parameter ``key``."""
    parts = key.split(".")
    if parts[0] == "norm":
        return getattr(net.norm, parts[1])
    blk = net.layers[int(parts[1])]
    if parts[2] == "attn":
        return getattr(getattr(blk.attn, parts[3]), parts[4])
    if parts[2] == "ffn":
        return getattr(blk.ffn[parts[3]], parts[4])
    return getattr(blk.norms[parts[3]], parts[4])


def _as_torch(key, a, torch):
    t = torch.from_numpy(np.array(a, dtype=np.float64))
    return t.T.contiguous() if key.endswith(".weight") and a.ndim == 2 else t


OPTS = [("sgd", 0.0), ("sgd", 0.3), ("adam", 0.0), ("adam", 0.3), ("adamw", 0.0), ("adamw", 0.3)]


@pytest.mark.parametrize("which", sorted(MODELS))
@pytest.mark.parametrize("optimizer,wd", OPTS)
def test_step_matches_torch(which, optimizer, wd):
    torch = _torch()
    from sigprop.torch.plain import PlainTransformer

    torch.set_num_threads(1)
    m = MODELS[which]()
    # the simulation's GeLU evaluates Phi by an erfc approximation (relative error < 1.2e-7),
    # torch's by erf: agreement to ~1e-6 there, to float64 rounding elsewhere
    tol = 1e-10 if m.activation != "gelu" else 1e-5
    rng = np.random.default_rng(7)
    P = st.init_params(m, rng)
    shape = (B, L, D)
    X = correlated(rng, shape, m.input.mean, m.input.var, m.input.corr, np.float64)
    U = correlated(rng, shape, 0.0, m.grad.var, m.grad.corr, np.float64)
    Xf = correlated(rng, shape, m.input.mean, m.input.var, m.input.corr, np.float64)
    lr = 0.05 if optimizer == "sgd" else 1e-3
    betas, eps = (0.8, 0.95), 1e-8

    net = PlainTransformer(m, seed=0).double().eval()
    with torch.no_grad():
        for k, v in P.items():
            _torch_param(net, k).copy_(_as_torch(k, v, torch))
    tX, tXf = torch.from_numpy(X), torch.from_numpy(Xf)
    with torch.no_grad():
        y0 = net(tX).numpy()
    _, out = st.forward(m, P, X)
    np.testing.assert_allclose(out, y0, rtol=tol, atol=tol)

    loss = (net(tX) * torch.from_numpy(U)).sum() / (B * L)
    loss.backward()
    grads = st.gradients(m, P, X, U)
    mapped = {id(_torch_param(net, k)) for k in P}
    for name, p in net.named_parameters():
        if id(p) not in mapped:             # a norm module this placement does not use
            assert p.grad is None, name
    scale = max(float(np.abs(g).max()) for g in grads.values())
    for k, g in grads.items():
        tg = _as_torch(k, g, torch).numpy()
        np.testing.assert_allclose(tg, _torch_param(net, k).grad.numpy(), rtol=100 * tol, atol=0.1 * tol * scale,
                                   err_msg=k)

    kw = {"lr": lr, "weight_decay": wd}
    opt = {"sgd": lambda: torch.optim.SGD(net.parameters(), **kw),
           "adam": lambda: torch.optim.Adam(net.parameters(), betas=betas, eps=eps, **kw),
           "adamw": lambda: torch.optim.AdamW(net.parameters(), betas=betas, eps=eps, **kw)}[optimizer]()
    opt.step()
    P2 = st.optimizer_step(P, grads, optimizer, lr, betas, eps, wd)
    # the key bias's gradient is 0 in exact arithmetic (it shifts a query's logits by one
    # constant), so both sides hold rounding noise there, which Adam divides by eps
    atol = 0.01 * tol * lr if optimizer == "sgd" else 1e-6 * lr
    for k, v in P2.items():
        np.testing.assert_allclose(_as_torch(k, v, torch).numpy(), _torch_param(net, k).detach().numpy(),
                                   rtol=10 * tol, atol=atol, err_msg=k)
    moved = max(float(np.abs(P2[k] - P[k]).max()) for k in P)
    assert moved > 0.1 * lr                      # the step did move the parameters
    with torch.no_grad():
        for batch, tb in ((X, tX), (Xf, tXf)):
            y1 = net(tb).numpy()
            _, o0 = st.forward(m, P, batch)
            _, o1 = st.forward(m, P2, batch)
            np.testing.assert_allclose(o1, y1, rtol=10 * tol, atol=10 * tol)
            # the change itself, not only the outputs, agrees
            dy = y1 - st.forward(m, P, batch)[1]
            np.testing.assert_allclose(o1 - o0, dy, rtol=1e4 * tol, atol=10 * tol * float(np.abs(dy).max()))


def test_adam_first_step_is_sign_descent():
    """Where |g| >> eps, Adam's first step moves every entry by lr, against its gradient's sign
    (whatever the betas); AdamW's decay shrinks by lr * wd on top."""
    rng = np.random.default_rng(0)
    P = {"w": rng.standard_normal(1000)}
    g = {"w": rng.standard_normal(1000)}
    for betas in ((0.9, 0.999), (0.5, 0.5)):
        P2 = st.optimizer_step(P, g, "adam", 1e-3, betas, 1e-12)
        np.testing.assert_allclose(P2["w"] - P["w"], -1e-3 * np.sign(g["w"]), rtol=1e-6)
    P3 = st.optimizer_step(P, g, "adamw", 1e-3, (0.9, 0.999), 1e-12, weight_decay=0.1)
    np.testing.assert_allclose(P3["w"], P["w"] * (1 - 1e-4) - 1e-3 * np.sign(g["w"]), rtol=1e-6)


def test_simulate_step_points_and_small_lr():
    """One entry per trace point plus the output; the input never changes; the change's
    variance scales as lr^2 under SGD (a first-order change); fresh and own batch both
    reported; the same seed gives the same numbers."""
    m = resolve("preln", n_layers=2, d_model=32, n_heads=4, seq_len=8, final_norm=True)
    r1 = st.simulate_step(m, "sgd", lr=1e-3, batch_size=2, trials=2, seed=3)
    r2 = st.simulate_step(m, "sgd", lr=2e-3, batch_size=2, trials=2, seed=3)
    assert [p for p in r1.points] == [(0, "input"), (1, "attention"), (1, "ffn"), (2, "attention"),
                                      (2, "ffn"), (2, "output")]
    assert r1.var[0] == 0.0 and r1.fresh_var[0] == 0.0
    np.testing.assert_allclose(r2.var[1:] / r1.var[1:], 4.0, rtol=1e-2)
    np.testing.assert_allclose(r2.fresh_var[1:] / r1.fresh_var[1:], 4.0, rtol=1e-2)
    assert (r1.var[1:] > 0).all() and (r1.fresh_var[1:] > 0).all()
    again = st.simulate_step(m, "sgd", lr=1e-3, batch_size=2, trials=2, seed=3)
    np.testing.assert_array_equal(again.rel, r1.rel)
    u = r1.update(-2)
    assert u["rel"] == pytest.approx(r1.rel_top) and set(u) >= {"var", "rel", "fresh_var", "fresh_rel"}


def test_refusals():
    m = resolve("preln", n_layers=1, d_model=32, n_heads=4, seq_len=8)
    with pytest.raises(DomainError, match="optimizer"):
        st.simulate_step(m, "lion", trials=1)
    with pytest.raises(DomainError, match="lr"):
        st.simulate_step(m, "sgd", lr=0.0, trials=1)
    with pytest.raises(DomainError, match="batch_size"):
        st.simulate_step(m, batch_size=0, trials=1)
    with pytest.raises(DomainError, match="without biases"):
        st.simulate_step(_mixed(), trials=1, bias=False)


def _modern(qk_norm="layernorm", norm="layernorm", bias_std=0.1):
    """GQA (4 query heads on 2 key/value heads), rotary positions, QK-norm, causal."""
    layers = [{"attention": _sub(p, 1.0, 0.9, 1.2, "qkvo", 0.4, bias_std),
               "ffn": _sub(p, 1.0, 0.8, 1.0, ("gate", "up", "down"), 0.2, bias_std)} for p in ("pre", "post")]
    return Model.from_json({
        "arch": "test", "n_layers": 2, "d_model": D, "n_heads": H, "d_head": DH, "d_ff": DFF, "seq_len": L,
        "activation": "silu", "norm": norm, "causal": True,
        "dropout": {"attention": 0.0, "hidden": 0.0, "ffn_inner": 0.0},
        "input": {"mean": 0.1, "var": 1.0, "corr": 0.3}, "grad": {"var": 1.0, "corr": 0.2},
        "layers": layers, "ffn_kind": "glu", "n_kv_heads": 2, "rope": {"base": 100.0}, "qk_norm": qk_norm,
        "final_norm": True})


@pytest.mark.parametrize("qk_norm", ["layernorm", "rmsnorm"])
def test_modern_gradients_by_central_differences(qk_norm):
    """The hand-written parameter backward through grouped key/value heads, rotary positions
    and QK-norm (with its gain and, LayerNorm, bias) against central differences of the loss
    in float64, on a sample of every parameter's entries."""
    m = _modern(qk_norm)
    rng = np.random.default_rng(3)
    P = st.init_params(m, rng)
    assert "layers.0.attn.q_norm.weight" in P and ("layers.0.attn.k_norm.bias" in P) == (qk_norm == "layernorm")
    X = correlated(rng, (B, L, D), m.input.mean, m.input.var, m.input.corr, np.float64)
    U = correlated(rng, (B, L, D), 0.0, m.grad.var, m.grad.corr, np.float64)
    grads = st.gradients(m, P, X, U)

    def loss(Q):
        return float((st.forward(m, Q, X)[1] * U).sum()) / (B * L)

    h = 1e-6
    for k, v in P.items():
        flat = v.reshape(-1)
        for i in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            Q = {**P, k: v.copy()}
            Q[k].reshape(-1)[i] += h
            up = loss(Q)
            Q[k].reshape(-1)[i] -= 2 * h
            fd = (up - loss(Q)) / (2 * h)
            assert grads[k].reshape(-1)[i] == pytest.approx(fd, rel=1e-5, abs=1e-9), (k, i)


def _hf(family):
    """(HF model in float64 built from a config of the test's sizes, the sigprop model,
    sigprop parameter name -> HF parameter)."""
    _torch()
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=16, hidden_size=D, intermediate_size=DFF, num_hidden_layers=2, num_attention_heads=H,
                  num_key_value_heads=2, head_dim=DH, rms_norm_eps=1e-6, rope_theta=100.0, hidden_act="silu",
                  max_position_embeddings=64, attention_bias=False, tie_word_embeddings=False)
    cfg = {"llama": lambda: transformers.LlamaConfig(mlp_bias=False, **common),
           "qwen3": lambda: transformers.Qwen3Config(use_sliding_window=False, **common)}[family]()
    cfg._attn_implementation = "eager"
    net = transformers.AutoModel.from_config(cfg).double().eval()
    m = resolve("preln", n_layers=2, d_model=D, n_heads=H, n_kv_heads=2, d_head=DH, d_ff=DFF, seq_len=L,
                ffn="swiglu", norm="rmsnorm", norm_eps=1e-6, rope_base=100.0, qk_norm=family == "qwen3",
                final_norm=True, causal=True, bias=False, init="normal", init_std=0.2, input_corr=0.3)
    names = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
             "attn.o": "self_attn.o_proj", "ffn.gate": "mlp.gate_proj", "ffn.up": "mlp.up_proj",
             "ffn.down": "mlp.down_proj", "norms.attention_in": "input_layernorm",
             "norms.ffn_in": "post_attention_layernorm", "attn.q_norm": "self_attn.q_norm",
             "attn.k_norm": "self_attn.k_norm"}
    params = dict(net.named_parameters())

    def hf_name(key):
        if key.startswith("norm."):
            return key
        _, l, a, b, what = key.split(".")
        return f"layers.{l}.{names[a + '.' + b]}.{what}"
    return net, m, lambda key: params[hf_name(key)]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_modern_step_matches_transformers(family, optimizer):
    """Grouped key/value heads and rotary positions (LLaMA), and QK-norm (Qwen3), against the
    transformers model of that family in float64 with the simulation's parameters (no biases):
    one torch.optim step changes the output as the simulation's does.  transformers computes
    its RMSNorm and its rotary angles in float32: agreement to ~1e-6."""
    torch = _torch()
    torch.set_num_threads(1)
    net, m, tp = _hf(family)
    rng = np.random.default_rng(11)
    P = st.init_params(m, rng, bias=False)
    assert not any(k.endswith(".bias") for k in P)
    X = correlated(rng, (B, L, D), m.input.mean, m.input.var, m.input.corr, np.float64)
    U = correlated(rng, (B, L, D), 0.0, m.grad.var, m.grad.corr, np.float64)
    with torch.no_grad():
        for k, v in P.items():
            tp(k).copy_(_as_torch(k, v, torch))
    assert sum(p.numel() for n, p in net.named_parameters() if not n.startswith("embed")) == \
        sum(v.size for v in P.values())
    tX = torch.from_numpy(X)

    def top(x):
        return net(inputs_embeds=x).last_hidden_state

    _, o0 = st.forward(m, P, X)
    with torch.no_grad():
        np.testing.assert_allclose(o0, top(tX).numpy(), rtol=1e-5, atol=1e-5)
    ((top(tX) * torch.from_numpy(U)).sum() / (B * L)).backward()
    grads = st.gradients(m, P, X, U)
    for k, g in grads.items():
        ref = tp(k).grad.numpy()
        np.testing.assert_allclose(_as_torch(k, g, torch).numpy(), ref, rtol=1e-4,
                                   atol=1e-5 * float(np.abs(ref).max()), err_msg=k)
    lr = 0.5 if optimizer == "sgd" else 1e-2
    params = [p for n, p in net.named_parameters() if not n.startswith("embed")]
    (torch.optim.SGD(params, lr=lr, weight_decay=0.1) if optimizer == "sgd"
     else torch.optim.AdamW(params, lr=lr, weight_decay=0.1)).step()
    P2 = st.optimizer_step(P, grads, optimizer, lr, weight_decay=0.1)
    _, o1 = st.forward(m, P2, X)
    with torch.no_grad():
        dy = top(tX).numpy() - o0
    assert float(np.abs(dy).max()) > 1e-3                 # the step moved the output
    np.testing.assert_allclose(o1 - o0, dy, rtol=1e-3, atol=1e-4 * float(np.abs(dy).max()))


@pytest.mark.parametrize("qk_norm", [None, "layernorm", "rmsnorm"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_forward_matches_the_attention_component(qk_norm, causal):
    """At the initial parameters (QK-norm gain 1, bias 0) one attention sublayer's branch is the
    Monte Carlo attention component's (sigprop.mc.components.attention), with the same
    weights: grouped key/value heads, rotary positions, QK-norm of either kind."""
    from sigprop import registry
    from sigprop.mc.components import get as component

    m = _modern(qk_norm or "layernorm").replace(qk_norm=qk_norm, causal=causal)
    rng = np.random.default_rng(5)
    P = st.init_params(m, rng)
    X = correlated(rng, (B, L, D), 0.0, 1.0, 0.3, np.float64)
    Y, _ = st._Net(m, P, tape=False).attention(X, "layers.0.attn")
    pre = "layers.0.attn"
    W = {"qkv": np.concatenate([P[f"{pre}.{w}.weight"] for w in "qkv"], axis=1),
         "bqkv": np.concatenate([P[f"{pre}.{w}.bias"] for w in "qkv"]),
         "o": P[f"{pre}.o.weight"], "bo": P[f"{pre}.o.bias"]}
    prm = dict(d=D, n_heads=H, d_head=DH, L=L, p=0.0, causal=int(causal), kv_heads=2, rope=100.0,
               q_std=1.0, k_std=1.0, v_std=1.0, o_std=1.0)
    if qk_norm:
        prm.update(qk_norm=registry.norm(qk_norm).qk_code, qk_eps=m.norm_eps)
    ref, _ = component("attention").forward(X, W, prm, np.random.default_rng(0))
    np.testing.assert_allclose(Y, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("arch,n_layers,quoted,trials", [
    ("postln", 6, 0.053, 8), ("deepnorm", 6, 0.024, 8), ("postln", 24, 0.65, 4), ("deepnorm", 24, 0.108, 4)])
def test_deepnet_model_update(arch, n_layers, quoted, trials):
    """DeepNet's model-update figures (d_model 128, 32 tokens, batch 4, one Adam step at lr 1e-3,
    the relative change of the top stream on the step's batch), quoted to two digits: within 10%
    (or 4 standard errors).  The quoted figures are variance ratios."""
    m = resolve(arch, n_layers=n_layers, d_model=128, seq_len=32)
    r = st.simulate_step(m, "adam", lr=1e-3, batch_size=4, trials=trials, seed=1)
    assert abs(r.rel_top - quoted) <= max(0.1 * quoted, 4 * r.rel_se[-2]), (r.rel_top, r.rel_se[-2])
    assert r.fresh_rel_top < r.rel_top


def test_select_steps_only_the_chosen_parameters():
    """With ``select`` only the chosen parameters move: the change is zero below the first
    chosen layer, and every chosen subset of all parameters together gives the full step."""
    m = resolve("preln", n_layers=3, d_model=32, n_heads=4, seq_len=8)
    kw = dict(optimizer="adam", lr=1e-3, batch_size=2, trials=1, seed=2)
    full = st.simulate_step(m, **kw)
    last = st.simulate_step(m, select=lambda k: k.startswith("layers.2."), **kw)
    assert (last.var[:5] == 0).all() and (last.var[5:] > 0).all()          # points of layers 1, 2: no change
    every = st.simulate_step(m, select=lambda k: True, **kw)
    np.testing.assert_array_equal(every.var, full.var)
    assert last.var[-1] < full.var[-1]
