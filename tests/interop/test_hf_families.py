"""The later Hugging Face families (sigprop.interop.hf; docs/hf.md): each small
config.json written here resolves into the model fields its config and the family's modeling
code give (values typed here from transformers' modeling and configuration files, never
computed with the code under test); what sigprop cannot model exits 2 with one line naming
it; and, where transformers is installed, the init stds are those its _init_weights draws.

The measured comparison of each family against transformers' own model (hooks, sigprop
measure) is in tests/torch/test_torch_interop.py (tests/_torch_configs.py holds their configs);
Falcon's, whose logit variance the probe cannot read, is here (test_falcon_agrees_with_transformers)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests._cli import cli
from sigprop.errors import DomainError
from sigprop.interop.hf import SEQ_LEN_FROM_CONFIG, read_config, resolve
from tests import _paths

R0 = 0.221          # sigprop's token-collision probability of the embedding rule

DATA = _paths.DATA / "hf"

#: config.json files shaped like published ones (Qwen3-0.6B, roberta-base, distilbert-base with
#: its dropout off, starcoder2-3b, Phi-3-mini-4k, gemma-2b, a small Command R, granite-3.0-2b,
#: OLMo 3 7B, SmolLM3-3B with every layer rotary, StableLM with full rotary and QK-norm, Phi with
#: full rotary, Falcon-7B), fewer layers where the layer count does not matter
CONFIGS = {
    "qwen3": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rms_norm_eps=1e-6, rope_theta=1000000, attention_bias=False, tie_word_embeddings=True,
                  use_sliding_window=False, sliding_window=None, max_window_layers=28, hidden_act="silu",
                  initializer_range=0.02, vocab_size=151936, attention_dropout=0.0),
    "roberta": dict(model_type="roberta", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                    intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1, max_position_embeddings=514, type_vocab_size=1,
                    initializer_range=0.02, layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                    vocab_size=50265),
    "distilbert": dict(model_type="distilbert", dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                       activation="gelu", dropout=0.0, attention_dropout=0.1, max_position_embeddings=512,
                       initializer_range=0.02, sinusoidal_pos_embds=False, vocab_size=30522),
    "starcoder2": dict(model_type="starcoder2", hidden_size=3072, num_hidden_layers=30, num_attention_heads=24,
                       num_key_value_heads=2, intermediate_size=12288, hidden_act="gelu_pytorch_tanh",
                       norm_epsilon=1e-5, max_position_embeddings=16384, initializer_range=0.018042,
                       rope_theta=999999.4420358813, sliding_window=4096, use_bias=True, residual_dropout=0.1,
                       embedding_dropout=0.1, attention_dropout=0.1, vocab_size=49152),
    "phi3": dict(model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                 original_max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                 rope_scaling=None, sliding_window=2047, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                 hidden_act="silu", initializer_range=0.02, vocab_size=32064),
    "gemma": dict(model_type="gemma", hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=256, hidden_act="gelu",
                  hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6,
                  rope_theta=10000.0, attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
                  vocab_size=256000),
    "cohere": dict(model_type="cohere", hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                   num_attention_heads=16, num_key_value_heads=4, layer_norm_eps=1e-5, logit_scale=0.125,
                   max_position_embeddings=8192, rope_theta=8000000.0, use_qk_norm=True, hidden_act="silu",
                   initializer_range=0.02, attention_bias=False, vocab_size=256000),
    "granite": dict(model_type="granite", hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                    rms_norm_eps=1e-5, rope_theta=10000.0, embedding_multiplier=12.0, residual_multiplier=0.22,
                    attention_multiplier=0.015625, logits_scaling=8.0, attention_bias=False, mlp_bias=False,
                    hidden_act="silu", initializer_range=0.02, vocab_size=49155),
    "olmo3": dict(model_type="olmo3", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=65536,
                  rms_norm_eps=1e-6, rope_theta=500000, sliding_window=4096, attention_bias=False,
                  hidden_act="silu", initializer_range=0.02, vocab_size=100278),
    "smollm3": dict(model_type="smollm3", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=65536,
                    rms_norm_eps=1e-6, rope_theta=5000000.0, no_rope_layers=[1] * 36, use_sliding_window=False,
                    sliding_window=None, hidden_act="silu", initializer_range=0.02, vocab_size=128256),
    "stablelm": dict(model_type="stablelm", hidden_size=2560, intermediate_size=6912, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, layer_norm_eps=1e-5, max_position_embeddings=4096,
                     rope_theta=10000, partial_rotary_factor=1.0, use_qkv_bias=True, qk_layernorm=True,
                     use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0, hidden_act="silu",
                     initializer_range=0.02, vocab_size=50304),
    "phi": dict(model_type="phi", hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                num_attention_heads=32, layer_norm_eps=1e-5, max_position_embeddings=2048, rope_theta=10000.0,
                partial_rotary_factor=1.0, qk_layernorm=False, resid_pdrop=0.1, embd_pdrop=0.0,
                attention_dropout=0.0, hidden_act="gelu_new", initializer_range=0.02, vocab_size=51200),
    "falcon": json.loads((DATA / "falcon-7b.json").read_text()),
}

_GLU = ("gate", "up", "down")
_R = 0.02

#: family -> the fields expected (typed from the config above and the family's modeling code)
EXPECTED = {
    "qwen3": dict(n_layers=28, d_model=1024, n_heads=16, n_kv_heads=8, d_head=128, d_ff=3072, seq_len=2048,
                  activation="silu", norm="rmsnorm", norm_eps=1e-6, ffn_kind="glu", block="sequential", rope=1e6,
                  qk_norm="rmsnorm", final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0), placement="pre",
                  att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0,
                  input=(_R ** 2, R0)),
    # positions from pad_token_id + 1 = 2: 514 - 2 = 512 tokens; token + position + token-type
    # tables (one type), LayerNorm (eps 1e-5 against the sum's variance 3 r^2: ms / (ms + eps)),
    # dropout 0.1
    "roberta": dict(n_layers=12, d_model=768, n_heads=12, n_kv_heads=12, d_head=64, d_ff=3072, seq_len=512,
                    activation="gelu", norm="layernorm", norm_eps=1e-5, ffn_kind="mlp", block="sequential",
                    rope=None, qk_norm=None, final_norm=False, causal=False, dropout=(0.1, 0.1, 0.0),
                    placement="post", att=dict.fromkeys("qkvo", _R), ffn={"in": _R, "out": _R}, branch=1.0,
                    input=(3 * _R ** 2 / (3 * _R ** 2 + 1e-5) / 0.9, (R0 + 1) / 3 * 0.9)),
    # token + position tables, LayerNorm (eps 1e-12, fixed in the modeling code), no dropout
    "distilbert": dict(n_layers=6, d_model=768, n_heads=12, n_kv_heads=12, d_head=64, d_ff=3072, seq_len=512,
                       activation="gelu", norm="layernorm", norm_eps=1e-12, ffn_kind="mlp", block="sequential",
                       rope=None, qk_norm=None, final_norm=False, causal=False, dropout=(0.1, 0.0, 0.0),
                       placement="post", att=dict.fromkeys("qkvo", _R), ffn={"in": _R, "out": _R}, branch=1.0,
                       input=(1.0, R0 / 2)),
    # sliding_window 4096 >= seq_len 2048: full attention; embedding dropout 0.1
    "starcoder2": dict(n_layers=30, d_model=3072, n_heads=24, n_kv_heads=2, d_head=128, d_ff=12288, seq_len=2048,
                       activation="gelu", norm="layernorm", norm_eps=1e-5, ffn_kind="mlp", block="sequential",
                       rope=999999.4420358813, qk_norm=None, final_norm=True, causal=True,
                       dropout=(0.1, 0.1, 0.0), placement="pre", att=dict.fromkeys("qkvo", 0.018042),
                       ffn={"in": 0.018042, "out": 0.018042}, branch=1.0,
                       input=(0.018042 ** 2 / 0.9, R0 * 0.9)),
    "phi3": dict(n_layers=32, d_model=3072, n_heads=32, n_kv_heads=32, d_head=96, d_ff=8192, seq_len=2047,
                 activation="silu", norm="rmsnorm", norm_eps=1e-5, ffn_kind="glu", block="sequential", rope=10000.0,
                 qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0), placement="pre",
                 att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0, input=(_R ** 2, R0)),
    # token table times sqrt(2048); (hidden_act gelu is Gemma's legacy name of the tanh GeLU)
    "gemma": dict(n_layers=18, d_model=2048, n_heads=8, n_kv_heads=1, d_head=256, d_ff=16384, seq_len=2048,
                  activation="gelu", norm="rmsnorm", norm_eps=1e-6, ffn_kind="glu", block="sequential", rope=10000.0,
                  qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0), placement="pre",
                  att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0,
                  input=(2048 * _R ** 2, R0)),
    "cohere": dict(n_layers=16, d_model=2048, n_heads=16, n_kv_heads=4, d_head=128, d_ff=5632, seq_len=2048,
                   activation="silu", norm="layernorm", norm_eps=1e-5, ffn_kind="glu", block="parallel",
                   rope=8e6, qk_norm="layernorm", final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0),
                   placement="pre", att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0,
                   input=(_R ** 2, R0)),
    # logits q.k / 64 instead of q.k / sqrt(64): W_q's std times sqrt(64) / 64; branches times
    # 0.22; the embedding times 12
    "granite": dict(n_layers=40, d_model=2048, n_heads=32, n_kv_heads=8, d_head=64, d_ff=8192, seq_len=2048,
                    activation="silu", norm="rmsnorm", norm_eps=1e-5, ffn_kind="glu", block="sequential",
                    rope=10000.0, qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0),
                    placement="pre", att={"q": _R * 0.015625 * 8, "k": _R, "v": _R, "o": _R},
                    ffn=dict.fromkeys(_GLU, _R), branch=0.22, input=((12 * _R) ** 2, R0)),
    "olmo3": dict(n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, d_head=128, d_ff=11008, seq_len=2048,
                  activation="silu", norm="rmsnorm", norm_eps=1e-6, ffn_kind="glu", block="sequential",
                  rope=500000.0, qk_norm="rmsnorm", final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0),
                  placement="output", att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0,
                  input=(_R ** 2, R0)),
    "smollm3": dict(n_layers=36, d_model=2048, n_heads=16, n_kv_heads=4, d_head=128, d_ff=11008, seq_len=2048,
                    activation="silu", norm="rmsnorm", norm_eps=1e-6, ffn_kind="glu", block="sequential",
                    rope=5e6, qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0), placement="pre",
                    att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0, input=(_R ** 2, R0)),
    "stablelm": dict(n_layers=32, d_model=2560, n_heads=32, n_kv_heads=8, d_head=80, d_ff=6912, seq_len=2048,
                     activation="silu", norm="layernorm", norm_eps=1e-5, ffn_kind="glu", block="parallel",
                     rope=10000.0, qk_norm="layernorm", final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0),
                     placement="pre", att=dict.fromkeys("qkvo", _R), ffn=dict.fromkeys(_GLU, _R), branch=1.0,
                     input=(_R ** 2, R0)),
    "phi": dict(n_layers=32, d_model=2560, n_heads=32, n_kv_heads=32, d_head=80, d_ff=10240, seq_len=2048,
                activation="gelu", norm="layernorm", norm_eps=1e-5, ffn_kind="mlp", block="parallel", rope=10000.0,
                qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.1, 0.0), placement="pre",
                att=dict.fromkeys("qkvo", _R), ffn={"in": _R, "out": _R}, branch=1.0, input=(_R ** 2, R0)),
    # Falcon-7B: multi-query (one kv head), parallel_attn with one LayerNorm, MLP 4 x 4544,
    # rotary base 10000 (the class's default), max_position_embeddings 2048 (its default)
    "falcon": dict(n_layers=32, d_model=4544, n_heads=71, n_kv_heads=1, d_head=64, d_ff=18176, seq_len=2048,
                   activation="gelu", norm="layernorm", norm_eps=1e-5, ffn_kind="mlp", block="parallel",
                   rope=10000.0, qk_norm=None, final_norm=True, causal=True, dropout=(0.0, 0.0, 0.0),
                   placement="pre", att=dict.fromkeys("qkvo", _R), ffn={"in": _R, "out": _R}, branch=1.0,
                   input=(_R ** 2, R0)),
}
# (Phi-3's sliding_window 2047 is shorter than 2048: the default sequence is refused, so its
# expected fields are those at --seq-len 2047)
SEQ = {"phi3": 2047}


def _write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _col0(s, attr):
    return {w: float(getattr(s, attr)[w][0]) for w in s.names}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_family_fields(tmp_path, family):
    e = EXPECTED[family]
    h = resolve(read_config(_write(tmp_path, CONFIGS[family])), seq_len=SEQ.get(family))
    m = h.model
    assert h.family == family and m.arch == family
    for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "d_ff", "seq_len", "activation", "norm",
                "ffn_kind", "block", "qk_norm", "final_norm", "causal"):
        assert getattr(m, key) == e[key], key
    if family not in SEQ:
        assert h.seq_len_source == SEQ_LEN_FROM_CONFIG
    assert m.norm_eps == pytest.approx(e["norm_eps"], rel=1e-12)
    assert m.rope == (None if e["rope"] is None else pytest.approx(e["rope"], rel=1e-12))
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == e["dropout"]
    assert m.attention.placements() == {e["placement"]} and m.ffn.placements() == {e["placement"]}
    assert _col0(m.attention, "std") == pytest.approx(e["att"], rel=1e-12)
    assert _col0(m.ffn, "std") == pytest.approx(e["ffn"], rel=1e-12)
    assert set(_col0(m.attention, "bias_std").values()) == {0.0} and set(_col0(m.ffn, "bias_std").values()) == {0.0}
    for s in (m.attention, m.ffn):
        assert set(s.skip_scale) == {1.0} and set(s.norm_scale) == {1.0}
        assert set(s.branch_scale) == {e["branch"]}
    var, corr = e["input"]
    assert m.input.mean == 0
    # (an embedding LayerNorm at width d moves the variance and the correlation by O(1/d))
    rel = 3e-3 if family in ("roberta", "distilbert") else 1e-9
    assert m.input.var == pytest.approx(var, rel=rel)
    assert m.input.corr == pytest.approx(corr, rel=rel)
    assert m.notes["hf"]["family"] == family and all(isinstance(n, str) for n in h.notes)


def test_notes_name_the_family_fields(tmp_path):
    def text(family, **kw):
        return " ".join(resolve(dict(CONFIGS[family], **kw), seq_len=SEQ.get(family)).notes)

    t = text("granite")
    assert "attention_multiplier 0.015625" in t and "residual_multiplier 0.22" in t and "logits_scaling 8" in t
    assert "embedding_multiplier" in t
    t = text("cohere")
    assert "logit_scale 0.125" in t and "without a bias" in t and "use_qk_norm" in t
    assert "RMSNorm per head" in text("qwen3")
    assert "q, k, v and o" in text("qwen3", attention_bias=True)
    assert "pad_token_id + 1" in text("roberta")
    assert "1e-12" in text("distilbert")
    assert "whole q and k" in text("olmo3")
    assert "fused qkv_proj" in text("phi3")
    assert "(1 + w)" in text("gemma") and "sqrt(hidden_size)" in text("gemma")
    assert "use_bias" in text("starcoder2")


def test_sliding_windows(tmp_path):
    """A window at least the sequence is full attention (no window column); a shorter one is the
    model's window column, which the predictor refuses for causal models (naming it)."""
    from sigprop.model.predict import Predictor

    for family, kw in (("starcoder2", {}), ("phi3", {}), ("olmo3", {}),
                       ("qwen3", dict(use_sliding_window=True, sliding_window=1024, max_window_layers=20))):
        cfg = dict(CONFIGS[family], **kw)
        m = resolve(cfg, seq_len=4097).model
        assert m.window is not None and max(m.window) == cfg["sliding_window"]
        with pytest.raises(DomainError, match="sliding-window"):
            Predictor(m)
        assert resolve(cfg, seq_len=min(cfg["sliding_window"], 64)).model.window is None
    # Qwen3 without use_sliding_window ignores the window; OLMo 3's full layers every fourth
    assert resolve(dict(CONFIGS["qwen3"], sliding_window=16), seq_len=2048).model.window is None
    w = resolve(CONFIGS["olmo3"], seq_len=8192).model.window
    assert sum(1 for v in w if v) == 24 and w[3] == w[7] == 0


def test_distilbert_dropout_only_on_the_ffn_branch():
    """DistilBERT drops its FFN output and not its attention output: refused when that
    dropout is on, predicted with --hidden-dropout 0 (or --dropout 0)."""
    cfg = dict(CONFIGS["distilbert"], dropout=0.1)
    with pytest.raises(DomainError, match="dropout 0.1"):
        resolve(cfg)
    m = resolve(cfg, hidden_dropout=0.0).model
    assert m.dropout.hidden == 0.0 and m.dropout.attention == 0.1
    assert resolve(cfg, dropout=0.0).model.dropout.attention == 0.0


def test_granite_branch_scale_option_replaces_the_multiplier():
    m = resolve(CONFIGS["granite"], branch_scale=0.5).model
    assert set(m.attention.branch_scale) == {0.5}


@pytest.mark.parametrize("cfg, frac", [
    (dict(CONFIGS["stablelm"], partial_rotary_factor=None), 0.25),            # the class's default
    ({k: v for k, v in CONFIGS["phi"].items() if k != "partial_rotary_factor"}, 0.5),
    (dict(CONFIGS["phi3"], sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                 "partial_rotary_factor": 0.75}), 0.75),
])
def test_partial_rotary_defaults_predict(cfg, frac):
    """StableLM's and Phi's partial rotary (their configuration classes' defaults where the file
    gives none), and Phi-3's: the rotated part's frequencies, then zeros (sigprop.rope)."""
    rope = resolve(cfg).model.rope
    f = np.asarray(rope.inv_freq)
    d_head = 2 * f.size
    n_rot = int(d_head * frac) // 2
    assert np.all(f[:n_rot] > 0) and np.all(f[n_rot:] == 0)


#: config, word the one error line must hold
REFUSED = [
    (dict(CONFIGS["smollm3"], no_rope_layers=None), "no_rope_layer_interval"),
    (dict(CONFIGS["smollm3"], no_rope_layers=[1, 1, 1, 0] * 9), "no_rope_layers"),
    (dict(CONFIGS["distilbert"], sinusoidal_pos_embds=True), "sinusoidal_pos_embds"),
    (dict(CONFIGS["stablelm"], hidden_dropout=0.1), "hidden_dropout"),
    (dict(CONFIGS["granite"], attention_multiplier=0), "attention_multiplier"),
    (dict(CONFIGS["phi3"], sliding_window=None,
          rope_scaling={"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}), "longrope"),
    ({"model_type": "mixtral"}, "mixture of experts is not modelled yet"),
    ({"model_type": "qwen3_moe"}, "mixture of experts is not modelled yet"),
    ({"model_type": "deepseek_v3"}, "mixture of experts is not modelled yet"),
    ({"model_type": "gpt_oss"}, "mixture of experts is not modelled yet"),
    ({"model_type": "olmoe"}, "mixture of experts is not modelled yet"),
    ({"model_type": "qwen2_moe"}, "mixture of experts is not modelled yet"),
    ({"model_type": "t5"}, "encoder-decoder"),
    ({"model_type": "bart"}, "encoder-decoder"),
    (dict(CONFIGS["falcon"], alibi=True), "alibi true"),
    (dict(CONFIGS["falcon"], new_decoder_architecture=True, parallel_attn=False), "parallel_attn false"),
    (dict(CONFIGS["falcon"], num_ln_in_parallel_attn=2), "num_ln_in_parallel_attn 2"),
    (dict(CONFIGS["falcon"], new_decoder_architecture=True, num_ln_in_parallel_attn=3), "num_ln_in_parallel_attn"),
    (dict(CONFIGS["falcon"], multi_query=False, num_kv_heads=8), "num_kv_heads 8"),
    (dict(CONFIGS["falcon"], new_decoder_architecture=True, num_kv_heads=8), "must divide"),
    (dict(CONFIGS["falcon"], parallel_attn=False, attention_dropout=0.1), "attention_dropout 0.1"),
    (dict(CONFIGS["falcon"], n_head=32), "n_head"),
    (dict(CONFIGS["falcon"], apply_residual_connection_post_layernorm=True), "apply_residual_connection"),
    ({"model_type": "modernbert"}, "modernbert"),
]


@pytest.mark.parametrize("config, word", REFUSED, ids=[w for _, w in REFUSED])
def test_refused(capsys, tmp_path, config, word):
    code, out, err = cli(capsys, "predict", "--hf-config", str(_write(tmp_path, config)))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, err
    assert word in lines[0], lines[0]


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_every_family_predicts(capsys, tmp_path, family):
    code, out, err = cli(capsys, "predict", "--hf-config", str(_write(tmp_path, CONFIGS[family])), "--layers", "2",
                         "--seq-len", "64", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["hf"]["family"] == family and obj["model"]["n_layers"] == 2


# ---------------------------------------------------------------------------------------
# against transformers (where installed): defaults and the stds its init draws
# ---------------------------------------------------------------------------------------

CLASSES = {"qwen3": "Qwen3Config", "roberta": "RobertaConfig", "distilbert": "DistilBertConfig",
           "starcoder2": "Starcoder2Config", "phi3": "Phi3Config", "gemma": "GemmaConfig", "cohere": "CohereConfig",
           "granite": "GraniteConfig", "olmo3": "Olmo3Config", "smollm3": "SmolLM3Config",
           "stablelm": "StableLmConfig", "phi": "PhiConfig", "falcon": "FalconConfig"}


def test_defaults_match_transformers():
    """The configuration classes' defaults typed in sigprop.interop.hf against transformers' own."""
    transformers = pytest.importorskip("transformers")
    from sigprop.interop.hf import FAMILIES

    for fam, cls in CLASSES.items():
        c = getattr(transformers, cls)()
        rp = getattr(c, "rope_parameters", None) or {}
        if "full_attention" in rp:
            rp = rp["full_attention"]
        for key, v in FAMILIES[fam].defaults.items():
            if key.startswith("__"):
                continue                                  # (DistilBERT's fixed eps)
            if (fam, key) in {("qwen3", "sliding_window"), ("smollm3", "no_rope_layers"),
                              ("roberta", "position_embedding_type"), ("falcon", "ffn_hidden_size")}:
                continue    # (the class's post-init rewrites the first two from other keys, and
                            # Falcon's ffn_hidden_size None to 4 hidden_size; RoBERTa in
                            # transformers 5 has absolute positions only)
            if key in ("rope_theta", "partial_rotary_factor"):
                assert rp[key] == v, (fam, key, rp, v)
                continue
            got = getattr(c, key, None)
            if key in ("num_key_value_heads", "head_dim", "num_kv_heads") and v is None:
                continue                                  # transformers fills these in from the heads
            assert got == v, (fam, key, got, v)


def _tiny(family: str) -> dict:
    """The family's config above at width 128 (4 heads of 32), 3 layers."""
    cfg = dict(CONFIGS[family], vocab_size=500)
    k = {"distilbert": ("dim", "n_heads", "n_layers", "hidden_dim")}.get(
        family, ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"))
    cfg.update({k[0]: 128, k[1]: 4, k[2]: 3, k[3]: 256})
    if "num_key_value_heads" in cfg:
        cfg["num_key_value_heads"] = 2
    if "head_dim" in cfg:
        cfg["head_dim"] = 32
    if family == "falcon":
        cfg["ffn_hidden_size"] = 256
    if family == "smollm3":
        cfg["no_rope_layers"] = [1, 1, 1]
    if family in ("phi3", "cohere", "olmo3", "smollm3", "granite", "qwen3", "gemma", "stablelm", "phi", "starcoder2"):
        cfg.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return cfg


#: family -> {module path inside a layer: (sublayer, sigprop weight names it holds)}
_ATT = {"self_attn.q_proj": ("attention", "q"), "self_attn.k_proj": ("attention", "k"),
        "self_attn.v_proj": ("attention", "v"), "self_attn.o_proj": ("attention", "o")}
_MLP = {"mlp.gate_proj": ("ffn", "gate"), "mlp.up_proj": ("ffn", "up"), "mlp.down_proj": ("ffn", "down")}
_BERT = {"attention.self.query": ("attention", "q"), "attention.self.key": ("attention", "k"),
         "attention.self.value": ("attention", "v"), "attention.output.dense": ("attention", "o"),
         "intermediate.dense": ("ffn", "in"), "output.dense": ("ffn", "out")}
MODULES = {
    **dict.fromkeys(("qwen3", "gemma", "cohere", "olmo3", "smollm3", "stablelm"), {**_ATT, **_MLP}),
    "granite": {**_ATT, **_MLP},
    "roberta": _BERT,
    "distilbert": {"attention.q_lin": ("attention", "q"), "attention.k_lin": ("attention", "k"),
                   "attention.v_lin": ("attention", "v"), "attention.out_lin": ("attention", "o"),
                   "ffn.lin1": ("ffn", "in"), "ffn.lin2": ("ffn", "out")},
    "starcoder2": {**_ATT, "mlp.c_fc": ("ffn", "in"), "mlp.c_proj": ("ffn", "out")},
    "phi3": {"self_attn.qkv_proj": ("attention", "qkv"), "self_attn.o_proj": ("attention", "o"),
             "mlp.gate_up_proj": ("ffn", "gateup"), "mlp.down_proj": ("ffn", "down")},
    "phi": {"self_attn.q_proj": ("attention", "q"), "self_attn.k_proj": ("attention", "k"),
            "self_attn.v_proj": ("attention", "v"), "self_attn.dense": ("attention", "o"),
            "mlp.fc1": ("ffn", "in"), "mlp.fc2": ("ffn", "out")},
    "falcon": {"self_attention.query_key_value": ("attention", "qkv"), "self_attention.dense": ("attention", "o"),
               "mlp.dense_h_to_4h": ("ffn", "in"), "mlp.dense_4h_to_h": ("ffn", "out")},
}
#: the std transformers' init gives each module's weight (typed: initializer_range everywhere;
#: Granite's q_proj too, the attention multiplier acting in its forward pass)
INIT = {"starcoder2": 0.018042}


@pytest.mark.parametrize("family", sorted(MODULES))
def test_stds_are_transformers_init(family):
    """Every weight of every layer of a small model transformers builds from the config (its own
    _init_weights, seeded) has the std typed for it (within 5%: 128 x 128 draws or more), the
    std sigprop resolves for it (Granite: except q, whose sigprop std carries the attention
    multiplier); every bias is 0 and every norm gain 1 (Gemma: weight 0 in its (1 + w))."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _tiny(family)
    h = resolve(cfg, seq_len=16)
    m = h.model
    conf = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    net = transformers.AutoModel.from_config(conf)
    want = INIT.get(family, 0.02)
    seen = set()
    for full, mod in net.named_modules():
        parts = full.split(".")
        idx = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if idx is not None and ".".join(parts[idx + 1:]) in MODULES[family]:
            rel = ".".join(parts[idx + 1:])
            kind, name = MODULES[family][rel]
            got = mod.weight.detach().double().std().item()
            assert got == pytest.approx(want, rel=0.05), (family, full, got)
            s = getattr(m, kind).std
            for n in ({"qkv": "qkv", "gateup": ("gate", "up")}.get(name, (name,))):
                if not (family == "granite" and n == "q"):
                    assert float(s[n][int(parts[idx])]) == pytest.approx(want, rel=1e-12), (family, n)
            seen.add(rel)
        if isinstance(getattr(mod, "bias", None), torch.Tensor):
            assert float(mod.bias.detach().abs().max()) == 0.0, full
        if "norm" in type(mod).__name__.lower() and isinstance(getattr(mod, "weight", None), torch.Tensor):
            assert torch.all(mod.weight == (0.0 if family == "gemma" else 1.0)), full
    assert seen == set(MODULES[family]), set(MODULES[family]) - seen
    emb = net.get_input_embeddings().weight.detach().double()
    assert emb.std().item() == pytest.approx(want, rel=0.05)


@pytest.mark.parametrize("family", ["gemma", "granite", "roberta", "distilbert"])
def test_embedding_output_is_the_input(family):
    """The variance of transformers' embedding output (random token ids; Gemma's sqrt(hidden_size),
    Granite's embedding_multiplier, RoBERTa's and DistilBERT's LayerNorm) is sigprop's input variance."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = _tiny(family)
    h = resolve(cfg, seq_len=32)
    torch.manual_seed(0)
    net = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**cfg))
    net.train()
    ids = torch.randint(3, cfg["vocab_size"], (8, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if family == "granite":                    # the multiplier is applied in GraniteModel.forward
            x = net.get_input_embeddings()(ids).double() * cfg["embedding_multiplier"]
        elif family in ("roberta", "distilbert"):
            x = net.embeddings(input_ids=ids).double()
        else:
            x = net.get_input_embeddings()(ids).double()
    assert x.var().item() == pytest.approx(h.model.input.var, rel=0.08)


def test_roberta_positions_and_decoder():
    """RoBERTa's positions start at pad_token_id + 1: --seq-len beyond the rest of its table is
    refused; is_decoder makes it causal (as BERT's)."""
    with pytest.raises(DomainError, match="position table"):
        resolve(CONFIGS["roberta"], seq_len=513)
    assert resolve(CONFIGS["roberta"], seq_len=512).model.seq_len == 512
    assert resolve(dict(CONFIGS["roberta"], pad_token_id=0), seq_len=513).model.seq_len == 513
    assert resolve(dict(CONFIGS["roberta"], is_decoder=True), seq_len=16).model.causal is True


# ---------------------------------------------------------------------------------------
# Falcon: its layouts (old and new decoder architecture, parallel_attn), and measured
# against transformers' own model
# ---------------------------------------------------------------------------------------

#: shaped like Falcon-40B's published config.json (new_decoder_architecture: 8 kv groups, ln_attn and ln_mlp)
FALCON_40B = dict(CONFIGS["falcon"], hidden_size=8192, num_attention_heads=128, num_hidden_layers=60,
                  num_kv_heads=8, new_decoder_architecture=True)


@pytest.mark.parametrize("cfg, kv, block, d_ff", [
    (FALCON_40B, 8, "parallel", 4 * 8192),
    (dict(FALCON_40B, num_ln_in_parallel_attn=1, ffn_hidden_size=16384), 8, "parallel", 16384),
    (dict(FALCON_40B, num_kv_heads=None), 128, "parallel", 4 * 8192),     # (num_kv_heads null: every head)
    (dict(FALCON_40B, multi_query=False, parallel_attn=True), 8, "parallel", 4 * 8192),  # (both not read)
    (dict(CONFIGS["falcon"], multi_query=False), 71, "parallel", 4 * 4544),
    (dict(CONFIGS["falcon"], num_kv_heads=8), 1, "parallel", 4 * 4544),  # (multi_query: num_kv_heads not read)
    (dict(CONFIGS["falcon"], parallel_attn=False), 1, "sequential", 4 * 4544),
    (dict(CONFIGS["falcon"], parallel_attn=None, multi_query=None), 71, "sequential", 4 * 4544),  # (null: false)
])
def test_falcon_layouts(cfg, kv, block, d_ff):
    """Falcon's kv heads and block from new_decoder_architecture, multi_query, num_kv_heads and
    parallel_attn, as transformers' FalconAttention and FalconDecoderLayer read them."""
    h = resolve(cfg, seq_len=64)
    m = h.model
    assert (m.n_kv_heads, m.block, m.d_ff, m.d_head) == (kv, block, d_ff, 64)
    assert m.norm == "layernorm" and m.attention.placements() == {"pre"} and m.rope == 10000.0 and m.final_norm
    t = " ".join(h.notes)
    if cfg.get("new_decoder_architecture") and cfg.get("num_ln_in_parallel_attn") != 1:
        assert "ln_attn" in t and "ln_mlp" in t and "one norm" in t


def test_falcon_fields_and_aliases():
    """n_embed (the original configs' key, read by FalconConfig's post-init) is hidden_size; a
    rotary base and rope scaling go through the shared rotary code; bias true names the biases;
    the two dropouts of the sequential layout."""
    cfg = {k: v for k, v in CONFIGS["falcon"].items() if k != "hidden_size"}
    assert resolve(dict(cfg, n_embed=4544), seq_len=64).model.d_model == 4544
    with pytest.raises(DomainError, match="n_embed"):
        resolve(dict(CONFIGS["falcon"], n_embed=4096), seq_len=64)
    assert resolve(dict(CONFIGS["falcon"], rope_theta=500000.0), seq_len=64).model.rope == 500000.0
    rope = resolve(dict(CONFIGS["falcon"], rope_scaling={"rope_type": "linear", "factor": 2.0}), seq_len=64).model.rope
    f = np.asarray(rope.inv_freq)
    assert f.size == 32 and f[1] == pytest.approx(1e4 ** (-2 / 64) / 2, rel=1e-12)
    h = resolve(dict(CONFIGS["falcon"], bias=True), seq_len=64)
    assert "query_key_value" in " ".join(h.notes)
    seq = dict(CONFIGS["falcon"], parallel_attn=False, attention_dropout=0.1, hidden_dropout=0.1)
    m = resolve(seq, seq_len=64).model
    assert (m.dropout.attention, m.dropout.hidden, m.dropout.ffn_inner) == (0.0, 0.1, 0.0)
    # unequal dropouts: --hidden-dropout replaces both, and the transformers config says so
    h = resolve(dict(seq, hidden_dropout=0.2), seq_len=64, hidden_dropout=0.05)
    assert h.model.dropout.hidden == 0.05
    tc = h.transformers_config()
    assert tc["attention_dropout"] == 0.05 and tc["hidden_dropout"] == 0.05 and None not in tc
    # parallel: attention_dropout is not used (rotary: no dropout on the probabilities)
    m = resolve(dict(CONFIGS["falcon"], attention_dropout=0.1, hidden_dropout=0.1), seq_len=64).model
    assert (m.dropout.attention, m.dropout.hidden) == (0.0, 0.1)


def test_falcon_7b_file_predicts(capsys):
    code, out, err = cli(capsys, "predict", "--hf-config", str(DATA / "falcon-7b.json"), "--layers", "2",
                         "--seq-len", "32", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["hf"]["family"] == "falcon" and obj["model"]["n_kv_heads"] == 1


def test_falcon_takes_no_sigprop_init():
    """Its fused query_key_value's layout depends on the config: writing an init is refused."""
    from sigprop.interop.torch_names import layout, require_init

    with pytest.raises(DomainError, match="query_key_value"):
        require_init(layout("hf:falcon"))


_FALCON_SMALL = dict(vocab_size=256, max_position_embeddings=64, hidden_size=128, num_hidden_layers=4,
                     num_attention_heads=4, pad_token_id=0)
#: small Falcon-7B-like (multi-query, parallel), Falcon-40B-like (new_decoder_architecture, 2 kv
#: groups, ln_attn and ln_mlp), and sequential (parallel_attn false, biases, both dropouts) models
FALCON_MEASURED = {
    "7b": dict(CONFIGS["falcon"], **_FALCON_SMALL, hidden_dropout=0.1),
    "40b": dict(FALCON_40B, **_FALCON_SMALL, num_kv_heads=2),
    "sequential": dict(CONFIGS["falcon"], **_FALCON_SMALL, multi_query=False, parallel_attn=False, bias=True,
                       attention_dropout=0.1, hidden_dropout=0.1),
}


def _falcon_measured(cfg, model=None):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch

    from sigprop.interop.torch_names import layout
    from sigprop.torch.measure import compare_measured, hf_source, measure

    h = resolve(cfg, seq_len=32)
    model = h.model if model is None else model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        meas = measure(model, hf_source(h.config, "falcon", layout=layout("hf:falcon")), trials=8, batch=4, seed=0)
    finally:
        torch.set_num_threads(threads)
    return model, meas, compare_measured(model, meas)[1]


@pytest.mark.parametrize("name", sorted(FALCON_MEASURED))
def test_falcon_agrees_with_transformers(name):
    """A 4-layer width-128 Falcon built by transformers from the config with its own random init,
    measured at every sublayer in training mode (sigprop measure): within check's tolerance."""
    model, meas, res = _falcon_measured(FALCON_MEASURED[name])
    assert res.passed, res.failures
    assert len(res.measured) == 1 + (1 if model.block == "parallel" else 2) * model.n_layers


def test_falcon_measurement_sees_the_dropout():
    """The comparison can fail: the small Falcon-7B with hidden_dropout 0.1 against the model
    resolved without it."""
    cfg = FALCON_MEASURED["7b"]
    wrong = resolve(cfg, seq_len=32, hidden_dropout=0.0).model
    _, _, res = _falcon_measured(cfg, wrong)
    assert not res.passed
