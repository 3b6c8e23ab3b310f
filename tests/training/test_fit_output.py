"""What a `fit` prints: a progress bar that stays true when training is bounded by steps, and no
checkpoint-directory warning on a fresh run whose logs live beside its checkpoints."""

import io
import warnings
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger

from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import Eagle2Module
from taps_train.training.checkpointing import LastCheckpoint, RunCheckpoint
from taps_train.training.progress import StepRichProgressBar, StepTQDMProgressBar

RECIPE = "name: t\nseed: 0\nmax_length: 128\nsources:\n  - source: gsm_symbolic\n    args: {size: 20, seed: 3}\n    heldout: 2\n    count: 8\n"


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    path.write_text(RECIPE)
    return str(path)


@pytest.fixture(autouse=True)
def taps_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path_factory.getbasetemp() / "fit_output_home"))  # one feature cache for the module


def fit(recipe: str, verifier_dir: Path, run: Path, **trainer_args) -> Trainer:
    """Two steps, bounded by max_steps (Lightning's max_epochs stays -1), as the shipped configs train."""
    trainer_args.setdefault("logger", False)
    trainer = Trainer(accelerator="cpu", max_steps=2, limit_val_batches=0, enable_model_summary=False, default_root_dir=run, **trainer_args)
    trainer.fit(Eagle2Module(verifier=str(verifier_dir)), datamodule=DrafterDataModule(recipe, verifier=str(verifier_dir), batch_size=4))
    return trainer


def test_rich_bar_reads_epoch_and_steps_not_a_negative_epoch_total(recipe, random_verifier_dir, tmp_path):
    screen = io.StringIO()
    bar = RichProgressBar(leave=True, console_kwargs={"file": screen, "force_terminal": True, "width": 200})
    trainer = fit(recipe, random_verifier_dir, tmp_path, callbacks=[bar])
    shown = screen.getvalue()
    assert "Epoch 0" in shown and "step: 2/2" in shown and "/-2" not in shown
    assert type(trainer.progress_bar_callback) is StepRichProgressBar and trainer.progress_bar_callback._leave  # the user's settings kept


def test_tqdm_bar_shows_steps_of_max_steps(recipe, random_verifier_dir, tmp_path, capsys):
    trainer = fit(recipe, random_verifier_dir, tmp_path, callbacks=[TQDMProgressBar(refresh_rate=1)])
    assert type(trainer.progress_bar_callback) is StepTQDMProgressBar
    assert "step=2/2" in capsys.readouterr().out


class OwnBar(RichProgressBar):
    """A user's own bar class."""


@pytest.mark.parametrize(("options", "expected"), [({"enable_progress_bar": False}, type(None)), ({"callbacks": [OwnBar()]}, OwnBar)],
                         ids=["disabled", "own-class"])
def test_a_disabled_or_custom_bar_stays_as_chosen(recipe, random_verifier_dir, tmp_path, options, expected):
    assert type(fit(recipe, random_verifier_dir, tmp_path, **options).progress_bar_callback) is expected


def run_layout(run: Path, checkpoint: type[ModelCheckpoint]) -> dict:
    """The shipped configs' layout: CSV logs in <run>/logs, the best and the periodic checkpoints in <run>."""
    return {"logger": CSVLogger(save_dir=run, name="logs"), "enable_progress_bar": False,
            "callbacks": [checkpoint(dirpath=run, filename="best-{step}"), LastCheckpoint(dirpath=run, every_n_train_steps=1, save_last=True)]}


def directory_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "Checkpoint directory" in str(w.message)]


@pytest.mark.parametrize(("checkpoint", "warns"), [(ModelCheckpoint, True), (RunCheckpoint, False)], ids=["lightning", "run"])
def test_a_fresh_run_warns_only_with_lightnings_checkpoint(recipe, random_verifier_dir, tmp_path, checkpoint, warns):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(recipe, random_verifier_dir, tmp_path / "run", **run_layout(tmp_path / "run", checkpoint))
    assert bool(directory_warnings(caught)) == warns  # Lightning's: the CSV logs made the directory non-empty


def test_a_directory_holding_checkpoints_still_warns(recipe, random_verifier_dir, tmp_path):
    run = tmp_path / "run"
    fit(recipe, random_verifier_dir, run, **run_layout(run, RunCheckpoint))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(recipe, random_verifier_dir, run, **run_layout(run, RunCheckpoint))
    found = directory_warnings(caught)
    assert found and all(w.startswith(f"Checkpoint directory {run} already holds 3 checkpoint(s) (best-step=2.ckpt, epoch=0-step=2.ckpt, last.ckpt)")
                         for w in found)


def test_a_second_run_replaces_its_checkpoints_rather_than_saving_beside_them(recipe, random_verifier_dir, tmp_path):
    """Lightning's version counter would save `last-v1.ckpt` and leave `last.ckpt`, which eval and export read, the old run's."""
    run = tmp_path / "run"
    fit(recipe, random_verifier_dir, run, **run_layout(run, RunCheckpoint))
    first = (run / "last.ckpt").stat().st_mtime_ns
    fit(recipe, random_verifier_dir, run, **run_layout(run, RunCheckpoint))
    assert sorted(path.name for path in run.glob("*.ckpt")) == ["best-step=2.ckpt", "epoch=0-step=2.ckpt", "last.ckpt"]
    assert (run / "last.ckpt").stat().st_mtime_ns > first
