"""The Llama-3-shaped stand-in verifier: shapes, sharding, loadability, determinism, reuse."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from taps_train.errors import TapsError
from taps_train.verifier.offline.standin import LLAMA3_VOCAB, MANIFEST, build_standin
from taps_train.verifier.offline.tokenizer import BOS, EOT, PAD
from tests.conftest import STANDIN_SMALL


def _weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


def test_config_has_llama3_shapes_and_tokenizer_ids(standin):
    config = AutoConfig.from_pretrained(standin)
    tokenizer = AutoTokenizer.from_pretrained(standin)
    assert config.model_type == "llama" and config.vocab_size == LLAMA3_VOCAB == 128_256
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.intermediate_size == round(3.5 * 64) and config.num_hidden_layers == 2
    assert config.tie_word_embeddings is False
    assert config.rope_parameters["rope_theta"] == 500_000.0 and config.max_position_embeddings == 8192
    assert config.rms_norm_eps == 1e-5 and config.dtype == torch.bfloat16
    # Ids come from the trained tokenizer, whose Llama-3 special tokens all exist.
    assert config.bos_token_id == tokenizer.convert_tokens_to_ids(BOS) == tokenizer.bos_token_id
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids(EOT)
    assert config.pad_token_id == tokenizer.convert_tokens_to_ids(PAD)
    assert len(tokenizer) < LLAMA3_VOCAB and tokenizer.chat_template


def test_sharded_with_embedding_and_head_in_shards_of_their_own(standin):
    weight_map = _weight_map(standin)
    shards = set(weight_map.values())
    embed_shard, head_shard = weight_map["model.embed_tokens.weight"], weight_map["lm_head.weight"]
    assert len(shards) >= 3 and embed_shard != head_shard
    assert {k for k, v in weight_map.items() if v in (embed_shard, head_shard)} == {"lm_head.weight", "model.embed_tokens.weight"}
    with safe_open(str(standin / embed_shard), "pt") as handle:
        assert handle.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    manifest = json.loads((standin / MANIFEST).read_text())
    assert manifest["spec"]["vocab_size"] == LLAMA3_VOCAB and sorted(manifest["shards"]) == sorted(shards)


def test_loads_with_transformers_and_runs_a_chat_prompt(standin):
    model = AutoModelForCausalLM.from_pretrained(standin).eval()
    tokenizer = AutoTokenizer.from_pretrained(standin)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert model.dtype == torch.bfloat16
    assert logits.shape == (1, ids.shape[1], LLAMA3_VOCAB) and torch.isfinite(logits).all()
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()


def test_same_settings_give_same_bytes_and_are_reused(standin, tmp_path):
    again = build_standin(tmp_path / "again", **STANDIN_SMALL)
    for name in set(_weight_map(standin).values()):
        assert (again / name).read_bytes() == (standin / name).read_bytes()
    stamp = (standin / MANIFEST).stat().st_mtime_ns
    assert build_standin(standin, **STANDIN_SMALL) == standin and (standin / MANIFEST).stat().st_mtime_ns == stamp


def test_seed_and_dtype_change_the_weights(tmp_path):
    other = build_standin(tmp_path / "f32", layers=1, hidden=32, heads=2, kv_heads=1, dtype="float32", seed=3)
    reseeded = build_standin(tmp_path / "f32-seed4", layers=1, hidden=32, heads=2, kv_heads=1, dtype="float32", seed=4)
    name = "model.embed_tokens.weight"
    tensors = []
    for path in (other, reseeded):
        with safe_open(str(path / _weight_map(path)[name]), "pt") as handle:
            assert handle.get_slice(name).get_dtype() == "F32"
            tensors.append(handle.get_tensor(name))
    assert not torch.equal(*tensors)
    assert tensors[0].std().item() == pytest.approx(0.02, rel=0.05)


def test_refuses_other_settings_and_foreign_directories(standin, tmp_path):
    with pytest.raises(TapsError, match=f"{MANIFEST}.*records other settings.*new --out"):
        build_standin(standin, **{**STANDIN_SMALL, "seed": 1})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(TapsError, match=f"{foreign} is not empty"):
        build_standin(foreign, **STANDIN_SMALL)
    with pytest.raises(TapsError, match="hidden 64 must split into 3 heads"):
        build_standin(tmp_path / "bad", layers=1, hidden=64, heads=3, kv_heads=1)
    with pytest.raises(TapsError, match="multiple of kv_heads 3"):
        build_standin(tmp_path / "bad", layers=1, hidden=64, heads=4, kv_heads=3)
