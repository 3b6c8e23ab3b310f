import json
import shutil

import pytest
import torch

from taps_train.errors import TapsError
from taps_train.verifier import load_verifier


def test_local_directory_loads_frozen_in_eval_mode(random_verifier_dir):
    loaded = load_verifier(str(random_verifier_dir))
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert loaded.model.config.vocab_size == len(loaded.tokenizer)


def test_bfloat16_dtype(random_verifier_dir):
    loaded = load_verifier(str(random_verifier_dir), dtype="bfloat16")
    assert next(loaded.model.parameters()).dtype.is_floating_point and str(loaded.model.dtype) == "torch.bfloat16"


def test_missing_path_names_the_path(tmp_path):
    with pytest.raises(TapsError, match=f"verifier path {tmp_path}/nope does not exist"):
        load_verifier(str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(TapsError, match="has no config.json"):
        load_verifier(str(tmp_path))


def test_non_causal_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(TapsError, match="'vit' model without a causal-LM head"):
        load_verifier(str(tmp_path))


def test_missing_weight_file(random_verifier_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(random_verifier_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(TapsError, match=f"verifier directory {broken} has no model.safetensors"):
        load_verifier(str(broken))


def test_unknown_dtype(random_verifier_dir):
    with pytest.raises(TapsError, match="unknown verifier compute dtype"):
        load_verifier(str(random_verifier_dir), dtype="int3")


def test_pickled_weights_are_refused_not_unpickled(random_verifier_dir, tmp_path, monkeypatch):
    pickled = tmp_path / "pickled"
    shutil.copytree(random_verifier_dir, pickled)
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    monkeypatch.setattr("torch.load", lambda *a, **k: pytest.fail("a pickle was loaded"))
    with pytest.raises(TapsError, match="holds only pickled weights \\(pytorch_model.bin\\).*safetensors"):
        load_verifier(str(pickled))


def test_auto_placement_on_a_cpu_machine_is_float32_cpu(random_verifier_dir):
    loaded = load_verifier(str(random_verifier_dir))
    assert (loaded.placement.device, loaded.placement.dtype) == ("cpu", torch.float32)
    assert {p.device.type for p in loaded.model.parameters()} == {"cpu"}
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_explicit_compute_dtype_is_honoured(random_verifier_dir, dtype):
    loaded = load_verifier(str(random_verifier_dir), device="cpu", dtype=dtype)
    assert {p.dtype for p in loaded.model.parameters()} == {getattr(torch, dtype)}


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "auto-shard"])
def test_cuda_devices_without_cuda_fail_before_loading(random_verifier_dir, device, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("taps_train.verifier.loading.resolve_verifier_path", lambda *a: pytest.fail("got past the device check"))
    with pytest.raises(TapsError, match=f"--device {device} needs CUDA"):
        load_verifier(str(random_verifier_dir), device=device)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "", "tpu:0", "cpu:1"])
def test_unknown_device_is_refused(random_verifier_dir, device, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(TapsError, match="device"):
        load_verifier(str(random_verifier_dir), device=device)


def test_sharded_verifier_with_a_missing_shard_is_one_line(standin, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(standin, broken)
    shard = json.loads((broken / "model.safetensors.index.json").read_text())["weight_map"]["model.layers.0.mlp.up_proj.weight"]
    (broken / shard).unlink()
    with pytest.raises(TapsError, match=f"cannot load verifier weights.*{shard}"):
        load_verifier(str(broken))


def test_verifier_whose_weights_disagree_with_its_config_is_one_line(standin, tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(standin, wrong)
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(TapsError, match=f"cannot load verifier weights/tokenizer from {wrong}"):
        load_verifier(str(wrong))
