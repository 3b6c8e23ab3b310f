"""A study as a list of cells: one `taps-train fit` per backbone x training set, then one `taps-train eval`
per drafter, per strategy over the specialists and per averaging weight.

Each cell has a fingerprint of everything that decides its outputs: the fit config it runs (derived from the
backbone's config, so any change to that config shows) and the recipe's text for fits; the eval options and
the fingerprints of the fits whose checkpoints it reads for evals. A finished cell whose fingerprint still
matches is skipped; change a recipe and its fits and every evaluation of them run again, nothing else.
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from taps_train.eval.report import report_path
from taps_train.fit_config import FIX
from taps_train.study.config import Study
from taps_train.user_yaml import read_yaml

LAST_CHECKPOINT = "taps_train.training.checkpointing.LastCheckpoint"
CHECKPOINT_CALLBACKS = ("lightning.pytorch.callbacks.ModelCheckpoint", "taps_train.training.checkpointing.RunCheckpoint", LAST_CHECKPOINT)


@dataclass
class Cell:
    """One command of the study. `key` names its folder-safe state file; `needs` the cells it reads."""

    key: str
    kind: str  # "fit" or "eval"
    backbone: str
    label: str  # the training set (fit) or the evaluated variant (eval)
    args: list[str]
    outputs: list[Path]  # a fit's last checkpoint (a file, or a DeepSpeed checkpoint directory); an eval's reports
    fingerprint: str
    log: Path
    needs: list[str] = field(default_factory=list)
    fit_config: dict | None = None  # written to `config_path` before a fit runs
    steps: int = 0
    decodes: int = 0  # prompts x benchmarks x temperatures an eval decodes
    tree: str = "fixed"  # an eval's tree: the study's fixed one, or the machine's (`auto`)

    @property
    def config_path(self) -> Path:
        return self.outputs[0].parent / "config.yaml"


def plan(study: Study) -> list[Cell]:
    """Every cell in the order they run, backbone by backbone: its fits, then the evaluations that read them, tree by
    tree. A backbone is finished before the next one trains, so a study that runs in several sittings leaves whole
    backbones behind, whose checkpoints it no longer needs (see `run.unfinished`)."""
    cells = []
    for backbone in study.backbones:
        fits = {(backbone, name): _fit_cell(study, backbone, name, recipe) for name, recipe in _training_sets(study).items()}
        cells += [*fits.values(), *(cell for tree in study.trees for cell in _evals(study, backbone, tree, fits))]
    return cells


def _evals(study: Study, backbone: str, tree: str, fits: dict[tuple[str, str], Cell]) -> list[Cell]:
    """A backbone's evaluations at one tree. With `auto` the first is the calibration (`eval --tree auto` of the first
    mixture's drafter, else the first domain's) and every other reads the shape it chose (`--tree-from`)."""
    names = list(_training_sets(study))
    if tree == "auto":
        names.insert(0, names.pop(len(study.domains) if study.mixtures else 0))
    calibration = _eval_cell(study, backbone, names[0], [fits[backbone, names[0]]], "single", tree) if tree == "auto" else None
    cells = [calibration] if calibration else []
    cells += [_eval_cell(study, backbone, name, [fits[backbone, name]], "single", tree, calibration) for name in names[len(cells):]]
    specialists = [fits[backbone, name] for name in study.domains]
    cells += [_eval_cell(study, backbone, strategy, specialists, strategy, tree, calibration) for strategy in study.strategies]
    if tree == "fixed":
        cells += [_eval_cell(study, backbone, f"average_lambda{weight:g}", specialists, "average", tree, weights=[weight, 1 - weight])
                  for weight in study.lambdas]
    return cells


def fit_dir(study: Study, backbone: str, name: str) -> Path:
    return study.out_dir / "fits" / f"{backbone}_{name}"


def eval_dir(study: Study, tree: str = "fixed") -> Path:
    """Where the evaluations at `tree` (`fixed` or `auto`) write their reports, one folder per backbone."""
    return study.out_dir / ("eval" if tree == "fixed" else f"eval_{tree}")


def report_dir(study: Study, tree: str = "fixed") -> Path:
    """Where `taps-train report` of the evaluations at `tree` goes (`report_dir`, or the study folder's report/)."""
    root = Path(study.report_dir) if study.report_dir is not None else study.out_dir / "report"
    return root if tree == "fixed" else root / f"{tree}_tree"


def _training_sets(study: Study) -> dict[str, str]:
    return {**{name: domain.recipe for name, domain in study.domains.items()}, **study.mixtures}


def _fit_cell(study: Study, backbone: str, name: str, recipe: str) -> Cell:
    directory = fit_dir(study, backbone, name)
    config = fit_config(read_yaml(study.backbones[backbone], "fit config", FIX), study, recipe, directory)
    checkpoint = directory / "last.ckpt"
    fingerprint = _hash({"config": config, "recipe": Path(recipe).read_text()})
    return Cell(key=f"fit_{backbone}_{name}", kind="fit", backbone=backbone, label=name, args=["fit", "--config", str(directory / "config.yaml")],
                outputs=[checkpoint], fingerprint=fingerprint, log=directory / "fit.log", fit_config=config, steps=_budget(config))


def _budget(config: dict) -> int:
    """The fit's steps when its config bounds them (0 when only epochs do: then its time cannot be estimated)."""
    steps = config["trainer"].get("max_steps", -1)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else 0


def fit_config(base: dict, study: Study, recipe: str, directory: Path) -> dict:
    """The backbone's fit config with the study's recipe, steps, seed and verifier, writing into `directory`, where
    `last.ckpt` is what an interrupted fit resumes from and, once it finished, the final weights the study evaluates."""
    config = json.loads(json.dumps(base))  # a deep copy of plain YAML data
    config["seed_everything"] = study.seed
    trainer = config.setdefault("trainer", {})
    trainer["default_root_dir"] = str(directory)
    if study.max_steps is not None:  # one step budget for every cell, whatever epochs the config says
        trainer.update(max_steps=study.max_steps, max_epochs=-1)
        if isinstance(trainer.get("val_check_interval"), int) and trainer["val_check_interval"] > study.max_steps:
            trainer["val_check_interval"] = study.max_steps
    logger = trainer.get("logger")
    if isinstance(logger, dict) and "save_dir" in logger.get("init_args", {}):
        logger["init_args"]["save_dir"] = str(directory)
    callbacks = trainer.setdefault("callbacks", [])
    for callback in callbacks:
        if callback.get("class_path") in CHECKPOINT_CALLBACKS:
            callback.setdefault("init_args", {})["dirpath"] = str(directory)
            if callback["init_args"].get("save_last"):
                callback["class_path"] = LAST_CHECKPOINT  # last.ckpt ends as the final weights
    if not any(c.get("class_path") == LAST_CHECKPOINT for c in callbacks):
        callbacks.append({"class_path": LAST_CHECKPOINT, "init_args": {"dirpath": str(directory), "save_last": True}})
    config["model"].setdefault("init_args", {})["verifier"] = study.verifier
    config["data"].setdefault("init_args", {})["recipe"] = recipe
    return config


def _eval_cell(study: Study, backbone: str, label: str, drafters: list[Cell], strategy: str, tree: str,
               calibration: Cell | None = None, weights: list[float] | None = None) -> Cell:
    output = eval_dir(study, tree) / backbone / f"{label}.json"
    options = ["--strategy", strategy, "--verifier", study.verifier, "--benchmarks", *study.benchmarks,
               "--temperatures", *[f"{t:g}" for t in study.temperatures], "--prompts", str(study.prompts),
               "--max-new-tokens", str(study.max_new_tokens), "--seed", str(study.seed)]
    if calibration is None:  # the fixed tree, or the bound the calibration searches
        options += [*(["--tree", "auto"] if tree == "auto" else []), "--total-tokens", str(study.tree.total_tokens),
                    "--depth", str(study.tree.depth), "--top-k", str(study.tree.top_k)]
    else:
        options += ["--tree-from", str(calibration.outputs[0])]
    if weights is not None:
        options += ["--weights", *[f"{w:g}" for w in weights]]
    if tree not in study.baseline:
        options.append("--no-baseline")
    args = ["eval", "--drafters", *[str(d.outputs[0]) for d in drafters], *options, "--output", str(output)]
    outputs = [report_path(output, t, len(study.temperatures)) for t in study.temperatures]
    read = [*drafters, *([calibration] if calibration else [])]
    fingerprint = _hash({"options": options, "drafters": [d.fingerprint for d in read]})
    key = f"eval_{backbone}_{label}" + ("" if tree == "fixed" else f"@{tree}")  # @: not in any name, so no key collides
    return Cell(key=key, kind="eval", backbone=backbone, label=label, args=args, outputs=outputs, fingerprint=fingerprint,
                log=study.out_dir / "logs" / f"{key}.log", needs=[d.key for d in read],
                decodes=study.prompts * len(study.benchmarks) * len(study.temperatures), tree=tree)


def _hash(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
