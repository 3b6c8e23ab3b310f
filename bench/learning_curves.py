"""Learning curves of a drafter recipe: τ against the tokens it trained on and against its distinct training samples.

One long run per training-set size (the first N conversations of one recipe: prefixes, so every size reads the same
regenerated replies and feature cache), checkpoints kept along it, every checkpoint evaluated as a user would
(`taps-train eval`: `--tree auto` with its speedup, chains in vLLM, ...), each point with its interval over prompts. The
report (markdown + PNG) says what a log-linear fit of τ over the training-set size predicts at 10x and 100x the data.

Recipe choices are compared the same way: each of the config's `variants` (overrides of the fit config's model, data or
trainer arguments) is one more run at the first training-set size, evaluated at the same steps on the same prompts, and
the report gives its τ minus the curve's at each step with a paired interval over the prompts: τ per unit of compute,
not one end point. A variant that changes what a step costs gives its own `steps` (its run's length and schedule), so
that at equal training time both runs are compared at the end of their own decay, not one of them halfway through it.
`overrides` (the same form, without steps) change every run, e.g. to keep a curve's recipe when its fit config moves on.

Resumable from any point: fits resume from their last checkpoint (kept under $TAPS_HOME/curves/<name>, not in the
repository), and every evaluation is a record of its own under `<out>/records/` (committed), so a fresh clone
finds the evaluated points done and writes the same report (`--report-only` never trains or evaluates).

    python bench/learning_curves.py --config bench/curves/smol_eagle2_math.yaml [--report-only] [--engine-python .vllm/bin/python]
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from taps_train import files
from taps_train.errors import TapsError
from taps_train.eval.plots import tau_difference
from taps_train.home import taps_home
from taps_train.user_yaml import read_yaml

CHECKPOINT_CALLBACKS = ("taps_train.training.checkpointing.LastCheckpoint", "taps_train.training.checkpointing.RunCheckpoint")
TIMER = "lightning.pytorch.callbacks.Timer"  # its elapsed training time rides in every checkpoint and survives a resume
EQUAL_TIME = 0.25  # a curve checkpoint counts as "at equal training time" with a variant's within this share of the variant's time
RESUME_EVERY = 25  # steps between the run's last.ckpt saves, whatever steps it evaluates: a kill loses a minute or two
# What a run's own fit config sets and a variant may not: the steps, folders and data of the curve.
CURVE_SETS = {"trainer": {"max_steps", "val_check_interval", "check_val_every_n_epoch", "default_root_dir", "logger", "callbacks"},
              "model": {"verifier"}, "data": {"recipe", "verifier"}}


@dataclass(frozen=True)
class Evaluation:
    """One way of measuring a checkpoint: `taps-train eval` options, at the run's steps `at` (None: every step)."""

    name: str
    args: list[str]
    at: list[int] | None = None


@dataclass(frozen=True)
class Curves:
    name: str
    fit_config: str  # a `taps-train fit` config: model, optimizer, batches; its recipe, steps and folders are replaced
    recipe: str  # a one-source recipe; size N trains on its first N conversations
    samples: list[int]  # training-set sizes, one run each, in this order
    steps: list[int]  # checkpoints evaluated along every run; the last is the run's length (and its schedule's)
    evaluations: list[Evaluation]
    verifier: str
    out: str
    variants: dict[str, dict] = field(default_factory=dict)  # name -> {model|data|trainer: {argument: value}, steps?: [...]}: one run each
    overrides: dict[str, dict] = field(default_factory=dict)  # {model|data|trainer: {argument: value}} of every run (a variant's on top)

    @classmethod
    def read(cls, path: str) -> "Curves":
        raw = read_yaml(path, "learning-curve config", "see bench/curves/*.yaml")
        try:
            evaluations = [Evaluation(name, [str(a) for a in spec["args"]], spec.get("at")) for name, spec in raw.pop("evaluations").items()]
            curves = cls(evaluations=evaluations, **raw)
        except (AttributeError, KeyError, TypeError) as err:
            raise TapsError(f"learning-curve config {path}: {err}; see bench/curves/*.yaml for the fields") from err
        if len(set(curves.samples)) != len(curves.samples) or min(curves.samples) < 1:
            raise TapsError(f"learning-curve config {path}: samples must be distinct positive counts (runs go in their order)")
        for name in curves.variants:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(name)):
                raise TapsError(f"learning-curve config {path}: variant name {name!r} must be letters, digits, '_', '.' or '-' (it names folders)")
        runs_steps = {"steps": curves.steps} | {f"variant {name}'s steps": spec["steps"] for name, spec in curves.variants.items()
                                                 if isinstance(spec, dict) and "steps" in spec}
        for what, steps in runs_steps.items():
            if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s > 0 for s in steps) or sorted(set(steps)) != steps:
                raise TapsError(f"learning-curve config {path}: {what} must be increasing positive counts")
        checkpoints = sorted({step for steps in runs_steps.values() for step in steps})
        for evaluation in curves.evaluations:
            if evaluation.at is not None and not set(evaluation.at) <= set(checkpoints):
                raise TapsError(f"learning-curve config {path}: evaluation {evaluation.name} is at steps {evaluation.at}, "
                                f"not all of them checkpoints of a run (steps {checkpoints})")
        checked = {f"variant {name}": curves.overrides_of(name) for name, spec in curves.variants.items()
                   if not (isinstance(spec, dict) and set(spec) == {"steps"})}  # a variant may change its length alone
        if curves.overrides != {}:  # the default: no change
            checked["overrides"] = curves.overrides
        for what, overrides in checked.items():
            if not isinstance(overrides, dict) or not overrides or not all(isinstance(v, dict) for v in overrides.values()):
                raise TapsError(f"learning-curve config {path}: {what} must map model, data or trainer to the arguments it changes")
            for section, arguments in overrides.items():
                if section not in CURVE_SETS:
                    raise TapsError(f"learning-curve config {path}: {what} changes {section!r}; only model, data and trainer")
                if set(arguments) & CURVE_SETS[section]:
                    raise TapsError(f"learning-curve config {path}: {what} sets {section}.{sorted(set(arguments) & CURVE_SETS[section])[0]}, "
                                    "which the curve sets for every run")
        return curves

    def steps_of(self, variant: str | None) -> list[int]:
        """The checkpoints a run evaluates; the last is the run's length and its schedule's."""
        return self.variants[variant].get("steps", self.steps) if variant else self.steps

    def overrides_of(self, variant: str) -> dict[str, dict]:
        """A variant's changes to the fit config: its spec without its steps."""
        spec = self.variants[variant]
        return {section: arguments for section, arguments in spec.items() if section != "steps"} if isinstance(spec, dict) else spec

    def runs(self) -> list[tuple[str | None, int]]:
        """(variant, samples) of every run in order: the curve's sizes, then each variant at the first size."""
        return [(None, samples) for samples in self.samples] + [(variant, self.samples[0]) for variant in self.variants]

    def pending(self, samples: int, variant: str | None = None) -> list[tuple[int, Evaluation]]:
        """(step, evaluation) of every record of run `samples` not yet written, the trained drafter first: the point a
        user wants most."""
        return [(step, evaluation) for step in reversed(self.steps_of(variant)) for evaluation in self.evaluations
                if (evaluation.at is None or step in evaluation.at) and not self.record_path(samples, step, evaluation, variant).exists()]

    def run_dir(self, samples: int, variant: str | None = None) -> Path:
        curve = taps_home() / "curves" / self.name
        return (curve / variant if variant else curve) / f"n{samples}"

    def record_path(self, samples: int, step: int, evaluation: Evaluation, variant: str | None = None) -> Path:
        records = Path(self.out) / "records"
        return (records / variant if variant else records) / f"n{samples}_step{step}_{evaluation.name}.json"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return run_dir / f"step={step}.ckpt"


# --- training --------------------------------------------------------------------------------------------------------


def write_run_files(curves: Curves, samples: int, variant: str | None = None) -> Path:
    """The recipe of the first `samples` conversations and the fit config of that run, in its folder; the config's path."""
    run_dir = curves.run_dir(samples, variant)
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe = read_yaml(curves.recipe, "recipe", "pass a one-source recipe")
    if len(recipe.get("sources") or []) != 1:
        raise TapsError(f"recipe {curves.recipe}: a learning curve needs a recipe of one source, it has {len(recipe.get('sources') or [])}")
    if samples > recipe["sources"][0]["count"]:
        raise TapsError(f"recipe {curves.recipe} holds {recipe['sources'][0]['count']} training conversations, fewer than {samples}")
    recipe["sources"][0]["count"] = samples
    recipe["name"] = f"{recipe['name']}_n{samples}"
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))

    config = read_yaml(curves.fit_config, "fit config", "pass a taps-train fit config")
    steps = curves.steps_of(variant)
    last, every = steps[-1], math.gcd(*steps)
    trainer = config["trainer"]
    trainer.update(max_steps=last, val_check_interval=last, check_val_every_n_epoch=None, default_root_dir=str(run_dir))
    trainer["logger"]["init_args"]["save_dir"] = str(run_dir)
    callbacks = [c for c in trainer.get("callbacks", []) if c["class_path"] not in (*CHECKPOINT_CALLBACKS, TIMER)]
    callbacks += [{"class_path": CHECKPOINT_CALLBACKS[1], "init_args": {"dirpath": str(run_dir), "filename": "{step}",
                                                                        "every_n_train_steps": every, "save_top_k": -1}},
                  {"class_path": CHECKPOINT_CALLBACKS[0], "init_args": {"dirpath": str(run_dir), "save_last": True, "save_top_k": 0,
                                                                        "every_n_train_steps": min(every, RESUME_EVERY)}},
                  {"class_path": TIMER, "init_args": {"interval": "step", "verbose": False}}]  # a string: the CLI cannot write its enum default back to YAML
    trainer["callbacks"] = callbacks
    config["model"]["init_args"]["verifier"] = curves.verifier
    config["data"]["init_args"].update(recipe=str(run_dir / "recipe.yaml"), verifier=curves.verifier)
    for overrides in (curves.overrides, curves.overrides_of(variant) if variant else {}):
        for section, arguments in overrides.items():
            (trainer if section == "trainer" else config[section]["init_args"]).update(arguments)
    check_resumable(run_dir, config)
    (run_dir / "fit.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir / "fit.yaml"


def check_resumable(run_dir: Path, config: dict) -> None:
    """Refuse to resume a run whose checkpoints trained under another config: `--ckpt_path` would go on with the new
    steps, rates or data from the old run's weights, optimizer and schedule, a mix that no config describes."""
    old_path = run_dir / "fit.yaml"
    if not ((run_dir / "last.ckpt").exists() and old_path.exists()):
        return
    changed = differences(training_part(yaml.safe_load(old_path.read_text())), training_part(config))
    if changed:
        raise TapsError(f"{run_dir} holds checkpoints of a run trained with another config ({', '.join(changed)} changed since: "
                        f"the curve config, its fit config or its overrides); delete {run_dir} to train it afresh, or restore them")


def training_part(config: dict) -> dict:
    """What decides the weights a fit trains to: all of its config but the trainer's folders, logger and callbacks."""
    trainer = {key: value for key, value in config["trainer"].items() if key not in ("default_root_dir", "logger", "callbacks")}
    return {**config, "trainer": trainer}


def differences(old: object, new: object, where: str = "") -> list[str]:
    """The dotted paths at which two parsed YAML documents differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [path for key in sorted(old.keys() | new.keys(), key=str)
                for path in differences(old.get(key), new.get(key), f"{where}.{key}" if where else str(key))]
    return [] if old == new else [where]


def train(curves: Curves, samples: int, variant: str | None = None) -> None:
    """Fit the run of `samples` conversations to its last step, resuming from its last checkpoint."""
    run_dir = curves.run_dir(samples, variant)
    if all(checkpoint_path(run_dir, step).exists() for step in curves.steps_of(variant)):
        return
    command = ["taps-train", "fit", "--config", str(write_run_files(curves, samples, variant))]
    if (run_dir / "last.ckpt").exists():
        command += ["--ckpt_path", str(run_dir / "last.ckpt")]
    print(f"[curves] {run_label(samples, variant)}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)


# --- evaluation ------------------------------------------------------------------------------------------------------


def trained(checkpoint: Path) -> dict:
    """How much training a checkpoint holds: its tokens, and its fit's wall time where the run kept a Timer (older runs
    did not): the basis of τ per unit of compute, for variants that change the cost of a step."""
    import torch

    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    seconds = saved.get("callbacks", {}).get("Timer", {}).get("time_elapsed", {}).get("train")
    return {"trained_tokens": int(saved["taps"]["trained_tokens"])} | ({"trained_seconds": round(seconds, 3)} if seconds is not None else {})


def run_label(samples: int, variant: str | None) -> str:
    return f"{variant} n={samples}" if variant else f"n={samples}"


def evaluate(curves: Curves, samples: int, step: int, evaluation: Evaluation, engine_python: str | None, variant: str | None = None) -> None:
    """One record: the eval report of the checkpoint at `step` of run `samples`, measured `evaluation`'s way."""
    record = curves.record_path(samples, step, evaluation, variant)
    if record.exists():
        return
    checkpoint = checkpoint_path(curves.run_dir(samples, variant), step)
    print(f"[curves] {run_label(samples, variant)} step {step} {evaluation.name}", flush=True)
    report = eval_report(checkpoint, curves.verifier, evaluation, engine_python)
    body = {"samples": samples, "step": step, **trained(checkpoint), "evaluation": evaluation.name,
            "eval_args": evaluation.args, "report": report} | ({"variant": variant} if variant else {})
    files.write_text(record, json.dumps(body, indent=1, sort_keys=True) + "\n")


def eval_report(drafter: Path, verifier: str, evaluation: Evaluation, engine_python: str | None) -> dict:
    """`taps-train eval` of one drafter (a checkpoint, or an export directory vLLM serves) at T=0, `evaluation`'s way."""
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "report.json"
        command = ["taps-train", "eval", "--drafters", str(drafter), "--verifier", verifier, "--temperatures", "0",
                   *evaluation.args, "--output", str(output)]
        if "vllm" in evaluation.args and engine_python:
            command += ["--engine-python", engine_python]
        print(f"[curves] {' '.join(command)}", flush=True)
        subprocess.run(command, check=True)
        [written] = Path(scratch).glob("report*.json")
        return json.loads(written.read_text())


# --- report ----------------------------------------------------------------------------------------------------------


def read_records(curves: Curves) -> list[dict]:
    found = []
    for variant, samples in curves.runs():
        for step in curves.steps_of(variant):
            for evaluation in curves.evaluations:
                path = curves.record_path(samples, step, evaluation, variant)
                if path.exists():
                    found.append(json.loads(path.read_text()))
    return found


def log_linear_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(a, b) of τ = a + b log10(N) by least squares over (N, τ); None below two sizes."""
    if len({n for n, _ in points}) < 2:
        return None
    xs, ys = [math.log10(n) for n, _ in points], [tau for _, tau in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def _interval(values: list[float] | None) -> str:
    return f"[{values[0]:.2f}, {values[1]:.2f}]" if values else ""


def changes(overrides: dict[str, dict]) -> str:
    """"model.lr=0.003, ...": overrides of a fit config as the report names them."""
    return ", ".join(f"{section}.{name}={value}" for section, arguments in overrides.items() for name, value in arguments.items())


def write_report(curves: Curves, records: list[dict]) -> Path:
    out = Path(curves.out)
    out.mkdir(parents=True, exist_ok=True)
    fit = f"`{curves.fit_config}` with {changes(curves.overrides)}" if curves.overrides else f"`{curves.fit_config}`"
    lines = [f"# Learning curves: {curves.name}", "",
             f"Fit config {fit} on the first N conversations of `{curves.recipe}`, verifier `{curves.verifier}`, "
             f"checkpoints at steps {curves.steps}; τ at T=0 with 95% intervals over prompts (taps_train.eval.intervals). Reproduce: "
             f"`python bench/learning_curves.py --config <this config>` (records in `records/`). Training time: the fit's wall "
             "time to that checkpoint (Lightning's Timer, on the machine that trained it; blank for runs that kept none).", ""]
    benchmarks = sorted({name for r in records for name in r["report"]["benchmarks"]})
    for evaluation in curves.evaluations:
        rows = [r for r in records if r["evaluation"] == evaluation.name and not r.get("variant")]
        if not rows:
            continue
        lines += [f"## {evaluation.name}: `taps-train eval {' '.join(evaluation.args)}`", "",
                  "| samples | step | trained tokens | training time | tree | " + " | ".join(f"{b} τ | {b} speedup" for b in benchmarks) + " |",
                  "| --- | --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in benchmarks) + " |"]
        for r in sorted(rows, key=lambda r: (r["samples"], r["step"])):
            cells = []
            for b in benchmarks:
                result = r["report"]["benchmarks"].get(b)
                if result is None:
                    cells += ["", ""]
                    continue
                speedup = result.get("speedup")
                cells += [f"{result['acceptance_length']:.2f} {_interval(result.get('tau_ci95'))}",
                          f"{speedup:.2f}x {_interval(result.get('speedup_ci95'))}" if speedup else ""]
            lines.append(f"| {r['samples']:,} | {r['step']:,} | {r['trained_tokens']:,} | {minutes_cell(r)} | {tree_cell(r['report'].get('tree'))} | "
                         + " | ".join(cells) + " |")
        lines.append("")
        lines += predictions(rows, benchmarks, curves.steps[-1])
        lines += size_differences(rows, benchmarks) + [""]
        plot(curves, evaluation, [r for r in records if r["evaluation"] == evaluation.name], benchmarks, out)  # variants too
        lines += [f"![τ against trained tokens]({evaluation.name}_tau_vs_tokens.png)",
                  f"![τ against distinct samples]({evaluation.name}_tau_vs_samples.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines + variants_section(curves, records, benchmarks)))
    return path


def predictions(rows: list[dict], benchmarks: list[str], step: int) -> list[str]:
    """What a log-linear fit of τ over the sizes at `step` predicts at 10x and 100x the largest. Points `--tree auto`
    decoded plainly are left out: their τ 1.00 measures no drafter, so a fit through them says nothing."""
    lines = []
    for b in benchmarks:
        at_step = [r for r in rows if r["step"] == step and b in r["report"]["benchmarks"]]
        plain = sorted(r["samples"] for r in at_step if tree_cell(r["report"].get("tree")) == "plain")
        drafted = [(r["samples"], r["report"]["benchmarks"][b]["acceptance_length"]) for r in at_step if r["samples"] not in plain]
        fit = log_linear_fit(drafted)
        if fit:
            largest = max(n for n, _ in drafted)
            predict = {k: fit[0] + fit[1] * math.log10(k * largest) for k in (10, 100)}
            lines.append(f"- {b}: τ = {fit[0]:.2f} + {fit[1]:.3f} log10(N) over N = {sorted(n for n, _ in drafted)} at step "
                         f"{step:,}; at 10x the data ({10 * largest:,}) it predicts τ {predict[10]:.2f}, at 100x "
                         f"{predict[100]:.2f} (a log-linear extrapolation: curves bend down as they near the tree's ceiling, "
                         "so read these as upper estimates, and only at this many steps)")
        if plain:
            lines.append(f"- {b}: N = {plain} decoded plainly at step {step:,} (`--tree auto` found no tree that pays), "
                         "left out of the fit")
    return lines


def size_differences(rows: list[dict], benchmarks: list[str]) -> list[str]:
    """The largest training set's τ minus each smaller one's at every step both reached, paired over the same prompts:
    where more distinct data starts to pay, at equal training tokens. Only where the two are `comparable`."""
    by_run = {(r["samples"], r["step"]): r["report"] for r in rows}
    largest = max((n for n, _ in by_run), default=None)
    lines = []
    for (samples, step), report in sorted(by_run.items()):
        reference = by_run.get((largest, step))
        if samples == largest or reference is None or not comparable(report, reference):
            continue
        results, reference = report["benchmarks"], reference["benchmarks"]
        cells = [f"{b} {difference_cell(reference.get(b), results.get(b))}" for b in benchmarks if reference.get(b) and results.get(b)]
        lines.append(f"- N = {largest:,} minus N = {samples:,} at step {step:,} [paired 95%]: {', '.join(cells)}")
    return lines


def minutes_cell(record: dict) -> str:
    seconds = record.get("trained_seconds")
    return f"{seconds / 60:.1f} min" if seconds else ""


def comparable(report: dict, reference: dict) -> bool:
    """Whether two evaluations' τ measure their drafters, not their trees: both decoded with the same tree (`--tree auto`
    picks one per drafter, machine and load), and it drafts (two plain decodes both measure τ 1.00)."""
    tree = tree_cell(report.get("tree"))
    return tree == tree_cell(reference.get("tree")) and tree != "plain"


def tree_cell(tree: dict | None) -> str:
    """total/depth/top-k of the tree an evaluation decoded with; `plain` where --tree auto found no tree that pays; `chain
    of k` where the tree is one line of k drafted tokens (vLLM's chains: total 4, depth 2, top-k 1 in EAGLE-2's terms)."""
    if not tree:
        return ""
    if tree["total_tokens"] == 1:
        return "plain"
    if tree["top_k"] == 1 and tree["total_tokens"] == tree["depth"] + 2:
        return f"chain of {tree['total_tokens'] - 1}"
    return f"{tree['total_tokens']}/{tree['depth']}/{tree['top_k']}"


def variants_section(curves: Curves, records: list[dict], benchmarks: list[str]) -> list[str]:
    """Each variant's τ at every evaluated step, and its difference from the curve's run of the same size at that step
    and at the curve's checkpoint nearest in training time, each with a paired interval over the same prompts. Nothing
    until a variant has a point (a queued variant is no result)."""
    if not any(r.get("variant") in curves.variants for r in records):
        return []
    samples = curves.samples[0]
    curve_records = [r for r in records if not r.get("variant") and r["samples"] == samples]
    curve = {(r["step"], r["evaluation"]): r["report"] for r in curve_records}
    lines = [f"## Recipe variants: N = {samples:,}, each against the curve's run of that size", "",
             "| variant | changes | evaluation | step | training time | " + " | ".join(f"{b} τ | {b} τ minus the curve's [paired 95%]" for b in benchmarks) + " |",
             "| --- | --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in benchmarks) + " |"]
    for variant in curves.variants:
        own_steps = curves.steps_of(variant)
        described = "; ".join(filter(None, [changes(curves.overrides_of(variant)),
                                            f"a run of {own_steps[-1]:,} steps" if own_steps != curves.steps else ""]))
        for r in variant_records(records, variant):
            cells = []
            for b in benchmarks:
                result = r["report"]["benchmarks"].get(b)
                cells += [f"{result['acceptance_length']:.2f}" if result else "", paired_cell(r["report"], curve.get((r["step"], r["evaluation"])), b)]
            lines.append(f"| {variant} | {described} | {r['evaluation']} | {r['step']:,} | {minutes_cell(r)} | " + " | ".join(cells) + " |")
    lines += equal_time_table(curves, records, curve_records, benchmarks)
    return lines + ["", "A difference is resolved when its interval excludes 0. Intervals hold the prompts' variation, not "
                    "training's: one fit per run, so a seed can move τ too.", ""]


def variant_records(records: list[dict], variant: str) -> list[dict]:
    return sorted((r for r in records if r.get("variant") == variant), key=lambda r: (r["evaluation"], r["step"]))


def equal_time_table(curves: Curves, records: list[dict], curve_records: list[dict], benchmarks: list[str]) -> list[str]:
    """Each variant point against the curve's checkpoint (of `curve_records`, its run at the variants' size) nearest it
    in training time: τ per minute of training, for variants that change what a step costs. Nothing where no variant
    point has such a checkpoint."""
    rows = []
    for variant in curves.variants:
        for r in variant_records(records, variant):
            reference = nearest_in_time(r, curve_records)
            if reference is None:
                continue
            cells = [paired_cell(r["report"], reference["report"], b) for b in benchmarks]
            rows.append(f"| {variant} | {r['evaluation']} | {r['step']:,} ({minutes_cell(r)}) | {reference['step']:,} "
                        f"({minutes_cell(reference)}) | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "At equal training time (a variant that makes a step dearer must beat the curve's run where both had the "
            "same minutes, not only at the same step): each variant point against the curve's checkpoint nearest it in "
            f"training time, where one is within {EQUAL_TIME:.0%} of it.", "",
            "| variant | evaluation | step (training time) | the curve's step (training time) | "
            + " | ".join(f"{b} τ minus the curve's [paired 95%]" for b in benchmarks) + " |",
            "| --- | --- | --- | --- | " + " | ".join("---" for _ in benchmarks) + " |", *rows]


def nearest_in_time(record: dict, curve_records: list[dict]) -> dict | None:
    """The curve's record of the same evaluation whose training time is nearest `record`'s, if within EQUAL_TIME of it;
    None where there is none (e.g. a dearer variant past the curve's last step) or either kept no training time (runs
    without a Timer)."""
    seconds = record.get("trained_seconds")
    near = [r for r in curve_records if r["evaluation"] == record["evaluation"] and r.get("trained_seconds")
            and abs(r["trained_seconds"] - seconds) <= EQUAL_TIME * seconds] if seconds else []
    return min(near, key=lambda r: abs(r["trained_seconds"] - seconds), default=None)


def paired_cell(report: dict, reference: dict | None, benchmark: str) -> str:
    """`report`'s τ minus `reference`'s on one benchmark, where the two are `comparable`; else which trees they decoded with."""
    if reference is None:
        return ""
    if not comparable(report, reference):
        tree, reference_tree = tree_cell(report.get("tree")), tree_cell(reference.get("tree"))
        return "both decoded plainly" if tree == reference_tree else f"trees differ ({tree} against {reference_tree})"
    return difference_cell(report["benchmarks"].get(benchmark), reference["benchmarks"].get(benchmark))


def difference_cell(result: dict | None, reference: dict | None) -> str:
    if not result or not reference:
        return ""
    difference, interval = tau_difference(result, reference)
    return f"{difference:+.2f}" + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "")


def plot(curves: Curves, evaluation: Evaluation, rows: list[dict], benchmarks: list[str], out: Path) -> None:
    """τ against trained tokens, one line per run (the curve's sizes and the variants), and τ against distinct samples,
    one line per step of the curve's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def errorbar(axis, xs, results, label):
        taus = [r["acceptance_length"] for r in results]
        low = [t - (r.get("tau_ci95") or [t, t])[0] for t, r in zip(taus, results)]
        high = [(r.get("tau_ci95") or [t, t])[1] - t for t, r in zip(taus, results)]
        axis.errorbar(xs, taus, yerr=[low, high], marker="o", capsize=3, label=label)

    def plot(lines: list[tuple[str, list[dict]]], across: str, xlabel: str, what: str, name: str) -> None:
        """One panel per benchmark: τ against `across`, one line per (label, records)."""
        figure, axes = plt.subplots(1, len(benchmarks), figsize=(5.5 * len(benchmarks), 4), squeeze=False)
        for axis, b in zip(axes[0], benchmarks):
            for label, records in lines:
                points = sorted((r for r in records if b in r["report"]["benchmarks"]), key=lambda r: r[across])
                if points:
                    errorbar(axis, [r[across] for r in points], [r["report"]["benchmarks"][b] for r in points], label)
            axis.set(xscale="log", xlabel=xlabel, ylabel="τ (T=0)", title=b)
            axis.legend()
        figure.suptitle(f"{curves.name}, {evaluation.name}: τ against {what}")
        figure.tight_layout()
        figure.savefig(out / f"{evaluation.name}_tau_vs_{name}.png", dpi=110)
        plt.close(figure)

    curve = [r for r in rows if not r.get("variant")]
    runs = [(f"N = {n:,}", [r for r in curve if r["samples"] == n]) for n in curves.samples]
    runs += [(f"{v} (N = {curves.samples[0]:,})", [r for r in rows if r.get("variant") == v]) for v in curves.variants]
    plot(runs, "trained_tokens", "trained tokens", "trained tokens", "tokens")
    plot([(f"step {s:,}", [r for r in curve if r["step"] == s]) for s in curves.steps], "samples", "distinct training samples N",
         "distinct samples", "samples")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--report-only", action="store_true", help="write the report from the records; train and evaluate nothing")
    parser.add_argument("--engine-python", default=os.environ.get("TAPS_ENGINE_PYTHON"), help="a python with vLLM, for vLLM evaluations")
    args = parser.parse_args()
    try:
        curves = Curves.read(args.config)
        if not args.report_only:
            for variant, samples in curves.runs():
                pending = curves.pending(samples, variant)
                if pending:  # a run whose points are all recorded is done, even where its checkpoints are gone
                    train(curves, samples, variant)
                for step, evaluation in pending:
                    evaluate(curves, samples, step, evaluation, args.engine_python, variant)
                write_report(curves, read_records(curves))
        print(f"[curves] report: {write_report(curves, read_records(curves))}")
    except TapsError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
