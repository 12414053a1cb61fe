"""Architecture and initialisation presets, DeepNorm constants, the DSLM init and its
stream-correlation recursion, and TOML option files.  Expected values are typed here from
the published formulas (theory.md sections 4-6), never computed with the code under test."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.model import presets
from sigprop.model.config import load_config
from sigprop.model.deepnorm import deepnorm_constants, deepnorm_encoder_decoder, deepnorm_general
from sigprop.model.presets import ARCH_NAMES, INIT_NAMES, resolve
from sigprop.model.spec import WEIGHTS, Model
from sigprop.rules import REGISTRY

SMALL = dict(d_model=64, n_heads=4, d_ff=256, seq_len=16)
needs_relu = pytest.mark.skipif("relu" not in REGISTRY, reason="activation rules not registered")
needs_gelu = pytest.mark.skipif("gelu" not in REGISTRY, reason="activation rules not registered")


def relu_ffn_block(d, dff, p_ffn, p_hid):
    """Independent FFN block for ReLU (theory.md section 3): output variance
    d dff s^4 v / (2 (1-p_ffn)(1-p_hid)), output correlation
    (1-p_ffn)(1-p_hid)(sqrt(1-r^2) + (pi - arccos r) r) / pi."""
    def block(v, r, s):
        v, r, s = (np.asarray(a, dtype=float) for a in (v, r, s))
        var = d * dff * s**4 * v / (2 * (1 - p_ffn) * (1 - p_hid)) + 0 * r
        corr = (1 - p_ffn) * (1 - p_hid) * (np.sqrt(1 - r**2) + (np.pi - np.arccos(r)) * r) / np.pi
        return var, corr + 0 * v
    return block


# ---------------------------------------------------------------------------------------
# DeepNorm constants ([DeepNet] Table 1)
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 6, 12, 18, 24, 100, 1000, 10_000])
def test_deepnorm_single_stack(n):
    for kind in ("encoder", "decoder"):
        c = deepnorm_constants(n, kind)
        assert c.alpha == pytest.approx((2 * n) ** 0.25, rel=1e-14)
        assert c.beta == pytest.approx((8 * n) ** -0.25, rel=1e-14)


@pytest.mark.parametrize("n, m", [(1, 1), (6, 6), (12, 6), (18, 18), (100, 100), (200, 50), (3, 1000)])
def test_deepnorm_encoder_decoder(n, m):
    c = deepnorm_encoder_decoder(n, m)
    assert c["encoder"].alpha == pytest.approx(0.81 * (n**4 * m) ** (1 / 16), rel=1e-14)
    assert c["encoder"].beta == pytest.approx(0.87 * (n**4 * m) ** (-1 / 16), rel=1e-14)
    assert c["decoder"].alpha == pytest.approx((3 * m) ** 0.25, rel=1e-14)
    assert c["decoder"].beta == pytest.approx((12 * m) ** -0.25, rel=1e-14)


def test_deepnorm_general_pattern():
    for k in (1, 2, 3, 160, 2000):
        c = deepnorm_general(k)
        assert c.alpha == pytest.approx(k ** 0.25) and c.beta == pytest.approx((4 * k) ** -0.25)
    assert deepnorm_general(160).alpha == pytest.approx(3.5565588200778)   # MiniMax-01: (2*80)^(1/4)
    assert deepnorm_constants(80).alpha == pytest.approx(3.5565588200778)
    assert deepnorm_constants(18) == deepnorm_general(36)


@pytest.mark.parametrize("call", [lambda: deepnorm_constants(0), lambda: deepnorm_constants(2.0),
                                  lambda: deepnorm_constants(4, "both"), lambda: deepnorm_encoder_decoder(3, 0),
                                  lambda: deepnorm_general(True)])
def test_deepnorm_rejects(call):
    with pytest.raises(DomainError):
        call()


# ---------------------------------------------------------------------------------------
# defaults and options
# ---------------------------------------------------------------------------------------

def test_defaults_are_the_dslm_figure_model():
    m = resolve(n_layers=24)
    assert (m.arch, m.d_model, m.n_heads, m.d_head, m.d_ff, m.seq_len) == ("preln", 1024, 16, 64, 4096, 256)
    assert (m.activation, m.norm, m.causal) == ("relu", "layernorm", False)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.1, 0.1, 0.0)
    assert (m.input.mean, m.input.var) == (0.0, 1.0)
    assert m.input.corr == pytest.approx(0.221 * 0.9, rel=1e-15)
    assert (m.grad.var, m.grad.corr) == (1.0, 0.0)
    assert m.notes["init"] == "normal"


def test_dropout_options():
    m = resolve(n_layers=2)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.1, 0.1, 0.0)
    m = resolve(n_layers=2, dropout=0.2)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.2, 0.2, 0.2)
    assert m.input.corr == pytest.approx(0.221 * 0.8)
    m = resolve(n_layers=2, dropout=0.2, attn_dropout=0.0, hidden_dropout=0.3, ffn_dropout=0.05)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.0, 0.3, 0.05)
    assert m.input.corr == pytest.approx(0.221 * 0.7)
    assert resolve(n_layers=2, input_corr=0.0).input.corr == 0.0


def test_geometry_options():
    m = resolve(n_layers=3, d_model=96, n_heads=3, d_ff=100, seq_len=7, causal=True, activation="gelu")
    assert (m.d_head, m.d_ff, m.seq_len, m.causal, m.activation) == (32, 100, 7, True, "gelu")
    m = resolve(n_layers=3, d_model=100, n_heads=16, d_head=8)
    assert (m.d_head, m.d_ff) == (8, 400)
    assert m.fans("attention", "o") == (128, 100)


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="gpt"), "unknown arch 'gpt'; known: preln, postln, dslm, dslm-post, deepnorm, lns, mixln"),
    (dict(init="he"), "unknown init 'he'; known: normal, xavier, torch-default, scaled, dslm, deepnorm"),
    (dict(widht=3), "unknown option 'widht'; known: arch, init, n_layers"),
    (dict(n_layers=None), "n_layers is required"),
    (dict(n_layers=0), "n_layers must be an integer in [1, 1000000], got 0"),
    (dict(n_layers=1_000_001), "n_layers must be an integer in [1, 1000000], got 1000001"),
    (dict(n_layers=2.5), "n_layers must be an integer"),
    (dict(n_layers="4"), "n_layers must be an integer"),
    (dict(d_model=100), "d_model 100 is not divisible by n_heads 16: give d_head"),
    (dict(dropout=1.0), "dropout must be in [0, 1), got 1"),
    (dict(hidden_dropout=-0.1), "hidden_dropout must be in [0, 1)"),
    (dict(input_var=0.0), "input_var must be > 0"),
    (dict(input_corr=1.2), "input_corr must be in [0, 1]"),
    (dict(grad_corr=-2.0), "grad_corr must be in [-1, 1]"),
    (dict(init_std=-0.02), "init_std must be >= 0"),
    (dict(causal=1), "causal must be true or false"),
    (dict(activation="tanh"), "unknown activation 'tanh'; known: relu, gelu"),
    (dict(skip_scale=math.inf), "skip_scale must be finite"),
    (dict(arch="dslm", beta_k=5.0, n_layers=4), "beta^2 = beta_k / n_layers = 5/4 = 1.25 must be <= 1"),
    (dict(arch="dslm", branch_scale=1.5), "branch_scale 1.5 > 1 leaves no room"),
    (dict(layers=3, n_layers=3), "option 'n_layers' given twice"),
])
def test_bad_options(kwargs, message):
    kw = dict(n_layers=4)
    kw.update(kwargs)
    if kw["n_layers"] is None:
        del kw["n_layers"]
    with pytest.raises(DomainError) as e:
        resolve(**kw)
    assert message in str(e.value)


def test_aliases_and_dashes():
    assert resolve(layers=3, heads=8).n_heads == 8
    assert presets.canonical_name("d-model") == "d_model"
    assert presets.canonical_name("layers") == "n_layers"
    assert presets.canonical_name("nope") is None


# ---------------------------------------------------------------------------------------
# architectures
# ---------------------------------------------------------------------------------------

def _cols(m, name):
    return {kind: getattr(getattr(m, kind), name) for kind in WEIGHTS}


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_both_sublayers_of_a_layer_share_placement_and_scales(arch):
    m = resolve(arch, n_layers=9, **SMALL)
    for name in ("post", "skip_scale", "branch_scale", "norm_scale"):
        c = _cols(m, name)
        assert np.array_equal(c["attention"], c["ffn"])


@pytest.mark.parametrize("n", [1, 7, 12])
def test_arch_formulas(n):
    def cols(arch, **kw):
        m = resolve(arch, n_layers=n, **SMALL, **kw)
        s = m.attention
        return s.post.tolist(), s.skip_scale, s.branch_scale, s.norm_scale

    post, a, b, nn = cols("preln")
    assert post == [False] * n and np.all(a == 1) and np.all(b == 1) and np.all(nn == 1)
    post, a, b, nn = cols("postln")
    assert post == [True] * n and np.all(a == 1) and np.all(b == 1) and np.all(nn == 1)
    for arch, placement in (("dslm", False), ("dslm-post", True)):
        post, a, b, nn = cols(arch, init="normal")
        assert post == [placement] * n
        np.testing.assert_allclose(b, math.sqrt(1 / n), rtol=1e-15)
        np.testing.assert_allclose(a, math.sqrt(1 - 1 / n), rtol=1e-15, atol=1e-300)
        post, a, b, nn = cols(arch, init="normal", beta_k=0.5)
        np.testing.assert_allclose(b ** 2, 0.5 / n, rtol=1e-14)
        np.testing.assert_allclose(a ** 2 + b ** 2, 1.0, rtol=1e-14)
    post, a, b, nn = cols("deepnorm")
    assert post == [True] * n
    np.testing.assert_allclose(a, (2 * n) ** 0.25, rtol=1e-14)
    assert np.all(b == 1) and np.all(nn == 1)
    post, a, b, nn = cols("lns")
    assert post == [False] * n
    np.testing.assert_allclose(nn, [1 / math.sqrt(l) for l in range(1, n + 1)], rtol=1e-15)


@pytest.mark.parametrize("n, alpha, n_post", [(8, 0.25, 2), (7, 0.25, 1), (100, 0.29, 29), (10, 0.0, 0),
                                              (10, 1.0, 10), (3, 0.5, 1), (1, 0.25, 0)])
def test_mixln(n, alpha, n_post):
    m = resolve("mixln", n_layers=n, mixln_alpha=alpha, **SMALL)
    assert m.attention.post.tolist() == [True] * n_post + [False] * (n - n_post)


def test_scale_overrides():
    m = resolve("preln", n_layers=3, skip_scale=0.5, branch_scale=2.0, **SMALL)
    assert np.all(m.ffn.skip_scale == 0.5) and np.all(m.ffn.branch_scale == 2.0)
    m = resolve("deepnorm", n_layers=3, skip_scale=1.5, **SMALL)
    assert np.all(m.ffn.skip_scale == 1.5) and np.all(m.ffn.branch_scale == 1.0)
    # dslm: one of the two keeps lambda^2 + beta^2 = 1
    m = resolve("dslm", n_layers=3, branch_scale=0.6, init="normal", **SMALL)
    np.testing.assert_allclose(m.ffn.skip_scale, 0.8)
    m = resolve("dslm-post", n_layers=3, skip_scale=0.6, init="normal", **SMALL)
    np.testing.assert_allclose(m.ffn.branch_scale, 0.8)
    m = resolve("dslm", n_layers=3, skip_scale=2.0, branch_scale=3.0, init="normal", **SMALL)
    assert np.all(m.ffn.skip_scale == 2.0) and np.all(m.ffn.branch_scale == 3.0)


# ---------------------------------------------------------------------------------------
# initialisations
# ---------------------------------------------------------------------------------------

def _std(m):
    return {kind: {w: getattr(m, kind).std[w] for w in WEIGHTS[kind]} for kind in WEIGHTS}


def _bias(m):
    return {kind: {w: getattr(m, kind).bias_std[w] for w in WEIGHTS[kind]} for kind in WEIGHTS}


def _assert_std(m, expected, bias=None):
    for kind in WEIGHTS:
        for w in WEIGHTS[kind]:
            np.testing.assert_allclose(getattr(m, kind).std[w], expected[w], rtol=1e-14, err_msg=f"{kind}.{w}")
            b = 0.0 if bias is None else bias.get(w, 0.0)
            np.testing.assert_allclose(getattr(m, kind).bias_std[w], b, rtol=1e-14, err_msg=f"{kind}.{w} bias")


# geometries: square (n_heads d_head = d) and not
GEOMS = [dict(d_model=64, n_heads=4, d_ff=256), dict(d_model=48, n_heads=4, d_head=20, d_ff=100)]


@pytest.mark.parametrize("g", GEOMS)
def test_init_normal_and_scaled(g):
    n = 6
    _assert_std(resolve(n_layers=n, init="normal", **g), dict(q=0.02, k=0.02, v=0.02, o=0.02, **{"in": 0.02, "out": 0.02}))
    _assert_std(resolve(n_layers=n, init="normal", init_std=0.05, **g), dict(q=.05, k=.05, v=.05, o=.05, **{"in": .05, "out": .05}))
    r = 0.02 / math.sqrt(2 * n)
    _assert_std(resolve(n_layers=n, init="scaled", **g), dict(q=0.02, k=0.02, v=0.02, o=r, **{"in": 0.02, "out": r}))


@pytest.mark.parametrize("g", GEOMS)
def test_init_xavier(g):
    m = resolve(n_layers=3, init="xavier", **g)
    d, dk, dff = m.d_model, m.d_head, m.d_ff
    w = m.n_heads * dk
    qkv = math.sqrt(2 / (d + dk))
    _assert_std(m, dict(q=qkv, k=qkv, v=qkv, o=math.sqrt(2 / (w + d)), **{"in": math.sqrt(2 / (d + dff)),
                                                                           "out": math.sqrt(2 / (d + dff))}))


def test_init_xavier_tgs_values():
    """theory.md section 6: FFN sqrt(2/(5d)) at d_ff = 4d, Q/K/V sqrt(2/(d + dk)), O sqrt(1/d)."""
    m = resolve(n_layers=2, init="xavier")
    s = _std(m)
    assert s["ffn"]["in"][0] == pytest.approx(math.sqrt(2 / (5 * 1024)))
    assert s["attention"]["o"][0] == pytest.approx(math.sqrt(1 / 1024))
    assert s["attention"]["q"][0] == pytest.approx(math.sqrt(2 / (1024 + 64)))


def test_init_torch_default():
    """Distribution variances typed from torch.nn.init's definitions: xavier_uniform bound
    sqrt(6/(fan_in+fan_out)); kaiming_uniform(a) bound sqrt(2/(1+a^2)) sqrt(3/fan_in); a
    uniform(-B, B) draw has variance B^2/3; Linear's bias bound 1/sqrt(fan_in)."""
    d, h, dff = 64, 4, 256
    m = resolve(n_layers=2, init="torch-default", d_model=d, n_heads=h, d_ff=dff)
    var_uniform = lambda bound: bound**2 / 3  # noqa: E731
    qkv = var_uniform(math.sqrt(6 / (d + 3 * d)))
    assert qkv == pytest.approx(1 / (2 * d))
    kaiming = lambda fan_in: var_uniform(math.sqrt(2 / (1 + 5)) * math.sqrt(3 / fan_in))  # noqa: E731
    bias = lambda fan_in: var_uniform(1 / math.sqrt(fan_in))  # noqa: E731
    expected = dict(q=math.sqrt(qkv), k=math.sqrt(qkv), v=math.sqrt(qkv), o=math.sqrt(kaiming(d)),
                    **{"in": math.sqrt(kaiming(d)), "out": math.sqrt(kaiming(dff))})
    _assert_std(m, expected, bias={"in": math.sqrt(bias(d)), "out": math.sqrt(bias(dff))})


@pytest.mark.parametrize("n", [2, 18, 100])
def test_init_deepnorm(n):
    m = resolve("deepnorm", n_layers=n, **SMALL)
    assert m.notes["init"] == "deepnorm"
    d, dff = 64, 256
    beta = (8 * n) ** -0.25
    xav = lambda fi, fo, gain=1.0: gain * math.sqrt(2 / (fi + fo))  # noqa: E731
    _assert_std(m, dict(q=xav(d, d), k=xav(d, d), v=xav(d, d, beta), o=xav(d, d, beta),
                        **{"in": xav(d, dff, beta), "out": xav(dff, d, beta)}))


@pytest.mark.parametrize("arch, init", [("preln", "normal"), ("postln", "normal"), ("lns", "normal"),
                                        ("mixln", "normal"), ("deepnorm", "deepnorm")])
def test_default_init_of_each_arch(arch, init):
    assert resolve(arch, n_layers=3, **SMALL).notes["init"] == init


@needs_relu
@pytest.mark.parametrize("arch", ["dslm", "dslm-post"])
def test_default_init_of_dslm(arch):
    assert resolve(arch, n_layers=3, **SMALL).notes["init"] == "dslm"


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("init", [i for i in INIT_NAMES if i != "dslm"])
def test_every_arch_init_pair_resolves_and_round_trips(arch, init):
    m = resolve(arch, init=init, n_layers=5, **SMALL)
    assert Model.from_json(m.to_json()) == m


# ---------------------------------------------------------------------------------------
# DSLM init (theory.md section 4)
# ---------------------------------------------------------------------------------------

PUBLISHED_CORR = {12: 0.250, 24: 0.296, 48: 0.378, 96: 0.504, 192: 0.660, 768: 0.830}


def _published_config(block):
    """d = 1024, p = 0.1, lambda^2 = 0.995 (beta^2 = 0.005, i.e. k = 0.005 N)."""
    if block:
        orig = presets.ffn_block_from_rules
        presets.ffn_block_from_rules = lambda d, dff, act, pf, ph: relu_ffn_block(d, dff, pf, ph)
    try:
        return resolve("dslm", n_layers=768, beta_k=0.005 * 768)
    finally:
        if block:
            presets.ffn_block_from_rules = orig


@pytest.mark.parametrize("block", [True, pytest.param(False, marks=needs_relu)], ids=["test-block", "rules"])
def test_dslm_published_constants(block):
    m = _published_config(block)
    np.testing.assert_allclose(m.attention.branch_scale ** 2, 0.005, rtol=1e-12)
    s = _std(m)
    assert round(s["attention"]["v"][0], 5) == 0.04558 and round(s["attention"]["o"][0], 5) == 0.04558
    assert round(s["attention"]["v"][191], 5) == 0.03379
    assert round(s["ffn"]["in"][0], 5) == 0.02559 and round(s["ffn"]["out"][0], 5) == 0.02559
    assert s["attention"]["q"][0] == 0.03125 and s["attention"]["k"][0] == 0.03125
    r = m.notes["dslm_stream_corr"]
    for n_layers, published in PUBLISHED_CORR.items():
        assert round(r[2 * n_layers], 3) == published, n_layers
    # the closed forms the recursion must reproduce at layer 0
    p, r0 = 0.1, 0.221 * 0.9
    assert s["attention"]["v"][0] == pytest.approx(math.sqrt(math.sqrt((1 - p) / r0) / 1024), rel=1e-14)
    assert s["ffn"]["in"][0] == pytest.approx(math.sqrt(math.sqrt((1 - p) / 2) / 1024), rel=1e-12)
    # V/O std at layer l from the recursion's correlation entering that layer
    np.testing.assert_allclose(s["attention"]["v"], (np.sqrt((1 - p) / r[0:-1:2]) / 1024) ** 0.5, rtol=1e-14)
    # unit variance everywhere (lambda^2 + beta^2 = 1, unit-gain blocks)
    np.testing.assert_allclose(m.notes["dslm_stream_var"], 1.0, rtol=1e-12)


def test_dslm_limit():
    """Published limit 0.8347 of the stream correlation (beta^2 = 0.005, p = 0.1)."""
    presets_block = presets.ffn_block_from_rules
    presets.ffn_block_from_rules = lambda d, dff, act, pf, ph: relu_ffn_block(d, dff, pf, ph)
    try:
        m = resolve("dslm", n_layers=6000, beta_k=0.005 * 6000)
    finally:
        presets.ffn_block_from_rules = presets_block
    assert round(m.notes["dslm_stream_corr"][-1], 4) == 0.8347


def test_dslm_stream_newton_equals_sequential():
    block = relu_ffn_block(64, 256, 0.05, 0.1)
    inp = presets.Forward(0.0, 2.0, 0.3)
    for arch in ARCH_NAMES:
        opts = presets.defaults()
        opts.update(arch=arch)
        sc = presets._scales(arch, 150, opts)
        s = presets.dslm_ffn_std(block)
        a = presets.dslm_stream(sc, 0.1, inp, block, s, "newton")
        b = presets.dslm_stream(sc, 0.1, inp, block, s, "sequential")
        np.testing.assert_allclose(a.corr, b.corr, rtol=0, atol=1e-12, err_msg=arch)
        np.testing.assert_array_equal(a.var, b.var)


def test_dslm_stream_sequential_by_hand():
    """Three Pre-LN layers with a = b = 1 (init dslm on preln), by hand: the stream variance
    grows by 1 per sublayer and the correlation is the variance-weighted mixture."""
    block = relu_ffn_block(64, 256, 0.0, 0.1)
    opts = presets.defaults()
    sc = presets._scales("preln", 3, opts)
    s = presets.dslm_ffn_std(block)
    assert s == pytest.approx(math.sqrt(math.sqrt(2 * 0.9 / (64 * 256))), rel=1e-13)
    st = presets.dslm_stream(sc, 0.1, presets.Forward(0.0, 1.0, 0.2), block, s)
    r, v = 0.2, 1.0
    k = lambda x: (math.sqrt(1 - x * x) + (math.pi - math.acos(x)) * x) / math.pi  # noqa: E731
    for i in range(6):
        c = 0.9 if i % 2 == 0 else 0.9 * k(r)
        r, v = (r * v + c) / (v + 1), v + 1
        assert st.corr[i + 1] == pytest.approx(r, rel=1e-13)
        assert st.var[i + 1] == pytest.approx(v, rel=1e-14)


def test_affine_scan():
    rng = np.random.default_rng(1)
    for size in (1, 2, 3, 17, 1000):
        A, B = rng.random(size), rng.normal(size=size)
        A[::5] = 0.0
        x = [0.7]
        for a, b in zip(A, B):
            x.append(a * x[-1] + b)
        np.testing.assert_allclose(presets.affine_scan(A, B, 0.7), x, rtol=1e-12, atol=1e-14)


@needs_relu
def test_dslm_needs_positive_input_corr():
    with pytest.raises(DomainError, match="layer 1 has r = 0; give input_corr > 0"):
        resolve("dslm", n_layers=4, input_corr=0.0, **SMALL)
    # ... but p = 0 and r = 1 are fine
    m = resolve("dslm", n_layers=4, input_corr=1.0, dropout=0.0, **SMALL)
    np.testing.assert_allclose(m.notes["dslm_stream_corr"], 1.0)
    np.testing.assert_allclose(m.attention.std["v"], (1 / (64 * 64)) ** 0.25)


@needs_relu
def test_dslm_general_geometry_gives_unit_blocks():
    """Non-square attention and d_ff != 4d: V/O std^4 = (1-p)/(r d n_heads d_head); FFN
    std from unit block variance (ReLU: s^4 = 2 (1-p_hid)(1-p_ffn)/(d d_ff))."""
    m = resolve("dslm", n_layers=5, d_model=48, n_heads=4, d_head=20, d_ff=100, hidden_dropout=0.2,
                ffn_dropout=0.1)
    r = m.notes["dslm_stream_corr"][0:-1:2]
    np.testing.assert_allclose(m.attention.std["v"] ** 4, 0.8 / (r * 48 * 80), rtol=1e-13)
    np.testing.assert_allclose(m.ffn.std["in"] ** 4, 2 * 0.8 * 0.9 / (48 * 100), rtol=1e-12)
    np.testing.assert_allclose(m.attention.std["q"] ** 2, 1 / 48, rtol=1e-15)


@needs_gelu
def test_dslm_gelu_ffn_std_gives_unit_variance():
    """GeLU: E[gelu(x)^2] for x ~ N(0, v) by quadrature here; the FFN std s must satisfy
    d_ff s^2 E[gelu^2](d s^2) / (1 - p) = 1."""
    m = resolve("dslm", n_layers=3, activation="gelu", **SMALL)
    s = m.ffn.std["in"][0]
    v = 64 * s * s
    z, wts = np.polynomial.hermite_e.hermegauss(200)
    x = math.sqrt(v) * z
    from math import erf
    gelu = x * 0.5 * (1 + np.array([erf(t / math.sqrt(2)) for t in x]))
    m2 = float(np.sum(wts * gelu**2) / math.sqrt(2 * math.pi))
    assert 256 * s * s * m2 / 0.9 == pytest.approx(1.0, rel=1e-10)


# ---------------------------------------------------------------------------------------
# cost of deep models
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["preln", "postln", "deepnorm", "lns", "mixln"])
def test_hundred_thousand_layers_are_cheap(arch):
    resolve(arch, n_layers=10)
    t0 = time.perf_counter()
    m = resolve(arch, n_layers=100_000)
    assert time.perf_counter() - t0 < 0.5     # typically ~0.01 s; generous for shared machines
    assert m.attention.std["q"].shape == (100_000,)


@needs_relu
def test_hundred_thousand_layer_dslm_is_cheap():
    t0 = time.perf_counter()
    m = resolve("dslm", n_layers=100_000)
    assert time.perf_counter() - t0 < 3.0     # typically ~0.15 s
    r = m.notes["dslm_stream_corr"]
    assert np.all(np.diff(r[0::2]) > 0) and 0.6 < r[-1] < 0.8347   # rises layer by layer


# ---------------------------------------------------------------------------------------
# config files
# ---------------------------------------------------------------------------------------

def _toml(tmp_path, text, name="c.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_config_reads_options(tmp_path):
    p = _toml(tmp_path, 'arch = "postln"\nlayers = 96\nd-model = 256\nheads = 4\nd_ff = 512\n'
                        'dropout = 0\ncausal = true\ninput-corr = 0.5\ninit = "xavier"\nbeta_k = 2\n')
    cfg = load_config(p)
    assert cfg == {"arch": "postln", "n_layers": 96, "d_model": 256, "n_heads": 4, "d_ff": 512, "dropout": 0.0,
                   "causal": True, "input_corr": 0.5, "init": "xavier", "beta_k": 2.0}
    assert type(cfg["dropout"]) is float
    m = resolve(**cfg)
    assert (m.arch, m.n_layers, m.d_model, m.n_heads, m.d_ff, m.causal) == ("postln", 96, 256, 4, 512, True)
    assert m.notes["init"] == "xavier"


@pytest.mark.parametrize("text, message", [
    ("widht = 3", "c.toml: unknown key 'widht'"),
    ("d-model = 2.5", "c.toml: d-model must be an integer"),
    ("d-model = 256.0", "c.toml: d-model must be an integer"),
    ('layers = "96"', "c.toml: layers must be an integer"),
    ("layers = 0", "c.toml: layers must be an integer in [1, 1000000], got 0"),
    ("dropout = 1.5", "c.toml: dropout must be in [0, 1), got 1.5"),
    ('dropout = "x"', "c.toml: dropout must be a number"),
    ("causal = 1", "c.toml: causal must be true or false"),
    ('arch = "gpt"', "c.toml: unknown arch 'gpt'; known: preln"),
    ("d-model = 256\nd_model = 128", "c.toml: key 'd_model' repeats 'd-model'"),
    ("[model]\nlayers = 3", "c.toml: unknown key 'model'"),
    ("layers = {a = 1}", "c.toml: key 'layers' must be a value, not a table"),
    ("layers = [1, 2]", "c.toml: key 'layers' must be a single value"),
    ("layers = = 3", "c.toml' is not valid TOML"),
    ("input_var = 0", "c.toml: input_var must be > 0"),
])
def test_config_errors_name_the_key(tmp_path, text, message):
    with pytest.raises(DomainError) as e:
        load_config(_toml(tmp_path, text))
    assert message in str(e.value)


def test_config_unreadable(tmp_path):
    with pytest.raises(DomainError, match="cannot read config file"):
        load_config(tmp_path / "none.toml")
