"""DeepSpeed checkpoint directories -> the drafter-only checkpoint dict every reader understands.

Under `DeepSpeedStrategy` Lightning writes `<name>.ckpt/` as a directory: `latest` names a tag, and
`<tag>/` holds the model-states file(s) (Lightning's client state, with the `taps` section) plus the
ZeRO optimizer partitions that carry the fp32 master weights. DeepSpeed's own `zero_to_fp32` merges
the partitions (ZeRO-2 and ZeRO-3 alike); it unpickles with `weights_only=False`, so here every load
it makes goes through `weights_only=True` with an explicit allow-list of the DeepSpeed classes its
files hold: a checkpoint is an untrusted file.
"""

import contextlib
import io
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from taps_train import files
from taps_train.errors import TapsError, first_line
from taps_train.paths import output_file

# What ZeRO optimizer-state files pickle besides tensors and builtins (DeepSpeed 0.15-0.19).
_ALLOWED = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)
_METADATA = ("global_step", "epoch", "hyper_parameters", "datamodule_hyper_parameters", "pytorch-lightning_version")
_TAG = re.compile(r"^[A-Za-z0-9_.\-]+$")


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    return Path(path).is_dir()


def read_deepspeed_checkpoint(directory: str | Path) -> dict:
    """{"state_dict": trainable `drafter.*` weights in float32, "taps", and the run's metadata (step, epoch,
    module/datamodule hyperparameters) - the layout of a single-file checkpoint, minus optimizer state."""
    directory = Path(directory)
    tag_dir = _tag_dir(directory)
    states = sorted(tag_dir.glob("*model_states.pt"))
    if not states:
        raise TapsError(f"DeepSpeed checkpoint {directory} has no model states file in {tag_dir}; the checkpoint is incomplete")
    client = _load(states[0], directory)
    if not isinstance(client, dict) or "taps" not in client:
        raise TapsError(f"{directory} is not a taps-train drafter checkpoint (no 'taps' section); pass a checkpoint written by `taps-train fit`")
    weights = _merged_weights(directory, tag_dir.name)
    metadata = {key: client[key] for key in _METADATA if key in client}
    return {"state_dict": {name: tensor for name, tensor in weights.items() if name.startswith("drafter.")}, "taps": client["taps"], **metadata}


def consolidate(directory: str | Path, output: str | Path | None = None) -> Path:
    """Write a DeepSpeed checkpoint directory as one drafter-only file (default: `<dir>.drafter.ckpt`
    next to it) that every command reads without DeepSpeed installed."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TapsError(f"{directory} is not a DeepSpeed checkpoint directory; consolidate reads `<name>.ckpt/` directories written under DeepSpeed")
    if output is None and not directory.resolve().name:
        raise TapsError(f"{directory} is the filesystem root, not a `<name>.ckpt` DeepSpeed checkpoint directory; pass the checkpoint directory")
    output = output_file(output or directory.resolve().with_name(f"{directory.resolve().name.removesuffix('.ckpt')}.drafter.ckpt"), "--output")
    checkpoint = read_deepspeed_checkpoint(directory)
    files.save_torch(output, checkpoint)
    return output


def _tag_dir(directory: Path) -> Path:
    latest = directory / "latest"
    if not latest.is_file():
        raise TapsError(
            f"{directory} is a directory but not a DeepSpeed checkpoint (no 'latest' file); pass a checkpoint file or "
            "a `<name>.ckpt` directory written by `taps-train fit` under DeepSpeed"
        )
    tag = latest.read_text(errors="replace").strip()
    if not _TAG.match(tag) or tag in (".", ".."):
        raise TapsError(f"DeepSpeed checkpoint {directory}: 'latest' names an invalid tag {tag[:60]!r}")
    if not (directory / tag).is_dir():
        raise TapsError(f"DeepSpeed checkpoint {directory}: 'latest' names tag {tag!r} but {directory / tag} does not exist")
    return directory / tag


def _merged_weights(directory: Path, tag: str) -> dict[str, torch.Tensor]:
    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError as err:
        raise TapsError(f"{directory} is a DeepSpeed checkpoint; reading it needs DeepSpeed: pip install 'taps-train[deepspeed]', "
                        "or consolidate it where DeepSpeed is installed (`taps-train consolidate`)") from err

    try:
        with _weights_only_loading(), contextlib.redirect_stdout(io.StringIO()):
            return get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag, exclude_frozen_parameters=True)
    except (OSError, RuntimeError, ValueError, KeyError, IndexError, AssertionError, EOFError, pickle.UnpicklingError) as err:
        raise TapsError(f"cannot merge the ZeRO partitions of DeepSpeed checkpoint {directory}: {first_line(err)}") from err


def _load(path: Path, directory: Path):
    try:
        with torch.serialization.safe_globals(_allowed_classes()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - arbitrary bytes make the unpickler fail in arbitrary ways
        raise TapsError(f"cannot read DeepSpeed checkpoint {directory} ({path.name}): {first_line(err)}") from err


@contextlib.contextmanager
def _weights_only_loading() -> Iterator[None]:
    """Make DeepSpeed's `torch.load(..., weights_only=False)` calls safe loads for the duration."""
    unsafe_load = torch.load

    def safe_load(*args, **kwargs):
        kwargs["weights_only"] = True
        return unsafe_load(*args, **kwargs)

    torch.load = safe_load
    try:
        with torch.serialization.safe_globals(_allowed_classes()):
            yield
    finally:
        torch.load = unsafe_load


def _allowed_classes() -> list:
    import importlib

    classes = []
    for module, name in _ALLOWED:
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # absent in this DeepSpeed version: then its files cannot hold it either
            continue
    return classes
