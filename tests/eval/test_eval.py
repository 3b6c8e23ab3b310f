"""`taps-train eval` reports and the validation-time AcceptanceLengthCallback, on a tiny random verifier."""

import json
from pathlib import Path

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from taps_train.cli import main
from taps_train.data.datamodule import DrafterDataModule
from taps_train.eval.callback import AcceptanceLengthCallback
from taps_train.eval.report import read_report
from taps_train.training import Eagle2Module

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"
REPORT_KEYS = {"verifier", "drafters", "strategy", "temperature", "tree", "benchmarks", "average_acceptance_length"}
BENCHMARK_KEYS = {"acceptance_length", "verify_calls", "new_tokens", "prompts", "mean_tree_tokens", "accept_rate_by_depth", "wall_time_s"}


@pytest.fixture
def recipe(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    path = tmp_path / "recipe.yaml"
    path.write_text("name: t\nseed: 0\nmax_length: 256\nsources:\n  - source: gsm_symbolic\n    args: {size: 40, seed: 3}\n    heldout: 4\n    count: 16\n")
    return str(path)


def fit(module, recipe, verifier_dir, tmp_path, callbacks, steps=2, **kwargs) -> Trainer:
    trainer = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, callbacks=callbacks, num_sanity_val_steps=0, **kwargs)
    trainer.fit(module, datamodule=DrafterDataModule(recipe, verifier=str(verifier_dir), batch_size=4))
    return trainer


@pytest.fixture
def checkpoint(recipe, random_verifier_dir, tmp_path) -> Path:
    fit(Eagle2Module(verifier=str(random_verifier_dir)), recipe, random_verifier_dir, tmp_path,
        [ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)], limit_val_batches=0)
    return tmp_path / "ck" / "last.ckpt"


def test_eval_writes_one_contract_report_per_temperature(checkpoint, random_verifier_dir, tmp_path, capsys):
    main(["eval", "--drafters", str(checkpoint), "--verifier", str(random_verifier_dir),
          "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}",
          "--prompts", "2", "--max-new-tokens", "8", "--temperatures", "0", "1", "--output", str(tmp_path / "r.json"),
          "--total-tokens", "12", "--depth", "2", "--top-k", "3"])
    for temperature in ("0", "1"):
        path = tmp_path / f"r_T{temperature}.json"
        assert read_report(path).to_json() == path.read_text()  # the writer's output is what the reader accepts, unchanged
        report = json.loads(path.read_text())
        assert REPORT_KEYS <= set(report) and report["temperature"] == float(temperature)
        assert report["tree"] == {"total_tokens": 12, "depth": 2, "top_k": 3}
        assert report["machine"]["threads"] >= 1 and report["machine"]["processor"]  # what timed it, for readers comparing speedups
        for name in ("gsm8k", "mt_bench"):
            result = report["benchmarks"][name]
            assert BENCHMARK_KEYS <= set(result)
            assert result["prompts"] == 2 and result["verify_calls"] > 0
            assert result["acceptance_length"] == pytest.approx(result["new_tokens"] / result["verify_calls"])
            assert 1.0 <= result["acceptance_length"] <= 4.0  # at most depth + 2 tokens per call
            assert result["mean_tree_tokens"] <= 12
            assert len(result["prompt_new_tokens"]) == len(result["prompt_verify_calls"]) == 2
            assert sum(result["prompt_new_tokens"]) == result["new_tokens"] and sum(result["prompt_verify_calls"]) == result["verify_calls"]
            low, high = result["tau_ci95"]
            assert low <= high and low >= min(n / c for n, c in zip(result["prompt_new_tokens"], result["prompt_verify_calls"])) - 1e-9
    assert "acceptance length" in capsys.readouterr().out


def test_eval_refuses_a_drafter_of_another_verifier(checkpoint, other_verifier_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--drafters", str(checkpoint), "--verifier", str(other_verifier_dir),
              "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--output", str(tmp_path / "r.json")])
    assert exit_info.value.code == 1
    assert "was trained against verifier" in capsys.readouterr().err


def test_callback_logs_tau_and_the_best_checkpoint_follows_it(recipe, random_verifier_dir, tmp_path):
    callback = AcceptanceLengthCallback(benchmarks=[f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}"], prompts_per_benchmark=2, max_new_tokens=6,
                                        total_tokens=10, depth=2, top_k=3)
    best = ModelCheckpoint(dirpath=tmp_path / "best", filename="best-{step}", monitor="val/tau", mode="max", save_top_k=1)
    trainer = fit(Eagle2Module(verifier=str(random_verifier_dir)), recipe, random_verifier_dir, tmp_path, [callback, best],
                  steps=4, val_check_interval=2, limit_val_batches=1)
    metrics = trainer.callback_metrics
    assert 1.0 <= float(metrics["val/tau"]) <= 4.0
    assert float(metrics["val/tau/gsm8k"]) == pytest.approx(float(metrics["val/tau"]))
    assert float(metrics["val/tau_seconds"]) > 0
    assert best.best_model_path and Path(best.best_model_path).exists()
