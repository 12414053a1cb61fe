"""Whole-model Monte Carlo (sigprop.mc.model): the simulated forward against a plain float64
implementation of the contract's semantics written here (same weights and dropout masks,
recorded as the simulation draws them), its backward against central differences of that
plain forward, and the matrix-multiply count against a product-by-product enumeration."""

import copy

import numpy as np
import pytest

import sigprop.mc.components.attention as attention_module
import sigprop.mc.model as model_module
from sigprop.mc.components import get as component
from sigprop.errors import DomainError
from sigprop.model.spec import Model

B, L, D, H, DH, DFF = 2, 5, 8, 2, 3, 12     # H * DH != D on purpose


def _sublayer(placement, a, b, n, names, std, bias_std):
    return {"placement": placement, "skip_scale": a, "branch_scale": b, "norm_scale": n,
            "init": {w: {"std": std, "bias_std": bias_std} for w in names}}


def _model(activation="relu", causal=False, p=0.3, att_std=0.6):
    layers = [
        {"attention": _sublayer("pre", 0.9, 1.3, 1.7, "qkvo", att_std, 0.2),
         "ffn": _sublayer("pre", 1.0, 0.8, 0.6, ("in", "out"), 0.5, 0.3)},
        {"attention": _sublayer("post", 1.2, 0.7, 1.0, "qkvo", att_std, 0.1),
         "ffn": _sublayer("post", 0.5, 1.1, 1.0, ("in", "out"), 0.4, 0.0)},
    ]
    return Model.from_json({
        "arch": "test", "n_layers": 2, "d_model": D, "n_heads": H, "d_head": DH, "d_ff": DFF, "seq_len": L,
        "activation": activation, "norm": "layernorm", "causal": causal,
        "dropout": {"attention": p, "hidden": p, "ffn_inner": p},
        "input": {"mean": 0.0, "var": 1.0, "corr": 0.2}, "grad": {"var": 1.0, "corr": 0.0},
        "layers": layers,
    })


class _Recorder:
    """Copies of every weight draw (before the simulation folds constants into them) and every
    dropout mask, in the order drawn."""

    def __init__(self, monkeypatch):
        self.weights, self.masks, self.attn_masks = [], [], []
        for name in ("attention", "linear"):
            comp = component(name)
            orig = comp.sample_weights

            def wrapped(rng, params, dtype, orig=orig):
                W = orig(rng, params, dtype)
                self.weights.append(copy.deepcopy(W))
                return W
            monkeypatch.setattr(comp, "sample_weights", wrapped)
        for module, store in ((model_module, self.masks), (attention_module, self.attn_masks)):
            orig = module.keep_mask

            def wrapped_mask(rng, shape, p, orig=orig, store=store):
                k = orig(rng, shape, p)
                store.append(k.copy())
                return k
            monkeypatch.setattr(module, "keep_mask", wrapped_mask)
        drop = component("dropout")        # the generic (non-ReLU) FFN path draws through it
        orig_fwd = drop.forward

        def drop_forward(X, W, params, rng):
            Y, mask = orig_fwd(X, W, params, rng)
            self.masks.append(None if mask is None else mask != 0)
            return Y, mask
        monkeypatch.setattr(drop, "forward", drop_forward)


def _ln(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def _gelu(x):
    from sigprop.backend.numeric import Phi     # the simulation's own Phi (error < 1.2e-7)
    return x * Phi(x)


def _plain_forward(m, X, weights, masks, attn_masks):
    """The contract, line by line, in float64 (no folding, no fused steps)."""
    weights, masks, attn_masks = list(weights), list(masks), list(attn_masks)
    p_att, p_hid, p_in = m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner
    hd = H * DH

    def attention(h):
        W = weights.pop(0)
        z = h.reshape(B * L, D) @ W["qkv"]
        if W["bqkv"] is not None:
            z = z + W["bqkv"]
        q, k, v = z.reshape(B, L, 3, H, DH).transpose(2, 0, 3, 1, 4)
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

    def ffn(h):
        W1, W2 = weights.pop(0), weights.pop(0)
        u = h @ W1["W"] + (W1["b"] if W1["b"] is not None else 0.0)
        u = np.maximum(u, 0.0) if m.activation == "relu" else _gelu(u)
        if p_in > 0:
            u = u * masks.pop(0) / (1 - p_in)
        return u @ W2["W"] + (W2["b"] if W2["b"] is not None else 0.0)

    out = [X]
    x = X
    for l in range(m.n_layers):
        for kind, F in (("attention", attention), ("ffn", ffn)):
            cols = getattr(m, kind)
            a, b, n = cols.skip_scale[l], cols.branch_scale[l], cols.norm_scale[l]

            def drop(y):
                return y * masks.pop(0) / (1 - p_hid) if p_hid > 0 else y
            if cols.post[l]:
                x = _ln(a * x + b * drop(F(x)))
            else:
                x = a * x + b * drop(F(n * _ln(x)))
            out.append(x)
    assert not weights and not masks and not attn_masks    # everything drawn was used
    return out


def _run_trial(m, X, G, seed):
    tr = model_module._Trial(m, np.random.default_rng(seed), np.float64)
    xs, backs = [X], []
    x = X
    for l in range(m.n_layers):
        for kind in ("attention", "ffn"):
            x, back, _ = tr.sublayer(kind, l, x)
            xs.append(x)
            backs.append(back)
    gs = [G]
    for back in reversed(backs):
        gs.append(back(gs[-1]))
    return xs, gs[::-1]


# att_std 8: logits in the hundreds, the softmax's max-subtracting path
@pytest.mark.parametrize("activation,causal,att_std", [("relu", False, 0.6), ("relu", True, 0.6), ("gelu", False, 0.6),
                                                       ("relu", True, 8.0)])
def test_trial_forward_is_the_contract_and_backward_its_gradient(monkeypatch, activation, causal, att_std):
    m = _model(activation, causal, att_std=att_std)
    rng = np.random.default_rng(5)
    X = rng.standard_normal((B, L, D)) * 1.5 + 0.3
    G = rng.standard_normal((B, L, D))
    X_in, G_in = X.copy(), G.copy()
    rec = _Recorder(monkeypatch)
    xs, gs = _run_trial(m, X, G, seed=11)
    np.testing.assert_array_equal(X, X_in)                  # inputs are left alone
    np.testing.assert_array_equal(G, G_in)
    assert len(rec.weights) == 3 * m.n_layers and rec.attn_masks
    plain = _plain_forward(m, X, rec.weights, rec.masks, rec.attn_masks)
    for got, want in zip(xs, plain):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    # d <G, out(X)> / dX along random directions, by central differences of the plain forward
    def loss(Xv):
        return float(np.sum(G * _plain_forward(m, Xv, rec.weights, rec.masks, rec.attn_masks)[-1]))
    h = 1e-6
    for k in range(3):
        V = np.random.default_rng(100 + k).standard_normal(X.shape)
        numeric = (loss(X + h * V) - loss(X - h * V)) / (2 * h)
        assert float(np.sum(gs[0] * V)) == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_flops_count_every_product_performed():
    m = _model()
    hd = H * DH
    T = B * L
    products = [(T, D, 3 * hd), (T, hd, D), (T, D, hd), (T, 3 * hd, D)]            # projections
    products += [(T, D, DFF), (T, DFF, D)] * 2                                      # FFN, both ways
    per_head = [(L, DH, L), (L, L, DH)] + [(L, L, DH), (L, DH, L), (L, L, DH), (L, L, DH)]
    flop = sum(2 * a * b_ * c for a, b_, c in products) + B * H * sum(2 * a * b_ * c for a, b_, c in per_head)
    assert model_module._flops(m, B) == pytest.approx(m.n_layers * flop, rel=1e-12)


def test_simulate_reports_timing_and_work():
    m = _model()
    meas = model_module.simulate(m, batch=B, trials=2, seed=0)
    assert meas.simulate_s > 0 and meas.gflop == pytest.approx(2 * model_module._flops(m, B) / 1e9)
    assert len(meas.forward) == len(meas.backward) == 1 + 2 * m.n_layers


# --- the sampling primitives of the hot path ---------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 70001)])
def test_fast_standard_normal_shapes(shape):
    from sigprop.mc.sampling import standard_normal

    z = standard_normal(np.random.default_rng(0), shape)
    assert z.shape == shape and z.dtype == np.float32 and np.all(np.isfinite(z))
    assert standard_normal(np.random.default_rng(0), shape, np.float64).dtype == np.float64


def test_fast_standard_normal_moments():
    from sigprop.mc.sampling import standard_normal

    n = 1 << 22
    z = standard_normal(np.random.default_rng(1), (n,)).astype(np.float64)
    # standard errors of the mean, variance, third moment, kurtosis: 1, sqrt 2, sqrt 15, sqrt 96 over sqrt n
    se = np.sqrt(np.array([1.0, 2.0, 15.0, 96.0]) / n)
    got = np.array([z.mean(), z.var() - 1.0, np.mean(z**3), np.mean(z**4) / z.var() ** 2 - 3.0])
    assert np.all(np.abs(got) < 5 * se), got / se
    assert abs(np.mean(z[1:] * z[:-1])) < 5 / np.sqrt(n)       # neighbours uncorrelated
    # the two members of each Box-Muller pair (blocks of 2 _CHUNK: cosines, then sines) are
    # independent: E z1 z2 = 0 and E z1^2 z2^2 = 1 (standard errors 1 and sqrt 8 over sqrt pairs)
    from sigprop.mc.sampling import _CHUNK

    blocks = z[: n // (2 * _CHUNK) * 2 * _CHUNK].reshape(-1, 2, _CHUNK)
    z1, z2 = blocks[:, 0].ravel(), blocks[:, 1].ravel()
    assert abs(np.mean(z1 * z2)) < 5 / np.sqrt(z1.size)
    assert abs(np.mean(z1**2 * z2**2) - 1.0) < 5 * np.sqrt(8 / z1.size)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_keep_mask_frequency(p):
    from sigprop.mc.sampling import keep_mask

    n = 1 << 21
    k = keep_mask(np.random.default_rng(2), (n // 8, 8), p)
    assert k.shape == (n // 8, 8) and k.dtype == bool
    assert abs(k.mean() - (1 - p)) <= 5 * np.sqrt(p * (1 - p) / n)


def test_logit_se_pools_the_relative_spread_over_layers():
    from sigprop.mc.model import logit_stats

    rng = np.random.default_rng(3)
    trials, points = 8, 7
    lg = np.full((trials, points, 2), np.nan)
    # attention at points 1, 3, 5: per-draw second moments with 20% relative spread, zero means
    for k in (1, 3, 5):
        lg[:, k, 0] = 0.0
        lg[:, k, 1] = 2.0 * (1 + 0.2 * rng.standard_normal(trials))
    lg[:, 3, 1] = 2.0                       # one layer whose draws happen to agree exactly
    out = logit_stats(lg)
    assert [o is None for o in out] == [True, False, True, False, True, False, True]
    mean3, se3 = out[3]
    assert mean3 == 2.0
    # its own sample SD is 0; the pooled relative spread (~0.2 * sqrt(2/3) here) still applies
    assert 0.05 * 2.0 / np.sqrt(trials) < se3 < 0.4 * 2.0 / np.sqrt(trials)
    for k in (1, 5):
        own = lg[:, k, 1].std(ddof=1) / np.sqrt(trials)
        assert out[k][1] >= own


def test_logit_variance_keeps_the_draw_means():
    """The per-draw mean logit is part of the variance (its expectation is 0): the estimate is
    the mean second moment, not reduced by the square of the grand mean of a few draws."""
    from sigprop.mc.model import logit_stats

    lg = np.zeros((4, 2, 2))
    lg[:, 0] = np.nan
    lg[:, 1, 0] = [0.5, -0.5, 0.5, 0.5]             # draw means (grand mean 0.25)
    lg[:, 1, 1] = [1.0, 1.0, 1.0, 1.0]              # second moments
    mean, _ = logit_stats(lg)[1]
    assert mean == 1.0                               # the old estimator gave 1 - 0.25^2


def test_logit_se_pools_over_neighbouring_layers_only():
    from sigprop.mc.model import LOGIT_POOL_HALF_WIDTH, logit_stats

    rng = np.random.default_rng(5)
    trials, n = 8, 40
    lg = np.zeros((trials, n, 2))
    spread = np.where(np.arange(n) < n // 2, 0.02, 0.4)   # quiet early layers, noisy late ones
    lg[:, :, 1] = 1.0 + spread * rng.standard_normal((trials, n))
    lg[:, -1, 1] = 1.0                                     # a deep layer whose draws agree
    se_last = logit_stats(lg)[-1][1]
    # pooled only over the last LOGIT_POOL_HALF_WIDTH + 1 points: the noisy regime's spread
    assert LOGIT_POOL_HALF_WIDTH < n // 2
    assert 0.2 / np.sqrt(trials) < se_last < 0.6 / np.sqrt(trials)


def test_logit_se_scales_with_the_neighbourhood_level():
    """Draws that all happen to fall low do not shrink their own SE: the pooled relative spread
    is scaled by the neighbourhood's mean level."""
    from sigprop.mc.model import logit_stats

    rng = np.random.default_rng(7)
    trials, n = 8, 13
    lg = np.zeros((trials, n, 2))
    lg[:, :, 1] = 1.0 + 0.3 * rng.standard_normal((trials, n))
    lg[:, 6, 1] = 0.6                                      # the middle point: all draws low
    mean, se = logit_stats(lg)[6]
    assert mean == pytest.approx(0.6)
    # pooled relative SD ~0.29: x level ~0.97 gives ~0.10; x the point's own 0.6 gave ~0.06
    assert se > 0.08


@pytest.mark.parametrize("arch,extra", [("preln", {}), ("postln", {}), ("peri", {}),
                                        ("llama", {"n_kv_heads": 1})])
def test_attention_recomputed_in_backward_is_bit_identical(monkeypatch, arch, extra):
    """Long context: an attention layer whose backward cache exceeds RECOMPUTE_BYTES keeps only
    its input, weights and random state and recomputes the cache in its backward pass.  Forced
    here at a short sequence (RECOMPUTE_BYTES 0), the seeded trial's numbers, forward, backward
    and logits, are bit for bit those of the trial that keeps every cache (causal, dropout 0.1:
    the dropout masks are drawn again from the saved state); with another random state in
    the backward the numbers differ (the comparison can fail)."""
    from sigprop.model.presets import resolve

    m = resolve(arch, None, n_layers=3, causal=True, seq_len=12, d_model=16, n_heads=2, d_ff=32, dropout=0.1,
                **extra)
    seed = np.random.SeedSequence(3)
    keep = model_module.run_trial(m, 2, model_module.Rng(seed), np.float32)
    made = []
    orig = model_module._rng_copy

    def counting(rng):
        r = orig(rng)
        made.append(r)
        return r
    monkeypatch.setattr(model_module, "RECOMPUTE_BYTES", 0)
    monkeypatch.setattr(model_module, "_rng_copy", counting)
    again = model_module.run_trial(m, 2, model_module.Rng(seed), np.float32)
    assert made and all(r is not None for r in made)
    for a, b in zip(keep, again):
        np.testing.assert_array_equal(a, b)
    assert m.dropout.attention > 0
    monkeypatch.setattr(model_module, "_rng_copy", lambda rng: model_module.Rng(99))
    other = model_module.run_trial(m, 2, model_module.Rng(seed), np.float32)
    assert not np.array_equal(other[1], keep[1])


# ---------------------------------------------------------------------------------------
# memory: estimated from the shapes, refused before allocating
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, batch, dtype", [
    (dict(), 8, np.float32),
    (dict(seq_len=256), 8, np.float32),                       # attention caches recomputed
    (dict(seq_len=128, dropout=0.1), 8, np.float32),           # kept, with dropout masks
    (dict(d_model=256, d_ff=1024, heads=4), 2, np.float32),    # weights dominate
    (dict(arch="llama", kv_heads=2, seq_len=64), 8, np.float32),
    (dict(block="parallel", seq_len=64), 8, np.float32),
    (dict(arch="postln", dropout=0.1, seq_len=64), 8, np.float64),
    (dict(seq_len=32), 64, np.float32),                        # activations dominate
])
def test_trial_memory_bounds_the_measured_peak(options, batch, dtype):
    import tracemalloc

    import sigprop
    from sigprop.mc.backend import Rng, numpy_backend
    from sigprop.mc.model import run_trial, trial_memory

    opts = {**dict(layers=4, d_model=64, heads=4, d_ff=128, seq_len=16), **options}
    m = sigprop.build_model(**opts)
    run_trial(sigprop.build_model(layers=1, d_model=8, heads=1, d_ff=8, seq_len=4), 1,
              Rng(np.random.SeedSequence(1), numpy_backend(), "host"))      # (first-call allocations)
    tracemalloc.start()
    try:
        run_trial(m, batch, Rng(np.random.SeedSequence(0), numpy_backend(), "host"), dtype)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 1.0 <= trial_memory(m, batch, dtype) / peak <= 1.7


def test_simulate_refuses_before_allocating(monkeypatch):
    import tracemalloc

    import sigprop
    from sigprop.mc import component
    from sigprop.mc.model import simulate, trial_memory

    big = sigprop.build_model(layers=2, d_model=1024, heads=8, d_ff=4096, seq_len=64)
    assert trial_memory(big, 64) > 500e6
    monkeypatch.setattr(component, "available_memory", lambda: trial_memory(big, 64) / 2)
    tracemalloc.start()
    try:
        with pytest.raises(DomainError, match=r"batch 64, float32\) needs about .* GiB of memory, more than the"):
            simulate(big, batch=64, trials=2)
        assert tracemalloc.get_traced_memory()[1] < 20e6
    finally:
        tracemalloc.stop()
    m = sigprop.build_model(layers=2, d_model=32, heads=2, d_ff=64, seq_len=8)
    monkeypatch.setattr(component, "available_memory", lambda: trial_memory(m, 8) * 1.01)
    assert simulate(m, batch=8, trials=2).trials == 2


@pytest.mark.parametrize("args", [
    ["--batch", "1000000000"],
    ["--d-model", "100000"],
])
def test_check_refuses_sizes_beyond_memory(capsys, args):
    from tests._cli import cli

    base = ["--layers", "4", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "16"]
    code, out, err = cli(capsys, "check", *base, *args)
    assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "GiB available on cpu" in err and args[1] in err


def test_api_check_refuses_sizes_beyond_memory():
    import sigprop

    with pytest.raises(DomainError, match="batch 1000000000"):
        sigprop.check(layers=2, d_model=32, heads=2, d_ff=64, seq_len=8, batch=10**9)
