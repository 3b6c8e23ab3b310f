"""DeepSpeed ZeRO-2 and ZeRO-3 on two gloo CPU processes (`DS_ACCELERATOR=cpu`, the test-only strategy
in tests/training/deepspeed_cpu.py): fit, SIGKILL, resume to the same weights as an uninterrupted run;
checkpoints without the frozen verifier parts; eval / export / average / init_from / consolidate of the
checkpoint directory; the τ callback under ZeRO-3 equal to single-process decoding of the same weights.

The first DeepSpeed process JIT-builds a shared-memory op (~3.5 min on 2 cores), cached afterwards
under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("deepspeed")

from taps_train.cli import main  # noqa: E402
from taps_train.drafter.checkpoint import read_checkpoint  # noqa: E402
from taps_train.eval.callback import AcceptanceLengthCallback  # noqa: E402
from taps_train.training import HassModule  # noqa: E402

pytestmark = pytest.mark.deepspeed

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "benchmarks" / "gsm8k.jsonl"
STRATEGIES = {
    2: {"stage": 2},
    # Threshold 0: partition every parameter, however small (the default keeps tensors under 100k elements whole).
    3: {"config": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}},
}
TAU = {"benchmarks": [f"gsm8k:{GSM8K}"], "prompts_per_benchmark": 3, "max_new_tokens": 8, "total_tokens": 12, "depth": 3, "top_k": 4}
STEPS, KILL_AT, SAVE_EVERY = 6, 4, 3


def _config(root: Path, verifier: Path, recipe: Path, stage: int, precision: str, kill: bool) -> dict:
    callbacks = [
        # 3 prompts over 2 ranks: the ranks decode different numbers of prompts (no collective may hide in decoding).
        {"class_path": "taps_train.eval.callback.AcceptanceLengthCallback", "init_args": TAU},
        # the shipped configs' callback: each checkpoint directory written under a temporary name, renamed by rank 0
        {"class_path": "taps_train.training.checkpointing.LastCheckpoint",
         "init_args": {"dirpath": str(root), "save_last": True, "every_n_train_steps": SAVE_EVERY, "save_top_k": -1}},
    ]
    if kill:
        callbacks.append({"class_path": "tests.training.deepspeed_cpu.KillAtStep", "init_args": {"step": KILL_AT}})
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 2, "precision": precision, "max_steps": STEPS,
            "strategy": {"class_path": "tests.training.deepspeed_cpu.CpuDeepSpeedStrategy", "init_args": STRATEGIES[stage]},
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(root), "name": "logs"}},
            "enable_progress_bar": False, "limit_val_batches": 1, "val_check_interval": SAVE_EVERY, "num_sanity_val_steps": 0,
            "default_root_dir": str(root), "callbacks": callbacks,
        },
        "model": {"class_path": "taps_train.training.HassModule", "init_args": {"verifier": str(verifier), "lr": 1e-3}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe), "batch_size": 2}},
    }


def _fit(work: Path, root: Path, config: dict, *extra: str) -> subprocess.CompletedProcess:
    path = root.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TAPS_HOME": str(work / "home"), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "taps_train", "fit", "--config", str(path), *extra],
                          capture_output=True, text=True, timeout=900, env=env, cwd=work)


@pytest.fixture(scope="module", params=[(2, "32-true"), (3, "bf16-mixed")], ids=["zero2-fp32", "zero3-bf16"])
def runs(request, tmp_path_factory, random_verifier_dir) -> dict:
    """One uninterrupted run, one killed after step 4 and resumed from its step-3 checkpoint."""
    stage, precision = request.param
    work = tmp_path_factory.mktemp(f"zero{stage}")
    recipe = work / "recipe.yaml"
    recipe.write_text("name: ds\nseed: 0\nmax_length: 256\nsources:\n  - source: gsm_symbolic\n    args: {size: 60, seed: 5}\n    heldout: 4\n    count: 24\n")
    straight, crashed = work / "straight", work / "crashed"
    done = _fit(work, straight, _config(straight, random_verifier_dir, recipe, stage, precision, kill=False))
    assert done.returncode == 0, done.stderr[-3000:]
    killed = _fit(work, crashed, _config(crashed, random_verifier_dir, recipe, stage, precision, kill=True))
    assert killed.returncode != 0 and not (crashed / f"epoch=0-step={STEPS}.ckpt").exists()
    resumed = _fit(work, crashed, _config(crashed, random_verifier_dir, recipe, stage, precision, kill=False),
                   "--ckpt_path", str(crashed / "last.ckpt"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"stage": stage, "precision": precision, "work": work, "straight": straight, "crashed": crashed, "verifier": random_verifier_dir}


def test_killed_and_resumed_run_ends_with_the_uninterrupted_weights(runs):
    final = f"epoch=0-step={STEPS}.ckpt"
    straight, resumed = read_checkpoint(runs["straight"] / final), read_checkpoint(runs["crashed"] / final)
    assert straight["global_step"] == resumed["global_step"] == STEPS
    assert straight["state_dict"].keys() == resumed["state_dict"].keys()
    for name, weight in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], weight, rtol=0, atol=0, msg=name)
    first = read_checkpoint(runs["straight"] / f"epoch=0-step={SAVE_EVERY}.ckpt")
    assert any(not torch.equal(first["state_dict"][n], w) for n, w in straight["state_dict"].items())  # training moved them


def test_checkpoints_leave_the_frozen_verifier_parts_out(runs):
    states = sorted((runs["straight"] / "last.ckpt" / "checkpoint").glob("*model_states.pt"))
    assert states
    for path in states:
        client = torch.load(path, map_location="cpu", weights_only=True)
        assert not [k for k in client["module"] if "embed_tokens" in k or "lm_head" in k]
        assert not client.get("frozen_param_fragments")
        assert set(client["taps"]) == {"drafter_config", "verifier", "trained_tokens"}
    checkpoint = read_checkpoint(runs["straight"] / "last.ckpt")
    assert sorted(checkpoint["state_dict"]) == sorted(f"drafter.{n}" for n, p in _module(runs).drafter.named_parameters() if p.requires_grad)


def test_eval_export_average_and_warm_start_read_the_directory(runs, tmp_path):
    directory = runs["straight"] / "last.ckpt"
    consolidated = tmp_path / "drafter.ckpt"
    main(["consolidate", str(directory), "--output", str(consolidated)])
    assert read_checkpoint(consolidated)["taps"] == read_checkpoint(directory)["taps"]
    reports = {}
    for name, path in (("dir", directory), ("file", consolidated)):
        main(["eval", "--drafters", str(path), "--verifier", str(runs["verifier"]), "--benchmarks", f"gsm8k:{GSM8K}", "--prompts", "2",
              "--max-new-tokens", "6", "--total-tokens", "8", "--depth", "2", "--top-k", "3", "--output", str(tmp_path / f"{name}.json")])
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())["benchmarks"]["gsm8k"]
    assert reports["dir"]["acceptance_length"] == reports["file"]["acceptance_length"] and reports["dir"]["new_tokens"] > 0
    main(["export", str(directory), "--out", str(tmp_path / "export"), "--verifier", str(runs["verifier"]), "--dtype", "float32"])
    assert (tmp_path / "export" / "model.safetensors").is_file() and (tmp_path / "export" / "config.json").is_file()
    main(["average", "--drafters", str(directory), str(consolidated), "--output", str(tmp_path / "avg.ckpt")])
    averaged = read_checkpoint(tmp_path / "avg.ckpt")["state_dict"]
    for name, weight in read_checkpoint(consolidated)["state_dict"].items():
        torch.testing.assert_close(averaged[name], weight)
    warm = HassModule(verifier=str(runs["verifier"]), init_from=str(directory))
    torch.testing.assert_close(warm.drafter.fc.weight, read_checkpoint(consolidated)["state_dict"]["drafter.fc.weight"])


def test_tau_logged_during_training_equals_single_process_decoding_of_the_same_weights(runs):
    logged = [row for row in _metrics(runs["straight"]) if row.get("val/tau")]
    assert [int(row["step"]) for row in logged] == [SAVE_EVERY - 1, STEPS - 1]  # Lightning logs validation at step - 1
    module = _module(runs, init_from=runs["straight"] / f"epoch=0-step={STEPS}.ckpt")
    counts = AcceptanceLengthCallback(**TAU).measure(module)
    new, calls = counts["gsm8k"]
    assert float(logged[-1]["val/tau"]) == pytest.approx(new / calls, abs=1e-6)


def _module(runs: dict, init_from: Path | None = None) -> HassModule:
    """A single-process module; under bf16-mixed its trained weights are rounded to bf16 as the engine's were."""
    module = HassModule(verifier=str(runs["verifier"]), init_from=str(init_from) if init_from else None)
    if runs["precision"].startswith("bf16"):
        with torch.no_grad():
            for parameter in module.drafter.parameters():
                if parameter.requires_grad:
                    parameter.copy_(parameter.to(torch.bfloat16).float())
    return module


def _metrics(root: Path) -> list[dict]:
    import csv

    with open(next(root.glob("logs/version_*/metrics.csv"))) as f:
        return list(csv.DictReader(f))
