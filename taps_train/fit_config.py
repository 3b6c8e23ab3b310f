"""The shape of a `taps-train fit` config file, checked before LightningCLI (and a study) reads it.

jsonargparse checks every key's type against the classes, but a section of the wrong kind can slip past it (a
`trainer:` written as a list is dropped and training runs on defaults) or reach a constructor as something it
cannot handle. The file is read with taps-train's YAML limits (taps_train/user_yaml.py) and each section must
be what LightningCLI expects; the study checks its backbone configs with the same function.
"""

from pathlib import Path
from typing import Any

from taps_train.errors import TapsError
from taps_train.paths import writable_directory
from taps_train.ranges import float_problem, int_problem, require
from taps_train.user_yaml import read_yaml

FIX = "see configs/ for complete examples"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _component_problems(key: str, value: Any) -> list[str]:
    """`class_path` + `init_args` (a mapping) of one configurable class."""
    if not isinstance(value, dict):
        return [f"{key} must be a mapping with class_path and init_args, got {_kind(value)}"]
    problems = []
    if "class_path" in value and not isinstance(value["class_path"], str):
        problems.append(f"{key}.class_path must be a dotted class name, got {_kind(value['class_path'])}")
    if "init_args" in value and not isinstance(value["init_args"], dict | type(None)):
        problems.append(f"{key}.init_args must be a mapping of constructor arguments, got {_kind(value['init_args'])}")
    return problems


def fit_config_problems(config: Any) -> list[str]:
    """What is wrong with the sections of a fit config (empty: the shape is right; jsonargparse checks the rest)."""
    if not isinstance(config, dict):
        return [f"the file must be a mapping of sections (trainer, model, data, ...), got {_kind(config)}"]
    problems = [f"{key} must be a mapping, got {_kind(config[key])}" for key in ("trainer", "optimizer", "lr_scheduler")
                if key in config and not isinstance(config[key], dict | type(None))]
    problems += [problem for key in ("model", "data") if key in config for problem in _component_problems(key, config[key])]
    trainer = config.get("trainer")
    if isinstance(trainer, dict):
        callbacks = trainer.get("callbacks")
        if callbacks is not None:
            items = callbacks if isinstance(callbacks, list) else [callbacks]
            problems += [p for i, item in enumerate(items) for p in _component_problems(f"trainer.callbacks[{i}]", item)]
        logger = trainer.get("logger")
        if logger is not None and not isinstance(logger, bool):
            items = logger if isinstance(logger, list) else [logger]
            problems += [p for i, item in enumerate(items) for p in _component_problems(f"trainer.logger[{i}]", item)]
        for key in ("plugins", "profiler", "strategy", "accelerator"):
            value = trainer.get(key)
            if isinstance(value, dict):
                problems += _component_problems(f"trainer.{key}", value)
    return problems


def check_trainer_options(trainer) -> None:
    """The Trainer's loop bounds, which Lightning itself accepts out of range (a negative max_steps other than -1 ends in a
    traceback mid-run, a zero log interval in a ZeroDivisionError)."""
    def optional(key: str, minimum: int, what: str) -> None:
        value = trainer.get(key)
        if value is not None:
            require(f"trainer.{key}", int_problem(value, minimum, what))

    optional("max_steps", -1, "a step count, or -1 for no limit")
    optional("max_epochs", -1, "an epoch count, or -1 for no limit")
    optional("min_steps", 0, "a step count")
    optional("log_every_n_steps", 1, "at least 1")
    optional("accumulate_grad_batches", 1, "at least 1")
    optional("num_sanity_val_steps", -1, "a batch count, or -1 for all")
    if trainer.get("gradient_clip_val") is not None:
        require("trainer.gradient_clip_val", float_problem(trainer["gradient_clip_val"], 0.0))
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "val_check_interval"):
        value = trainer.get(key)
        if value is not None:
            require(f"trainer.{key}", float_problem(value, 0.0, what="a batch count or a fraction"))


def check_output_directories(trainer) -> None:
    """Every folder the run will write, checked before it starts: the trainer's root, its loggers' folders and its
    callbacks' (checkpoint) folders, each named by its config key (a callback writing under /proc would otherwise fail
    at its first save, after training began)."""
    def parts(value) -> list:
        return value if isinstance(value, list) else [value]

    places = {"trainer.default_root_dir": trainer.get("default_root_dir")}
    for key in ("logger", "callbacks"):
        for i, item in enumerate(parts(trainer.get(key))):
            init_args = item.get("init_args") if hasattr(item, "get") else None
            if init_args is not None and hasattr(init_args, "get"):
                places[f"trainer.{key}[{i}].init_args.save_dir"] = init_args.get("save_dir")
                places[f"trainer.{key}[{i}].init_args.dirpath"] = init_args.get("dirpath")
    for label, folder in places.items():
        if isinstance(folder, str | Path) and "://" not in str(folder):
            writable_directory(folder, label, "pass a writable folder")


def check_fit_config_file(path: str | Path, what: str = "fit config") -> dict:
    """The parsed file, or one line naming it and its first problem."""
    config = read_yaml(path, what, FIX)
    problems = fit_config_problems(config)
    if problems:
        raise TapsError(f"{what} {path}: {problems[0]}; {FIX}")
    return config
