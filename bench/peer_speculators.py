"""EAGLE-3 drafters trained by taps-train and by speculators 0.9 (vllm-project) side by side, on the same data.

Both train on the same samples with the same verifier hidden states, the same tokens per step, the same number of
steps and the same draft vocabulary size; each keeps its own recipe otherwise (loss, optimizer, schedule, training-time
test depth). Both are served by vLLM CPU and evaluated on the same prompts; the report gives each τ with its interval
and the paired difference.

- taps-train's side is one learning-curve run (bench/learning_curves.py: `samples[0]` conversations, to `steps[-1]`).
- speculators' side reads taps-train's EAGLE-3 feature cache exported to its layout (`data/` under the work folder:
  an Arrow dataset of input_ids / loss_mask / seq_len, `hidden_states/hs_<i>.safetensors` with the three fused verifier
  layers and the verifier's last state, `token_freq.pt` for its draft vocabulary), so it never needs the vLLM server
  it would otherwise ask for hidden states. The cache stores the post-norm last state y; speculators wants the pre-norm
  one and applies the verifier's norm itself, so it gets y / w (w the norm's weight): RMSNorm(y / w) = y up to the
  norm's epsilon. Its validation split (it insists on one) is the `validation_samples` after the run's, on which
  neither trains. It runs on a CPU through bench/peer/speculators_cpu.py, in the python speculators is installed in.

Resumable: taps-train's fit as any curve run; speculators from its last epoch's checkpoint; every evaluation is a
record of its own under `<out>/records/` (committed), so a fresh clone writes the same report with `--report-only`.

    python bench/peer_speculators.py --config bench/peer/speculators_eagle3_math.yaml \
        --speculators-python /path/to/speculators-venv/bin/python --engine-python .vllm/bin/python
"""

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

from taps_train import files
from taps_train.errors import TapsError
from taps_train.eval.plots import tau_difference
from taps_train.home import taps_home
from taps_train.user_yaml import read_yaml

BENCH = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("learning_curves", BENCH / "learning_curves.py")
learning_curves = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning_curves)
Curves, Evaluation = learning_curves.Curves, learning_curves.Evaluation
T = TypeVar("T")


@dataclass(frozen=True)
class Peer:
    name: str
    curve: str  # a learning-curve config: its first size and last step are taps-train's run; its evaluations, both drafters'
    out: str
    validation_samples: int = 40
    speculators_args: list[str] = field(default_factory=list)  # more `speculators train` options, after the ones set here

    @classmethod
    def read(cls, path: str) -> "Peer":
        raw = read_yaml(path, "peer comparison config", "see bench/peer/*.yaml")
        try:
            peer = cls(**raw)
        except TypeError as err:
            raise TapsError(f"peer comparison config {path}: {err}; see bench/peer/*.yaml for the fields") from err
        if not isinstance(peer.validation_samples, int) or peer.validation_samples < 1:
            raise TapsError(f"peer comparison config {path}: validation_samples must be a positive count (speculators needs a validation split)")
        return peer

    @property
    def work(self) -> Path:
        return taps_home() / "peer" / self.name

    def record_path(self, evaluation: Evaluation) -> Path:
        return Path(self.out) / "records" / f"speculators_{evaluation.name}.json"


# --- speculators' data: taps-train's feature cache in its layout --------------------------------------------------------


def export_for_speculators(curves: Curves, samples: int, validation: int, directory: Path) -> dict:
    """Write `directory` (once; a kill loses the export, seconds): the run's `samples` training conversations then
    `validation` more, from the feature cache of the run's fit config (built here first where missing: the run then
    finds it). What the training needs to know about the data is returned (and kept in `export.json`)."""
    summary = directory / "export.json"
    if summary.exists():
        return json.loads(summary.read_text())
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    from taps_train.data.datamodule import DrafterDataModule
    from taps_train.drafter.config import vocab_tokens
    from taps_train.drafter.eagle3 import default_feature_layers
    from taps_train.features import FEATURES, TARGETS
    from taps_train.verifier.loading import read_verifier_files

    config = read_yaml(str(learning_curves.write_run_files(curves, samples)), "fit config", "")
    model, data = config["model"]["init_args"], dict(config["data"]["init_args"])
    verifier = read_verifier_files(curves.verifier)
    layers = tuple(model.get("feature_layers") or default_feature_layers(verifier.config.num_hidden_layers))
    recipe = read_yaml(data["recipe"], "recipe", "")
    recipe["sources"][0]["count"] += validation
    recipe["name"] += f"_and_{validation}_validation"
    directory.parent.mkdir(parents=True, exist_ok=True)
    recipe_path = directory.parent / "recipe_with_validation.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    data.update(recipe=str(recipe_path), verifier=curves.verifier)
    module = DrafterDataModule(**data, verifier_states=layers)
    module.prepare_data()
    module.setup("fit")
    [train] = module.train_set.datasets
    norm = final_norm_weight(Path(verifier.path))
    if bool((norm == 0).any()):
        raise TapsError(f"verifier {curves.verifier}: its final norm has zero weights, so its pre-norm state cannot be recovered")
    rows, frequencies = {"input_ids": [], "loss_mask": [], "seq_len": []}, Counter()
    with files.atomic_directory(directory) as staging:
        (staging / "hidden_states").mkdir()
        for index, position in enumerate(train.positions):
            sample = train.cache[position]
            features = sample[FEATURES].view(len(sample["input_ids"]), len(layers), -1)
            last = (sample[TARGETS] / norm)[:, None, :]
            save_file({"hidden_states": torch.cat([features, last], dim=1).to(torch.bfloat16).contiguous(),
                       "token_ids": sample["input_ids"].contiguous()}, staging / "hidden_states" / f"hs_{index}.safetensors")
            rows["input_ids"].append(sample["input_ids"].tolist())
            rows["loss_mask"].append(sample["loss_mask"].long().tolist())
            rows["seq_len"].append(len(sample["input_ids"]))
            if index < samples:  # the draft vocabulary comes from the training samples alone, as taps-train's does
                frequencies.update(sample["input_ids"][sample["loss_mask"]].tolist())
        dataset = Dataset.from_dict(rows)
        dataset.set_format(type="torch")  # speculators compares its rows' tensors with the hidden-state files' token ids
        dataset.save_to_disk(str(staging / "dataset"))
        torch.save(dict(frequencies), staging / "token_freq.pt")
        body = {"samples": samples, "validation_samples": validation, "tokens": sum(rows["seq_len"][:samples]),
                "feature_layers": list(layers), "draft_vocab_size": vocab_tokens(model["draft_vocab_size"], verifier.config.vocab_size, "draft_vocab_size"),
                "tokens_per_step": data_tokens_per_step(config), "verifier_dir": str(verifier.path)}
        (staging / "export.json").write_text(json.dumps(body, indent=1) + "\n")
    return body


def final_norm_weight(verifier_dir: Path):
    """The verifier's final RMSNorm weight, from whichever of its safetensors files holds it."""
    from taps_train.verifier.loading import open_safetensors

    for path in sorted(verifier_dir.glob("*.safetensors")):
        with open_safetensors(path) as handle:
            if "model.norm.weight" in handle.keys():
                return handle.get_tensor("model.norm.weight").float()
    raise TapsError(f"verifier {verifier_dir}: no model.norm.weight in its safetensors files; the export needs its final norm")


def data_tokens_per_step(config: dict) -> int:
    """Tokens in one of the fit's steps: its batches' token cap (speculators packs `--total-seq-len` tokens per step)."""
    cap = config["data"]["init_args"].get("max_tokens_per_batch")
    if not cap:
        raise TapsError("the curve's fit config sets no data.max_tokens_per_batch; the comparison needs equal tokens per step")
    return int(cap)


# --- speculators' training ---------------------------------------------------------------------------------------------


def train_speculators(peer: Peer, data: dict, steps: int, python: str) -> Path:
    """Train (or resume) speculators' drafter to `steps`; its final checkpoint directory."""
    done = peer.work / "trained.json"
    if done.exists():
        return Path(json.loads(done.read_text())["checkpoint"])
    save = peer.work / "checkpoints"
    epochs = math.ceil(steps * data["tokens_per_step"] / data["tokens"]) + 1  # max_steps stops it; packing leaves steps short of full
    command = [python, str(BENCH / "peer" / "speculators_cpu.py"), "--speculator-type", "eagle3",
               "--verifier-name-or-path", data["verifier_dir"], "--data-path", str(peer.work / "data" / "dataset"),
               "--hidden-states-path", str(peer.work / "data" / "hidden_states"), "--save-path", str(save),
               "--total-seq-len", str(data["tokens_per_step"]), "--max-steps", str(steps), "--epochs", str(epochs),
               "--train-data-ratio", repr((data["samples"] + 0.5) / (data["samples"] + data["validation_samples"])),
               "--target-layer-ids", *map(str, data["feature_layers"]), "--draft-vocab-size", str(data["draft_vocab_size"]),
               "--token-freq-path", str(peer.work / "data" / "token_freq.pt"), "--hidden-states-dtype", "float32",
               "--on-missing", "raise", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--num-workers", "0",
               "--log-dir", str(peer.work / "logs"), *peer.speculators_args]
    print(f"[peer] {' '.join(command)}", flush=True)
    if subprocess.run(command, env=os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).returncode != 0:
        raise TapsError(f"speculators' training failed (its output is above); rerun to resume it from its last epoch's checkpoint in {save}")
    checkpoint = max((d for d in save.iterdir() if d.is_dir() and not d.is_symlink() and d.name.isdigit()), key=lambda d: int(d.name))
    files.write_text(done, json.dumps({"checkpoint": str(checkpoint), "steps": steps}, indent=1) + "\n")
    return checkpoint


def timed(path: Path, train: Callable[[], T]) -> T:
    """`train()`, its wall time kept in `path` (JSON) the first time it is called: a resumed call times only its part."""
    began = time.perf_counter()
    result = train()
    if not path.exists():
        files.write_text(path, json.dumps({"seconds": round(time.perf_counter() - began, 1)}) + "\n")
    return result


# --- report --------------------------------------------------------------------------------------------------------------


def write_report(peer: Peer, curves: Curves) -> Path:
    """One table per evaluation and benchmark: each taps-train run of the curve (its recipe, then each variant's) against
    speculators' drafter, paired over the same prompts."""
    samples, step = curves.samples[0], curves.steps[-1]
    fit = f"`{curves.fit_config}` with {learning_curves.changes(curves.overrides)}" if curves.overrides else f"`{curves.fit_config}`"
    lines = [f"# EAGLE-3 side by side: taps-train and speculators 0.9 ({peer.name})", "",
             f"Both trained on the first {samples:,} conversations of `{curves.recipe}` (verifier `{curves.verifier}`, the same "
             f"feature cache), {step:,} steps of the same tokens per step, the same draft vocabulary size; taps-train with "
             f"{fit} and, in further rows, each recipe variant of the curve config on top of it; speculators with its own defaults "
             f"(bench/peer_speculators.py lists what is set). τ at T=0 with 95% intervals over prompts; the difference is paired "
             f"over the same prompts. Reproduce: `python bench/peer_speculators.py --config <this config>`.", ""]
    runs = {"taps-train": None, **{f"taps-train {variant}": variant for variant in curves.variants}}
    for evaluation in curves.evaluations:
        theirs_path = peer.record_path(evaluation)
        ours = {label: json.loads(path.read_text()) for label, variant in runs.items()
                if (path := curves.record_path(samples, step, evaluation, variant)).exists()}
        if not (ours and theirs_path.exists()):
            continue
        theirs = json.loads(theirs_path.read_text())["report"]["benchmarks"]
        lines += [f"## {evaluation.name}: `taps-train eval {' '.join(evaluation.args)}`", ""]
        for name in sorted(theirs):
            lines += [f"| {name} | τ | minus speculators [paired 95%] | speedup | training time |", "| --- | --- | --- | --- | --- |"]
            for label, record in ours.items():
                if (a := record["report"]["benchmarks"].get(name)) is not None:
                    lines.append(f"| {label} | {tau_cell(a)} | {learning_curves.difference_cell(a, theirs[name])} | {speedup_cell(a)} | "
                                 f"{learning_curves.minutes_cell(record)} |")
            lines += [f"| speculators | {tau_cell(theirs[name])} | | {speedup_cell(theirs[name])} | |", ""]
    times = {who: json.loads(path.read_text())["seconds"] for who, path in
             (("taps-train", peer.work / "taps_train.json"), ("speculators", peer.work / "speculators.json")) if path.exists()}
    if times:
        lines += ["Training wall time of the side-by-side fits on this machine (the first call of each; a resumed run counts only "
                  "its last part): " + ", ".join(f"{who} {seconds:,.0f} s ({seconds / step:.2f} s a step)" for who, seconds in times.items())
                  + ". The variants' training time is their fit's own (Lightning's Timer).", ""]
    path = Path(peer.out) / "report.md"
    files.write_text(path, "\n".join(lines))
    return path


def tau_cell(result: dict) -> str:
    interval = result.get("tau_ci95")
    return f"{result['acceptance_length']:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def speedup_cell(result: dict) -> str:
    interval = result.get("speedup_ci95")
    if not result.get("speedup"):
        return ""
    return f"{result['speedup']:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--speculators-python", help="a python with speculators 0.9 installed (CPU torch)")
    parser.add_argument("--engine-python", default=os.environ.get("TAPS_ENGINE_PYTHON"), help="a python with vLLM, for vLLM evaluations")
    parser.add_argument("--report-only", action="store_true", help="write the report from the records; train and evaluate nothing")
    args = parser.parse_args()
    try:
        if args.engine_python:  # regenerated replies are kept per engine: the export, the fit and the curves read vLLM's
            os.environ["TAPS_ENGINE_PYTHON"] = args.engine_python
        peer = Peer.read(args.config)
        curves = Curves.read(peer.curve)
        samples, step = curves.samples[0], curves.steps[-1]
        if not args.report_only:
            ours = curves.pending(samples)
            theirs = [e for e in curves.evaluations if not peer.record_path(e).exists()]
            if theirs and not args.speculators_python:
                raise TapsError("--speculators-python is required to train speculators' drafter (or pass --report-only)")
            if ours or theirs:  # first: the cache it builds holds the validation samples too, and the fit finds it
                data = export_for_speculators(curves, samples, peer.validation_samples, peer.work / "data")
            if ours:
                timed(peer.work / "taps_train.json", lambda: learning_curves.train(curves, samples))
                for at, evaluation in ours:
                    learning_curves.evaluate(curves, samples, at, evaluation, args.engine_python)
            if theirs:
                checkpoint = timed(peer.work / "speculators.json", lambda: train_speculators(peer, data, step, args.speculators_python))
                for evaluation in theirs:
                    report = learning_curves.eval_report(checkpoint, curves.verifier, evaluation, args.engine_python)
                    body = {"trainer": "speculators", "samples": samples, "step": step, "evaluation": evaluation.name,
                            "eval_args": evaluation.args, "report": report}
                    files.write_text(peer.record_path(evaluation), json.dumps(body, indent=1, sort_keys=True) + "\n")
        print(f"[peer] report: {write_report(peer, curves)}")
    except TapsError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
