"""Fit checkpoints are written whole or not at all (issue 36): Lightning writes a checkpoint in place, so a kill or a
full disk during a save used to leave a truncated `last.ckpt` that `--ckpt_path`, eval and studies then read."""

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer

from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import Eagle2Module
from taps_train.training.checkpointing import LastCheckpoint

pytestmark = [pytest.mark.faults, pytest.mark.usefixtures("taps_home")]

RECIPE = "name: t\nseed: 0\nmax_length: 64\nsources:\n  - source: gsm_symbolic\n    args: {size: 20, seed: 3}\n    heldout: 2\n    count: 8\n"


def test_a_save_cut_short_keeps_the_previous_checkpoint(random_verifier_dir, tmp_path, monkeypatch):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    real_save, saves = Trainer.save_checkpoint, []

    def cut_short(trainer, filepath, weights_only=False):
        saves.append(filepath)
        if len(saves) == 2:  # the second save dies half-way
            with open(filepath, "wb") as handle:
                handle.write(b"half a checkpoint")
            raise RuntimeError("killed during the save")
        real_save(trainer, filepath, weights_only)

    monkeypatch.setattr(Trainer, "save_checkpoint", cut_short)
    run = tmp_path / "run"
    trainer = Trainer(accelerator="cpu", max_steps=4, limit_val_batches=0, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=run,
                      callbacks=[LastCheckpoint(dirpath=run, filename="{step}", every_n_train_steps=2, save_last=True, save_top_k=-1)])
    with pytest.raises(RuntimeError, match="killed during the save"):
        trainer.fit(Eagle2Module(verifier=str(random_verifier_dir)), datamodule=DrafterDataModule(str(recipe), verifier=str(random_verifier_dir),
                                                                                                    batch_size=2))
    assert all(Path(path).name.startswith(".") and path.endswith(".tmp") for path in saves)  # every save went to a temporary name
    written = sorted(p.name for p in run.iterdir() if p.is_file())
    assert written == ["step=2.ckpt"]  # the first save whole; nothing half-written under a name a later run reads
    assert torch.load(run / "step=2.ckpt", map_location="cpu", weights_only=True)["global_step"] == 2
