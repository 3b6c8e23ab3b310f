"""Hugging Face model directories that transformers 4.x and 5.x read alike.

transformers 5 writes RoPE as `rope_parameters`, the dtype as `dtype` and fast tokenizers as
`tokenizer_class: TokenizersBackend`. transformers 4.57 (what vLLM, SGLang and many users still pin) does
not know that tokenizer class, and reads a config without `rope_theta` *silently* with RoPE base 10,000:
a Llama-3 verifier then gives other logits with no warning. Every directory taps-train writes carries
both spellings of the same facts.
"""

import json
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

# 5.x's generic fast-tokenizer class; 4.x names the same class PreTrainedTokenizerFast (5.x keeps that alias).
TOKENIZERS_BACKEND = "TokenizersBackend"
FAST_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def legacy_rope_keys(config: dict) -> dict:
    """`rope_theta` and `rope_scaling` (transformers 4) equal to a 5.x `rope_parameters`; empty when the
    parameters are per layer type (4.x has no spelling for those)."""
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" not in rope:
        return {}
    theta = rope.pop("rope_theta")
    return {"rope_theta": theta, "rope_scaling": None if rope.get("rope_type", "default") == "default" else rope}


def portable_config(config: dict) -> dict:
    """A saved config with the transformers 4 keys next to the 5.x ones."""
    legacy = {"torch_dtype": config["dtype"]} if config.get("dtype") else {}
    return {**config, **legacy_rope_keys(config), **legacy}


def save_portable(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, **save_options) -> None:
    """`save_pretrained` of model (with `save_options`, e.g. max_shard_size) and tokenizer, then the 4.x
    spellings added to their JSON files."""
    model.save_pretrained(directory, **save_options)
    tokenizer.save_pretrained(directory)
    _rewrite_json(directory / "config.json", portable_config)
    _rewrite_json(directory / "tokenizer_config.json", _portable_tokenizer_config)


def _portable_tokenizer_config(config: dict) -> dict:
    if config.get("tokenizer_class") == TOKENIZERS_BACKEND:
        return {**config, "tokenizer_class": FAST_TOKENIZER_CLASS}
    return config


def _rewrite_json(file: Path, change) -> None:
    file.write_text(json.dumps(change(json.loads(file.read_text())), indent=2, sort_keys=True) + "\n")
