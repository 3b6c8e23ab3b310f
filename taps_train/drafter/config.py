"""The drafter's config: a one-layer `LlamaConfig` derived from whatever verifier it serves.

Any HF causal LM verifier works: we read its hidden size, heads, RoPE and vocabulary under the names
most architectures use. A Llama config is also what serving engines expect in an EAGLE checkpoint.
"""

from transformers import LlamaConfig, PretrainedConfig


def drafter_config(verifier_config: PretrainedConfig, fc_bias: bool = False) -> LlamaConfig:
    hidden = verifier_config.hidden_size
    heads = verifier_config.num_attention_heads
    config = LlamaConfig(
        vocab_size=verifier_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=getattr(verifier_config, "intermediate_size", 4 * hidden),
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=getattr(verifier_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(verifier_config, "head_dim", None) or hidden // heads,
        hidden_act=getattr(verifier_config, "hidden_act", "silu"),
        max_position_embeddings=getattr(verifier_config, "max_position_embeddings", 4096),
        rms_norm_eps=getattr(verifier_config, "rms_norm_eps", 1e-6),
        rope_parameters=getattr(verifier_config, "rope_parameters", None),
        tie_word_embeddings=False,
        bos_token_id=getattr(verifier_config, "bos_token_id", None),
        eos_token_id=getattr(verifier_config, "eos_token_id", None),
        pad_token_id=getattr(verifier_config, "pad_token_id", None),
    )
    config.architectures = ["LlamaForCausalLMEagle"]
    config.fc_bias = fc_bias
    return config
