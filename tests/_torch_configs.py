"""Small Hugging Face configs (4 layers, d_model 128, 4 heads of 32, vocabulary 256, context 64)
of every family sigprop reads, for the PyTorch interop tests."""

_D = dict(vocab_size=256, max_position_embeddings=64, initializer_range=0.02)
_LLAMA = dict(_D, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False)

CONFIGS = {
    "gpt2": dict(model_type="gpt2", vocab_size=256, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                 initializer_range=0.02),
    "bert": dict(_D, model_type="bert", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512, hidden_act="gelu"),
    "llama": dict(_LLAMA, model_type="llama", rope_theta=10000.0),
    "mistral": dict(_LLAMA, model_type="mistral", rope_theta=10000.0, sliding_window=None),
    "qwen2": dict(_LLAMA, model_type="qwen2", rope_theta=10000.0, use_sliding_window=False),
    "gpt_neox": dict(_D, model_type="gpt_neox", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=512, rotary_pct=1.0, use_parallel_residual=True, hidden_act="gelu"),
    "gptj": dict(model_type="gptj", vocab_size=256, n_positions=64, n_embd=128, n_layer=4, n_head=4,
                 rotary_dim=32, initializer_range=0.02),
    "olmo2": dict(_LLAMA, model_type="olmo2", rope_theta=10000.0),
    "gemma2": dict(_LLAMA, model_type="gemma2", head_dim=32, query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh",
                   attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=64),
    "gemma3_text": dict(_LLAMA, model_type="gemma3_text", head_dim=32, query_pre_attn_scalar=32,
                        hidden_activation="gelu_pytorch_tanh", sliding_window=64),
}

# the later families (the same sizes)
CONFIGS.update({
    "qwen3": dict(_LLAMA, model_type="qwen3", head_dim=32, rope_theta=10000.0, use_sliding_window=False),
    "roberta": dict(_D, model_type="roberta", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                    intermediate_size=512, hidden_act="gelu", max_position_embeddings=66, pad_token_id=1,
                    type_vocab_size=1),
    "distilbert": dict(vocab_size=256, max_position_embeddings=64, initializer_range=0.02, model_type="distilbert",
                       dim=128, n_layers=4, n_heads=4, hidden_dim=512, activation="gelu", dropout=0.0,
                       attention_dropout=0.1),
    "starcoder2": dict(_D, model_type="starcoder2", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=512, hidden_act="gelu_pytorch_tanh", use_bias=True,
                       sliding_window=None, rope_theta=10000.0),
    "phi3": dict(_LLAMA, model_type="phi3", rope_theta=10000.0, sliding_window=None, pad_token_id=0,
                 bos_token_id=1, eos_token_id=2),
    "gemma": dict(_LLAMA, model_type="gemma", head_dim=32, hidden_act="gelu_pytorch_tanh"),
    "cohere": dict(_D, model_type="cohere", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=256, layer_norm_eps=1e-5, hidden_act="silu",
                   rope_theta=10000.0, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "granite": dict(_LLAMA, model_type="granite", rope_theta=10000.0, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.03125 * 0.5, logits_scaling=8.0),
    "olmo3": dict(_LLAMA, model_type="olmo3", rope_theta=10000.0, sliding_window=64, pad_token_id=1,
                  eos_token_id=2),
    "smollm3": dict(_LLAMA, model_type="smollm3", rope_theta=10000.0, no_rope_layers=[1, 1, 1, 1],
                    pad_token_id=1, eos_token_id=2),
})
CONFIGS.update({
    "stablelm": dict(_D, model_type="stablelm", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=256, hidden_act="silu", partial_rotary_factor=1.0,
                     use_parallel_residual=True, qk_layernorm=True, use_qkv_bias=True, rope_theta=10000.0),
    "phi": dict(_D, model_type="phi", hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                intermediate_size=512, hidden_act="gelu_new", partial_rotary_factor=1.0, qk_layernorm=True,
                resid_pdrop=0.1, rope_theta=10000.0),
})
