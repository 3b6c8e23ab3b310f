"""Reading a verifier's embedding and LM head from its safetensors files, without the model."""

import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

import taps_train.verifier.loading as loading_module
import taps_train.verifier.parts as parts_module
from taps_train.errors import TapsError
from taps_train.verifier.parts import INDEX, read_verifier_layer, read_verifier_parts
from taps_train.verifier.offline.standin import build_standin

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _weight_map(path: Path) -> dict[str, str]:
    return json.loads((path / INDEX).read_text())["weight_map"]


def _linked_copy(source: Path, target: Path) -> Path:
    """A copy of a model directory whose files are symlinks, so a test can replace just one of them."""
    target.mkdir()
    for file in source.iterdir():
        (target / file.name).symlink_to(file)
    return target


def _replace(path: Path, text: str) -> None:
    path.unlink()
    path.write_text(text)


def _tiny_llama(path: Path, tied: bool) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def test_sharded_parts_equal_the_loaded_models_and_keep_bfloat16(standin):
    parts = read_verifier_parts(str(standin))
    model = AutoModelForCausalLM.from_pretrained(standin)
    assert parts.embedding.dtype == parts.lm_head.dtype == torch.bfloat16
    assert torch.equal(parts.embedding, model.get_input_embeddings().weight)
    assert torch.equal(parts.lm_head, model.get_output_embeddings().weight)
    assert not parts.tied and parts.embed_scale == 1.0 and parts.source == str(standin)


def test_cast_on_load(standin):
    parts = read_verifier_parts(str(standin), config=AutoConfig.from_pretrained(standin), dtype=torch.float32, device="cpu")
    model = AutoModelForCausalLM.from_pretrained(standin)
    assert parts.embedding.dtype == parts.lm_head.dtype == torch.float32
    assert torch.equal(parts.lm_head, model.get_output_embeddings().weight.float())
    with pytest.raises(TapsError, match="not a floating-point dtype"):
        read_verifier_parts(str(standin), dtype=torch.int8)


def test_reads_only_the_two_tensors_from_their_two_shards(standin, monkeypatch):
    opened, got = [], []
    real_safe_open = loading_module.safe_open  # parts opens safetensors through loading.open_safetensors

    class Recording:
        def __init__(self, file: str, framework: str):
            opened.append(Path(file).name)
            self.inner = real_safe_open(file, framework=framework)

        def __enter__(self):
            self.inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_slice(self, name):
            return self.inner.get_slice(name)

        def get_tensor(self, name):
            got.append(name)
            return self.inner.get_tensor(name)

    monkeypatch.setattr(loading_module, "safe_open", Recording)
    parts = read_verifier_parts(str(standin))
    weight_map = _weight_map(standin)
    assert sorted(got) == [HEAD, EMBED]
    assert sorted(opened) == sorted([weight_map[EMBED], weight_map[HEAD]])
    assert len(set(weight_map.values())) > len(opened)  # the decoder-layer shard was never opened
    assert [(r.file, r.name) for r in parts.tensors_read] == [(weight_map[EMBED], EMBED), (weight_map[HEAD], HEAD)]
    assert parts.bytes_read == 2 * 128_256 * 64 * 2


def test_tied_single_file_model_shares_one_tensor(tmp_path):
    path = _tiny_llama(tmp_path / "tied", tied=True)
    assert HEAD not in load_file(path / "model.safetensors")
    parts = read_verifier_parts(str(path))
    model = AutoModelForCausalLM.from_pretrained(path)
    assert parts.tied and parts.lm_head is parts.embedding
    assert torch.equal(parts.lm_head, model.get_output_embeddings().weight)
    assert [r.name for r in parts.tensors_read] == [EMBED]


def test_untied_single_file_model(random_verifier_dir):
    parts = read_verifier_parts(str(random_verifier_dir))
    model = AutoModelForCausalLM.from_pretrained(random_verifier_dir)
    assert not parts.tied and parts.embedding.dtype == torch.float32
    assert torch.equal(parts.embedding, model.get_input_embeddings().weight)
    assert torch.equal(parts.lm_head, model.get_output_embeddings().weight)


def test_checkpoint_without_the_base_model_prefix(tmp_path):
    """Keys saved from the bare LlamaModel (`embed_tokens.weight`) load into the causal LM unchanged."""
    path = _tiny_llama(tmp_path / "plain", tied=False)
    state = load_file(path / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"})
    parts = read_verifier_parts(str(path))
    model = AutoModelForCausalLM.from_pretrained(path)
    assert [r.name for r in parts.tensors_read] == ["embed_tokens.weight", HEAD]
    assert torch.equal(parts.embedding, model.get_input_embeddings().weight)


def test_gemma_reports_the_embedding_scale_its_module_applies(tmp_path):
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    Gemma2ForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "gemma")
    parts = read_verifier_parts(str(tmp_path / "gemma"))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "gemma", dtype=torch.bfloat16)
    assert parts.tied and parts.embed_scale == pytest.approx(math.sqrt(64))
    ids = torch.tensor([[1, 7, 200]])
    scale = torch.tensor(parts.embed_scale, dtype=parts.embedding.dtype)  # Gemma scales in the weight dtype
    assert torch.equal(parts.embedding[ids] * scale, model.get_input_embeddings()(ids))


def test_granite_reports_its_embedding_multiplier(tmp_path):
    config = GraniteConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, embedding_multiplier=12.0)
    GraniteForCausalLM(config).save_pretrained(tmp_path / "granite")
    assert read_verifier_parts(str(tmp_path / "granite")).embed_scale == 12.0


def test_hub_id_fetches_only_the_index_and_the_two_shards(standin, tmp_path, monkeypatch):
    """An offline hub cache laid out as huggingface_hub writes it stands in for the hub."""
    snapshot = tmp_path / "hub" / "models--acme--standin" / "snapshots" / ("0" * 40)
    shutil.copytree(standin, snapshot)
    (tmp_path / "hub" / "models--acme--standin" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--standin" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    fetched = []

    def recording_download(repo, filename, revision=None):
        fetched.append(filename)
        return huggingface_hub.hf_hub_download(repo, filename, revision=revision)

    monkeypatch.setattr(parts_module, "hf_hub_download", recording_download)
    parts = read_verifier_parts("acme/standin")
    weight_map = _weight_map(standin)
    assert fetched == [INDEX, weight_map[EMBED], weight_map[HEAD]]
    assert torch.equal(parts.lm_head, read_verifier_parts(str(standin)).lm_head)


def test_unreachable_hub_id_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TapsError) as caught:
        read_verifier_parts("acme/no-such-model")
    message = str(caught.value)
    assert "\n" not in message and "acme/no-such-model" in message and "network" in message


def test_pickled_checkpoint_is_refused(tmp_path, random_verifier_dir):
    path = tmp_path / "pickled"
    path.mkdir()
    shutil.copy(random_verifier_dir / "config.json", path)
    torch.save({"x": torch.zeros(1)}, path / "pytorch_model.bin")
    with pytest.raises(TapsError, match=rf"{path}.*pickled.*pytorch_model\.bin.*safetensors"):
        read_verifier_parts(str(path))


def test_index_naming_a_missing_shard(standin, tmp_path):
    path = _linked_copy(standin, tmp_path / "copy")
    head_shard = _weight_map(standin)[HEAD]
    (path / head_shard).unlink()
    with pytest.raises(TapsError, match=f"{INDEX} names shard {head_shard} for {HEAD}, but that file is missing"):
        read_verifier_parts(str(path))


def test_shard_missing_the_named_tensor(standin, tmp_path):
    path = _linked_copy(standin, tmp_path / "copy")
    index = json.loads((standin / INDEX).read_text())
    index["weight_map"][HEAD] = index["weight_map"][EMBED]
    _replace(path / INDEX, json.dumps(index))
    with pytest.raises(TapsError, match=f"{path / index['weight_map'][EMBED]} does not hold {HEAD}"):
        read_verifier_parts(str(path))


def test_shapes_that_disagree_with_the_config(standin, tmp_path):
    path = _linked_copy(standin, tmp_path / "copy")
    config = json.loads((standin / "config.json").read_text())
    _replace(path / "config.json", json.dumps({**config, "vocab_size": 128_000}))
    with pytest.raises(TapsError, match=rf"{EMBED} has shape \[128256, 64\] but {path}/config.json implies \[128000, 64\]"):
        read_verifier_parts(str(path))


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_safetensors(standin, tmp_path, damage):
    path = _linked_copy(standin, tmp_path / "copy")
    shard = path / _weight_map(standin)[EMBED]
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\xff" * 64)
    with pytest.raises(TapsError, match=f"{shard} is not a valid safetensors file"):
        read_verifier_parts(str(path))


def test_integer_embedding_is_refused(tmp_path):
    path = _tiny_llama(tmp_path / "int8", tied=False)
    state = load_file(path / "model.safetensors")
    state[EMBED] = state[EMBED].to(torch.int8)
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TapsError, match=rf"{path / 'model.safetensors'}: {EMBED} is stored as I8"):
        read_verifier_parts(str(path))


def test_untied_checkpoint_without_a_head_is_refused(tmp_path):
    """transformers would initialise a random head here, so the drafter must not pretend it is tied."""
    path = _tiny_llama(tmp_path / "headless", tied=False)
    state = load_file(path / "model.safetensors")
    del state[HEAD]
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TapsError, match=rf"{path / 'model.safetensors'} has no tensor {HEAD} and config.json does not tie it"):
        read_verifier_parts(str(path))


# Peak RSS of this process image (VmHWM): ru_maxrss would carry over the pytest parent's peak across exec.
_PEAK_RSS = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    from taps_train.verifier.parts import read_verifier_parts
    def peak():
        return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
    before = peak()
    if sys.argv[2] == "parts":
        parts = read_verifier_parts(sys.argv[1])
        tensors = [parts.embedding, parts.lm_head]
    else:
        tensors = list(AutoModelForCausalLM.from_pretrained(sys.argv[1]).parameters())
    with torch.no_grad():
        touched = sum(float(t.sum()) for t in tensors)  # fault in every page, as a copy into the drafter would
    print(peak() - before)
    """
)


@pytest.mark.integration
def test_peak_memory_is_the_parts_not_the_model(tmp_path):
    """Default stand-in (8 layers x 1024): reading the parts costs their bytes; loading the model costs all of it."""
    path = build_standin(tmp_path / "standin")
    model_bytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    parts_bytes = 2 * 128_256 * 1024 * 2

    def peak(mode: str) -> int:
        run = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(path), mode], capture_output=True, text=True, check=True)
        return int(run.stdout.split()[-1])

    parts_peak, model_peak = peak("parts"), peak("model")
    print(f"peak RSS growth: parts {parts_peak / 1e6:.0f} MB, full model {model_peak / 1e6:.0f} MB; files: parts {parts_bytes / 1e6:.0f} MB of {model_bytes / 1e6:.0f} MB")
    assert parts_peak < 1.1 * parts_bytes + 64e6
    assert model_peak > 0.9 * model_bytes and model_peak - parts_peak > 0.8 * (model_bytes - parts_bytes)


def test_last_layer_equals_the_loaded_models_and_reads_only_its_tensors(standin):
    model = AutoModelForCausalLM.from_pretrained(standin)
    expected = dict(model.model.layers[-1].named_parameters())
    layer = read_verifier_layer(str(standin))
    assert list(layer) == list(expected)
    for name, tensor in layer.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name]), name


def test_last_layer_of_a_checkpoint_without_the_base_model_prefix(tmp_path):
    """`layers.0.mlp.up_proj.weight` saved from the bare LlamaModel: the longest unique suffix of the name finds it."""
    path = _tiny_llama(tmp_path / "plain", tied=False)
    state = load_file(path / "model.safetensors")
    save_file({k.removeprefix("model."): v for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"})
    layer = read_verifier_layer(str(path))
    assert torch.equal(layer["mlp.up_proj.weight"], state["model.layers.0.mlp.up_proj.weight"])


def test_last_layer_missing_from_the_checkpoint(tmp_path):
    path = _tiny_llama(tmp_path / "cut", tied=False)
    state = load_file(path / "model.safetensors")
    save_file({k: v for k, v in state.items() if ".layers." not in k}, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(TapsError, match=r"has no tensor model.layers.0.self_attn.q_proj.weight; the checkpoint .* is incomplete"):
        read_verifier_layer(str(path))
