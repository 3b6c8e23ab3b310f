"""Eagle2Module / HassModule with the real Lightning Trainer on a tiny random verifier."""

import math
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from taps_train.data.datamodule import DrafterDataModule
from taps_train.errors import TapsError
from taps_train.training import Eagle2Module, HassModule
from taps_train.training.base import lr_factor


@pytest.fixture
def recipe(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: tiny_test\nseed: 0\nmax_length: 256\nsources:\n"
        "  - source: gsm_symbolic\n    args: {size: 80, seed: 3}\n    heldout: 8\n    count: 48\n"
    )
    return str(path)


def data(recipe: str, verifier: Path, **kwargs) -> DrafterDataModule:
    return DrafterDataModule(recipe, verifier=str(verifier), batch_size=4, **kwargs)


def trainer(tmp_path: Path, max_steps: int, **kwargs) -> Trainer:
    return Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   num_sanity_val_steps=0, limit_val_batches=0, gradient_clip_val=0.5, gradient_clip_algorithm="value",
                   default_root_dir=tmp_path, **kwargs)


def drafter_weights(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.drafter.state_dict().items()}


@pytest.mark.parametrize("module_class", [Eagle2Module, HassModule])
def test_training_reduces_the_loss(module_class, recipe, random_verifier_dir, tmp_path):
    dm = data(recipe, random_verifier_dir)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    module = module_class(verifier=str(random_verifier_dir), lr=3e-3, feature_noise=0.0)
    before = module.step_losses(batch, train=False)[1]
    trainer(tmp_path, max_steps=40, enable_checkpointing=False).fit(module, datamodule=dm)
    after = module.step_losses(batch, train=False)[1]
    # A random verifier's next-token distribution is nearly uniform (soft CE ~ ln|V| whatever we do),
    # but its features are learnable, and the drafter's agreement with its argmax rises.
    assert after["feature_loss_step1"] < 0.85 * before["feature_loss_step1"]
    assert after["acc_top5_step1"] > before["acc_top5_step1"]


def test_hass_logs_every_alignment_step(recipe, random_verifier_dir):
    dm = data(recipe, random_verifier_dir)
    dm.prepare_data()
    dm.setup("fit")
    loss, logs = HassModule(verifier=str(random_verifier_dir)).step_losses(next(iter(dm.train_dataloader())), train=True)
    for step in (1, 2, 3):
        assert {f"feature_loss_step{step}", f"prob_loss_step{step}", f"topk_loss_step{step}", f"acc_top1_step{step}"} <= set(logs)
    assert math.isfinite(loss.item())


def test_checkpoint_holds_only_trainable_drafter_weights(recipe, random_verifier_dir, tmp_path):
    module = HassModule(verifier=str(random_verifier_dir))
    trainer(tmp_path, max_steps=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(module, datamodule=data(recipe, random_verifier_dir))
    checkpoint = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    keys = set(checkpoint["state_dict"])
    assert "drafter.fc.weight" in keys and "drafter.fc.bias" in keys
    assert not {"drafter.embed_tokens.weight", "drafter.lm_head.weight"} & keys
    assert checkpoint["taps"]["drafter_config"]["num_hidden_layers"] == 1
    assert checkpoint["taps"]["verifier"] == module.verifier_fingerprint


class KillAtStep(Callback):
    """Simulates a crash: the run dies when it reaches `step` (after earlier checkpoints were written)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


def seeded_hass(verifier: Path, optimizer: str = "adamw") -> HassModule:
    torch.manual_seed(0)  # what `seed_everything` does in the CLI: same initial drafter weights
    return HassModule(verifier=str(verifier), optimizer=optimizer, lr=3e-3, warmup_steps=3, schedule="cosine")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_mid_epoch_ends_with_the_same_weights(recipe, random_verifier_dir, tmp_path, optimizer):
    """12 batches per epoch; the run dies at step 7 (mid-epoch 0), resumes from the step-6 checkpoint
    and finishes at step 16 (mid-epoch 1): same weights as a run that never stopped (the optimizer's
    momentum, both optimizers' for muon, travels in the checkpoint)."""
    straight = seeded_hass(random_verifier_dir, optimizer)
    trainer(tmp_path / "a", max_steps=16, enable_checkpointing=False).fit(straight, datamodule=data(recipe, random_verifier_dir))

    crashed = seeded_hass(random_verifier_dir, optimizer)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "b", every_n_train_steps=6, save_top_k=-1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer(tmp_path / "b", max_steps=16, callbacks=[ckpt, KillAtStep(7)]).fit(crashed, datamodule=data(recipe, random_verifier_dir))
    saved = tmp_path / "b" / "epoch=0-step=6.ckpt"
    assert saved.exists(), list((tmp_path / "b").iterdir())

    resumed = seeded_hass(random_verifier_dir, optimizer)
    resumed_trainer = trainer(tmp_path / "c", max_steps=16, enable_checkpointing=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed_trainer.fit(resumed, datamodule=data(recipe, random_verifier_dir), ckpt_path=saved)
    assert not [w for w in caught if "not resumable" in str(w.message)]  # it is: the loader starts past the trained batches
    assert resumed_trainer.global_step == 16
    for (name, a), b in zip(drafter_weights(straight).items(), drafter_weights(resumed).values()):
        torch.testing.assert_close(a, b, msg=name)
    assert not torch.equal(drafter_weights(crashed)["fc.weight"], drafter_weights(straight)["fc.weight"])


def test_checkpoint_from_another_verifier_is_refused(recipe, random_verifier_dir, other_verifier_dir, tmp_path):
    module = Eagle2Module(verifier=str(random_verifier_dir))
    trainer(tmp_path, max_steps=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(module, datamodule=data(recipe, random_verifier_dir))
    with pytest.raises(TapsError, match="trained against verifier"):
        Eagle2Module(verifier=str(other_verifier_dir), init_from=str(tmp_path / "ck" / "last.ckpt"))
    other = Eagle2Module(verifier=str(other_verifier_dir))
    with pytest.raises(TapsError, match="trained against verifier"):
        trainer(tmp_path / "o", max_steps=2).fit(other, datamodule=data(recipe, other_verifier_dir), ckpt_path=tmp_path / "ck" / "last.ckpt")


def test_warm_start_loads_drafter_weights_only(recipe, random_verifier_dir, tmp_path):
    module = Eagle2Module(verifier=str(random_verifier_dir), lr=1e-2)
    trainer(tmp_path, max_steps=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(module, datamodule=data(recipe, random_verifier_dir))
    warm = Eagle2Module(verifier=str(random_verifier_dir), init_from=str(tmp_path / "ck" / "last.ckpt"))
    for (name, a), b in zip(drafter_weights(module).items(), drafter_weights(warm).values()):
        torch.testing.assert_close(a, b, msg=name)


def test_non_finite_loss_stops_naming_step_and_batch(recipe, random_verifier_dir, tmp_path):
    module = Eagle2Module(verifier=str(random_verifier_dir))
    with torch.no_grad():
        module.drafter.fc.weight[0, 0] = float("nan")
    with pytest.raises(TapsError, match="non-finite training loss .* global step 0, batch 0"):
        trainer(tmp_path, max_steps=2, enable_checkpointing=False).fit(module, datamodule=data(recipe, random_verifier_dir))


def test_lr_schedule_shapes():
    assert lr_factor(0, 100, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(10, 100, 10, "cosine", 0.1) == pytest.approx(1.0)
    assert lr_factor(100, 100, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert lr_factor(55, 100, 10, "linear", 0.0) == pytest.approx(0.5)
    assert lr_factor(99, 100, 10, "constant", 0.0) == 1.0


def test_bad_module_arguments_are_clear(random_verifier_dir):
    with pytest.raises(TapsError, match="unknown model.schedule"):
        Eagle2Module(verifier=str(random_verifier_dir), schedule="exponential")
    with pytest.raises(TapsError, match="align_steps"):
        HassModule(verifier=str(random_verifier_dir), align_steps=0)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_that_emulates_it_warns(recipe, random_verifier_dir, tmp_path, monkeypatch, native):
    """The smol configs train in bf16-mixed, which pays only where the CPU computes bf16 (AVX512-BF16 or AMX)."""
    monkeypatch.setattr("taps_train.training.base.native_bf16", lambda: native)
    module = Eagle2Module(verifier=str(random_verifier_dir))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, max_steps=1, enable_checkpointing=False, precision="bf16-mixed").fit(module, datamodule=data(recipe, random_verifier_dir))
    emulated = [str(w.message) for w in caught if "is emulated there" in str(w.message)]
    assert len(emulated) == (0 if native else 1)
    assert not emulated or "set trainer.precision: 32-true" in emulated[0]
