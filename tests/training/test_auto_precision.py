"""`trainer.precision: auto`: bf16-mixed where the hardware computes bfloat16, 32-true where a CPU would emulate it."""

import json

import pytest
import torch

from taps_train.cli import main
from taps_train.training.trainer import Trainer, auto_precision
from tests.training.test_fit_output import RECIPE


@pytest.fixture
def cpu_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16-mixed"), (False, "32-true")])
@pytest.mark.parametrize("accelerator", ["auto", "cpu"])
def test_a_cpu_trains_in_bf16_only_where_it_computes_bf16(cpu_only, monkeypatch, native, expected, accelerator):
    monkeypatch.setattr("taps_train.training.trainer.native_bf16", lambda: native)
    precision, reason = auto_precision(accelerator)
    assert precision == expected and ("emulated" in reason) is not native
    trainer = Trainer(precision="auto", accelerator=accelerator, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.precision == expected


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bf16-mixed"), (False, "16-mixed")])
def test_a_gpu_trains_in_bf16_where_it_has_it_else_fp16(monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a GPU")
    monkeypatch.setattr("taps_train.training.trainer.native_bf16", lambda: False)
    assert [auto_precision(a)[0] for a in ("auto", "gpu", "cuda")] == [expected] * 3
    assert auto_precision("cpu")[0] == "32-true"  # a CPU run on a GPU machine: the CPU's rule
    assert auto_precision("mps")[0] == "32-true"


def test_other_precisions_stay_lightnings(cpu_only):
    assert Trainer(precision="bf16-mixed", accelerator="cpu", logger=False).precision == "bf16-mixed"
    assert Trainer(accelerator="cpu", logger=False).precision == "32-true"  # Lightning's default
    with pytest.raises(ValueError, match="Precision 'fast' is invalid"):
        Trainer(precision="fast", accelerator="cpu", logger=False)


@pytest.mark.parametrize("native", [True, False])
def test_taps_train_fit_resolves_auto_and_says_what_it_chose(cpu_only, monkeypatch, tmp_path, random_verifier_dir, native):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("taps_train.training.trainer.native_bf16", lambda: native)
    said = []
    monkeypatch.setattr("taps_train.training.trainer.rank_zero_info", said.append)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    config = {
        "trainer": {"accelerator": "cpu", "precision": "auto", "max_steps": 1, "limit_val_batches": 0, "logger": False,
                    "enable_checkpointing": False, "enable_model_summary": False, "default_root_dir": str(tmp_path / "run")},
        "model": {"class_path": "taps_train.training.Eagle2Module", "init_args": {"verifier": str(random_verifier_dir)}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe), "batch_size": 4}},
    }
    path = tmp_path / "fit.yaml"
    path.write_text(json.dumps(config))
    main(["fit", "--config", str(path)])
    expected = "bf16-mixed" if native else "32-true"
    assert len(said) == 1 and said[0].startswith(f"trainer.precision auto: {expected} (")
