"""Rotary positions given by their frequencies (sigprop.rope.RopeFreqs): the model object's
{"inv_freq": ..., "attention_factor": ...} form, the attention rule and Monte Carlo with it,
and the frequencies sigprop.interop.hf computes for every rope_type, against transformers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sigprop.errors import DomainError
from sigprop.interop import hf
from sigprop.mc.component import measure
from sigprop.mc.components.attention import COMPONENT, rope_tables
from sigprop.model import presets
from sigprop.model.spec import Model
from sigprop.rope import RopeFreqs
from sigprop.rules import REGISTRY
from sigprop.rules import attention as att
from sigprop.state import Backward, Forward
from tests._paths import DATA

RULE = REGISTRY["attention"]


def _params(d=256, H=4, dh=64, L=64, wqk=1.2, causal=0, **kw):
    return dict(d=d, n_heads=H, d_head=dh, L=L, q_std=wqk / math.sqrt(d), k_std=wqk / math.sqrt(d),
                v_std=1 / math.sqrt(d), o_std=1 / math.sqrt(H * dh), p=0.0, causal=causal, **kw)


def _base_freqs(base, dh):
    return RopeFreqs(base ** (-2 * np.arange(dh // 2) / dh))


def _llama3(dh=64, base=5e5):
    inv, s = hf.rope_inv_freq("llama3", {"rope_theta": base, "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                              dh, 256, 131072, _raise)
    return RopeFreqs(inv, s)


def _raise(msg):
    raise DomainError(msg)


# --- the rule -------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("qk", [0, 2])
def test_frequencies_of_a_base_are_the_base(causal, qk):
    """A RopeFreqs holding base^(-2i/dh) is the base, bit for bit (the same sums over the
    same frequencies)."""
    x, g = Forward(0.0, 1.0, 0.6), Backward(1.0, 0.3)
    prm = _params(causal=causal, qk_norm=qk)
    a = RULE.evaluate(x, g, **prm, rope=1e4)
    b = RULE.evaluate(x, g, **prm, rope=_base_freqs(1e4, 64))
    assert a == b
    assert att.mean_row_logit_var({**prm, "rope": _base_freqs(1e4, 64)}, x) == att.mean_row_logit_var(
        {**prm, "rope": 1e4}, x)


def test_attention_factor_on_a_fully_rotated_head_scales_queries_and_keys():
    """yarn / longrope's factor s multiplies cos and sin: q and k each times s, which is the
    rule at q_std, k_std times s (exactly, with every plane rotating)."""
    x, g = Forward(0.0, 1.0, 0.5), Backward(1.0, 0.3)
    prm = _params(wqk=1.0, causal=1)
    f = _base_freqs(1e4, 64)
    s = 1.2
    a = RULE.evaluate(x, g, **prm, rope=RopeFreqs(f.inv_freq, s))
    b = RULE.evaluate(x, g, **{**prm, "q_std": prm["q_std"] * s, "k_std": prm["k_std"] * s}, rope=1e4)
    np.testing.assert_allclose([*a[0], *a[1]], [*b[0], *b[1]], rtol=1e-12)
    assert att.logit_var({**prm, "rope": RopeFreqs(f.inv_freq, s)}, x) == pytest.approx(
        s**4 * att.logit_var(prm, x))
    # partial rotary: the unrotated planes keep their scale; the logit variance is the planes' mean
    part = RopeFreqs(list(f.inv_freq[:8]) + [0.0] * 24, s)
    assert att.logit_var({**prm, "rope": part}, x) == pytest.approx((8 * s**4 + 24) / 32 * att.logit_var(prm, x))


def test_unrotated_planes_keep_the_shared_part_cancelling():
    """Frequency-0 planes contribute kappa = 1 (the Fejer mean is 1): all planes unrotated is no
    rotation (kbar = 1, the key-shared part cancels); a quarter rotated lies between."""
    n = np.array([16.0, 256.0])
    full = att._kappa_bar(None, n, 1e4, 64.0)
    none = att._kappa_bar(None, n, RopeFreqs([0.0] * 32), 64.0)
    quarter = att._kappa_bar(None, n, RopeFreqs(list(_base_freqs(1e4, 16).inv_freq) + [0.0] * 24), 64.0)
    np.testing.assert_allclose(none, 1.0)
    assert np.all(full < quarter) and np.all(quarter < 1)
    # the rotated quarter's own kbar (d_head 16), weighted by 8 of 32 planes
    np.testing.assert_allclose(quarter, 0.75 + 0.25 * att._kappa_bar(None, n, 1e4, 16.0), rtol=1e-12)


def test_rule_refuses_a_vector_of_the_wrong_length():
    x, g = Forward(0.0, 1.0, 0.5), Backward(1.0, 0.3)
    with pytest.raises(DomainError, match="d_head"):
        RULE.evaluate(x, g, **_params(), rope=RopeFreqs([0.1] * 16))


@pytest.mark.parametrize("rope", ["llama3", "partial", "yarn"])
def test_frequency_vectors_against_monte_carlo(rope):
    """The rule against sampling at one correlated point per frequency vector (llama3-scaled,
    a quarter rotated, yarn with its attention factor), causal rows."""
    freqs = {"llama3": _llama3(), "partial": RopeFreqs(list(_base_freqs(1e4, 16).inv_freq) + [0.0] * 24),
             "yarn": RopeFreqs(*hf.rope_inv_freq("yarn", {"rope_theta": 1e4, "factor": 4.0,
                                                         "original_max_position_embeddings": 64},
                                                 64, 64, 256, _raise))}[rope]
    x, g = Forward(0.0, 1.0, 0.9), Backward(1.0, 0.3)
    prm = _params(causal=1, rope=freqs)
    meas = measure(COMPONENT, prm, x, g, runs=12, batch=8, seed=5)
    y, gb = RULE.evaluate(x, g, **prm)
    for name, m_, se, pr, scale in (("x var", meas.x.var, meas.x.var_se, y.var, y.var),
                                    ("x cov", meas.x.cov, meas.x.cov_se, y.corr * y.var, y.var),
                                    ("g var", meas.g.var, meas.g.var_se, gb.var, gb.var),
                                    ("g cov", meas.g.cov, meas.g.cov_se, gb.corr * gb.var, gb.var)):
        assert abs(m_ - pr) <= 4 * se + 0.03 * abs(scale), (name, m_, pr, se)


# --- the Monte Carlo's rotation against transformers' --------------------------------------
def test_partial_rotary_is_a_permutation_of_transformers_layout():
    """GPT-NeoX / Phi rotate the first rd features of a head with rotate_half over them and pass
    the rest through (q_rot, q_pass), times the attention factor on the rotated part (Phi-3
    longrope); the Monte Carlo's tables (trailing frequencies 0, pairs (i, i + dh/2)) give the
    same logits after a fixed permutation of the head's features."""
    torch = pytest.importorskip("torch")
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    dh, rd, L, s = 16, 8, 12, 1.3
    base = 1e4
    inv = 1.0 / base ** (np.arange(0, rd, 2) / rd)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((L, dh)), rng.standard_normal((L, dh))
    emb = np.arange(L)[:, None] * inv[None, :]
    emb = np.concatenate([emb, emb], axis=1)
    cos, sin = torch.tensor(np.cos(emb) * s), torch.tensor(np.sin(emb) * s)
    qt, kt = apply_rotary_pos_emb(torch.tensor(q)[None, None], torch.tensor(k)[None, None], cos[None], sin[None])
    ref = (qt[0, 0] @ kt[0, 0].T).numpy()
    # sigprop's layout: plane i pairs features i and i + dh/2; the rotated planes first
    h = rd // 2
    perm = np.concatenate([np.arange(h), np.arange(rd, rd + (dh - rd) // 2),
                           np.arange(h, rd), np.arange(rd + (dh - rd) // 2, dh)])
    c, sn = rope_tables(L, dh, RopeFreqs(list(inv) + [0.0] * ((dh - rd) // 2), s))

    def rot(x):
        return x * c + np.concatenate([-x[:, dh // 2:], x[:, :dh // 2]], axis=1) * sn

    ours = rot(q[:, perm]) @ rot(k[:, perm]).T
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


# --- the model object -----------------------------------------------------------------------
def _model(rope):
    return presets.resolve(arch="llama", n_layers=2, d_model=256, n_heads=4, seq_len=64).replace(rope=rope)


def test_model_json_round_trip():
    m = _model(RopeFreqs([0.5] * 16 + [0.0] * 16, 1.1))
    obj = m.to_json()
    assert obj["rope"] == {"inv_freq": [0.5] * 16 + [0.0] * 16, "attention_factor": 1.1}
    back = Model.from_json(json.loads(json.dumps(obj)))
    assert back == m and back.rope == m.rope
    assert Model.from_json({**obj, "rope": {"inv_freq": [0.5] * 32}}).rope.attention_factor == 1.0
    assert Model.from_json({**obj, "rope": {"base": 5e5}}).rope == 5e5


@pytest.mark.parametrize("rope, word", [({"inv_freq": [0.5] * 8}, "d_head"), ({"inv_freq": [-1.0] * 32}, ">= 0"),
                                        ({"inv_freq": [0.5] * 32, "attention_factor": 0}, "attention_factor"),
                                        ({"inv_freq": [0.5] * 32, "base": 1e4}, "both"),
                                        ({"inv_freq": "x"}, "list"), ({"inv_freq": [0.5] * 32, "x": 1}, "unknown")])
def test_model_json_refusals(rope, word):
    obj = _model(1e4).to_json()
    with pytest.raises(DomainError, match=word):
        Model.from_json({**obj, "rope": rope})


def test_predict_and_trial_take_frequencies():
    """The whole-model predictor and the Monte Carlo trial run on a frequency vector; the
    vector of the base's own frequencies predicts what the base does."""
    from sigprop.model.predict import predict
    m = _model(1e4)
    a = predict(m)
    b = predict(m.replace(rope=_base_freqs(1e4, 64)))
    assert list(a) == list(b)
    c = predict(m.replace(rope=_llama3()))
    assert c[-1] != a[-1]


# --- transformers' rope types ------------------------------------------------------------------
TYPES = [
    ("linear", {"factor": 4.0}, 256),
    ("dynamic", {"factor": 2.0}, 256),
    ("dynamic", {"factor": 2.0}, 8192),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 1024}, 256),
    ("yarn", {"factor": 8.0, "original_max_position_embeddings": 512, "mscale": 1.0, "mscale_all_dim": 0.5,
              "beta_fast": 16, "beta_slow": 2}, 256),
    ("yarn", {"factor": 4.0, "original_max_position_embeddings": 1024, "attention_factor": 1.5, "truncate": False}, 256),
    ("longrope", {"short_factor": list(np.linspace(1, 2, 32)), "long_factor": list(np.linspace(1, 8, 32)),
                  "original_max_position_embeddings": 1024}, 512),
    ("longrope", {"short_factor": list(np.linspace(1, 2, 32)), "long_factor": list(np.linspace(1, 8, 32)),
                  "original_max_position_embeddings": 1024}, 2048),
    ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 512}, 256),
]


@pytest.mark.parametrize("kind, extra, seq_len", TYPES, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(TYPES)])
@pytest.mark.parametrize("prf", [1.0, 0.5])
def test_rope_types_match_transformers(kind, extra, seq_len, prf):
    """sigprop's frequencies and attention factor of every rope_type are transformers' (its
    ROPE_INIT_FUNCTIONS at the sequence length a forward over seq_len positions uses, float32)."""
    pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    dh, max_pos = 64, 4096
    if kind == "longrope" and prf != 1:
        extra = {**extra, "short_factor": extra["short_factor"][:16], "long_factor": extra["long_factor"][:16]}
    rp = {"rope_type": kind, "rope_theta": 10000.0, "partial_rotary_factor": prf, **extra}
    cfg = LlamaConfig(hidden_size=dh * 4, num_attention_heads=4, head_dim=dh, max_position_embeddings=max_pos,
                      rope_parameters=dict(rp))
    ref, ref_s = ROPE_INIT_FUNCTIONS[kind](cfg, None, seq_len=seq_len)
    p = dict(rp)
    p.setdefault("original_max_position_embeddings", max_pos)
    inv, s = hf.rope_inv_freq(kind, p, int(dh * prf), seq_len, max_pos, _raise)
    np.testing.assert_allclose(inv, ref.double().numpy(), rtol=3e-6)
    assert s == pytest.approx(ref_s, rel=1e-12)


def test_proportional_matches_transformers():
    pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rp = {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.25, "factor": 2.0}
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, rope_parameters=dict(rp))
    ref, ref_s = ROPE_INIT_FUNCTIONS["proportional"](cfg, None)
    inv, s = hf.rope_proportional(rp, 64, _raise)
    np.testing.assert_allclose(inv, ref.double().numpy(), rtol=3e-6)
    assert s == ref_s == 1.0


def _llama_cfg(**kw):
    return {**dict(model_type="llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
                   num_key_value_heads=4, num_hidden_layers=2, max_position_embeddings=131072, rope_theta=500000.0,
                   rms_norm_eps=1e-5), **kw}


def test_llama31_config_predicts_its_frequencies():
    pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    cfg = _llama_cfg(rope_scaling=scaling)
    m = hf.resolve(cfg, seq_len=256).model
    emb = LlamaRotaryEmbedding(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    assert isinstance(m.rope, RopeFreqs) and m.rope.attention_factor == emb.attention_scaling == 1.0
    np.testing.assert_allclose(m.rope.theta(), emb.inv_freq.double().numpy(), rtol=3e-6)


def test_pythia_predicts_a_quarter_rotated():
    pytest.importorskip("torch")
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

    cfg = json.loads((hf_data() / "pythia-160m.json").read_text())
    m = hf.resolve(cfg, seq_len=128).model
    inv = GPTNeoXRotaryEmbedding(GPTNeoXConfig(**{k: v for k, v in cfg.items() if k != "model_type"})).inv_freq
    assert m.rope.n_planes == 32 and m.rope.n_rotated == 8 == len(inv)
    np.testing.assert_allclose(m.rope.theta()[:8], inv.double().numpy(), rtol=3e-6)
    assert m.rope.inv_freq[8:] == (0.0,) * 24


def hf_data():
    from pathlib import Path
    return DATA / "hf"


@pytest.mark.parametrize("scaling, seq_len, word", [
    ({"rope_type": "linear", "factor": 2.0}, 256, None),
    ({"type": "yarn", "factor": 4.0}, 256, "attention factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, 256, "base"),
])
def test_scaled_llama_configs_predict(scaling, seq_len, word):
    h = hf.resolve(_llama_cfg(rope_scaling=scaling, max_position_embeddings=2048), seq_len=seq_len)
    if scaling.get("rope_type") == "dynamic":       # at most max_position_embeddings: the default
        assert h.model.rope == 500000.0
    else:
        assert isinstance(h.model.rope, RopeFreqs)
    # dynamic beyond max_position_embeddings: transformers' NTK base at seq_len
    d = hf.resolve(_llama_cfg(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=128),
                   seq_len=256).model
    b = 500000.0 * (2.0 * 256 / 128 - 1) ** (64 / 62)
    np.testing.assert_allclose(d.rope.theta(), b ** (-np.arange(0, 64, 2) / 64), rtol=1e-12)


def test_gptj_rotary_dim():
    cfg = json.loads((hf_data() / "gptj-6b.json").read_text())
    m = hf.resolve(cfg, seq_len=128).model
    rd = cfg["rotary_dim"]
    assert m.rope.n_rotated == rd // 2 and m.rope.n_planes == m.d_head // 2
    np.testing.assert_allclose(m.rope.theta()[:rd // 2], 1e4 ** (-np.arange(0, rd, 2) / rd), rtol=1e-12)


def test_solve_logit_var_counts_the_attention_factor():
    """The logit-variance target on a model whose rotation carries an attention factor: the
    solved Q/K stds give the target (the predictor's logit variance, which the factor scales)."""
    from sigprop.solve.solver import solve_logit_var
    f = _base_freqs(1e4, 64)
    m = _model(RopeFreqs(list(f.inv_freq[:8]) + [0.0] * 24, 1.3))
    sol = solve_logit_var(1.0, model=m)
    assert sol.feasible and sol.extra["logit_var_max_dev"] < 1e-2      # (without the factor: 0.46)


def test_model_derivation_reports_kbar_of_the_frequencies():
    """`export latex --what model` / the symbolic model: with a frequency vector the attention
    block gives kbar(L) of those frequencies (the rule's numeric twin), not of a base."""
    from sigprop.model.symbolic import attention_block
    f = RopeFreqs(list(_base_freqs(1e4, 16).inv_freq) + [0.0] * 24)
    der = attention_block(_model(f))
    kb = float(att._kappa_bar(None, 64.0, f, 64.0))
    assert any(f"kbar(L) = {kb:.6g}" in line for line in der.lines)
    assert kb != pytest.approx(float(att._kappa_bar(None, 64.0, 1e4, 64.0)), rel=1e-3)


def test_repr_is_exact():
    """The on-disk store keys its tables by the repr of the rule parameters: two vectors that
    differ anywhere (here in the last frequency, or the factor) have different reprs and keys,
    and the repr rebuilds the vector."""
    from sigprop.model import store
    a = RopeFreqs([1.0, 0.5, 0.25, 0.125])
    b = RopeFreqs([1.0, 0.5, 0.25, 0.125 + 1e-16 * 0.125 * 8])
    c = RopeFreqs([1.0, 0.5, 0.25, 0.125], 1.1)
    assert a != b and len({repr(a), repr(b), repr(c)}) == 3
    assert len({store.key("x", (("rope", r),)) for r in (a, b, c)}) == 3
    assert eval(repr(b), {"RopeFreqs": RopeFreqs}) == b
