"""bench/peer_speculators.py's export of taps-train's EAGLE-3 feature cache to speculators' layout, on the random
verifier: the rows and hidden states speculators reads are the cache's samples (training then validation), its last
state gives back the cache's post-norm targets through the verifier's norm, and its token frequencies are the training
samples' loss tokens alone. (speculators itself is not installed here; the bench runs it in its own venv.)"""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from datasets import load_from_disk
from safetensors.torch import load_file, save_file

from taps_train.errors import TapsError
from tests.bench.test_learning_curves import config  # noqa: F401 (fixture)
from tests.conftest import bench_script

ROOT = Path(__file__).resolve().parents[2]
peer_module = bench_script("peer_speculators")

pytestmark = pytest.mark.usefixtures("taps_home")


@pytest.fixture
def verifier_dir(random_verifier_dir, tmp_path) -> Path:
    """The random verifier with a final norm whose weights are not all 1, so that dividing by them shows."""
    directory = tmp_path / "verifier"
    shutil.copytree(random_verifier_dir, directory)
    weights = load_file(directory / "model.safetensors")
    weights["model.norm.weight"] = torch.linspace(0.5, 2.0, weights["model.norm.weight"].numel())
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


@pytest.fixture
def curve(config, verifier_dir, tmp_path) -> Path:
    """The learning-curve tests' curve as a peer comparison's: one EAGLE-3 run, evaluated in vLLM."""
    raw = yaml.safe_load(config.read_text())
    raw.update(name="peer_test", fit_config=str(ROOT / "configs" / "tiny" / "eagle3_math.yaml"), verifier=str(verifier_dir),
               samples=[12], steps=[2], evaluations={"vllm_chain3": {"args": ["--engine", "vllm", "--speculative-tokens", 3]}})
    config.write_text(yaml.safe_dump(raw))
    return config


def test_the_export_is_the_cache_in_speculators_layout(curve, verifier_dir, tmp_path):
    curves = peer_module.Curves.read(str(curve))
    directory = tmp_path / "export"
    summary = peer_module.export_for_speculators(curves, 12, 3, directory)

    assert summary["samples"] == 12 and summary["validation_samples"] == 3 and summary["tokens_per_step"] == 4096
    assert summary["draft_vocab_size"] == round(0.25 * json.loads((verifier_dir / "config.json").read_text())["vocab_size"])
    rows = load_from_disk(str(directory / "dataset"))
    assert rows.format["type"] == "torch"  # what speculators reads: tensors
    rows = rows.with_format(None)
    assert len(rows) == 15 and summary["tokens"] == sum(rows["seq_len"][:12])
    norm = load_file(verifier_dir / "model.safetensors")["model.norm.weight"].float()
    cache = peer_module.learning_curves  # the run's cache, read as training reads it
    from taps_train.data.datamodule import DrafterDataModule

    fit = yaml.safe_load(Path(cache.write_run_files(curves, 12)).read_text())["data"]["init_args"]
    module = DrafterDataModule(**(fit | {"recipe": str(directory.parent / "recipe_with_validation.yaml")}),
                               verifier_states=tuple(summary["feature_layers"]))
    module.setup("fit")
    [train] = module.train_set.datasets
    frequencies = {}
    for index, position in enumerate(train.positions):
        sample, row = train.cache[position], rows[index]
        states = load_file(directory / "hidden_states" / f"hs_{index}.safetensors")
        assert torch.equal(states["token_ids"], sample["input_ids"]) and row["input_ids"] == sample["input_ids"].tolist()
        assert row["loss_mask"] == sample["loss_mask"].long().tolist() and row["seq_len"] == len(sample["input_ids"])
        hidden = states["hidden_states"].float()
        assert hidden.shape == (len(sample["input_ids"]), 4, norm.numel())
        assert torch.allclose(hidden[:, :3].flatten(1), sample["features"], atol=1e-2, rtol=1e-2)
        last = hidden[:, 3]
        renormed = norm * last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + 1e-5)  # what speculators' verifier_norm gives
        assert torch.allclose(renormed, sample["targets"], atol=3e-2, rtol=3e-2)
        if index < 12:
            for token in sample["input_ids"][sample["loss_mask"]].tolist():
                frequencies[token] = frequencies.get(token, 0) + 1
    assert len(train.positions) == 15
    assert torch.load(directory / "token_freq.pt", weights_only=True) == frequencies

    stamp = (directory / "export.json").stat().st_mtime_ns
    assert peer_module.export_for_speculators(curves, 12, 3, directory) == summary  # done once
    assert (directory / "export.json").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("change, message", [
    ({"validation_samples": 0}, "validation_samples must be a positive count"),
    ({"tokens": 3}, "unexpected keyword argument 'tokens'"),
])
def test_bad_configs_are_one_line(tmp_path, change, message):
    path = tmp_path / "peer.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "curve": "c.yaml", "out": "o"} | change))
    with pytest.raises(TapsError, match=message):
        peer_module.Peer.read(str(path))


def test_the_shipped_config_names_a_curve_of_one_run():
    for path in sorted((ROOT / "bench" / "peer").glob("*.yaml")):
        peer = peer_module.Peer.read(str(path))
        curves = peer_module.Curves.read(str(ROOT / peer.curve))
        assert len(curves.samples) == 1, f"{path}: taps-train's side is one run (its variants are learning_curves.py's, not the comparison's)"


def record(tau_counts: tuple[list[int], list[int]]) -> dict:
    new_tokens, calls = tau_counts
    return {"report": {"benchmarks": {"math_heldout": {"acceptance_length": sum(new_tokens) / sum(calls), "tau_ci95": [1.0, 3.0],
                                                       "prompt_new_tokens": new_tokens, "prompt_verify_calls": calls,
                                                       "speedup": 1.5, "speedup_ci95": [1.2, 1.8]}}}}


def test_a_fresh_clone_with_both_records_trains_nothing_and_writes_the_paired_report(curve, tmp_path, monkeypatch):
    """The committed records are the comparison: no speculators, no checkpoints, no training, the same report."""
    peer = tmp_path / "peer.yaml"
    peer.write_text(yaml.safe_dump({"name": "p", "curve": str(curve), "out": str(tmp_path / "out")}))
    curve.write_text(yaml.safe_dump({**yaml.safe_load(curve.read_text()), "variants": {"lr_high": {"model": {"lr": 0.02}}}}))
    curves = peer_module.Curves.read(str(curve))
    [evaluation] = curves.evaluations
    for variant, counts, seconds in ((None, [40, 30, 50], None), ("lr_high", [20, 30, 40], 90.0)):
        path = curves.record_path(12, 2, evaluation, variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**record((counts, [10, 10, 10])), "trained_seconds": seconds}))
    theirs = peer_module.Peer.read(str(peer)).record_path(evaluation)
    theirs.parent.mkdir(parents=True, exist_ok=True)
    theirs.write_text(json.dumps(record(([30, 30, 30], [10, 10, 10]))))
    monkeypatch.setattr(peer_module.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    monkeypatch.setattr(peer_module, "export_for_speculators", lambda *a: pytest.fail("exported"))
    monkeypatch.setattr(sys, "argv", ["peer_speculators.py", "--config", str(peer)])
    peer_module.main()
    rows = [line for line in (tmp_path / "out" / "report.md").read_text().splitlines() if line.startswith("| ")]
    assert rows[0] == "| math_heldout | τ | minus speculators [paired 95%] | speedup | training time |"
    assert rows[2].startswith("| taps-train | 4.00 [1.00, 3.00] | +1.00 [") and rows[2].endswith("| 1.50x [1.20, 1.80] |  |")  # paired over 3 prompts
    assert rows[3].startswith("| taps-train lr_high | 3.00 [1.00, 3.00] | +0.00 [") and rows[3].endswith("| 1.5 min |")
    assert rows[4] == "| speculators | 3.00 [1.00, 3.00] | | 1.50x [1.20, 1.80] | |"
