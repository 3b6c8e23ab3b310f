"""The tiny verifier's job (the README's offline default before the main job moved to SmolLM2, which
tests/real/test_real_verifier.py runs shortened), shortened: `fit` with the shipped tiny HASS config, then `eval` of
its checkpoint. Training must clearly improve loss and accuracy; τ must beat 1."""

import csv
import json
from pathlib import Path

import pytest

from taps_train.cli import main
from tests.conftest import machine_threads

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_fit_then_eval_on_the_tiny_verifier(tiny_verifier_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the config's relative checkpoint/log paths land in tmp_path
    with machine_threads():  # the job as a user's process runs it
        main(["fit", "--config", str(ROOT / "configs" / "tiny" / "hass_mixed.yaml"),
              "--data.init_args.recipe", str(ROOT / "data_recipes" / "tiny_mixed.yaml"),
              "--trainer.max_steps", "120", "--trainer.val_check_interval", "60", "--trainer.limit_val_batches", "5"])
    metrics = next((tmp_path / "checkpoints" / "tiny_hass_mixed" / "logs").glob("*/metrics.csv"))
    rows = list(csv.DictReader(metrics.read_text().splitlines()))
    train = [r for r in rows if r.get("train/loss")]
    val = [r for r in rows if r.get("val/loss")]
    assert float(train[-1]["train/loss"]) < 0.8 * float(train[0]["train/loss"])
    assert float(val[-1]["val/acc_top1_step1"]) > 0.2
    assert float(val[-1]["val/tau"]) > 1.5
    checkpoint = tmp_path / "checkpoints" / "tiny_hass_mixed" / "last.ckpt"
    assert checkpoint.exists()
    main(["eval", "--drafters", str(checkpoint), "--benchmarks", "math_heldout", "--prompts", "2", "--max-new-tokens", "32",
          "--output", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["benchmarks"]["math_heldout"]["acceptance_length"] > 1.5

