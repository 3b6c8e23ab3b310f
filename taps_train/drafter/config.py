"""The drafter's config: a one-layer `LlamaConfig` derived from whatever verifier it serves.

Any HF causal LM verifier works: we read its hidden size, heads, RoPE and vocabulary under the names
most architectures use. A Llama config is also what serving engines expect in an EAGLE checkpoint, so
the drafter stays a Llama layer whatever the verifier's family: it takes the verifier's sizes (those
its features, embedding and LM head impose) but not its architecture quirks (Gemma's GELU MLP,
attention scalars, softcapping, per-layer-type RoPE).
"""

import torch
from transformers import LlamaConfig, PretrainedConfig

from taps_train.errors import TapsError


def drafter_config(verifier_config: PretrainedConfig, fc_bias: bool = False) -> LlamaConfig:
    verifier_config = verifier_config.get_text_config(decoder=True)  # multimodal wrappers nest the LM's config
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
        # SiLU whatever the verifier uses: the drafter is a fresh network, and the EAGLE Llama layer
        # of SGLang and vLLM implements no other activation.
        hidden_act="silu",
        max_position_embeddings=getattr(verifier_config, "max_position_embeddings", 4096),
        rms_norm_eps=getattr(verifier_config, "rms_norm_eps", 1e-6),
        rope_parameters=global_rope_parameters(verifier_config),
        tie_word_embeddings=False,
        bos_token_id=getattr(verifier_config, "bos_token_id", None),
        eos_token_id=getattr(verifier_config, "eos_token_id", None),
        pad_token_id=getattr(verifier_config, "pad_token_id", None),
    )
    config.architectures = ["LlamaForCausalLMEagle"]
    config.fc_bias = fc_bias
    return config


def global_rope_parameters(verifier_config: PretrainedConfig) -> dict | None:
    """The RoPE of the verifier's full-attention layers. Models with per-layer-type RoPE (Gemma-3:
    local layers at base 1e4, global ones at 1e6 and possibly scaled) nest it by layer type; the drafter
    attends over the whole context like the global layers, so it takes theirs."""
    rope = getattr(verifier_config, "rope_parameters", None)
    if rope and all(isinstance(value, dict) for value in rope.values()):
        return dict(rope.get("full_attention") or next(iter(rope.values())))
    return rope


def check_vocab_size(size: int | float, option: str) -> None:
    """A drafter's own vocabulary size option (`option`, e.g. draft_vocab_size): tokens or a fraction of the verifier's."""
    valid_int = isinstance(size, int) and not isinstance(size, bool) and size >= 1
    if not (valid_int or isinstance(size, float) and 0 < size <= 1):
        raise TapsError(f"{option} must be an int >= 1 (tokens) or a float in (0, 1] (a fraction of the verifier's "
                        f"vocabulary), got {size!r}")


def vocab_tokens(size: int | float, verifier_vocab_size: int, option: str) -> int:
    """`size` in tokens: an int is a count (at most the verifier's vocabulary), a float in (0, 1] a fraction of the
    verifier's vocabulary (rounded, at least 1), so one config fits verifiers of any vocabulary."""
    check_vocab_size(size, option)
    if isinstance(size, int):
        if size > verifier_vocab_size:
            raise TapsError(f"{option} {size} exceeds the verifier's vocabulary of {verifier_vocab_size} tokens; "
                            f"pass at most {verifier_vocab_size}, or a fraction such as 0.25")
        return size
    return max(1, round(size * verifier_vocab_size))


def most_frequent_tokens(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent token ids of `counts` ([vocab] occurrences), ascending (ties: lower id first): the
    vocabulary a drafter that proposes from its training data's tokens is given."""
    return torch.sort(-counts, stable=True).indices[:size].sort().values
