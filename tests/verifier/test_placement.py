"""Devices and dtypes of the real-verifier path (issue 10): where the verifier runs and in which
precision, what training holds of it, and what the cache fingerprint records."""

import pytest
import torch
from safetensors.torch import load_file

from taps_train.cli import main
from taps_train.data.feature_cache import CacheSettings
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.eval.callback import AcceptanceLengthCallback
from taps_train.training import HassModule
from tests.training.test_training import data, recipe, trainer  # noqa: F401 (fixture)


def test_module_reads_embedding_and_head_without_building_the_verifier(random_verifier_dir, monkeypatch):
    from transformers import LlamaForCausalLM

    def refuse(*args, **kwargs):
        raise AssertionError("the verifier model was loaded")

    real_init, built = LlamaForCausalLM.__init__, []

    def shapes_only(self, *args, **kwargs):  # building on the meta device (names and shapes, no storage) is fine
        real_init(self, *args, **kwargs)
        built.append({p.device.type for p in self.parameters()})

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", refuse)
    monkeypatch.setattr(LlamaForCausalLM, "__init__", shapes_only)
    module = HassModule(verifier=str(random_verifier_dir))
    assert all(devices == {"meta"} for devices in built)
    stored = load_file(random_verifier_dir / "model.safetensors")
    assert torch.equal(module.drafter.embed_tokens.weight, stored["model.embed_tokens.weight"])
    assert torch.equal(module.drafter.lm_head.weight, stored["lm_head.weight"])
    assert not module.drafter.embed_tokens.weight.requires_grad and not module.drafter.lm_head.weight.requires_grad


@pytest.mark.parametrize(("precision", "frozen"), [("bf16-mixed", torch.bfloat16), ("32-true", torch.float32)])
def test_frozen_parts_follow_the_training_precision_once(precision, frozen, recipe, random_verifier_dir, tmp_path):  # noqa: F811
    dm = data(recipe, random_verifier_dir)
    module = HassModule(verifier=str(random_verifier_dir), feature_noise=0.0)
    trainer(tmp_path, max_steps=2, enable_checkpointing=False, precision=precision).fit(module, datamodule=dm)
    assert module.drafter.embed_tokens.weight.dtype == frozen and module.drafter.lm_head.weight.dtype == frozen
    assert module.drafter.fc.weight.dtype == torch.float32  # trainable weights stay in full precision
    frozen_params = [p for p in module.parameters() if not p.requires_grad]
    assert len(frozen_params) == 2  # no float32 duplicate kept anywhere in the module


def test_online_mode_and_callback_share_one_verifier_in_the_chosen_dtype(recipe, random_verifier_dir, tmp_path, monkeypatch):  # noqa: F811
    import taps_train.training.base as modules

    loads = []
    real = modules.load_verifier
    monkeypatch.setattr(modules, "load_verifier", lambda *a, **k: loads.append((a, k)) or real(*a, **k))
    dm = data(recipe, random_verifier_dir, online=True)
    module = HassModule(verifier=str(random_verifier_dir), verifier_dtype="bfloat16", feature_noise=0.0)
    callback = AcceptanceLengthCallback(benchmarks=["gsm8k:tests/fixtures/benchmarks/gsm8k.jsonl"], prompts_per_benchmark=1, max_new_tokens=4)
    run = trainer(tmp_path, max_steps=2, enable_checkpointing=False, callbacks=[callback])
    run.limit_val_batches = 1
    run.val_check_interval = 2
    run.fit(module, datamodule=dm)
    assert len(loads) == 1, "online features and the τ callback must share one verifier per process"
    verifier = module.frozen_verifier().model
    assert {p.dtype for p in verifier.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in verifier.parameters()} == {"cpu"}
    assert callback._verifier is verifier
    assert "frozen_verifier" not in str(module.state_dict().keys()) and not any(k.startswith("_verifier") for k in module.state_dict())


def test_cache_fingerprint_records_the_compute_dtype(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    def built(dtype: str) -> torch.Tensor:
        preparer = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", CacheSettings(), "cpu", dtype)
        [cache] = preparer.build(preparer.sources())
        assert cache.manifest["fingerprint"]["compute_dtype"] == dtype
        return cache

    fp32, bf16 = built("float32"), built("bfloat16")
    assert fp32.directory != bf16.directory
    a, b = (load_file(cache.directory / cache.shards[0]["file"])["features"] for cache in (fp32, bf16))
    assert a.dtype == b.dtype == torch.bfloat16  # stored in the cache dtype whatever the compute dtype
    assert not torch.equal(a, b) and torch.allclose(a.float(), b.float(), atol=0.1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "cuda"], "--device cuda needs CUDA"),
        (["--device", "tpu"], "unknown verifier device 'tpu'"),
        (["--verifier-dtype", "int8"], "unknown verifier compute dtype 'int8'"),
    ],
)
@pytest.mark.parametrize("command", ["cache", "eval"])
def test_bad_placement_is_one_line_before_any_work(command, argv, message, recipe, random_verifier_dir, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("taps_train.verifier.loading.AutoModelForCausalLM.from_pretrained", lambda *a, **k: pytest.fail("verifier loaded"))
    base = {"cache": ["cache", "--recipe", recipe, "--cache-dir", str(tmp_path / "c")],
            "eval": ["eval", "--drafters", str(tmp_path / "none.ckpt")]}[command]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, "--verifier", str(random_verifier_dir), *argv])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_tied_verifier_parts_stay_one_tensor_through_the_precision_cast(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from taps_train.drafter import Drafter, drafter_config

    verifier = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, tie_word_embeddings=True))
    drafter = Drafter(drafter_config(verifier.config))
    drafter.load_verifier_parts(verifier)
    drafter.cast_verifier_parts(torch.bfloat16)
    assert drafter.embed_tokens.weight is drafter.lm_head.weight and drafter.lm_head.weight.dtype == torch.bfloat16
    assert len([p for p in drafter.parameters() if not p.requires_grad]) == 1
