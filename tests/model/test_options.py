"""The modern-block options and the model presets (llama, gpt2, bert, olmo2, peri): every option
resolves into the model object's fields, the presets' numbers against their published
formulas, the refusals (one line, exit 2), config files, the Python API and the consumers
that refuse what they do not implement.  Expected values are typed here from the formulas
(docs/presets.md), never computed with the code under test."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.model.presets import resolve
from sigprop.model.spec import Model

SMALL = dict(d_model=64, n_heads=4, d_ff=256, seq_len=16)
R0 = 0.221


def run(*args):
    return subprocess.run([sys.executable, "-m", "sigprop", *args], capture_output=True, text=True, timeout=300)


def one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def stds(m, kind):
    s = getattr(m, kind)
    return {w: s.std[w] for w in s.names}


def biases(m, kind):
    s = getattr(m, kind)
    return {w: s.bias_std[w] for w in s.names}


def assert_all(col, value, **kw):
    np.testing.assert_allclose(col, value, rtol=kw.get("rtol", 1e-14), atol=kw.get("atol", 0))


# ---------------------------------------------------------------------------------------
# each option -> the model's fields
# ---------------------------------------------------------------------------------------

def test_generic_defaults_are_todays_model():
    m = resolve(n_layers=3, **SMALL)
    assert (m.norm, m.norm_eps, m.block, m.ffn_kind, m.activation) == ("layernorm", 1e-5, "sequential", "mlp", "relu")
    assert (m.n_kv_heads, m.rope, m.qk_norm, m.final_norm, m.causal) == (4, None, None, False, False)
    assert m.features() == []
    assert m.to_json().keys() == Model.from_json(m.to_json()).to_json().keys()
    assert not {"norm_eps", "block", "ffn_kind", "n_kv_heads", "rope", "qk_norm", "final_norm"} & set(m.to_json())


def test_norm_and_eps():
    m = resolve(n_layers=2, norm="rmsnorm", norm_eps=1e-6, **SMALL)
    assert (m.norm, m.norm_eps) == ("rmsnorm", 1e-6)
    assert resolve(n_layers=2, norm_eps=0.0, **SMALL).norm_eps == 0.0


@pytest.mark.parametrize("ffn, act", [("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu")])
def test_gated_ffn_kinds(ffn, act):
    m = resolve(n_layers=2, ffn=ffn, **SMALL)
    assert (m.ffn_kind, m.activation, m.ffn.names) == ("glu", act, ("gate", "up", "down"))
    assert m.fans("ffn", "gate") == (64, 256) and m.fans("ffn", "down") == (256, 64)
    # the activation option given alike: no contradiction
    assert resolve(n_layers=2, ffn=ffn, activation=act, **SMALL).activation == act


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
def test_mlp_keeps_the_activation_option(act):
    m = resolve(n_layers=2, ffn="mlp", activation=act, **SMALL)
    assert (m.ffn_kind, m.activation, m.ffn.names) == ("mlp", act, ("in", "out"))


def test_activation_changes_a_gated_preset_ffn():
    """llama's FFN is SwiGLU; --activation gelu keeps the gate: GeGLU.  --ffn mlp keeps its silu."""
    m = resolve("llama", n_layers=2, activation="gelu", **SMALL)
    assert (m.ffn_kind, m.activation) == ("glu", "gelu")
    m = resolve("llama", n_layers=2, ffn="mlp", **SMALL)
    assert (m.ffn_kind, m.activation) == ("mlp", "silu")
    m = resolve("gpt2", n_layers=2, ffn="swiglu", **SMALL)     # gpt2's gelu gives way to SwiGLU's silu
    assert (m.ffn_kind, m.activation) == ("glu", "silu")


def test_kv_heads():
    m = resolve(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, d_ff=256, seq_len=16)
    assert m.n_kv_heads == 2 and m.d_head == 8
    assert m.fans("attention", "k") == (64, 16) and m.fans("attention", "v") == (64, 16)
    assert m.fans("attention", "q") == (64, 64)
    assert resolve(layers=2, heads=8, kv_heads=1, d_model=64, seq_len=16).n_kv_heads == 1   # multi-query
    assert Model.from_json(m.to_json()).n_kv_heads == 2 and m.to_json()["n_kv_heads"] == 2


def test_rope():
    assert resolve(n_layers=2, rope=True, **SMALL).rope == 10000.0
    assert resolve(n_layers=2, rope_base=500.0, **SMALL).rope == 500.0          # a base turns it on
    assert resolve(n_layers=2, rope=True, rope_base=1e6, **SMALL).rope == 1e6
    assert resolve(n_layers=2, rope=False, **SMALL).rope is None
    assert resolve(n_layers=2, rope=True, **SMALL).to_json()["rope"] == {"base": 10000.0}


def test_qk_norm_takes_the_models_norm_kind():
    assert resolve(n_layers=2, qk_norm=True, **SMALL).qk_norm == "layernorm"
    assert resolve(n_layers=2, qk_norm=True, norm="rmsnorm", **SMALL).qk_norm == "rmsnorm"
    assert resolve(n_layers=2, qk_norm=False, **SMALL).qk_norm is None


def test_final_norm_and_causal():
    m = resolve(n_layers=2, final_norm=True, causal=True, **SMALL)
    assert m.final_norm and m.causal
    assert not resolve("llama", n_layers=2, final_norm=False, causal=False, **SMALL).final_norm


def test_bias_option():
    """torch-default draws biases (variance 1/(3 fan_in)); --no-bias zeroes every one."""
    d, f = 64, 256
    m = resolve(n_layers=2, init="torch-default", **SMALL)
    assert_all(biases(m, "ffn")["in"], math.sqrt(1 / (3 * d)))
    assert_all(biases(m, "ffn")["out"], math.sqrt(1 / (3 * f)))
    m = resolve(n_layers=2, init="torch-default", bias=False, **SMALL)
    for kind in ("attention", "ffn"):
        for col in biases(m, kind).values():
            assert_all(col, 0.0)
    assert_all(stds(m, "ffn")["in"], math.sqrt(1 / (3 * d)))          # the weights are untouched
    # llama has no biases; --bias brings back the init's
    m = resolve("llama", n_layers=2, init="torch-default", bias=True, **SMALL)
    assert_all(biases(m, "ffn")["gate"], math.sqrt(1 / (3 * d)))
    assert_all(biases(m, "ffn")["down"], math.sqrt(1 / (3 * f)))
    m = resolve("llama", n_layers=2, init="torch-default", **SMALL)
    assert_all(biases(m, "ffn")["gate"], 0.0)


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "output"])
@pytest.mark.parametrize("arch", ["preln", "postln", "llama", "gpt2", "bert", "olmo2", "peri"])
def test_placement_sets_every_sublayer(arch, placement):
    m = resolve(arch, n_layers=5, placement=placement, **SMALL)
    for kind in ("attention", "ffn"):
        assert [getattr(m, kind).placement_of(i) for i in range(5)] == [placement] * 5
    assert Model.from_json(m.to_json()) == m


@pytest.mark.parametrize("placement", ["pre", "post", "peri", "output"])
def test_placement_keeps_dslm_scales(placement):
    n = 8
    m = resolve("dslm", n_layers=n, placement=placement, init="normal", **SMALL)
    assert m.attention.placements() == {placement}
    assert_all(m.ffn.branch_scale, math.sqrt(1 / n))
    assert_all(m.ffn.skip_scale, math.sqrt(1 - 1 / n))


def test_placement_with_lns_keeps_its_norm_scale():
    m = resolve("lns", n_layers=4, placement="peri", **SMALL)
    assert m.attention.placements() == {"peri"}
    assert_all(m.attention.norm_scale, [1, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5])
    m = resolve("deepnorm", n_layers=4, placement="post", **SMALL)      # its own placement: allowed
    assert_all(m.attention.skip_scale, 8 ** 0.25)


def test_parallel_block():
    """One skip path per layer, the attention sublayer's: the ffn sublayer's skip scale is 1."""
    m = resolve(n_layers=3, block="parallel", skip_scale=0.5, **SMALL)
    assert m.block == "parallel"
    assert_all(m.attention.skip_scale, 0.5)
    assert_all(m.ffn.skip_scale, 1.0)
    assert m.attention.placements() == m.ffn.placements() == {"pre"}
    m = resolve("lns", n_layers=3, block="parallel", **SMALL)
    assert_all(m.ffn.norm_scale, [1, 1 / math.sqrt(2), 1 / math.sqrt(3)])
    m = resolve("peri", n_layers=3, block="parallel", placement="pre", **SMALL)
    assert m.block == "parallel"
    assert Model.from_json(m.to_json()) == m


# ---------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(arch="mixln", placement="pre"), "Mix-LN sets its own placements"),
    (dict(arch="mixln", placement="post"), "Mix-LN sets its own placements"),
    (dict(arch="deepnorm", placement="pre"), "DeepNorm is a Post-LN scheme"),
    (dict(arch="deepnorm", placement="peri"), "placement peri is not defined for it"),
    (dict(arch="lns", placement="post"), "LayerNorm Scaling scales the norm before each branch"),
    (dict(arch="lns", placement="output"), "which placement output does not have"),
    (dict(arch="dslm", placement="peri"), "init 'dslm' is derived for the pre and post placements, not peri"),
    (dict(arch="dslm-post", placement="output"), "not output"),
    (dict(arch="postln", block="parallel"), "a parallel block normalises one input for both branches"),
    (dict(arch="preln", placement="peri", block="parallel"), "placement peri was given"),
    (dict(arch="dslm", block="parallel"), "a parallel block (one residual sum per layer) is not defined"),
    (dict(arch="deepnorm", block="parallel"), "is not defined for it"),
    (dict(arch="preln", init="dslm", block="parallel"), "init 'dslm' is derived for sequential blocks"),
    (dict(arch="dslm", norm="rmsnorm", input_mean=0.5), "assumes a zero-mean stream"),
    (dict(ffn="swiglu", activation="relu"), "ffn swiglu is the gated FFN with silu; activation relu contradicts "
                                            "it (for a gated FFN with relu: ffn reglu)"),
    (dict(ffn="reglu", activation="silu"), "(for a gated FFN with silu: ffn swiglu)"),
    (dict(n_kv_heads=3), "n_kv_heads 3 must divide n_heads 4"),
    (dict(n_kv_heads=0), "n_kv_heads must be a positive integer"),
    (dict(rope=False, rope_base=100.0), "rope_base is given but rope is off"),
    (dict(rope_base=1.0), "rope_base must be > 1"),
    (dict(rope=True, d_head=15), "rope needs an even d_head"),
    (dict(norm="batchnorm"), "unknown norm 'batchnorm'; known: layernorm, rmsnorm"),
    (dict(ffn="moe"), "unknown ffn 'moe'; known: mlp, swiglu, geglu, reglu"),
    (dict(placement="sandwich"), "unknown placement 'sandwich'; known: pre, post, peri, output"),
    (dict(block="serial"), "unknown block 'serial'; known: sequential, parallel"),
    (dict(activation="tanh"), "unknown activation 'tanh'; known: relu, gelu, silu"),
    (dict(norm_eps=-1e-5), "norm_eps must be >= 0"),
    (dict(qk_norm=1), "qk_norm must be true or false"),
    (dict(arch="llama", init_std=0.0), "it needs init_std > 0"),
])
def test_refused(kwargs, message):
    kw = dict(n_layers=4, **SMALL)
    kw.update(kwargs)
    with pytest.raises(DomainError) as e:
        resolve(**kw)
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("args, words", [
    (["--arch", "mixln", "--placement", "pre"], "Mix-LN sets its own placements"),
    (["--arch", "deepnorm", "--placement", "pre"], "DeepNorm is a Post-LN scheme"),
    (["--arch", "postln", "--block", "parallel"], "give placement pre"),
    (["--ffn", "swiglu", "--activation", "gelu"], "ffn geglu"),
    (["--kv-heads", "3"], "must divide"),
    (["--no-rope", "--rope-base", "500"], "rope is off"),
    (["--norm", "rms"], "unknown norm 'rms'"),
    (["--ffn", "glu"], "unknown ffn 'glu'"),
    (["--placement", "middle"], "unknown placement 'middle'"),
    (["--norm-eps", "-1"], "--norm-eps must be >= 0"),
    (["--rope-base", "0.5"], "--rope-base must be > 1"),
])
def test_cli_refusals_are_one_line(args, words):
    r = run("predict", "--layers", "2", "--d-model", "64", "--heads", "4", "--seq-len", "8", *args)
    line = one_error_line(r)
    assert line.startswith("sigprop predict: error: ") and words in line, line


# ---------------------------------------------------------------------------------------
# inits on gated FFNs and grouped-query attention
# ---------------------------------------------------------------------------------------

N_INIT, D, H, KV, F = 6, 64, 8, 2, 192
GEOM = dict(d_model=D, n_heads=H, n_kv_heads=KV, d_ff=F, seq_len=16, ffn="swiglu")
DK = D // H


def test_normal_and_scaled_on_glu():
    m = resolve(n_layers=N_INIT, init="normal", **GEOM)
    for w in ("gate", "up", "down"):
        assert_all(stds(m, "ffn")[w], 0.02)
    m = resolve(n_layers=N_INIT, init="scaled", **GEOM)
    r = 0.02 / math.sqrt(2 * N_INIT)
    assert_all(stds(m, "ffn")["gate"], 0.02)
    assert_all(stds(m, "ffn")["up"], 0.02)
    assert_all(stds(m, "ffn")["down"], r)
    assert_all(stds(m, "attention")["o"], r)
    assert_all(stds(m, "attention")["v"], 0.02)


def test_xavier_on_glu_and_gqa():
    m = resolve(n_layers=N_INIT, init="xavier", **GEOM)
    for w in ("gate", "up", "down"):
        assert_all(stds(m, "ffn")[w], math.sqrt(2 / (D + F)))
    for w in ("q", "k", "v"):
        assert_all(stds(m, "attention")[w], math.sqrt(2 / (D + DK)))         # per head, as before
    assert_all(stds(m, "attention")["o"], math.sqrt(2 / (H * DK + D)))


def test_torch_default_on_glu_and_gqa():
    """Stacked in-projection (q, k, v rows: H dk + 2 KV dk) Xavier-uniform, variance
    2/(fan_in + fan_out); each FFN matrix an nn.Linear: kaiming-uniform(a = sqrt 5) variance
    1/(3 fan_in), bias uniform(+-1/sqrt(fan_in)) variance 1/(3 fan_in)."""
    m = resolve(n_layers=N_INIT, init="torch-default", **GEOM)
    qkv = math.sqrt(2 / (D + H * DK + 2 * KV * DK))
    for w in ("q", "k", "v"):
        assert_all(stds(m, "attention")[w], qkv)
    assert_all(stds(m, "attention")["o"], math.sqrt(1 / (3 * H * DK)))
    for w, fan_in in (("gate", D), ("up", D), ("down", F)):
        assert_all(stds(m, "ffn")[w], math.sqrt(1 / (3 * fan_in)))
        assert_all(biases(m, "ffn")[w], math.sqrt(1 / (3 * fan_in)))
    for w in ("q", "k", "v", "o"):
        assert_all(biases(m, "attention")[w], 0.0)


def test_deepnorm_on_glu_and_gqa():
    m = resolve("deepnorm", n_layers=N_INIT, **GEOM)
    beta = (8 * N_INIT) ** -0.25
    xav = lambda fi, fo, gain=1.0: gain * math.sqrt(2 / (fi + fo))  # noqa: E731
    a = stds(m, "attention")
    assert_all(a["q"], xav(D, H * DK))
    assert_all(a["k"], xav(D, KV * DK))
    assert_all(a["v"], xav(D, KV * DK, beta))
    assert_all(a["o"], xav(H * DK, D, beta))
    f = stds(m, "ffn")
    assert_all(f["gate"], xav(D, F, beta))
    assert_all(f["up"], xav(D, F, beta))
    assert_all(f["down"], xav(F, D, beta))


def test_dslm_reglu_unit_block():
    """ReGLU block, unit input: gate and up variance d s^2, E[relu(g)^2] = d s^2 / 2, so the
    block output variance is f s^2 (d s^2)^2 / (2 (1-p_ffn)(1-p_hid)) = 1:
    s^6 = 2 (1-p_ffn)(1-p_hid) / (f d^2); gate, up and down share it."""
    m = resolve("dslm", n_layers=4, ffn_dropout=0.05, **{**GEOM, "ffn": "reglu"})
    s = (2 * 0.95 * 0.9 / (F * D * D)) ** (1 / 6)
    for w in ("gate", "up", "down"):
        assert_all(stds(m, "ffn")[w], s, rtol=1e-9)
    assert m.notes["dslm_ffn_std"] == pytest.approx(s, rel=1e-9)


def test_dslm_swiglu_unit_block():
    """SwiGLU block: output variance f s^2 E[silu(g)^2] d s^2 / (1 - p_hid), g ~ N(0, d s^2),
    with E[silu^2] by Gauss-Hermite quadrature here."""
    m = resolve("dslm", n_layers=4, **GEOM)
    s = float(stds(m, "ffn")["gate"][0])
    x, w = np.polynomial.hermite_e.hermegauss(200)
    g = x * math.sqrt(D * s * s)
    silu2 = float(np.sum(w * (g / (1 + np.exp(-g))) ** 2) / math.sqrt(2 * math.pi))
    assert F * s * s * silu2 * D * s * s / 0.9 == pytest.approx(1.0, rel=1e-9)
    assert_all(stds(m, "ffn")["down"], s)


def test_dslm_vo_uses_the_query_width():
    """V/O std^4 = (1-p)/(r d n_heads d_head): grouped-query K/V do not change the width W_o reads."""
    m = resolve("dslm", n_layers=4, **GEOM)
    r0 = m.notes["dslm_stream_corr"][0]
    assert_all(stds(m, "attention")["v"][0], ((1 - 0.1) / (r0 * D * H * DK)) ** 0.25, rtol=1e-12)
    assert_all(stds(m, "attention")["q"], math.sqrt(1 / D))


# ---------------------------------------------------------------------------------------
# presets against their published configurations
# ---------------------------------------------------------------------------------------

def test_llama_preset_is_the_curse_of_depth_130m_model():
    m = resolve("llama")
    assert (m.n_layers, m.d_model, m.n_heads, m.d_head, m.d_ff, m.n_kv_heads) == (12, 768, 12, 64, 2048, 12)
    assert (m.norm, m.norm_eps, m.ffn_kind, m.activation) == ("rmsnorm", 1e-6, "glu", "silu")
    assert (m.rope, m.qk_norm, m.final_norm, m.causal, m.block) == (10000.0, None, True, True, "sequential")
    assert m.attention.placements() == m.ffn.placements() == {"pre"}
    for kind in ("attention", "ffn"):
        for w, col in stds(m, kind).items():
            assert_all(col, 0.02)
        for col in biases(m, kind).values():
            assert_all(col, 0.0)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.0, 0.0, 0.0)
    # the stream entering layer 1: the embedding N(0, 0.02^2) table itself
    assert (m.input.mean, m.input.var) == (0.0, pytest.approx(0.02 ** 2, rel=1e-14))
    assert m.input.corr == pytest.approx(R0, rel=1e-14)
    assert "LLaMA token embedding" in m.notes["input"] and "0.221" in m.notes["input"]
    assert m.notes["init"] == "normal"


def test_llama_sizes_and_gqa():
    """[CoD]'s other sizes through the flags; Mistral-style GQA with --kv-heads."""
    m = resolve("llama", n_layers=24, d_model=2048, n_heads=32, d_ff=5461)
    assert (m.n_layers, m.d_model, m.d_head, m.d_ff) == (24, 2048, 64, 5461)
    m = resolve("llama", n_kv_heads=4)
    assert m.n_kv_heads == 4 and m.fans("attention", "k") == (768, 256)


def test_gpt2_preset():
    n = 12
    m = resolve("gpt2")
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff) == (n, 768, 12, 3072)
    assert (m.norm, m.norm_eps, m.ffn_kind, m.activation) == ("layernorm", 1e-5, "mlp", "gelu")
    assert (m.rope, m.final_norm, m.causal) == (None, True, True)
    assert m.attention.placements() == {"pre"} and m.notes["init"] == "scaled"
    r = 0.02 / math.sqrt(2 * n)                 # c_proj: initializer_range / sqrt(2 n_layer)
    a, f = stds(m, "attention"), stds(m, "ffn")
    assert_all(a["o"], r)
    assert_all(f["out"], r)
    for col in (a["q"], a["k"], a["v"], f["in"]):
        assert_all(col, 0.02)
    for kind in ("attention", "ffn"):
        for col in biases(m, kind).values():
            assert_all(col, 0.0)
    assert resolve("gpt2", n_layers=6).attention.std["o"][0] == pytest.approx(0.0057735, rel=1e-4)  # HF's check
    # input: word N(0, 0.02^2) + position N(0, 0.01^2) tables, then embedding dropout 0.1
    var = (0.02 ** 2 + 0.01 ** 2) / 0.9
    corr = R0 * 0.02 ** 2 / (0.02 ** 2 + 0.01 ** 2) * 0.9
    assert m.input.var == pytest.approx(var, rel=1e-13) and m.input.corr == pytest.approx(corr, rel=1e-13)
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.1, 0.1, 0.0)


def test_bert_preset():
    d = 768
    m = resolve("bert")
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff, m.causal) == (12, d, 12, 3072, False)
    assert (m.norm, m.norm_eps, m.activation, m.final_norm) == ("layernorm", 1e-12, "gelu", False)
    assert m.attention.placements() == m.ffn.placements() == {"post"}
    for kind in ("attention", "ffn"):
        for col in stds(m, kind).values():
            assert_all(col, 0.02)
    # word + position + segment tables (one segment: shared by all tokens), then LayerNorm,
    # then dropout 0.1: LayerNorm output variance 1 (eps 1e-12 against 1.2e-3), its token
    # correlation r (1 - (1 - r^2) / (2 (d - 1))) to first order in 1/d; dropout: var / 0.9, corr * 0.9
    r = (R0 + 1) / 3
    r_ln = r * (1 - (1 - r * r) / (2 * (d - 1)))
    assert m.input.var == pytest.approx(1 / 0.9, rel=1e-8)
    assert m.input.corr == pytest.approx(0.9 * r_ln, rel=2e-6)
    assert m.input.mean == 0.0
    assert "BERT token embedding" in m.notes["input"] and "LayerNorm" in m.notes["input"]


def test_olmo2_preset():
    m = resolve("olmo2")
    assert (m.n_layers, m.d_model, m.n_heads, m.d_ff) == (32, 4096, 32, 11008)
    assert (m.norm, m.norm_eps, m.ffn_kind, m.activation) == ("rmsnorm", 1e-6, "glu", "silu")
    assert (m.rope, m.qk_norm, m.final_norm, m.causal) == (500000.0, "rmsnorm", True, True)
    assert m.attention.placements() == m.ffn.placements() == {"output"}
    for kind in ("attention", "ffn"):
        for col in stds(m, kind).values():
            assert_all(col, 0.02)
        for col in biases(m, kind).values():
            assert_all(col, 0.0)
    assert m.input.var == pytest.approx(0.02 ** 2, rel=1e-14) and m.input.corr == pytest.approx(R0, rel=1e-14)
    assert (m.dropout.attention, m.dropout.hidden) == (0.0, 0.0)


def test_peri_preset():
    m = resolve("peri", n_layers=6)
    assert m.attention.placements() == m.ffn.placements() == {"peri"}
    assert (m.norm, m.d_model, m.activation, m.causal) == ("layernorm", 1024, "relu", False)
    assert (m.input.var, m.input.corr) == (1.0, pytest.approx(R0 * 0.9))
    assert_all(m.ffn.skip_scale, 1.0)
    assert m.features() == ["placement peri"]


def test_embedding_input_follows_the_options():
    """Dropout and init_std reach the embedding; given input fields replace its values, and
    the note says so."""
    m = resolve("llama", dropout=0.2)
    assert m.input.var == pytest.approx(0.02 ** 2 / 0.8) and m.input.corr == pytest.approx(R0 * 0.8)
    m = resolve("llama", init_std=0.01)
    assert m.input.var == pytest.approx(1e-4)
    m = resolve("llama", input_var=2.0)
    assert (m.input.var, m.input.corr) == (2.0, pytest.approx(R0))
    assert "input_var as given" in m.notes["input"]
    m = resolve("llama", input_var=2.0, input_corr=0.5, input_mean=0.0)
    assert (m.input.var, m.input.corr) == (2.0, 0.5) and "input" not in m.notes
    m = resolve("bert", norm="rmsnorm")                    # the embedding's norm is the model's
    assert m.input.var == pytest.approx(1 / 0.9, rel=1e-6) and "RMSNorm" in m.notes["input"]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "bert", "olmo2", "peri"])
@pytest.mark.parametrize("init", ["normal", "xavier", "torch-default", "scaled", "deepnorm", "dslm"])
def test_presets_round_trip(arch, init):
    kw = dict(n_layers=3, **SMALL)
    if init == "dslm" and arch in ("olmo2", "peri"):
        with pytest.raises(DomainError, match="pre and post placements"):
            resolve(arch, init=init, **kw)
        return
    m = resolve(arch, init=init, **kw)
    obj = json.loads(json.dumps(m.to_json()))
    back = Model.from_json(obj)
    assert back == m and back.to_json() == obj


def test_preset_round_trips_with_gqa_and_parallel():
    m = resolve("llama", n_kv_heads=3, block="parallel")
    assert Model.from_json(json.loads(json.dumps(m.to_json()))) == m


# ---------------------------------------------------------------------------------------
# command line, config file, Python API
# ---------------------------------------------------------------------------------------

def _cli_model(capsys, *args):
    """The model the CLI's model options resolve to (a throwaway command decorated like the
    real ones, so that the flags, their parsing and the resolution are the commands')."""
    import typer

    from sigprop.cli._app import SigpropTyper
    from sigprop.cli._model_options import build_model, model_options

    app = SigpropTyper()

    @app.command("show")
    @model_options(default_layers=24)
    def show(model_opts: dict = None) -> None:
        print(json.dumps(build_model(model_opts, default_layers=24).to_json()))

    @app.command("other")
    def other() -> None:  # (two commands: typer keeps the command name)
        pass

    try:
        app(args=["show", *args], prog_name="sigprop", standalone_mode=False)
    except typer.Exit:
        pass
    return json.loads(capsys.readouterr().out)


def test_cli_flags_resolve_to_the_model(capsys):
    m = _cli_model(capsys, "--layers", "3", "--d-model", "64", "--heads", "8", "--kv-heads", "2", "--d-ff", "96",
                   "--seq-len", "8", "--norm", "rmsnorm", "--norm-eps", "1e-6", "--ffn", "geglu", "--rope-base",
                   "500", "--qk-norm", "--final-norm", "--placement", "peri", "--causal", "--no-bias",
                   "--init", "torch-default")
    assert (m["norm"], m["norm_eps"], m["ffn_kind"], m["activation"]) == ("rmsnorm", 1e-6, "glu", "gelu")
    assert (m["n_kv_heads"], m["rope"], m["qk_norm"], m["final_norm"], m["causal"]) == \
        (2, {"base": 500.0}, "rmsnorm", True, True)
    layer = m["layers"][2]
    assert layer["attention"]["placement"] == layer["ffn"]["placement"] == "peri"
    assert set(layer["ffn"]["init"]) == {"gate", "up", "down"}
    assert layer["ffn"]["init"]["gate"]["bias_std"] == 0.0
    assert layer["ffn"]["init"]["down"]["std"] == pytest.approx(math.sqrt(1 / (3 * 96)))
    m = _cli_model(capsys, "--layers", "2", "--d-model", "64", "--heads", "4", "--seq-len", "8", "--block", "parallel")
    assert m["block"] == "parallel" and m["layers"][0]["ffn"]["skip_scale"] == 1.0


def test_cli_preset_layers_win_over_the_commands_default(capsys):
    assert _cli_model(capsys, "--arch", "llama")["n_layers"] == 12
    assert _cli_model(capsys, "--arch", "llama", "--layers", "5")["n_layers"] == 5
    assert _cli_model(capsys, "--arch", "preln", "--d-model", "64", "--heads", "4")["n_layers"] == 24
    m = _cli_model(capsys, "--arch", "llama", "--no-rope", "--no-final-norm", "--bias", "--init", "torch-default")
    assert "rope" not in m and "final_norm" not in m
    assert m["layers"][0]["ffn"]["init"]["up"]["bias_std"] == pytest.approx(math.sqrt(1 / (3 * 768)))


def test_config_file_takes_the_new_keys(tmp_path, capsys):
    cfg = tmp_path / "m.toml"
    cfg.write_text('arch = "llama"\nlayers = 2\nd-model = 64\nheads = 8\nkv-heads = 2\nd-ff = 96\nseq-len = 8\n'
                   'ffn = "reglu"\nnorm-eps = 1e-5\nrope-base = 1000\nqk_norm = true\nbias = false\n'
                   'placement = "output"\nblock = "sequential"\nfinal-norm = false\n')
    a = _cli_model(capsys, "--config", str(cfg))
    b = _cli_model(capsys, "--arch", "llama", "--layers", "2", "--d-model", "64", "--heads", "8", "--kv-heads", "2",
                   "--d-ff", "96", "--seq-len", "8", "--ffn", "reglu", "--norm-eps", "1e-5", "--rope-base", "1000",
                   "--qk-norm", "--no-bias", "--placement", "output", "--block", "sequential", "--no-final-norm")
    assert a == b
    assert (a["ffn_kind"], a["activation"], a["rope"], a["qk_norm"], a["n_kv_heads"]) == \
        ("glu", "relu", {"base": 1000.0}, "rmsnorm", 2)
    cfg.write_text("rope = 1\n")
    r = run("predict", "--config", str(cfg))
    assert "rope must be true or false" in one_error_line(r)


def test_api_takes_the_new_keywords():
    import sigprop

    m = sigprop.build_model(arch="llama", layers=2, kv_heads=4, rope_base=1e5, qk_norm=True, bias=False)
    assert (m.n_layers, m.n_kv_heads, m.rope, m.qk_norm) == (2, 4, 1e5, "rmsnorm")
    m = sigprop.build_model(layers=2, d_model=64, heads=4, ffn="swiglu", norm="rmsnorm", placement="output")
    assert (m.ffn_kind, m.activation, m.norm) == ("glu", "silu", "rmsnorm") and m.attention.placements() == {"output"}


# ---------------------------------------------------------------------------------------
# consumers that do not implement the modern features refuse them
# ---------------------------------------------------------------------------------------

TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--d-ff", "128", "--seq-len", "8"]


@pytest.mark.parametrize("args, words", [
    (["solve-init", "--qk-norm"], "solve-init does not implement qk_norm (yet)"),
    (["solve-init", "--target", "logit-var", "--value", "1", "--qk-norm"], "does not implement qk_norm"),
    (["export", "latex", "--what", "solve", "--qk-norm"], "solve-init does not implement qk_norm"),
])
def test_consumers_refuse_what_they_do_not_implement(args, words):
    r = run(*args, *(TINY if "max-depth" not in args else TINY[2:]))
    line = one_error_line(r)
    assert words in line, line


def test_max_depth_refuses_modern_features():
    r = run("solve-init", "--target", "max-depth", "--max-grad-ratio", "10", "--d-model", "64", "--heads", "4",
            "--seq-len", "8", "--qk-norm")
    assert "solve-init does not implement qk_norm" in one_error_line(r)


def test_library_consumers_refuse():
    from sigprop.export.model import model_latex
    from sigprop.model import symbolic
    from sigprop.solve import solve

    m = resolve(n_layers=2, rope=True, **SMALL)
    symbolic.require_supported(m)           # the derivation and the export run what predict runs
    assert "rope" in symbolic.SUPPORTED
    with pytest.raises(DomainError, match="solve-init does not implement qk_norm"):
        solve("unit-forward", n_layers=2, qk_norm=True, **SMALL)


@pytest.mark.parametrize("arch", ["lns", "dslm", "deepnorm", "mixln"])
def test_depth_schemes_combine_with_llama_blocks(arch):
    """--arch lns --norm rmsnorm --ffn swiglu --rope (and the others alike): the scheme's
    placements and scales, LLaMA's blocks."""
    n = 8
    m = resolve(arch, n_layers=n, norm="rmsnorm", norm_eps=1e-6, ffn="swiglu", rope=True, final_norm=True,
                bias=False, causal=True, **SMALL)
    assert (m.norm, m.ffn_kind, m.activation, m.rope, m.final_norm) == ("rmsnorm", "glu", "silu", 10000.0, True)
    if arch == "lns":
        assert_all(m.ffn.norm_scale, [1 / math.sqrt(l) for l in range(1, n + 1)])
    if arch == "dslm":
        assert_all(m.attention.branch_scale, math.sqrt(1 / n))
        assert m.notes["init"] == "dslm" and set(m.ffn.names) == {"gate", "up", "down"}
    if arch == "deepnorm":
        assert m.attention.placements() == {"post"}
        assert_all(m.attention.skip_scale, (2 * n) ** 0.25)
    if arch == "mixln":
        assert [m.attention.placement_of(i) for i in range(n)] == ["post"] * 2 + ["pre"] * 6
    assert Model.from_json(m.to_json()) == m


def test_text_header_names_blocks_and_assumed_input():
    from sigprop.cli._render_model import model_header

    head = "\n".join(model_header(resolve("gpt2")))
    assert "model     gpt2, 12 layers, d_model 768, d_ff 3072, gelu" in head
    assert "attention 12 heads x 64, 256 tokens, causal" in head
    assert "norm      LayerNorm eps 1e-05, placement pre, sequential blocks, final norm" in head
    assert "stream entering layer 1: mean 0, var 0.0005556, token corr 0.1591" in head
    assert ("          assumed: the GPT-2 token embedding: word table N(0, 0.02^2) + position table N(0, 0.01^2), "
            "two positions holding the same token with probability 0.221, then dropout 0.1") in head
    head = "\n".join(model_header(resolve("llama", n_kv_heads=4)))
    assert "d_ff 2048, SwiGLU FFN" in head and "(4 key/value heads)" in head and "RoPE base 10000" in head
    assert "RMSNorm eps 1e-06" in head
    head = "\n".join(model_header(resolve("olmo2")))
    assert "QK-norm (RMSNorm)" in head and "placement output" in head and "RoPE base 500000" in head
    assert "assumed" not in "\n".join(model_header(resolve(n_layers=2)))


def test_compare_header_splits_what_differs():
    from types import SimpleNamespace

    from sigprop.cli.compare import _header

    rows = [SimpleNamespace(arch=a, model=resolve(a, n_layers=2, **SMALL)) for a in ("preln", "gpt2")]
    lines = _header(rows)
    assert "dropout   attention 0.1, hidden 0.1, ffn-inner 0" in lines                 # shared: once
    assert "model     preln: 2 layers, d_model 64, d_ff 256, relu" in lines
    assert "          gpt2: 2 layers, d_model 64, d_ff 256, gelu" in lines
    i = lines.index("          gpt2: stream entering layer 1: mean 0, var 0.0005556, token corr 0.1591")
    assert lines[i + 1].startswith("          gpt2: assumed: the GPT-2 token embedding")
    assert lines[-1].startswith("gradient")


def test_parallel_refusal_suggests_only_an_allowed_placement():
    with pytest.raises(DomainError) as e:
        resolve("mixln", n_layers=8, block="parallel", **SMALL)
    assert str(e.value).endswith("mixln has placement post, pre")
    with pytest.raises(DomainError) as e:
        resolve("bert", n_layers=2, block="parallel", **SMALL)
    assert str(e.value).endswith("bert has placement post: give placement pre")
    assert resolve("bert", n_layers=2, block="parallel", placement="pre", **SMALL).block == "parallel"
    assert resolve("olmo2", n_layers=2, rope=False, **SMALL).rope is None     # its base is not "given"
