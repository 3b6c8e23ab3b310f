"""The tiny verifier build: deterministic, cached, checked, resumable (on a micro spec, seconds)."""

import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from taps_train.errors import TapsError
from taps_train.verifier.offline import tiny
from taps_train.verifier.offline.pretrain import PretrainSchedule, pretrain
from taps_train.verifier.offline.tiny import (
    MANIFEST,
    TinyVerifierSpec,
    build_tiny_verifier,
    check_build,
    ensure_tiny_verifier,
)

MICRO = TinyVerifierSpec(
    vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, seq_len=64, batch_size=2,
    steps=4, warmup_steps=2, chat_conversations=12, math_problems=40, heldout_conversations=4, heldout_problems=8,
    max_doc_tokens=128,
)


@pytest.fixture(scope="module")
def micro_build(tmp_path_factory):
    return build_tiny_verifier(MICRO, home=tmp_path_factory.mktemp("home_a"))


def test_build_writes_a_loadable_hf_directory_with_manifest(micro_build):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = check_build(micro_build)
    assert manifest["spec"]["seed"] == 0 and manifest["parameters"] > 0
    assert manifest["data"]["sharegpt"]["file_records"] == 17_671
    assert set(manifest["heldout_loss"]) == {"gsm_symbolic", "sharegpt"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    model = AutoModelForCausalLM.from_pretrained(micro_build)
    tokenizer = AutoTokenizer.from_pretrained(micro_build)
    assert model.config.vocab_size == len(tokenizer)
    assert not (micro_build.parent / (micro_build.name + ".partial")).exists()


def test_same_seed_gives_same_weights_hash(micro_build, tmp_path):
    again = build_tiny_verifier(MICRO, home=tmp_path)
    files_a, files_b = check_build(micro_build)["files"], check_build(again)["files"]
    assert files_a["model.safetensors"] == files_b["model.safetensors"]
    assert files_a["tokenizer.json"] == files_b["tokenizer.json"]


def test_second_call_reuses_the_cache(micro_build, monkeypatch):
    monkeypatch.setattr(tiny, "_build", lambda *a: pytest.fail("rebuilt an intact cache"))
    began = time.perf_counter()
    assert ensure_tiny_verifier(MICRO, home=micro_build.parent.parent) == micro_build
    assert time.perf_counter() - began < 2


def test_corrupt_cache_is_refused_then_rebuilt(tmp_path):
    path = build_tiny_verifier(MICRO, home=tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(TapsError, match="missing model.safetensors.*--force"):
        ensure_tiny_verifier(MICRO, home=tmp_path)
    (path / MANIFEST).write_text("{")
    with pytest.raises(TapsError, match="no readable"):
        ensure_tiny_verifier(MICRO, home=tmp_path)
    assert build_tiny_verifier(MICRO, home=tmp_path) == path
    check_build(path)


def test_tampered_weights_fail_the_checksum(tmp_path):
    path = build_tiny_verifier(MICRO, home=tmp_path)
    with open(path / "model.safetensors", "r+b") as file:
        file.seek(-4, 2)
        file.write(b"\x00\x01\x02\x03")
    with pytest.raises(TapsError, match="corrupt model.safetensors"):
        check_build(path)


def test_interrupted_pretraining_resumes_to_the_same_weights(tmp_path, monkeypatch):
    blocks = torch.randint(0, 50, (12, 16))
    schedule = PretrainSchedule(steps=6, batch_size=2, lr=1e-2, warmup_steps=2)

    def fresh_model():
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1))

    straight = fresh_model()
    pretrain(straight, blocks, schedule, seed=1, state_path=tmp_path / "a.pt", checkpoint_every=3)

    calls = {"n": 0}
    real_clip = torch.nn.utils.clip_grad_norm_

    def crash_on_fifth_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real_clip(*args, **kwargs)

    interrupted = fresh_model()
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", crash_on_fifth_step)
    with pytest.raises(KeyboardInterrupt):
        pretrain(interrupted, blocks, schedule, seed=1, state_path=tmp_path / "b.pt", checkpoint_every=3)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real_clip)
    resumed = fresh_model()
    losses = pretrain(resumed, blocks, schedule, seed=1, state_path=tmp_path / "b.pt", checkpoint_every=3)
    assert len(losses) == 3  # steps 4..6 only
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
