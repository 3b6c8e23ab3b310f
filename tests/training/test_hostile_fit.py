"""Hostile fit configs: wrong shapes, alias bombs, class paths that are no module, trainer, datamodule and module
options out of range, a draft vocabulary larger than the verifier's, a checkpoint of another backbone."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from taps_train.data.datamodule import DrafterDataModule
from taps_train.drafter.config import vocab_tokens
from taps_train.errors import TapsError
from taps_train.fit_config import check_trainer_options, fit_config_problems
from tests.conftest import BOMB, one_line_error


@pytest.mark.parametrize("config, problem", [
    ({"trainer": [1, 2], "model": {}, "data": {}}, "trainer must be a mapping, got list"),
    ({"model": {"class_path": "x", "init_args": [1]}}, "model.init_args must be a mapping"),
    ({"trainer": {"callbacks": "foo"}}, "trainer.callbacks[0] must be a mapping"),
    ({"trainer": {"logger": {"class_path": "x", "init_args": "s"}}}, "trainer.logger[0].init_args must be a mapping"),
    ({"data": {"class_path": 3}}, "data.class_path must be a dotted class name"),
    ([1, 2], "the file must be a mapping of sections"),
])
def test_fit_config_shapes(config, problem):
    assert problem in fit_config_problems(config)[0]


def test_fit_refuses_a_config_alias_bomb_and_a_list_trainer(tmp_path, capsys, taps_home):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    assert "more than 64 aliases" in one_line_error(capsys, ["fit", "--config", str(tmp_path / "bomb.yaml")])
    (tmp_path / "list.yaml").write_text("trainer: [1, 2]\nmodel: {}\ndata: {}\n")
    assert "trainer must be a mapping" in one_line_error(capsys, ["fit", "--config", str(tmp_path / "list.yaml")])


def test_a_bad_class_path_is_one_line_naming_the_key_and_nothing_runs(tmp_path, capsys, taps_home):
    marker = tmp_path / "PWNED"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}},
                                                     "data": {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(marker)]}}}))
    err = one_line_error(capsys, ["fit", "--config", str(tmp_path / "c.yaml")])
    assert err.startswith(f"taps-train: error: fit config {tmp_path / 'c.yaml'}: Parser key") and not marker.exists()


@pytest.mark.parametrize("trainer, key", [({"max_steps": -5}, "trainer.max_steps"), ({"log_every_n_steps": 0}, "trainer.log_every_n_steps"),
                                          ({"gradient_clip_val": math.nan}, "trainer.gradient_clip_val"),
                                          ({"limit_val_batches": -1}, "trainer.limit_val_batches")])
def test_trainer_bounds(trainer, key):
    with pytest.raises(TapsError, match=key):
        check_trainer_options(trainer)
    check_trainer_options({"max_steps": -1, "max_epochs": None, "log_every_n_steps": 5, "limit_val_batches": 0.5})


@pytest.mark.parametrize("options, key", [
    ({"batch_size": 0}, "data.batch_size"), ({"batch_size": -1}, "data.batch_size"), ({"max_tokens_per_batch": 0}, "data.max_tokens_per_batch"),
    ({"max_tokens_per_batch": 100}, "smaller than one sample"), ({"val_samples_per_source": -1}, "data.val_samples_per_source"),
    ({"seed": -3}, "data.seed"),
])
def test_datamodule_options_out_of_range(random_verifier_dir, options, key):
    recipe = Path(__file__).parents[2] / "data_recipes" / "tiny_math.yaml"
    with pytest.raises(TapsError, match=key):
        DrafterDataModule(str(recipe), verifier=str(random_verifier_dir), **options)


def test_a_file_as_cache_dir_is_refused(random_verifier_dir, tmp_path):
    (tmp_path / "file").write_text("x")
    recipe = Path(__file__).parents[2] / "data_recipes" / "tiny_math.yaml"
    with pytest.raises(TapsError, match="data.cache_dir"):
        DrafterDataModule(str(recipe), verifier=str(random_verifier_dir), cache_dir=str(tmp_path / "file"))


@pytest.mark.parametrize("options, key", [({"lr": math.nan}, "model.lr"), ({"lr": -1e-3}, "model.lr"), ({"lr": 0.0}, "model.lr"),
                                          ({"warmup_steps": -2}, "model.warmup_steps"), ({"betas": (0.9, 1.5)}, "model.betas"),
                                          ({"topk": 0}, "model.topk"), ({"feature_noise": math.inf}, "model.feature_noise")])
def test_module_options_out_of_range(random_verifier_dir, options, key):
    from taps_train.training import Eagle2Module

    with pytest.raises(TapsError, match=key):
        Eagle2Module(verifier=str(random_verifier_dir), **options)


def test_draft_vocabulary_larger_than_the_verifiers_is_refused():
    with pytest.raises(TapsError, match="exceeds the verifier's vocabulary of 100 tokens"):
        vocab_tokens(101, 100, "draft_vocab_size")
    assert vocab_tokens(100, 100, "draft_vocab_size") == 100 and vocab_tokens(0.5, 100, "draft_vocab_size") == 50


def test_a_checkpoint_of_another_backbone_is_refused_before_loading(random_verifier_dir, tmp_path):
    from taps_train.training import Eagle2Module, Eagle3Module

    eagle3 = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=0.5)
    trained = {f"drafter.{k}": v for k, v in eagle3.drafter.state_dict().items() if k not in eagle3.drafter.frozen_parameter_names()}
    checkpoint = {"taps": {"drafter_config": eagle3.drafter.config.to_dict(), "verifier": eagle3.verifier_fingerprint}, "state_dict": trained}
    torch.save(checkpoint, tmp_path / "e3.ckpt")
    eagle2 = Eagle2Module(verifier=str(random_verifier_dir))
    with pytest.raises(TapsError, match=r"holds a LlamaForCausalLMEagle3 .* this Eagle2Module trains a LlamaForCausalLMEagle"):
        eagle2.on_load_checkpoint(checkpoint)
    with pytest.raises(TapsError, match="warm-start checkpoint .* holds a LlamaForCausalLMEagle3"):
        Eagle2Module(verifier=str(random_verifier_dir), init_from=str(tmp_path / "e3.ckpt"))
    hass = Eagle2Module(verifier=str(random_verifier_dir), fc_bias=True)
    with pytest.raises(TapsError, match="with fc bias"):
        Eagle2Module(verifier=str(random_verifier_dir)).on_load_checkpoint(
            {"taps": {"drafter_config": hass.drafter.config.to_dict(), "verifier": hass.verifier_fingerprint}})


def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_training(random_verifier_dir, tmp_path, capsys, taps_home):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: t\nseed: 0\nmax_length: 64\nsources:\n  - source: gsm_symbolic\n    args: {size: 10, seed: 3}\n    heldout: 1\n    count: 4\n")
    config = {"trainer": {"accelerator": "cpu", "max_steps": 1, "logger": False, "default_root_dir": str(tmp_path / "run"),
                          "callbacks": [{"class_path": "taps_train.training.checkpointing.LastCheckpoint",
                                         "init_args": {"dirpath": "/proc/taps-checkpoints", "save_last": True}}]},
              "model": {"class_path": "taps_train.training.Eagle2Module", "init_args": {"verifier": str(random_verifier_dir)}},
              "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe), "batch_size": 2}}}
    path = tmp_path / "fit.yaml"
    path.write_text(json.dumps(config))
    err = one_line_error(capsys, ["fit", "--config", str(path)])
    assert "trainer.callbacks[0].init_args.dirpath /proc/taps-checkpoints is not a writable directory" in err
    assert not (tmp_path / "run").exists()
