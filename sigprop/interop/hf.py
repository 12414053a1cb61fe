"""Hugging Face ``config.json`` -> sigprop's model object (docs/hf.md).

:func:`read_config` reads a ``config.json`` (a file, or a directory holding one);
:func:`resolve` maps it to a fully resolved :class:`sigprop.model.spec.Model` at
initialisation, as transformers builds and initialises that model (``_init_weights`` and the
configuration class's defaults for keys a file leaves out), and returns it in an
:class:`HFModel` with the family, the sequence length and its source, and every assumption
made, in words (``notes``).  No network access, no torch or transformers import.

Families (``model_type``): gpt2, bert, llama, mistral, qwen2, gpt_neox, gptj, olmo2, gemma2,
gemma3_text (and gemma3, whose ``text_config`` is read); qwen3, roberta, distilbert, starcoder2,
phi3, gemma, cohere, granite, olmo3, smollm3, stablelm, phi, falcon (:data:`REFUSED`: the model_types
refused by name: mixture of experts, encoder-decoder, recurrent, ...).  Every field that changes signal
propagation at initialisation is mapped, or refused with a :class:`sigprop.errors.DomainError`
naming it when sigprop cannot model it (a sliding window shorter than the sequence, mixture of
experts, ALiBi, different rotary positions in different layers, attention-logit soft-capping, ...).  Keys
that do not change propagation (vocabulary size, token ids, dtypes, caching) are ignored.

The stream entering layer 1 (``model.input``) is what the family's token embedding gives at
initialisation (its tables N(0, initializer_range^2), Gemma's scaled by sqrt(hidden_size),
BERT's followed by its LayerNorm, then the embedding dropout), computed with sigprop's
embedding rule under its assumption that two positions hold the same token with probability
:data:`sigprop.model.presets.R0_EMBEDDING`; ``input_mean``, ``input_var`` and ``input_corr``
replace it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sigprop import registry
from sigprop.rules import windows
from sigprop.errors import DomainError
from sigprop.files import MAX_CONFIG_BYTES, check_path, read_json

#: the default sequence length is the model's context, capped here
SEQ_LEN_CAP = 2048
#: ``HFModel.seq_len_source`` values
SEQ_LEN_FROM_FLAG = "--seq-len"
SEQ_LEN_FROM_CONFIG = f"min(max_position_embeddings, {SEQ_LEN_CAP})"

#: the resolve() options (sigprop.model.presets.OPTIONS names) that may replace what the config
#: gives; every other model option conflicts with a config (the config fixes it)
OVERRIDES = frozenset((
    "n_layers", "init", "init_std", "dropout", "attn_dropout", "hidden_dropout", "ffn_dropout",
    "input_mean", "input_var", "input_corr", "grad_var", "grad_corr", "skip_scale", "branch_scale"))

#: Hugging Face activation names -> sigprop's activation
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu",
               "gelu_fast": "gelu", "silu": "silu", "swish": "silu"}
#: the tanh approximations of GeLU (modelled as the exact GeLU)
TANH_GELU = frozenset(("gelu_new", "gelu_pytorch_tanh", "gelu_fast"))
#: the largest |tanh-GeLU(x) - GeLU(x)| over the real line
TANH_GELU_MAX_DIFF = 4.7e-4

#: keys of mixture-of-experts configs (refused when they name more than one expert)
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


class Family(NamedTuple):
    """A supported ``model_type``: which config keys hold the sizes, the defaults of its
    configuration class (used for keys a file leaves out), and its fixed structure."""

    name: str
    title: str
    keys: dict            # sigprop quantity -> config key
    defaults: dict        # config key -> default of the configuration class
    norm: str             # layernorm | rmsnorm
    placement: str        # pre | post | peri | output
    ffn: str              # mlp | glu
    final_norm: bool
    causal: bool
    rope: bool
    positions: bool       # learned absolute position table (seq_len <= its size)
    dropout: tuple        # config keys of (attention probabilities, branch outputs, embedding) or None
    init: str             # sigprop init with the same stds as transformers' _init_weights
    embedding: str        # in words


_GPT_KEYS = dict(n_layers="n_layer", d_model="n_embd", n_heads="n_head", d_ff="n_inner",
                 activation="activation_function", norm_eps="layer_norm_epsilon", max_positions="n_positions")
_BERT_KEYS = dict(n_layers="num_hidden_layers", d_model="hidden_size", n_heads="num_attention_heads",
                  d_ff="intermediate_size", activation="hidden_act", norm_eps="layer_norm_eps",
                  max_positions="max_position_embeddings")
_LLAMA_KEYS = dict(_BERT_KEYS, n_kv_heads="num_key_value_heads", d_head="head_dim", norm_eps="rms_norm_eps")
_GEMMA_KEYS = dict(_LLAMA_KEYS, activation="hidden_activation")

_LLAMA_DEFAULTS = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=None,
                       head_dim=None, intermediate_size=11008, hidden_act="silu", rms_norm_eps=1e-6,
                       max_position_embeddings=2048, initializer_range=0.02, attention_dropout=0.0,
                       rope_theta=10000.0)
_DECODER = dict(final_norm=True, causal=True)
_LLAMA_FAMILY = dict(norm="rmsnorm", placement="pre", ffn="glu", rope=True, positions=False,
                     dropout=("attention_dropout", None, None), init="normal", embedding="token table", **_DECODER)

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("gpt2", "GPT-2", _GPT_KEYS,
           dict(n_layer=12, n_embd=768, n_head=12, n_inner=None, activation_function="gelu_new",
                layer_norm_epsilon=1e-5, n_positions=1024, initializer_range=0.02, attn_pdrop=0.1,
                resid_pdrop=0.1, embd_pdrop=0.1, scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
                tie_word_embeddings=True),
           norm="layernorm", placement="pre", ffn="mlp", rope=False, positions=True,
           dropout=("attn_pdrop", "resid_pdrop", "embd_pdrop"), init="scaled",
           embedding="token table + learned position table", **_DECODER),
    Family("bert", "BERT", _BERT_KEYS,
           dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                hidden_act="gelu", layer_norm_eps=1e-12, max_position_embeddings=512, initializer_range=0.02,
                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
                position_embedding_type="absolute", is_decoder=False, tie_word_embeddings=True),
           norm="layernorm", placement="post", ffn="mlp", final_norm=False, causal=False, rope=False,
           positions=True, dropout=("attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_dropout_prob"),
           init="normal", embedding="token + learned position + token-type tables, then LayerNorm"),
    Family("llama", "LLaMA", _LLAMA_KEYS, dict(_LLAMA_DEFAULTS, attention_bias=False, mlp_bias=False),
           **_LLAMA_FAMILY),
    Family("mistral", "Mistral", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=131072,
                sliding_window=4096), **_LLAMA_FAMILY),
    Family("qwen2", "Qwen2", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, intermediate_size=22016, max_position_embeddings=32768, use_sliding_window=False,
                sliding_window=None, max_window_layers=28), **_LLAMA_FAMILY),
    Family("gpt_neox", "GPT-NeoX", _BERT_KEYS,
           dict(num_hidden_layers=44, hidden_size=6144, num_attention_heads=64, intermediate_size=24576,
                hidden_act="gelu", layer_norm_eps=1e-5, max_position_embeddings=2048, initializer_range=0.02,
                attention_dropout=0.0, hidden_dropout=0.0, use_parallel_residual=True, rotary_pct=0.25,
                rotary_emb_base=10000.0, attention_bias=True),
           norm="layernorm", placement="pre", ffn="mlp", rope=True, positions=False,
           dropout=("attention_dropout", "hidden_dropout", "hidden_dropout"), init="normal",
           embedding="token table", **_DECODER),
    Family("gptj", "GPT-J", _GPT_KEYS,
           dict(n_layer=28, n_embd=4096, n_head=16, rotary_dim=64, n_inner=None, activation_function="gelu_new",
                layer_norm_epsilon=1e-5, n_positions=2048, initializer_range=0.02, attn_pdrop=0.0,
                resid_pdrop=0.0, embd_pdrop=0.0),
           norm="layernorm", placement="pre", ffn="mlp", rope=True, positions=True,
           dropout=("attn_pdrop", "resid_pdrop", "embd_pdrop"), init="normal", embedding="token table",
           **_DECODER),
    Family("olmo2", "OLMo 2", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, rms_norm_eps=1e-5, attention_bias=False), **dict(_LLAMA_FAMILY, placement="output")),
    Family("gemma2", "Gemma 2", _GEMMA_KEYS,
           dict(num_hidden_layers=26, hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                intermediate_size=9216, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                max_position_embeddings=8192, initializer_range=0.02, attention_dropout=0.0, attention_bias=False,
                rope_theta=10000.0, query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                use_bidirectional_attention=None, tie_word_embeddings=True),
           **dict(_LLAMA_FAMILY, placement="peri", embedding="token table times sqrt(hidden_size)")),
    Family("gemma3_text", "Gemma 3", _GEMMA_KEYS,
           dict(num_hidden_layers=26, hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                intermediate_size=9216, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                max_position_embeddings=131072, initializer_range=0.02, attention_dropout=0.0, attention_bias=False,
                rope_theta=1_000_000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=256, sliding_window=4096,
                sliding_window_pattern=6, attn_logit_softcapping=None, use_bidirectional_attention=False,
                tie_word_embeddings=True),
           **dict(_LLAMA_FAMILY, placement="peri", embedding="token table times sqrt(hidden_size)")),
)}

# -- the later families (defaults: the configuration classes of transformers 5) ----
#: DistilBERT's LayerNorms have eps 1e-12 fixed in its modeling code (no config key): a key no
#: config holds, so the default always applies
_FIXED_EPS = "__fixed_norm_eps"
_DISTILBERT_KEYS = dict(n_layers="n_layers", d_model="dim", n_heads="n_heads", d_ff="hidden_dim",
                        activation="activation", norm_eps=_FIXED_EPS, max_positions="max_position_embeddings")
_LN_DECODER_KEYS = dict(_BERT_KEYS, n_kv_heads="num_key_value_heads", d_head="head_dim")
_BERT_DEFAULTS = FAMILIES["bert"].defaults
_OLMO2 = FAMILIES["olmo2"]
FAMILIES.update({f.name: f for f in (
    Family("qwen3", "Qwen3", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, num_key_value_heads=32, head_dim=128, intermediate_size=22016,
                max_position_embeddings=32768, attention_bias=False, use_sliding_window=False, sliding_window=4096,
                max_window_layers=28), **_LLAMA_FAMILY),
    Family("roberta", "RoBERTa", _BERT_KEYS, dict(_BERT_DEFAULTS, pad_token_id=1), norm="layernorm",
           placement="post", ffn="mlp", final_norm=False, causal=False, rope=False, positions=True,
           dropout=("attention_probs_dropout_prob", "hidden_dropout_prob", "hidden_dropout_prob"), init="normal",
           embedding="token + learned position (from pad_token_id + 1) + token-type tables, then LayerNorm"),
    Family("distilbert", "DistilBERT", _DISTILBERT_KEYS,
           {"n_layers": 6, "dim": 768, "n_heads": 12, "hidden_dim": 3072, "activation": "gelu",
            _FIXED_EPS: 1e-12, "max_position_embeddings": 512, "initializer_range": 0.02, "dropout": 0.1,
            "attention_dropout": 0.1, "sinusoidal_pos_embds": False, "tie_word_embeddings": True},
           norm="layernorm", placement="post", ffn="mlp", final_norm=False, causal=False, rope=False,
           positions=True, dropout=("attention_dropout", "dropout", "dropout"), init="normal",
           embedding="token + learned position tables, then LayerNorm"),
    Family("starcoder2", "StarCoder2", dict(_LLAMA_KEYS, norm_eps="norm_epsilon"),
           dict(num_hidden_layers=30, hidden_size=3072, num_attention_heads=24, num_key_value_heads=2, head_dim=None,
                intermediate_size=12288, hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-5,
                max_position_embeddings=4096, initializer_range=0.018042, rope_theta=10000.0, sliding_window=None,
                attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0, use_bias=True,
                tie_word_embeddings=True),
           norm="layernorm", placement="pre", ffn="mlp", rope=True, positions=False,
           dropout=("attention_dropout", "residual_dropout", "embedding_dropout"), init="normal",
           embedding="token table", **_DECODER),
    Family("phi3", "Phi-3", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, hidden_size=3072, intermediate_size=8192, num_key_value_heads=None, rms_norm_eps=1e-5,
                max_position_embeddings=4096, resid_pdrop=0.0, embd_pdrop=0.0, sliding_window=None),
           **dict(_LLAMA_FAMILY, dropout=("attention_dropout", "resid_pdrop", None))),
    Family("gemma", "Gemma", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, num_hidden_layers=28, hidden_size=3072, num_attention_heads=16, num_key_value_heads=16,
                head_dim=256, intermediate_size=24576, hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192,
                attention_bias=False, use_bidirectional_attention=None, tie_word_embeddings=True),
           **dict(_LLAMA_FAMILY, embedding="token table times sqrt(hidden_size)")),
    Family("cohere", "Cohere (Command R)", dict(_LN_DECODER_KEYS),
           dict(num_hidden_layers=40, hidden_size=8192, num_attention_heads=64, num_key_value_heads=None, head_dim=None,
                intermediate_size=22528, hidden_act="silu", layer_norm_eps=1e-5, max_position_embeddings=8192,
                initializer_range=0.02, rope_theta=500000.0, attention_bias=False, attention_dropout=0.0,
                use_qk_norm=False, logit_scale=0.0625, tie_word_embeddings=True),
           norm="layernorm", placement="pre", ffn="glu", rope=True, positions=False,
           dropout=("attention_dropout", None, None), init="normal", embedding="token table", **_DECODER),
    Family("granite", "Granite", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, attention_bias=False, mlp_bias=False, embedding_multiplier=1.0, logits_scaling=1.0,
                residual_multiplier=1.0, attention_multiplier=1.0),
           **dict(_LLAMA_FAMILY, embedding="token table times embedding_multiplier")),
    Family("olmo3", "OLMo 3", _LLAMA_KEYS,
           dict(_OLMO2.defaults, rope_theta=500000.0, sliding_window=4096), **dict(_LLAMA_FAMILY, placement="output")),
    Family("smollm3", "SmolLM3", _LLAMA_KEYS,
           dict(_LLAMA_DEFAULTS, num_hidden_layers=36, hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                max_position_embeddings=32768, rope_theta=2000000.0, use_sliding_window=False, sliding_window=None,
                no_rope_layers=None, no_rope_layer_interval=4, attention_bias=False, mlp_bias=False,
                tie_word_embeddings=True), **_LLAMA_FAMILY),
    Family("stablelm", "StableLM", dict(_LN_DECODER_KEYS),
           dict(num_hidden_layers=32, hidden_size=2560, num_attention_heads=32, num_key_value_heads=None, head_dim=None,
                intermediate_size=6912, hidden_act="silu", layer_norm_eps=1e-5, max_position_embeddings=4096,
                initializer_range=0.02, rope_theta=10000.0, partial_rotary_factor=0.25, use_qkv_bias=False,
                qk_layernorm=False, use_parallel_residual=False, hidden_dropout=0.0, attention_dropout=0.0),
           norm="layernorm", placement="pre", ffn="glu", rope=True, positions=False,
           dropout=("attention_dropout", "hidden_dropout", None), init="normal", embedding="token table", **_DECODER),
    Family("phi", "Phi", dict(_LN_DECODER_KEYS),
           dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=32, num_key_value_heads=None, head_dim=None,
                intermediate_size=8192, hidden_act="gelu_new", layer_norm_eps=1e-5, max_position_embeddings=2048,
                initializer_range=0.02, rope_theta=10000.0, partial_rotary_factor=0.5, qk_layernorm=False,
                resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
           norm="layernorm", placement="pre", ffn="mlp", rope=True, positions=False,
           dropout=("attention_dropout", "resid_pdrop", "embd_pdrop"), init="normal", embedding="token table",
           **_DECODER),
    # (Falcon's kv heads follow multi_query / new_decoder_architecture: _falcon_kv_heads; with
    # rotary positions it drops no attention probabilities: its attention_dropout drops the
    # attention output of the sequential layout only: _falcon_checks)
    Family("falcon", "Falcon",
           dict(n_layers="num_hidden_layers", d_model="hidden_size", n_heads="num_attention_heads",
                d_ff="ffn_hidden_size", activation="activation", norm_eps="layer_norm_epsilon",
                max_positions="max_position_embeddings"),
           dict(num_hidden_layers=32, hidden_size=4544, num_attention_heads=71, num_kv_heads=None,
                ffn_hidden_size=None, activation="gelu", layer_norm_epsilon=1e-5, max_position_embeddings=2048,
                initializer_range=0.02, hidden_dropout=0.0, attention_dropout=0.0, alibi=False,
                new_decoder_architecture=False, multi_query=True, parallel_attn=True, bias=False,
                num_ln_in_parallel_attn=None, rope_theta=10000.0, tie_word_embeddings=True),
           norm="layernorm", placement="pre", ffn="mlp", rope=True, positions=False,
           dropout=(None, "hidden_dropout", None), init="normal", embedding="token table", **_DECODER),
)})
#: model_type -> why it is refused (exit 2): text families transformers ships that sigprop
#: does not read (docs/hf.md lists every text model_type and its status)
_MOE = "mixture of experts is not modelled yet"
#: (the lists: the text model_types of transformers 5.24 whose configuration class defaults to more
#: than one expert (and hunyuan_v1_moe, dots1), those that default to is_encoder_decoder, and those
#: built of recurrent or state-space layers)
REFUSED = {
    **dict.fromkeys((
        "afmoe", "aria_text", "axk1", "axk2", "bailing_hybrid", "beam", "cohere2_moe", "dbrx", "deepseek_v2",
        "deepseek_v3", "deepseek_v32", "deepseek_v4", "doge", "dots3_note_text", "ernie4_5_moe", "exaone_moe",
        "flex_olmo", "flint", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "granitemoe",
        "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "hy_v3", "hy_v4", "inkling2_loop_text",
        "inkling2_text", "inkling_text", "jamba", "jetmoe", "kimi_linear", "kolibri1", "laguna", "lara_mini",
        "lfm2_moe", "llama4", "llama4_text", "longcat_flash", "mellum", "mimo_v2_flash", "minimax", "minimax_m2",
        "minimax_m3_vl_text", "mixtral", "nemotron_h", "nllb-moe", "olmoe", "phimoe", "qwen2_moe", "qwen3_5_moe",
        "qwen3_5_moe_text", "qwen3_moe", "qwen3_next", "qwen4_exp_text", "sarvam_mla", "sarvam_moe", "solar_open",
        "switch_transformers", "zaya", "hunyuan_v1_moe", "dots1"), _MOE),
    **dict.fromkeys((
        "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "encoder-decoder", "fsmt", "led", "longt5",
        "m2m_100", "marian", "mbart", "mt5", "musicgen", "musicgen_melody", "mvp", "pegasus", "pegasus_x",
        "plbart", "prophetnet", "seamless_m4t", "seamless_m4t_v2", "t5", "t5gemma", "t5gemma2", "umt5", "whisper"),
                    "encoder-decoder models (cross-attention) are not modelled"),
    **dict.fromkeys(("bamba", "falcon_h1", "falcon_mamba", "lfm2", "mamba", "mamba2", "olmo_hybrid",
                     "recurrent_gemma", "rwkv", "xlstm", "zamba", "zamba2"),
                    "recurrent or state-space (Mamba-style) layers are not modelled; sigprop's layers are attention"),
    "modernbert": "ModernBERT's alternating local (sliding-window) attention, norm-free first layer and "
                  "GeGLU with bias-free LayerNorms are not mapped yet",
}
#: the model_type values read (gemma3: its text_config, a gemma3_text model)
MODEL_TYPES = (*FAMILIES, "gemma3")

_GPT_ALIASES = {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
                "num_hidden_layers": "n_layer"}
#: transformers' ``attribute_map`` of a model_type's configuration class (alias -> the key it
#: stores; the families not named have none): a config may give either name, and transformers
#: reads the alias when both are given.  Both with different values are refused (two different
#: models), the same value is fine, and an alias alone is read as its key.
ATTRIBUTE_MAPS = {
    "gpt2": _GPT_ALIASES, "gptj": _GPT_ALIASES,
    "falcon": {"n_embed": "hidden_size"},      # (FalconConfig.__post_init__: n_embed replaces hidden_size)
    "gemma3": {"image_token_id": "image_token_index", "boi_token_id": "boi_token_index",
               "eoi_token_id": "eoi_token_index"},
}


@dataclass(frozen=True)
class HFModel:
    """A Hugging Face config resolved into sigprop's model.

    ``model``: the :class:`sigprop.model.spec.Model` (its ``arch`` is the family; its
    ``notes["hf"]`` holds :meth:`to_json`); ``family``: the config's ``model_type`` (gemma3
    configs: "gemma3_text", the text model read); ``config``: the config read (for gemma3, the
    whole file); ``seq_len`` and ``seq_len_source`` (:data:`SEQ_LEN_FROM_FLAG` or
    :data:`SEQ_LEN_FROM_CONFIG`); ``notes``: every assumption made, one sentence each;
    ``init_std``: the weight std of transformers' init (``initializer_range``, or the
    ``init_std`` option); ``embedding``: the token embedding as initialised (``word_std``,
    ``position_std``, ``segment_std``: table stds, 0 where absent, the word std including
    Gemma's sqrt(hidden_size) factor; ``norm``: a norm after the sum; ``dropout``);
    ``overrides``: the options that replaced the config's values."""

    model: object
    family: str
    config: dict
    seq_len: int
    seq_len_source: str
    notes: list = field(default_factory=list)
    init_std: float = 0.02
    embedding: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The ``"hf"`` object of the commands' JSON output: family, seq_len_source, notes."""
        return {"family": self.family, "seq_len_source": self.seq_len_source, "notes": list(self.notes)}

    def transformers_config(self) -> dict:
        """A config from which transformers builds the model resolved here: the config read
        (gemma3: its text_config, as a gemma3_text config) with the number of layers (and
        ``layer_types``), ``initializer_range`` and the dropouts of the resolved model.  What a
        config cannot say is not written: the sequence length, an init other than the
        family's, residual scales, dropout inside the FFN, the input stream (see ``overrides``)."""
        fam = FAMILIES[self.family]
        cfg = dict(self.config)
        if cfg.get("model_type") == "gemma3":
            cfg = {"model_type": "gemma3_text", **self.config["text_config"]}
        cfg = _unaliased(cfg, fam.name, "config")      # (an alias would win over the keys written here)
        cfg = {k: v for k, v in cfg.items() if k not in ATTRIBUTE_MAPS.get(fam.name, {})}
        m = self.model
        cfg[fam.keys["n_layers"]] = m.n_layers
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = cfg["layer_types"][:m.n_layers]
        cfg["initializer_range"] = self.init_std
        att, hid, emb = fam.dropout
        if att is not None:
            cfg[att] = m.dropout.attention
        if fam.name == "falcon":          # (its attention-output dropout: hidden dropout's, _falcon_checks)
            cfg["attention_dropout"] = m.dropout.hidden
        if hid is not None:
            cfg[hid] = m.dropout.hidden
        if emb is not None and emb != hid:
            cfg[emb] = self.embedding["dropout"]
        return cfg


# ---------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------

def read_config(path) -> dict:
    """The JSON object of a Hugging Face ``config.json``: ``path`` is the file or a directory
    holding ``config.json``.  A missing or unreadable file, one that is not a regular file or is
    larger than :data:`sigprop.files.MAX_CONFIG_BYTES`, invalid or too deeply nested JSON, or a
    JSON value that is not an object raise DomainError (:func:`sigprop.files.read_json`)."""
    p = Path(check_path(path, "Hugging Face config"))
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise DomainError(f"no config.json in directory {str(path)!r}")
    obj = read_json(p, "Hugging Face config", MAX_CONFIG_BYTES)
    if not isinstance(obj, dict):
        raise DomainError(f"Hugging Face config {str(p)!r} must hold a JSON object, got {type(obj).__name__}")
    return obj


class _Reader:
    """Typed access to a config with the family's defaults; errors name the key."""

    def __init__(self, cfg: dict, defaults: dict, where: str):
        self.cfg, self.defaults, self.where = cfg, defaults, where

    def raw(self, key: str, default=None):
        if key in self.cfg:
            return self.cfg[key]
        return self.defaults.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.cfg

    def fail(self, msg: str):
        raise DomainError(f"{self.where}: {msg}")

    def int(self, key: str, default=None, allow_none: bool = False):
        v = self.raw(key, default)
        if v is None and allow_none:
            return None
        # (4.0 too: transformers' configuration classes refuse a float for an int field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            self.fail(f"{key} must be a positive integer, got {v!r}")
        return v

    def float(self, key: str, default=None, lo: float | None = None, allow_none: bool = False):
        v = self.raw(key, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.fail(f"{key} must be a finite number, got {v!r}")
        if lo is not None and v < lo:
            self.fail(f"{key} must be >= {lo:g}, got {v!r}")
        return float(v)

    def prob(self, key: str | None) -> float:
        if key is None:
            return 0.0
        v = self.float(key, 0.0, allow_none=True)
        v = 0.0 if v is None else v
        if not 0 <= v < 1:
            self.fail(f"{key} must lie in [0, 1), got {v!r}")
        return v

    def bool(self, key: str, default=False) -> bool:
        v = self.raw(key, default)
        if v is None:
            return bool(default)
        if not isinstance(v, bool):
            self.fail(f"{key} must be true or false, got {v!r}")
        return v


# ---------------------------------------------------------------------------------------
# resolving
# ---------------------------------------------------------------------------------------

def _unaliased(cfg: dict, model_type, where: str) -> dict:
    """``cfg`` with every alias of :data:`ATTRIBUTE_MAPS` read as its key; DomainError where a
    config gives both with different values."""
    aliases = ATTRIBUTE_MAPS.get(model_type, {}) if isinstance(model_type, str) else {}
    given = [a for a in aliases if a in cfg]
    if not given:
        return cfg
    out = dict(cfg)
    for alias in given:
        key = aliases[alias]
        if key in cfg and cfg[key] != cfg[alias]:
            raise DomainError(f"{where}: {key} {cfg[key]!r} and its alias {alias} {cfg[alias]!r} disagree "
                              f"(transformers reads {alias}); give one of them, or the same value")
        out[key] = cfg[alias]
    return out


def _g(v: float) -> str:
    return format(v, "g")


def resolve(config: dict, *, seq_len: int | None = None, where: str = "Hugging Face config",
            **options) -> HFModel:
    """Resolve a Hugging Face config (the dict :func:`read_config` returns) into an
    :class:`HFModel`.

    ``seq_len``: the sequence length (default min(max_position_embeddings, 2048), GPT-2's
    n_positions).  ``options``: model options of :func:`sigprop.model.presets.resolve` that
    replace the config's values, those of :data:`OVERRIDES` (n_layers, init, init_std, the
    dropouts, the input and upstream gradient, skip_scale, branch_scale); ``dropout`` also
    sets the embedding's dropout.  Any other option conflicts with the config (DomainError),
    as does every field that changes the answer and that sigprop cannot model.  ``where``
    prefixes error messages (e.g. the file's name)."""
    from sigprop.model import presets

    if not isinstance(config, dict):
        raise DomainError(f"{where} must be a JSON object, got {type(config).__name__}")
    opts = {}
    for k, v in options.items():
        name = presets.canonical_name(k)
        if name is None:
            raise DomainError(f"unknown option {k!r}; known: {', '.join(presets.OPTIONS)}")
        if v is None:
            continue
        if name == "seq_len":
            seq_len = v if seq_len is None else seq_len
            continue
        if name not in OVERRIDES:
            flag = presets.OPTIONS[name].flag
            raise DomainError(f"{flag} conflicts with the Hugging Face config, which fixes the model's structure "
                              f"(options that apply with it: {', '.join(presets.OPTIONS[o].flag for o in sorted(OVERRIDES))}"
                              ", --seq-len)")
        opts[name] = presets.OPTIONS[name].check(v, presets.OPTIONS[name].flag)

    notes: list[str] = []
    cfg = _unaliased(config, config.get("model_type"), where)
    model_type = cfg.get("model_type")
    if model_type is None:
        raise DomainError(f"{where}: no model_type (the family); supported: {', '.join(MODEL_TYPES)}")
    if model_type == "gemma3":
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise DomainError(f"{where}: model_type 'gemma3' needs a text_config object (the language model)")
        cfg = dict(text)
        cfg.setdefault("model_type", "gemma3_text")
        if cfg["model_type"] != "gemma3_text":
            raise DomainError(f"{where}: text_config.model_type must be 'gemma3_text', got {cfg['model_type']!r}")
        where = f"{where} (text_config)"
        notes.append("gemma3: the language model of text_config (a gemma3_text model) is read; the vision "
                     "tower and the image tokens are not modelled")
    if isinstance(model_type, str) and cfg["model_type"] in REFUSED:
        raise DomainError(f"{where}: model_type {cfg['model_type']!r} is refused: {REFUSED[cfg['model_type']]}")
    if not isinstance(model_type, str) or cfg["model_type"] not in FAMILIES:
        raise DomainError(f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)}")
    fam = FAMILIES[cfg["model_type"]]
    cfg = _unaliased(cfg, fam.name, where)
    r = _Reader(cfg, fam.defaults, where)
    _refuse_common(r)
    _refuse_family(fam, r, opts, notes)

    # sizes
    k = fam.keys
    n_layers = opts.pop("n_layers", None) or r.int(k["n_layers"])
    from sigprop.model.spec import MAX_LAYERS

    if n_layers > MAX_LAYERS:                    # (before anything is built per layer)
        r.fail(f"{k['n_layers']} {n_layers} is beyond the {MAX_LAYERS:,} layers sigprop predicts")
    d = r.int(k["d_model"])
    h = r.int(k["n_heads"])
    kv = r.int(k["n_kv_heads"], allow_none=True) if "n_kv_heads" in k else None
    kv = h if kv is None else kv
    if h % kv:
        r.fail(f"{k['n_kv_heads']} {kv} must divide {k['n_heads']} {h}")
    d_head = r.int(k["d_head"], allow_none=True) if "d_head" in k else None
    if d_head is None:
        if d % h:
            r.fail(f"{k['d_model']} {d} is not divisible by {k['n_heads']} {h} (and no head_dim is given)")
        d_head = d // h
    elif d_head != d // h or d % h:
        notes.append(f"head_dim {d_head} differs from {k['d_model']}/{k['n_heads']} = {d / h:g}: "
                     f"q, k, v map {d} -> heads x {d_head}, o maps back")
    d_ff = r.int(k["d_ff"], allow_none=True)
    if d_ff is None:
        if fam.name not in ("gpt2", "gptj", "falcon"):
            r.fail(f"{k['d_ff']} must be a positive integer, got None")
        d_ff = 4 * d
        notes.append(f"{k['d_ff']} null: the MLP width is 4 {k['d_model']} = {d_ff}")

    # activation
    act_key = k["activation"]
    act_name = r.raw(act_key)
    if fam.name in ("gemma2", "gemma3_text") and not r.has(act_key) and r.has("hidden_act"):
        act_key, act_name = "hidden_act", r.raw("hidden_act")
    if not isinstance(act_name, str) or act_name not in ACTIVATIONS:
        r.fail(f"{act_key} {act_name!r} is not modelled (sigprop models relu, gelu and its tanh approximations, "
               "silu/swish)")
    activation = ACTIVATIONS[act_name]
    if act_name in TANH_GELU:
        notes.append(f"{act_key} {act_name}: the tanh approximation of GeLU, modelled as the exact GeLU "
                     f"(they differ by at most {TANH_GELU_MAX_DIFF:g} anywhere)")

    # norm
    norm_eps = r.float(k["norm_eps"], lo=0.0)
    norm_words = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[fam.norm]
    if fam.name in ("gemma", "gemma2", "gemma3_text"):
        notes.append("RMSNorm computes x_hat (1 + w) with w initialised at 0: gain 1 at init")
    if fam.name == "cohere":
        notes.append("LayerNorm without a bias (CohereLayerNorm): the same as a LayerNorm whose bias is 0, as at init")
    if fam.name == "distilbert":
        notes.append("DistilBERT's LayerNorms have eps 1e-12 (fixed in its modeling code)")

    # sequence length
    max_pos = r.int(k["max_positions"])
    if fam.name == "roberta":
        max_pos = _roberta_positions(r, max_pos, notes)
    if seq_len is None:
        seq_len, source = min(max_pos, SEQ_LEN_CAP), SEQ_LEN_FROM_CONFIG
        notes.append(f"seq_len {seq_len} = min({k['max_positions']} {max_pos}, {SEQ_LEN_CAP})")
    else:
        source = SEQ_LEN_FROM_FLAG
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise DomainError(f"--seq-len must be an integer >= 2, got {seq_len!r}")
        if seq_len > max_pos:
            if fam.positions:
                r.fail(f"--seq-len {seq_len} exceeds {k['max_positions']} {max_pos}, the size of the model's "
                       "position table")
            notes.append(f"seq_len {seq_len} exceeds {k['max_positions']} {max_pos} (the context the model was "
                         "configured for); rotary positions extend to it (as transformers computes them at that length)")

    # attention: causal or not, scaling, sliding windows, positions
    causal = fam.causal
    if fam.name in ("bert", "roberta") and r.bool("is_decoder"):
        causal = True
        notes.append("is_decoder true: causal self-attention")
    if fam.name in ("gemma", "gemma2", "gemma3_text") and r.bool("use_bidirectional_attention"):
        causal = False
        notes.append("use_bidirectional_attention true: bidirectional attention")
    softcap = _attention_checks(fam, r, d_head)
    if softcap is not None:
        notes.append(f"attn_logit_softcapping {softcap:g}: every attention logit s (after the 1/sqrt(head_dim) "
                     f"scaling) becomes {softcap:g} tanh(s / {softcap:g}) before the mask and the softmax "
                     "(attn_softcap)")
    if fam.name in ("gemma2", "gemma3_text") and r.float("final_logit_softcapping", allow_none=True) is not None:
        notes.append("final_logit_softcapping caps the output head's logits, outside the stack: "
                     "it does not change the stream or the gradient given at the top")
    layer_types, window = _layer_types(fam, r, n_layers, seq_len, causal, notes)
    rope_base, local_rope = _rope(fam, r, d_head, seq_len, max_pos, layer_types, notes) if fam.rope else (None, None)
    if window is not None:
        win_active = any(windows.active(seq_len, w, causal) for w in window)
        if not win_active and local_rope is None:
            window = None            # (every window at least the sequence: full attention everywhere)
    if fam.name in ("bert", "roberta"):
        pet = r.raw("position_embedding_type", "absolute")
        if pet != "absolute":
            r.fail(f"position_embedding_type {pet!r} (relative position scores) is not modelled; "
                   "only 'absolute' is")

    # block, QK-norm
    block = "sequential"
    if fam.name == "gpt_neox":
        if r.bool("use_parallel_residual", True):
            block = "parallel"
            notes.append("use_parallel_residual true: x' = x + Att(LN1 x) + MLP(LN2 x); LN1 and LN2 are "
                         "equal at init (gain 1, bias 0), so one norm feeds both branches")
        else:
            notes.append("use_parallel_residual false: attention, then MLP, each pre-LN")
    elif fam.name == "gptj":
        block = "parallel"
        notes.append("GPT-J blocks: x' = x + Att(LN x) + MLP(LN x), one LayerNorm")
    else:
        block = _family_block(fam, r, notes)
    qk_norm = False
    if fam.name == "olmo2":
        qk_norm = True
        notes.append("QK-norm: OLMo 2 applies RMSNorm to the whole q and k projections (over all heads), "
                     "sigprop's rule per head; at init every head's mean square concentrates on the same "
                     "value, so the two agree to first order in 1/(heads x head_dim) and 1/head_dim")
    elif fam.name == "gemma3_text":
        qk_norm = True
        notes.append("QK-norm: RMSNorm per head on queries and keys, gain 1 at init")
    else:
        qk_norm = _family_qk_norm(fam, r, notes)

    # biases (zero at init: only named)
    bias = _biases(fam, r, notes)

    # dropout
    p_att, p_hid, p_emb = (r.prob(key) for key in fam.dropout)
    drop_names = [f"attention probabilities {p_att:g}" + (f" ({fam.dropout[0]})" if fam.dropout[0] else " (none)")]
    drop_names.append(f"branch outputs {p_hid:g}" + (f" ({fam.dropout[1]})" if fam.dropout[1] else " (none)"))
    drop_names.append(f"embedding {p_emb:g}" + (f" ({fam.dropout[2]})" if fam.dropout[2] else " (none)"))
    notes.append("dropout (training mode): " + ", ".join(drop_names) + ", none inside the FFN")
    if "dropout" in opts:
        p_emb = opts["dropout"]
    elif "hidden_dropout" in opts and fam.dropout[2] is not None and fam.dropout[2] == fam.dropout[1]:
        p_emb = opts["hidden_dropout"]
    given_drop = {k: opts[k] for k in ("dropout", "attn_dropout", "hidden_dropout", "ffn_dropout") if k in opts}
    if given_drop:
        notes.append("dropout as given, replacing the config's: " + ", ".join(f"{k} {v:g}" for k, v in given_drop.items())
                     + f" (embedding dropout {p_emb:g})")
    drop_opts = {"attn_dropout": p_att, "hidden_dropout": p_hid, "ffn_dropout": 0.0}
    if "dropout" in opts:
        drop_opts = {}
    for key in ("attn_dropout", "hidden_dropout", "ffn_dropout"):
        if key in opts:
            drop_opts[key] = opts.pop(key)

    # initialisation
    init_range = r.float("initializer_range", lo=0.0)
    if init_range == 0:
        init_range = 0.02
        notes.append("initializer_range 0: transformers then uses 0.02")
    init_std = opts.pop("init_std", init_range)
    init = opts.pop("init", None)
    if init is None:
        init = fam.init
        if fam.name == "gpt2":
            notes.append(f"init (transformers' GPT-2): every Conv1D and embedding N(0, {_g(init_std)}^2), both c_proj "
                         f"N(0, ({_g(init_std)}/sqrt(2 x {n_layers}))^2), biases 0, LayerNorm gain 1 bias 0 "
                         "(sigprop init 'scaled')")
        else:
            notes.append(f"init (transformers' _init_weights): every Linear and embedding N(0, {_g(init_std)}^2), "
                         f"no depth scaling, biases 0, {norm_words} gain 1" + (" bias 0" if fam.norm == "layernorm" else "")
                         + " (sigprop init 'normal')")
    else:
        notes.append(f"init '{init}' as given (not the family's own), init_std {_g(init_std)}")
    if "init_std" in options and init_std != init_range:
        notes.append(f"init_std {_g(init_std)} as given (the config's initializer_range is {_g(init_range)})")

    # the stream entering layer 1
    emb = _embedding(fam, r, d, init_std, p_emb)
    given_input = {key: opts.pop(key) for key in ("input_mean", "input_var", "input_corr") if key in opts}
    input_opts = dict(given_input)
    if len(given_input) < 3:
        x = presets.embedding_input(presets.Embedding(emb["word_std"] / init_std if init_std else 0.0,
                                                      emb["position_std"] / init_std if init_std else 0.0,
                                                      emb["segment_std"] / init_std if init_std else 0.0,
                                                      emb["norm"], fam.title),
                                    init_std, d, seq_len, fam.norm, norm_eps, p_emb)
        for key, v in zip(("input_mean", "input_var", "input_corr"), x):
            input_opts.setdefault(key, v)
        input_note = (f"the stream entering layer 1 is the {fam.title} token embedding at init: "
                      f"{_embedding_words(emb, fam)}, two positions holding the same token with probability "
                      f"{presets.R0_EMBEDDING:g} (sigprop's embedding rule)")
        if given_input:
            input_note += f"; {', '.join(sorted(given_input))} as given"
        notes.append(f"input: {input_note}: mean {input_opts['input_mean']:.4g}, var {input_opts['input_var']:.4g}, "
                     f"token corr {input_opts['input_corr']:.4g}")
    else:
        input_note = None
        notes.append("input: the stream entering layer 1 as given (input_mean, input_var, input_corr)")
    notes.append(f"tie_word_embeddings {str(bool(r.raw('tie_word_embeddings', False))).lower()}: the output head "
                 "does not change the stream; the gradient arriving at the top is the grad_var/grad_corr given")

    ffn_opt = "mlp" if fam.ffn == "mlp" else registry.activation(activation).glu
    resolve_opts = dict(
        n_layers=n_layers, d_model=d, n_heads=h, n_kv_heads=kv, d_head=d_head, d_ff=d_ff, seq_len=seq_len,
        ffn=ffn_opt, activation=activation, norm=fam.norm, norm_eps=norm_eps, placement=fam.placement,
        block=block, rope=rope_base is not None, qk_norm=qk_norm, final_norm=fam.final_norm, bias=bias,
        causal=causal, init_std=init_std, **drop_opts, **input_opts, **opts)
    if rope_base is not None:
        # (a frequency vector replaces the base once the model is built)
        resolve_opts["rope_base"] = rope_base if isinstance(rope_base, float) else presets.DEFAULT_ROPE_BASE
    if "dropout" in opts:
        resolve_opts["dropout"] = opts["dropout"]
    resolve_opts.update(_family_options(fam, r, opts, notes))
    model = presets.resolve(arch="preln", init=init, **resolve_opts)
    if rope_base is not None and not isinstance(rope_base, float):
        model = model.replace(rope=rope_base)
    model = _family_model(fam, r, model, notes)
    if softcap is not None:
        model = model.replace(attn_softcap=softcap)
    if window is not None:
        model = model.replace(window=window, local_rope=local_rope)
    hfm_fields = dict(family=fam.name, config=config, seq_len=seq_len, seq_len_source=source, notes=notes,
                      init_std=init_std, embedding=emb, overrides={k: v for k, v in options.items() if v is not None})
    hf_json = {"family": fam.name, "seq_len_source": source, "notes": list(notes)}
    model_notes = dict(model.notes)
    model_notes["hf"] = hf_json
    model_notes["input"] = input_note
    model = model.replace(arch=fam.name, notes=model_notes)
    return HFModel(model=model, **hfm_fields)


def _refuse_common(r: _Reader) -> None:
    """Fields of any family that change the answer and that sigprop cannot model."""
    for key in MOE_KEYS:
        v = r.cfg.get(key)
        if v not in (None, 0, 1, False):
            r.fail(f"{key} {v!r}: mixture-of-experts layers are not modelled")
    for key in ("alibi", "use_alibi"):
        if r.cfg.get(key):
            r.fail(f"{key} true: ALiBi attention biases are not modelled")
    if r.cfg.get("position_embedding_type") == "alibi":
        r.fail("position_embedding_type 'alibi': ALiBi attention biases are not modelled")
    for key in ("is_encoder_decoder", "add_cross_attention"):
        if r.cfg.get(key):
            r.fail(f"{key} true: cross-attention (encoder-decoder) is not modelled")


def _attention_checks(fam: Family, r: _Reader, d_head: int) -> float | None:
    """The logit scale (sigprop's logits are q.k / sqrt(d_head)) and the soft cap: Gemma 2's
    attn_logit_softcapping (None: uncapped), which transformers applies after the scaling and
    before the mask (eager_attention_forward)."""
    if fam.name == "gpt2":
        if not r.bool("scale_attn_weights", True):
            r.fail("scale_attn_weights false: logits without the 1/sqrt(head_dim) scale are not modelled")
        if r.bool("scale_attn_by_inverse_layer_idx", False):
            r.fail("scale_attn_by_inverse_layer_idx true: logits scaled by 1/layer are not modelled")
    if fam.name in ("gemma2", "gemma3_text"):
        q = r.float("query_pre_attn_scalar", allow_none=True)
        if q is not None and q != d_head:
            r.fail(f"query_pre_attn_scalar {q:g} differs from head_dim {d_head}: logits scaled by "
                   "query_pre_attn_scalar^-1/2 instead of head_dim^-1/2 are not modelled")
        cap = r.float("attn_logit_softcapping", allow_none=True)
        if cap is not None and not cap > 0:
            r.fail(f"attn_logit_softcapping must be null or > 0, got {cap:g}")
        return cap
    return None


def _layer_types(fam: Family, r: _Reader, n: int, seq_len: int, causal: bool, notes: list) -> tuple:
    """Every layer's attention type ("full_attention" or "sliding_attention") and the model's
    ``window`` column (sigprop's window of each layer, 0 for full attention; None where no layer
    has a window).  transformers' causal sliding window w attends to keys i-w+1..i (sigprop's
    causal window w); Gemma 3's bidirectional one (use_bidirectional_attention: its configuration
    first sets w' = w // 2 + 1) to |i - j| < w', the centred window 2 (w // 2) + 1."""
    given = r.cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or not all(t in ("full_attention", "sliding_attention") for t in given):
            r.fail(f"layer_types must be a list of 'full_attention' / 'sliding_attention', got {given!r}")
        if len(given) < n:
            r.fail(f"layer_types has {len(given)} entries for {n} layers")
        types = list(given[:n])
    elif fam.name == "gemma2":
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    elif fam.name == "gemma3_text":
        pattern = r.raw("sliding_window_pattern", r.raw("_sliding_window_pattern", 6))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            r.fail(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    elif fam.name in ("mistral", "starcoder2", "phi3"):      # sliding_window (when not null) on every layer
        types = ["sliding_attention"] * n
    elif fam.name == "olmo3":                               # every fourth layer full
        types = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
    elif fam.name in ("qwen2", "qwen3") and r.bool("use_sliding_window", False):
        mwl = r.int("max_window_layers", allow_none=True)
        mwl = 0 if mwl is None else mwl
        types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(n)]
    else:
        types = ["full_attention"] * n
    if fam.name in ("qwen2", "qwen3", "smollm3") and given is not None and not r.bool("use_sliding_window", False):
        types = ["full_attention"] * n
    window = None
    if "sliding_attention" in types:
        key = "sliding_window"
        w = r.raw(key)
        if w is not None:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                r.fail(f"sliding_window must be a positive integer or null, got {w!r}")
            count = types.count("sliding_attention")
            if not causal and fam.name != "gemma3_text":
                r.fail(f"sliding_window {w} with bidirectional attention in {fam.name}: transformers' mask for it "
                       "is not modelled (Gemma 3's, |i - j| < sliding_window, is)")
            sw = w if causal else 2 * (w // 2) + 1
            window = [sw if t == "sliding_attention" else 0 for t in types]
            if windows.active(seq_len, sw, causal):
                span = (f"keys i-{w - 1}..i" if causal else f"keys with |i - j| < {w // 2 + 1} (transformers' "
                        f"sliding_window // 2 + 1 when bidirectional: {sw} keys, fewer at the ends)")
                notes.append(f"sliding_window {w}: {count} of {n} layers attend to {span} (window {sw})")
            else:
                notes.append(f"sliding_window {w} >= seq_len {seq_len}: the {count} sliding-window layers attend to "
                             f"every {'earlier ' if causal else ''}token, as full attention")
    return types, window


#: families whose attention rotates only the first int(head_dim * partial_rotary_factor) features
#: of each head (q_rot / q_pass in transformers); the others rotate the whole head and ignore
#: partial_rotary_factor in their default rotation
PARTIAL_ROTARY_FAMILIES = frozenset({"gpt_neox", "gptj", "phi", "phi3", "stablelm"})


def rope_inv_freq(kind: str, p: dict, dim: int, seq_len: int, max_pos: int, fail):
    """(inverse frequencies, attention factor) of one rotary embedding as transformers'
    ``ROPE_INIT_FUNCTIONS[kind]`` (modeling_rope_utils; the model's own default for
    "default") computes them for a rotary part of ``dim`` features, at the model's
    sequence length ``seq_len`` (the lengths that "dynamic" and "longrope" switch on), in
    float64 with transformers' formulas (which run in float32).  ``p``: the rope parameters
    (rope_theta, factor, ...; original_max_position_embeddings already filled in as
    transformers' standardize_rope_params does); ``fail(msg)`` raises.  NumPy only."""
    import numpy as np

    base = p["rope_theta"]
    exps = np.arange(0, dim, 2, dtype=float) / dim

    def num(key, default=None, lo=None, allow_none=False):
        v = p.get(key, default)
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (lo is not None and v <= lo):
            fail(f"rope {kind!r}: {key} must be a number{'' if lo is None else f' > {lo:g}'}, got {v!r}")
        return float(v)

    def orig_max():
        v = p.get("original_max_position_embeddings", max_pos)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            fail(f"rope {kind!r}: original_max_position_embeddings must be a positive integer, got {v!r}")
        return v

    if kind == "default":
        return 1.0 / base ** exps, 1.0
    if kind == "linear":
        return 1.0 / base ** exps / num("factor", lo=0), 1.0
    if kind == "dynamic":
        # at init (and at every length up to max_position_embeddings) the default frequencies;
        # a forward over seq_len > max_position_embeddings positions recomputes them at seq_len
        factor = num("factor", lo=0)
        n = max(seq_len, max_pos)
        b = base * ((factor * n / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / b ** exps, 1.0
    if kind == "yarn":
        factor = num("factor", allow_none=True)
        orig = orig_max()
        if factor is None:
            factor = max_pos / orig
        att = num("attention_factor", allow_none=True)
        mscale, mscale_all = num("mscale", allow_none=True), num("mscale_all_dim", allow_none=True)

        def get_mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if att is None:
            att = (float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all)) if mscale and mscale_all
                   else get_mscale(factor))
        beta_fast = p.get("beta_fast") or 32
        beta_slow = p.get("beta_slow") or 1

        def corr_dim(rot):
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=float) - low) / (high - low), 0, 1)
        pos = base ** exps
        extra = 1 - ramp
        return (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra, float(att)
    if kind == "longrope":
        orig = orig_max()
        factor = num("factor", allow_none=True)
        if factor is None:
            factor = max_pos / orig
        att = num("attention_factor", allow_none=True)
        if att is None:
            att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        key = "long_factor" if seq_len > orig else "short_factor"
        ext = p.get(key)
        if not isinstance(ext, list) or len(ext) != dim // 2 or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in ext):
            fail(f"rope 'longrope': {key} must be a list of {dim // 2} positive numbers, got {ext!r}")
        return 1.0 / (np.asarray(ext, dtype=float) * base ** exps), float(att)
    if kind == "llama3":
        inv = 1.0 / base ** exps
        factor, lo_f, hi_f = num("factor", lo=0), num("low_freq_factor"), num("high_freq_factor")
        old = orig_max()
        lo_wl, hi_wl = old / lo_f, old / hi_f
        wl = 2 * math.pi / inv
        out = np.where(wl > lo_wl, inv / factor, inv)
        smooth = (old / wl - lo_f) / (hi_f - lo_f)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        return np.where(medium, smoothed, out), 1.0
    fail(f"rope_type {kind!r} is not one transformers computes (default, linear, dynamic, yarn, longrope, "
         "llama3, proportional)")


def rope_proportional(p: dict, d_head: int, fail):
    """transformers' "proportional" rope (the whole head's d_head/2 frequencies: the first
    int(partial_rotary_factor d_head // 2) rotate, exponents over d_head, the rest 0, all
    divided by factor); attention factor 1."""
    import numpy as np

    prf = p.get("partial_rotary_factor", 1.0)
    prf = 1.0 if prf is None else prf
    factor = p.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        fail(f"rope 'proportional': factor must be a number > 0, got {factor!r}")
    angles = int(prf * d_head // 2)
    rot = 1.0 / p["rope_theta"] ** (np.arange(0, 2 * angles, 2, dtype=float) / d_head)
    return np.concatenate([rot, np.zeros(d_head // 2 - angles)]) / factor, 1.0


def rope_for_head(fam_name: str, kind: str, p: dict, d_head: int, seq_len: int, max_pos: int, fail, notes: list,
                  what: str):
    """One layer type's rotation as a sigprop ``rope``: the base (a float) for transformers'
    default rotation of the whole head, else a :class:`sigprop.rope.RopeFreqs` of the head's
    d_head/2 frequencies (the rotary part's, then 0 for every unrotated plane: partial
    rotary's q_pass, which rotates the first features of each head with its own rotate_half
    over them, is a fixed permutation of the head's features away from sigprop's pairing
    (i, i + d_head/2), shared by queries and keys, so the logits' law is the same), with the
    attention factor.  None: nothing rotates."""
    import numpy as np

    from sigprop.rope import RopeFreqs

    prf = p.get("partial_rotary_factor", 1.0)
    prf = 1.0 if prf is None else prf
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 <= prf <= 1:
        fail(f"{what}.partial_rotary_factor must be a number in [0, 1], got {prf!r}")
    if kind == "proportional":
        inv, att = rope_proportional(p, d_head, fail)
        return RopeFreqs(inv, att)
    dim = d_head
    if prf != 1:
        if fam_name in PARTIAL_ROTARY_FAMILIES:
            dim = int(d_head * prf)
        elif kind == "default":
            notes.append(f"{what}.partial_rotary_factor {prf:g}: {fam_name} rotates the whole head (transformers "
                         "ignores the factor in its default rotation)")
        else:
            fail(f"{what}.partial_rotary_factor {prf:g} with rope_type {kind!r}: {fam_name} applies its "
                 f"{int(d_head * prf)} rotary features to all {d_head} of each head, which transformers cannot")
    if dim == 0:
        notes.append(f"{what}: no feature of a head rotates (rotary dimension 0)")
        return None
    if dim % 2:
        fail(f"{what}: a rotary part of {dim} features (odd) is not one transformers can rotate")
    if kind == "dynamic" and dim == 2:
        fail(f"{what}: rope_type 'dynamic' over 2 rotary features divides by zero in transformers")
    if kind == "dynamic" and seq_len <= max_pos:
        kind = "default"          # (transformers' NTK base is then rope_theta itself)
    inv, att = rope_inv_freq(kind, p, dim, seq_len, max_pos, fail)
    if kind == "default" and dim == d_head and att == 1.0:
        return float(p["rope_theta"])
    inv = np.concatenate([np.asarray(inv, dtype=float), np.zeros((d_head - dim) // 2)])
    if not np.all(np.isfinite(inv)) or np.any(inv < 0):
        fail(f"{what}: rope_type {kind!r} gives frequencies that are not finite and >= 0")
    return RopeFreqs(inv, att)


def _rope(fam: Family, r: _Reader, d_head: int, seq_len: int, max_pos: int, layer_types: list,
          notes: list):
    """(rope, local_rope): the rotation of the full-attention layers and, where the
    sliding-window layers rotate differently (Gemma 3's rope_local_base_freq, per-type
    rope_parameters), theirs (else None): each a rotary base (a float) or a
    :class:`sigprop.rope.RopeFreqs` (:func:`rope_for_head`)."""
    if fam.name == "gptj":
        rd = r.raw("rotary_dim", 64)
        if isinstance(rd, bool) or not isinstance(rd, int) or not 0 < rd <= d_head or rd % 2:
            r.fail(f"rotary_dim {rd!r}: transformers' GPT-J rotates the first rotary_dim features of each head "
                   f"(an even number in [2, {d_head}])")
        notes.append(f"rotary positions: GPT-J rotates adjacent pairs of the first {rd} of each head's {d_head} "
                     "features (rotate_every_two), base 10000; a fixed permutation of the features shared by queries "
                     "and keys, so the logits are those of the rotate_half convention")
        if rd == d_head:
            return 10000.0, None
        return rope_for_head("gptj", "default", {"rope_theta": 10000.0, "partial_rotary_factor": rd / d_head},
                             d_head, seq_len, max_pos, r.fail, notes, "rotary_dim"), None
    params = r.cfg.get("rope_parameters")
    legacy = r.cfg.get("rope_scaling")
    per_type = {}
    used = sorted(set(layer_types))
    if isinstance(params, dict) and set(params) & {"full_attention", "sliding_attention"}:
        for t in used:
            p = params.get(t)
            if not isinstance(p, dict):
                r.fail(f"rope_parameters has no entry for {t}, which layer_types uses")
            per_type[t] = (dict(p), f"rope_parameters.{t}", None)
    else:
        if params is not None and not isinstance(params, dict):
            r.fail(f"rope_parameters must be an object, got {params!r}")
        if legacy is not None and not isinstance(legacy, dict):
            r.fail(f"rope_scaling must be an object or null, got {legacy!r}")
        p = dict(params or legacy or {})
        what = "rope_parameters" if params is not None else "rope_scaling"
        for t in used:
            q = dict(p)
            src = None                    # the top-level key the base comes from (None: q's own)
            if "rope_theta" not in q:
                if fam.name == "gemma3_text" and t == "sliding_attention":
                    src = "rope_local_base_freq"
                    q["rope_theta"] = r.raw("rope_local_base_freq", 10000.0)
                    if params is None and legacy is not None:      # Gemma 3: rope_scaling is the global layers'
                        q = {"rope_type": "default", "rope_theta": q["rope_theta"]}
                elif fam.name == "gpt_neox":
                    src = "rotary_emb_base" if r.has("rotary_emb_base") or not r.has("rope_theta") else "rope_theta"
                    q["rope_theta"] = r.raw("rotary_emb_base", r.raw("rope_theta", 10000.0))
                else:
                    src = "rope_theta"
                    q["rope_theta"] = r.raw("rope_theta", 10000.0)
            if fam.name == "gpt_neox" and "partial_rotary_factor" not in q:
                q["partial_rotary_factor"] = r.raw("rotary_pct", 0.25)
            if "partial_rotary_factor" not in q and r.cfg.get("partial_rotary_factor") is not None:
                q["partial_rotary_factor"] = r.cfg["partial_rotary_factor"]
            elif "partial_rotary_factor" not in q and fam.name in _PARTIAL_ROTARY_DEFAULT:
                # (its configuration class's default where the file gives none: StableLM 0.25, Phi 0.5)
                q["partial_rotary_factor"] = fam.defaults["partial_rotary_factor"]
            per_type[t] = (q, what, src)
    ropes = {}
    for t, (p, what, src) in per_type.items():
        kind = p.get("rope_type", p.get("type", "default")) or "default"
        theta = p.get("rope_theta")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (math.isfinite(theta) and theta > 1):
            r.fail(f"{src or what + '.rope_theta'} must be a number > 1, got {theta!r}")
        if kind in ("llama3", "yarn", "longrope"):        # transformers' standardize_rope_params
            if r.has("original_max_position_embeddings"):
                p["original_max_position_embeddings"] = r.raw("original_max_position_embeddings")
            else:
                p.setdefault("original_max_position_embeddings", max_pos)
        rope = rope_for_head(fam.name, kind, p, d_head, seq_len, max_pos, r.fail, notes, what)
        if kind == "dynamic":
            notes.append(f"{what} rope_type 'dynamic': " + (
                f"the default rotation up to max_position_embeddings {max_pos} (seq_len {seq_len})"
                if seq_len <= max_pos else f"the NTK-rescaled base transformers computes at seq_len {seq_len}"))
        if kind == "longrope":
            orig = p["original_max_position_embeddings"]
            notes.append(f"{what} rope_type 'longrope': the {'long' if seq_len > orig else 'short'}_factor "
                         f"frequencies (seq_len {seq_len} {'>' if seq_len > orig else '<='} "
                         f"original_max_position_embeddings {orig})")
        ropes[t] = rope
    local = None
    if len(set(ropes.values())) > 1:
        if None in ropes.values():
            detail = ", ".join(f"{t} {b:g}" if isinstance(b, float) else f"{t} {'none' if b is None else b.describe()}"
                               for t, b in sorted(ropes.items()))
            r.fail(f"rope_parameters: some layers rotate and some do not ({detail}); not modelled")
        local = ropes.pop("sliding_attention")
    rope = ropes.get("full_attention", ropes.get("sliding_attention"))
    if rope is None:
        return None, None

    def words(b):
        return f"base {b:g}" if isinstance(b, float) else f"given by their frequencies: {b.describe()}"

    if local is None:
        notes.append(f"rotary positions on every query and key, {words(rope)} (rotate_half convention)")
    else:
        notes.append(f"rotary positions on every query and key (rotate_half convention): the full-attention layers "
                     f"{words(rope)}, the sliding-window layers {words(local)} (local_rope)")
    return rope, local


def _biases(fam: Family, r: _Reader, notes: list) -> bool:
    """Name the biases the model has (all zero at init); returns whether the FFN has biases
    (what an init that draws biases, such as torch-default, may give them)."""
    if fam.name in ("gpt2", "bert", "roberta", "distilbert"):
        notes.append("biases on every projection (q, k, v, o, FFN in and out) and norm: zero at init")
        return True
    if fam.name in _BIAS_WORDS:
        return _family_biases(fam, r, notes)
    if fam.name == "gpt_neox":
        att = r.bool("attention_bias", True)
        notes.append(f"biases: FFN in and out{', q, k, v and o' if att else ''}: zero at init")
        return True
    if fam.name == "gptj":
        notes.append("biases: FFN in and out (attention has none): zero at init")
        return True
    if fam.name == "qwen2":
        notes.append("biases: q, k and v projections (o and the FFN have none): zero at init")
        return False
    if fam.name == "mistral":                     # (Mistral's projections have no biases whatever the config says)
        notes.append("no biases")
        return False
    att, mlp = (r.bool("attention_bias", False),
                r.bool("mlp_bias", False) if fam.name in ("llama", "granite", "smollm3") else False)
    if att or mlp:
        parts = (["q, k, v and o"] if att else []) + (["gate, up and down"] if mlp else [])
        notes.append(f"biases: {' and '.join(parts)} (attention_bias/mlp_bias): zero at init")
    else:
        notes.append("no biases")
    return mlp


def _embedding(fam: Family, r: _Reader, d: int, init_std: float, p_emb: float) -> dict:
    """The token embedding as initialised: table stds (0 where absent), a norm after it, its dropout."""
    word = init_std * (math.sqrt(d) if fam.name in ("gemma", "gemma2", "gemma3_text") else 1.0)
    if fam.name == "granite":
        word *= abs(r.float("embedding_multiplier"))
    pos = init_std if fam.name in ("gpt2", "bert", "roberta", "distilbert") else 0.0
    seg = 0.0
    if fam.name in ("bert", "roberta"):
        tv = r.raw("type_vocab_size", 2)
        if tv is not None and tv != 0:
            seg = init_std
    return {"word_std": word, "position_std": pos, "segment_std": seg,
            "norm": fam.name in ("bert", "roberta", "distilbert"),
            "dropout": p_emb}


def _embedding_words(emb: dict, fam: Family) -> str:
    parts = [f"token table N(0, {_g(emb['word_std'])}^2)"
             + (" (N(0, initializer_range^2) times sqrt(hidden_size))" if fam.name.startswith("gemma") else "")
             + (" (N(0, initializer_range^2) times |embedding_multiplier|)" if fam.name == "granite" else "")]
    if emb["position_std"]:
        parts.append(f"position table N(0, {_g(emb['position_std'])}^2)")
    if emb["segment_std"]:
        parts.append(f"token-type table N(0, {_g(emb['segment_std'])}^2), every token of type 0")
    text = " + ".join(parts)
    if emb["norm"]:
        text += ", then LayerNorm"
    if emb["dropout"]:
        text += f", then dropout {_g(emb['dropout'])}"
    return text


# ---------------------------------------------------------------------------------------
# the later families: their own fields (kept apart from the shared code above)
# ---------------------------------------------------------------------------------------

#: families whose biases _family_biases names
_BIAS_WORDS = frozenset(("qwen3", "starcoder2", "phi3", "stablelm", "phi", "falcon"))
#: families whose default partial_rotary_factor (configuration class) is below 1
_PARTIAL_ROTARY_DEFAULT = frozenset(("stablelm", "phi"))
#: families that drop one branch output and not the other (the branch whose output is dropped)
_ONE_BRANCH_DROPOUT = {"distilbert": ("dropout", "the FFN output but not the attention output"),
                       "stablelm": ("hidden_dropout", "the MLP output but not the attention output")}


def _refuse_family(fam: Family, r: _Reader, opts: dict, notes: list) -> None:
    """A new family's fields that sigprop cannot model (DomainError naming them), and its notes
    on fields that do not change the stream."""
    name = fam.name
    if name == "falcon":
        _falcon_checks(r, opts, notes)
    if name == "distilbert" and r.bool("sinusoidal_pos_embds", False):
        r.fail("sinusoidal_pos_embds true: a fixed sinusoidal position table (its rows correlated between "
               "positions) is not modelled; only the learned table is")
    if name in _ONE_BRANCH_DROPOUT:
        key, words = _ONE_BRANCH_DROPOUT[name]
        p = opts.get("hidden_dropout", opts.get("dropout"))
        if p is None:
            p = r.prob(key)
        if p > 0:
            r.fail(f"{key} {p:g}: {fam.title} drops {words}, and sigprop's hidden dropout acts on both "
                   "branches: not modelled (--hidden-dropout 0 predicts the model without it)")
    if name == "smollm3":
        n = opts.get("n_layers") or r.int(fam.keys["n_layers"])
        given = r.cfg.get("no_rope_layers")
        if given is not None:
            if not isinstance(given, list) or not all(v in (0, 1) and not isinstance(v, float) for v in given):
                r.fail(f"no_rope_layers must be a list of 0 / 1, got {given!r}")
            if len(given) < n:
                r.fail(f"no_rope_layers has {len(given)} entries for {n} layers")
            use = [bool(v) for v in given[:n]]
            key = "no_rope_layers"
        else:
            k = r.int("no_rope_layer_interval")
            use = [(i + 1) % k != 0 for i in range(n)]
            key = f"no_rope_layer_interval {k}"
        nope = [i + 1 for i, u in enumerate(use) if not u]
        if nope:
            shown = ", ".join(map(str, nope[:6])) + (", ..." if len(nope) > 6 else "")
            r.fail(f"{key}: layers without rotary positions (NoPE: layers {shown} of {n}) are not modelled; "
                   "sigprop's rotary setting is one for every layer")
        notes.append("no_rope_layers: every layer has rotary positions")
    if name == "granite":
        for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
            r.float(key)
        if r.float("attention_multiplier") <= 0:
            r.fail(f"attention_multiplier must be > 0, got {r.raw('attention_multiplier')!r}")
        notes.append(f"logits_scaling {r.float('logits_scaling'):g}: divides the output logits, outside the stack")
    if name == "cohere":
        notes.append(f"logit_scale {r.float('logit_scale'):g}: multiplies the output logits, outside the stack")
        notes.append("Cohere rotates interleaved pairs of each head's features (rotate_every_two): a fixed "
                     "permutation of the features shared by queries and keys, so the logits are those of the "
                     "rotate_half convention")
    if name == "phi3":
        notes.append("Phi-3's fused qkv_proj and gate_up_proj are q, k, v and gate, up side by side: every part "
                     f"N(0, {_g(r.float('initializer_range') or 0.02)}^2), the same statistics as separate matrices")
    if name == "roberta":
        pad = r.raw("pad_token_id", 1)
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
            r.fail(f"pad_token_id must be a non-negative integer or null, got {pad!r}")


def _roberta_positions(r: _Reader, max_pos: int, notes: list) -> int:
    """RoBERTa's positions start at pad_token_id + 1: a sequence holds at most
    max_position_embeddings - pad_token_id - 1 tokens."""
    pad = r.raw("pad_token_id", 1) or 0
    n = max_pos - pad - 1
    if n < 2:
        r.fail(f"max_position_embeddings {max_pos} leaves {n} positions after pad_token_id {pad} + 1")
    notes.append(f"RoBERTa's position ids start at pad_token_id + 1 = {pad + 1}: at most {n} tokens "
                 f"(max_position_embeddings {max_pos} - {pad + 1})")
    return n


def _family_block(fam: Family, r: _Reader, notes: list) -> str:
    """The block of a new family: sequential, or parallel with one norm feeding both branches."""
    if fam.name in ("cohere", "phi"):
        notes.append(f"{fam.title} blocks: x' = x + Att(LN x) + MLP(LN x), one LayerNorm")
        return "parallel"
    if fam.name == "falcon":
        return _falcon_block(r, notes)
    if fam.name == "stablelm":
        if r.bool("use_parallel_residual", False):
            notes.append("use_parallel_residual true: x' = x + Att(LN x) + MLP(LN x), one LayerNorm (input_layernorm)")
            return "parallel"
        notes.append("use_parallel_residual false: attention, then MLP, each pre-LN")
    return "sequential"


def _family_qk_norm(fam: Family, r: _Reader, notes: list) -> bool:
    """QK-norm of a new family (sigprop's rule: per head, the model's norm kind, gain 1)."""
    if fam.name == "qwen3":
        notes.append("QK-norm: RMSNorm per head on queries and keys (q_norm, k_norm over head_dim), gain 1 at init")
        return True
    if fam.name == "olmo3":
        notes.append("QK-norm: OLMo 3 applies RMSNorm to the whole q and k projections (over all heads), "
                     "sigprop's rule per head; at init every head's mean square concentrates on the same "
                     "value, so the two agree to first order in 1/(heads x head_dim) and 1/head_dim")
        return True
    key = {"cohere": "use_qk_norm", "stablelm": "qk_layernorm", "phi": "qk_layernorm"}.get(fam.name)
    if key is not None and r.bool(key, False):
        notes.append(f"{key} true: QK-norm, a LayerNorm per head on queries and keys (over head_dim), gain 1 "
                     "(bias 0) at init")
        return True
    return False


def _family_biases(fam: Family, r: _Reader, notes: list) -> bool:
    """Name the biases of a new family (zero at init); returns whether its FFN has biases."""
    if fam.name == "qwen3":
        if r.bool("attention_bias", False):
            notes.append("biases: q, k, v and o (attention_bias; the FFN has none): zero at init")
        else:
            notes.append("no biases")
        return False
    if fam.name == "starcoder2":
        if r.bool("use_bias", True):
            notes.append("biases (use_bias): q, k, v, o, c_fc, c_proj and the LayerNorms: zero at init")
            return True
        notes.append("use_bias false: no projection biases (the LayerNorms keep theirs, zero at init)")
        return False
    if fam.name == "stablelm":
        notes.append("biases: q, k and v (use_qkv_bias): zero at init" if r.bool("use_qkv_bias", False)
                     else "no projection biases")
        return False
    if fam.name == "phi":
        notes.append("biases on q, k, v, dense, fc1, fc2 and the LayerNorms: zero at init")
        return True
    if fam.name == "falcon":
        if r.bool("bias", False):
            notes.append("bias true: biases on query_key_value, dense, dense_h_to_4h, dense_4h_to_h and the "
                         "LayerNorms: zero at init")
            return True
        notes.append("bias false: no projection biases (the LayerNorms keep theirs, zero at init)")
        return False
    notes.append("no biases")
    return False


def _family_options(fam: Family, r: _Reader, opts: dict, notes: list) -> dict:
    """presets.resolve options a new family sets (Granite: its residual multiplier as the branch
    scale; Falcon: its kv heads)."""
    if fam.name == "falcon":
        return {"n_kv_heads": _falcon_kv_heads(r, notes)}
    if fam.name != "granite":
        return {}
    m = r.float("residual_multiplier")
    if "branch_scale" in opts:
        notes.append(f"residual_multiplier {m:g} replaced by the --branch-scale given")
        return {}
    notes.append(f"residual_multiplier {m:g}: every branch output is multiplied by it before the residual "
                 "sum (sigprop's branch_scale)")
    return {"branch_scale": m}


def _family_model(fam: Family, r: _Reader, model, notes: list):
    """The resolved model, with what a new family changes after presets.resolve: Granite's
    attention_multiplier m replaces 1/sqrt(head_dim) on the logits (q.k m); sigprop's logits
    are q.k / sqrt(head_dim), so the same network has W_q's std times m sqrt(head_dim)."""
    if fam.name != "granite":
        return model
    from sigprop.model.spec import Sublayers

    m = r.float("attention_multiplier")
    f = m * math.sqrt(model.d_head)
    if f != 1.0:
        a = model.attention
        std = dict(a.std)
        std["q"] = a.std["q"] * f
        bias = dict(a.bias_std)
        bias["q"] = a.bias_std["q"] * f
        model = model.replace(attention=Sublayers("attention", a.placement, a.skip_scale, a.branch_scale,
                                                  a.norm_scale, std, bias))
    notes.append(f"attention_multiplier {m:g}: the logits are q.k x {m:g} instead of q.k / sqrt({model.d_head}); "
                 f"modelled as W_q's init std times {m:g} x sqrt({model.d_head}) = {f:.6g} (the same logits at init)")
    return model


# -- Falcon (transformers' modeling_falcon) ---------------------------------------

#: the keys of the original (RefinedWeb) Falcon configs that transformers' FalconConfig does not
#: read -> the key it reads instead
_FALCON_LEGACY = {"n_head": "num_attention_heads", "n_layer": "num_hidden_layers", "n_head_kv": "num_kv_heads"}


def _falcon_flag(r: _Reader, key: str) -> bool:
    """A Falcon switch as its modeling code tests it (``if config.key``): null is false."""
    v = r.raw(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        r.fail(f"{key} must be true, false or null, got {v!r}")
    return v


def _falcon_new(r: _Reader) -> bool:
    return _falcon_flag(r, "new_decoder_architecture")


def _falcon_checks(r: _Reader, opts: dict, notes: list) -> None:
    """What transformers' Falcon cannot build or sigprop cannot model (DomainError naming the
    field), and its dropout: with rotary positions no attention probability is dropped;
    ``attention_dropout`` drops the attention output of the sequential layout (parallel_attn
    false) and ``hidden_dropout`` the MLP output there, the sum of both branches' outputs in
    the parallel layouts."""
    for old, key in _FALCON_LEGACY.items():
        if old in r.cfg and r.cfg.get(key, object()) != r.cfg[old]:
            r.fail(f"{old} {r.cfg[old]!r}: transformers' Falcon does not read {old} (a key of the original "
                   f"Falcon code) but {key}{f' {r.cfg[key]!r}' if key in r.cfg else ' (absent: its default)'}; "
                   f"give {key}")
    if r.bool("apply_residual_connection_post_layernorm", False):
        r.fail("apply_residual_connection_post_layernorm true: transformers' Falcon does not read it (it builds "
               "the pre-LN residual); sigprop models what transformers builds: set it false")
    new, parallel = _falcon_new(r), _falcon_flag(r, "parallel_attn")
    n_ln = r.raw("num_ln_in_parallel_attn")
    if n_ln is not None and (isinstance(n_ln, bool) or n_ln not in (1, 2)):
        r.fail(f"num_ln_in_parallel_attn must be 1, 2 or null, got {n_ln!r}")
    if new and not parallel:
        r.fail("new_decoder_architecture true with parallel_attn false: transformers' Falcon layer then builds "
               "input_layernorm and post_attention_layernorm but its forward calls ln_attn (or no MLP norm): it "
               "cannot run")
    if not new and parallel and n_ln == 2:
        r.fail("num_ln_in_parallel_attn 2 without new_decoder_architecture: transformers' Falcon layer then builds "
               "ln_attn and ln_mlp but its forward calls input_layernorm: it cannot run")
    att = r.prob("attention_dropout")
    if new or parallel:
        if att:
            notes.append(f"attention_dropout {att:g}: unused (with rotary positions Falcon drops no attention "
                         "probabilities, and its parallel layout has no separate attention-output dropout)")
        p = r.prob("hidden_dropout")
        if p:
            notes.append(f"hidden_dropout {p:g}: one dropout on the sum of the two branch outputs; the two are "
                         "uncorrelated at init (independent zero-mean output weights), so the stream's second "
                         "moments are those of sigprop's hidden dropout on each branch")
        return
    hid = r.prob("hidden_dropout")
    if att != hid and not ({"dropout", "hidden_dropout"} & set(opts)):
        r.fail(f"attention_dropout {att:g} and hidden_dropout {hid:g}: with parallel_attn false Falcon drops "
               "the attention output with attention_dropout and the MLP output with hidden_dropout; sigprop's "
               "hidden dropout is one for both branches (give them equal, or --hidden-dropout)")
    if att:
        notes.append(f"attention_dropout {att:g}: with rotary positions Falcon drops no attention probabilities; "
                     "it drops the attention output (as hidden_dropout the MLP output): sigprop's hidden dropout")


def _falcon_block(r: _Reader, notes: list) -> str:
    """Falcon's layer: parallel (one norm, or ln_attn and ln_mlp: the same function of the same
    stream at init) or, with parallel_attn false, sequential pre-LN."""
    if _falcon_new(r):
        if r.raw("num_ln_in_parallel_attn") == 1:
            notes.append("new_decoder_architecture true, num_ln_in_parallel_attn 1: x' = x + Att(LN x) + "
                         "MLP(LN x), one LayerNorm (input_layernorm)")
        else:
            notes.append("new_decoder_architecture true: x' = x + Att(ln_attn x) + MLP(ln_mlp x); the two "
                         "LayerNorms of the same x are equal at init (gain 1, bias 0), so this is sigprop's "
                         "parallel block with one norm feeding both branches")
        return "parallel"
    if _falcon_flag(r, "parallel_attn"):
        notes.append("parallel_attn true: x' = x + Att(LN x) + MLP(LN x), one LayerNorm (input_layernorm)")
        return "parallel"
    notes.append("parallel_attn false: attention, then MLP, each pre-LN (input_layernorm, "
                 "post_attention_layernorm)")
    return "sequential"


def _falcon_kv_heads(r: _Reader, notes: list) -> int:
    """Falcon's key/value heads: num_kv_heads groups with new_decoder_architecture (grouped-query
    attention; its query_key_value holds each group's query heads, then its key and value);
    else 1 with multi_query (multi-query attention), or one per head."""
    h = r.int("num_attention_heads")
    kv = r.int("num_kv_heads", allow_none=True)
    if _falcon_new(r):
        kv = h if kv is None else kv
        if h % kv:
            r.fail(f"num_kv_heads {kv} must divide num_attention_heads {h}")
        notes.append(f"new_decoder_architecture true: {kv} key/value heads (num_kv_heads) shared by groups of "
                     f"{h // kv} query heads; multi_query and parallel_attn are not read")
        return kv
    if _falcon_flag(r, "multi_query"):
        notes.append("multi_query true: multi-query attention, one key/value head for all "
                     f"{h} query heads" + ("" if kv is None else f" (num_kv_heads {kv} is not read)"))
        return 1
    if kv is not None and kv != h:
        r.fail(f"num_kv_heads {kv} with multi_query false and no new_decoder_architecture: every head has its own "
               f"keys and values there, and transformers' Falcon fails (a shape error) unless num_kv_heads is "
               f"num_attention_heads {h}")
    notes.append("multi_query false: every head has its own keys and values")
    return h
