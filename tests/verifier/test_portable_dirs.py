"""Model directories taps-train writes carry transformers 4.x spellings next to 5.x's, and 5.x reads them as before.

transformers 4.57 reads a config without `rope_theta` silently with RoPE base 10,000 and cannot load
`tokenizer_class: TokenizersBackend`; the tiny verifier (micro spec) and the stand-in are checked here,
exports in tests/export/test_export.py (rope_theta, rope_scaling, torch_dtype of an exported drafter).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedModel, PreTrainedTokenizerBase

from taps_train.verifier.offline import standin, tiny
from taps_train.verifier.portable import legacy_rope_keys, portable_config, save_portable
from tests.verifier.test_tiny_build import MICRO

LLAMA3_THETA = 500_000.0
LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": LLAMA3_THETA, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42\n#### 42"},
    {"role": "user", "content": "And twice that?"},
]
TEXTS = ["Natalia sold clips to 48 of her friends in April.", "naïve café — 3.14159 × 2 = ?\n\n", "  leading and trailing  "]


@dataclass(frozen=True)
class Written:
    """A directory a build wrote, and the model and tokenizer it held in memory when it wrote them."""

    directory: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def build_recording(module: ModuleType, build: Callable[[], Path]) -> Written:
    """Run `build` with `module.save_portable` recording what it is asked to save."""
    saved = {}

    def recording_save(model, tokenizer, directory, **options):
        saved.update(model=model, tokenizer=tokenizer)
        save_portable(model, tokenizer, directory, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "save_portable", recording_save)
        directory = build()
    return Written(directory, saved["model"], saved["tokenizer"])


BUILDS = {
    "tiny": lambda tmp: build_recording(tiny, lambda: tiny.build_tiny_verifier(MICRO, home=tmp)),
    "standin": lambda tmp: build_recording(
        standin, lambda: standin.build_standin(tmp / "standin", layers=1, hidden=64, heads=2, kv_heads=1, dtype="float32")),
}


@pytest.fixture(scope="module", params=list(BUILDS))
def written(request, tmp_path_factory) -> Written:
    return BUILDS[request.param](tmp_path_factory.mktemp(request.param))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_config_has_rope_theta_and_torch_dtype_beside_the_5x_keys(written):
    config = read_json(written.directory / "config.json")
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": LLAMA3_THETA}
    assert config["rope_theta"] == LLAMA3_THETA and config["rope_scaling"] is None
    assert config["torch_dtype"] == config["dtype"] == "float32"


def test_tokenizer_config_names_the_class_transformers_4_knows(written):
    assert read_json(written.directory / "tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_transformers_5_loads_the_same_tokenizer(written):
    loaded, original = AutoTokenizer.from_pretrained(written.directory), written.tokenizer
    assert len(loaded) == len(original) and loaded.all_special_tokens == original.all_special_tokens
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (original.bos_token_id, original.eos_token_id, original.pad_token_id)
    for text in TEXTS:
        for special in (True, False):
            assert loaded(text, add_special_tokens=special)["input_ids"] == original(text, add_special_tokens=special)["input_ids"]
    for generation_prompt in (True, False):
        assert (loaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=generation_prompt)
                == original.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=generation_prompt))


def test_transformers_5_loads_the_same_model_with_rope_base_500k(written):
    loaded = AutoModelForCausalLM.from_pretrained(written.directory)
    assert loaded.config.rope_parameters == {"rope_type": "default", "rope_theta": LLAMA3_THETA}
    head_dim = loaded.config.head_dim
    expected = LLAMA3_THETA ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq, expected)
    original = written.model.state_dict()
    assert loaded.state_dict().keys() == original.keys()
    assert all(torch.equal(tensor, original[name]) for name, tensor in loaded.state_dict().items())


@pytest.mark.parametrize(("rope", "legacy"), [
    ({"rope_type": "default", "rope_theta": 1e4}, {"rope_theta": 1e4, "rope_scaling": None}),
    ({"rope_theta": 1e6}, {"rope_theta": 1e6, "rope_scaling": None}),
    (LLAMA31_ROPE, {"rope_theta": LLAMA3_THETA, "rope_scaling": {k: v for k, v in LLAMA31_ROPE.items() if k != "rope_theta"}}),
    (GEMMA3_ROPE, {}),  # per layer type: transformers 4 has no spelling for it
    (None, {}),
], ids=["default", "untyped", "llama3_scaled", "per_layer_type", "absent"])
def test_legacy_rope_keys(rope, legacy):
    assert legacy_rope_keys({"rope_parameters": rope}) == legacy


def test_portable_config_adds_keys_and_changes_none():
    config = {"model_type": "llama", "dtype": "bfloat16", "rope_parameters": dict(LLAMA31_ROPE)}
    portable = portable_config(config)
    assert config == {"model_type": "llama", "dtype": "bfloat16", "rope_parameters": LLAMA31_ROPE}  # input untouched
    assert portable == {**config, "torch_dtype": "bfloat16", **legacy_rope_keys(config)}
    assert "torch_dtype" not in portable_config({"model_type": "llama"})


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": LLAMA3_THETA}, LLAMA31_ROPE], ids=["default", "llama3_scaled"])
def test_transformers_5_reads_a_portable_config_back_the_same(rope):
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                         max_position_embeddings=131072, rope_parameters=rope)
    assert LlamaConfig.from_dict(portable_config(config.to_dict())).rope_parameters == rope
