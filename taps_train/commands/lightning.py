"""`taps-train fit | validate | test`: Lightning's own CLI, whose configs map one-to-one to constructor arguments.

Before Lightning starts: the config files are checked as YAML, the trainer options and a `--ckpt_path` read once, so
that a bad file or checkpoint is one line naming it, not a traceback from inside Lightning.
"""

import importlib
import inspect
import sys
from pathlib import Path

from taps_train.cli import COMMANDS
from taps_train.commands.errors import config_error, config_files, wrapped_taps_error
from taps_train.errors import TapsError


def run(args: list[str] | None, command: str) -> None:
    """`args` holds the command and its options; None: LightningCLI reads sys.argv itself."""
    from jsonargparse import ArgumentError
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    from taps_train.fit_config import check_fit_config_file, check_output_directories, check_trainer_options
    from taps_train.training.trainer import Trainer

    class TapsCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            # One verifier per run: the datamodule caches the features of the verifier the drafter serves.
            parser.link_arguments("model.init_args.verifier", "data.init_args.verifier")
            # ... and the hidden states its backbone reads (the feature contract).
            parser.link_arguments("model", "data.init_args.verifier_states", compute_fn=verifier_states, apply_on="instantiate")

        def parse_arguments(self, parser, args) -> None:
            super().parse_arguments(parser, args)
            # Right after parsing: Lightning itself torch.loads a --ckpt_path file next (for its hyperparameters),
            # and only then reads the verifier; a bad checkpoint fails first, as one line naming it.
            subcommand = self.config.get("subcommand")
            if subcommand:
                check_trainer_options(self.config[subcommand].get("trainer") or {})
                check_output_directories(self.config[subcommand].get("trainer") or {})
                check_ckpt_path(self.config[subcommand].get("ckpt_path"), self.config[subcommand].get("model"))

    for path in config_files(args if args is not None else sys.argv[1:]):
        check_fit_config_file(path, f"{command} config")
    try:
        TapsCLI(
            LightningModule,
            LightningDataModule,
            trainer_class=Trainer,  # Lightning's, plus `precision: auto`
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            save_config_kwargs={"overwrite": True},
            # jsonargparse's own refusals raise (not print pages and exit 2), to become one line naming key and file
            parser_kwargs={"description": f"taps-train {command}: {COMMANDS[command].summary}", "exit_on_error": False,
                           **{name: {"exit_on_error": False} for name in ("fit", "validate", "test")}},
        )
    except TapsError:
        raise
    except ArgumentError as err:
        raise TapsError(config_error(err, args if args is not None else sys.argv[1:], command)) from None
    except Exception as err:
        # jsonargparse wraps what a constructor raises (a Union of subclass types lists every subtype's
        # error) into a multi-page ValueError; a TapsError inside it is the user's error, in one line.
        cause = wrapped_taps_error(err)
        if cause is None:
            raise
        raise cause from None


def verifier_states(module) -> tuple[int, ...]:
    """The verifier hidden states a training module's drafter reads."""
    return module.drafter.feature_contract().layers


# Values of Trainer.fit/validate/test(ckpt_path=...) that name no file: Lightning resolves them itself.
LIGHTNING_CKPT_KEYWORDS = ("last", "best", "hpc")


def check_ckpt_path(ckpt_path: object, model=None) -> None:
    """Read a `--ckpt_path` checkpoint once up front (drafters are small), so a missing, empty or foreign
    file, a directory that is not a DeepSpeed checkpoint, or a checkpoint of another backbone than the config's `model`
    trains, is one line naming it, not Lightning's traceback."""
    if ckpt_path is None:
        return
    path = str(ckpt_path)
    if path in LIGHTNING_CKPT_KEYWORDS or path.startswith("registry") or "://" in path:
        return
    from taps_train.drafter.checkpoint import read_checkpoint
    from taps_train.training.base import check_backbone

    try:
        checkpoint = read_checkpoint(path)
    except TapsError as err:
        raise TapsError(f"--ckpt_path: {err}") from None
    if Path(path).is_file() and "pytorch-lightning_version" not in checkpoint:
        raise TapsError(f"--ckpt_path {path} holds drafter weights (from average, consolidate or elsewhere), not a training run Lightning "
                        f"can resume; start from its weights with --model.init_from {path}")
    module = _module_class(model)
    if module is not None:
        fc_bias = model.init_args.get("fc_bias") if model.get("init_args") else None
        if fc_bias is None:  # the module's default (HassModule: true); a module without the argument has no fc bias
            parameter = inspect.signature(module).parameters.get("fc_bias")
            fc_bias = parameter.default if parameter is not None else False
        check_backbone(checkpoint, module.drafter_class.architecture, bool(fc_bias), f"--ckpt_path {path}", module.__name__)


def _module_class(model) -> type | None:
    """The taps-train training module class a parsed `model` section names (None for anything else)."""
    from taps_train.training.base import DrafterModule

    class_path = model.get("class_path") if model is not None else None
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module_name, _, name = class_path.rpartition(".")
    try:
        module = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    return module if isinstance(module, type) and issubclass(module, DrafterModule) and hasattr(module, "drafter_class") else None
