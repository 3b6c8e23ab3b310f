"""Weight-space averaging of drafters (TAPS's "Averaged" baseline): θ = Σ λ_i θ_i."""

import math
from pathlib import Path

import torch

from taps_train import files

from taps_train.drafter.checkpoint import read_checkpoint
from taps_train.drafter.backbone import backbone_class
from taps_train.errors import TapsError
from taps_train.paths import output_file


def check_weights(weights: list[float], count: int, option: str = "--weights") -> list[float]:
    if len(weights) != count:
        raise TapsError(f"{option}: got {len(weights)} averaging weights for {count} drafters; pass one weight per drafter")
    bad = [w for w in weights if not math.isfinite(w) or w < 0]
    if bad:
        raise TapsError(f"{option}: averaging weights must be finite and non-negative, got {weights}; pass e.g. "
                        f"{' '.join(['%g' % (1 / count)] * count)}")
    if abs(sum(weights) - 1.0) > 1e-6:
        raise TapsError(f"{option}: averaging weights must sum to 1, got {weights} (sum {sum(weights):g}); rescale them")
    return weights


def average_checkpoints(paths: list[str | Path], weights: list[float] | None = None) -> dict:
    """A checkpoint dict (same format as `fit`'s) whose drafter weights are the λ-weighted average."""
    if len(paths) < 2:
        raise TapsError(f"--drafters: averaging needs at least two drafters, got {len(paths)}; pass two or more checkpoints")
    weights = check_weights(weights if weights is not None else [1.0 / len(paths)] * len(paths), len(paths))
    checkpoints = [read_checkpoint(path) for path in paths]  # each checked: shapes of its config, finite values
    first = checkpoints[0]
    for path, checkpoint in zip(paths[1:], checkpoints[1:]):
        configs = [c["taps"]["drafter_config"] for c in (first, checkpoint)]
        backbones = [config.get("architectures") for config in configs]
        if backbones[0] != backbones[1]:
            raise TapsError(f"cannot average {paths[0]} ({backbones[0][0]}) and {path} ({backbones[1][0]}): weights of different drafter "
                            "backbones do not correspond; average drafters of one backbone, or compose them (--strategy merge, route-confidence, ...)")
        flags = [backbone_class(config).variant_flags(config) for config in configs]
        if flags[0] != flags[1]:
            raise TapsError(f"cannot average {paths[0]} ({flags[0]}) and {path} ({flags[1]}): the two networks compute differently "
                            "whatever their weights; average drafters trained with the same flags, or compose them")
        if checkpoint["taps"]["verifier"] != first["taps"]["verifier"]:
            raise TapsError(f"cannot average {paths[0]} and {path}: trained against different verifiers "
                            f"({first['taps']['verifier']['path']} vs {checkpoint['taps']['verifier']['path']})")
    taps = {**first["taps"], "averaged_from": [str(p) for p in paths], "averaging_weights": weights}
    changed = backbone_class(taps["drafter_config"]).align_for_averaging([c["state_dict"] for c in checkpoints], weights)
    taps["drafter_config"] = {**taps["drafter_config"], **changed}
    for path, checkpoint in zip(paths[1:], checkpoints[1:]):
        shapes = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()}
        if shapes != {k: tuple(v.shape) for k, v in first["state_dict"].items()}:
            raise TapsError(f"cannot average {paths[0]} and {path}: different drafter architectures (parameter names or shapes differ)")
    state = {key: _average([c["state_dict"][key] for c in checkpoints], weights) for key in first["state_dict"]}
    _check_finite(state, f"the average of {', '.join(map(str, paths))}", "the weighted sum overflows the dtype; check the inputs")
    return {"state_dict": state, "taps": taps}


def _average(tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Weights are averaged; token maps (integer and boolean tensors, one vocabulary after the backbone's
    `align_for_averaging`) are indices, copied, never averaged."""
    if not tensors[0].is_floating_point():
        return tensors[0]
    return sum(w * t.float() for w, t in zip(weights, tensors)).to(tensors[0].dtype)


def _check_finite(state: dict, what: str, fix: str) -> None:
    for key, value in state.items():
        if torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            raise TapsError(f"{what} has non-finite values (NaN/inf) in {key}; {fix}")


def check_output(paths: list[str | Path], output: str | Path, option: str = "--output") -> Path:
    output = output_file(output, option)
    resolved = output.resolve()
    for path in paths:
        if Path(path).expanduser().resolve() == resolved:
            raise TapsError(f"{option} {output} is also an input drafter ({path}); write the average to a new file")
    return output


def write_average(paths: list[str | Path], weights: list[float] | None, output: str | Path) -> Path:
    output = check_output(paths, output)
    checkpoint = average_checkpoints(paths, weights)
    files.save_torch(output, checkpoint)
    return output
