"""Checkpoints count the tokens their run trained on (the x axis of bench/learning_curves.py): every unpadded token
of every training batch, carried over a resume, refused in one line when damaged."""

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from taps_train.errors import TapsError
from taps_train.training import Eagle2Module
from tests.training.test_training import data, recipe, trainer  # noqa: F401  (recipe is a fixture)


def unpadded_tokens(datamodule, steps: int) -> int:
    batches = iter(datamodule.train_dataloader())
    return sum(int(next(batches)["attention_mask"].sum()) for _ in range(steps))


def test_trained_tokens_count_every_unpadded_training_token_and_survive_a_resume(recipe, random_verifier_dir, tmp_path):  # noqa: F811
    module = Eagle2Module(verifier=str(random_verifier_dir))
    datamodule = data(recipe, random_verifier_dir)
    trainer(tmp_path, max_steps=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(module, datamodule=datamodule)
    counted = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)["taps"]["trained_tokens"]
    assert counted == module.trained_tokens() == unpadded_tokens(datamodule, 2) > 0

    resumed = Eagle2Module(verifier=str(random_verifier_dir))
    trainer(tmp_path, max_steps=3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck2", save_last=True)]).fit(
        resumed, datamodule=data(recipe, random_verifier_dir), ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert counted < torch.load(tmp_path / "ck2" / "last.ckpt", weights_only=True)["taps"]["trained_tokens"] == resumed.trained_tokens()


@pytest.mark.parametrize("value", [-1, "many", 2.5, True, None])
def test_a_damaged_token_count_is_refused_in_one_line(recipe, random_verifier_dir, tmp_path, value):  # noqa: F811
    module = Eagle2Module(verifier=str(random_verifier_dir))
    trainer(tmp_path, max_steps=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)]).fit(
        module, datamodule=data(recipe, random_verifier_dir))
    checkpoint = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    checkpoint["taps"]["trained_tokens"] = value
    with pytest.raises(TapsError, match="taps.trained_tokens is .*not a token count"):
        Eagle2Module(verifier=str(random_verifier_dir)).on_load_checkpoint(checkpoint)
