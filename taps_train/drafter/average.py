"""Weight-space averaging of drafters (TAPS's "Averaged" baseline): θ = Σ λ_i θ_i."""

from pathlib import Path

import torch

from taps_train.drafter.checkpoint import read_checkpoint
from taps_train.errors import TapsError


def check_weights(weights: list[float], count: int) -> list[float]:
    if len(weights) != count:
        raise TapsError(f"got {len(weights)} averaging weights for {count} drafters")
    if any(w < 0 for w in weights) or abs(sum(weights) - 1.0) > 1e-6:
        raise TapsError(f"averaging weights must be non-negative and sum to 1, got {weights}")
    return weights


def average_checkpoints(paths: list[str | Path], weights: list[float] | None = None) -> dict:
    """A checkpoint dict (same format as `fit`'s) whose drafter weights are the λ-weighted average."""
    if len(paths) < 2:
        raise TapsError(f"averaging needs at least two drafters, got {len(paths)}")
    weights = check_weights(weights or [1.0 / len(paths)] * len(paths), len(paths))
    checkpoints = [read_checkpoint(path) for path in paths]
    first = checkpoints[0]
    for path, checkpoint in zip(paths[1:], checkpoints[1:]):
        if checkpoint["taps"]["verifier"] != first["taps"]["verifier"]:
            raise TapsError(f"cannot average {paths[0]} and {path}: trained against different verifiers "
                            f"({first['taps']['verifier']['path']} vs {checkpoint['taps']['verifier']['path']})")
        shapes = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()}
        if shapes != {k: tuple(v.shape) for k, v in first["state_dict"].items()}:
            raise TapsError(f"cannot average {paths[0]} and {path}: different drafter architectures (parameter names or shapes differ)")
    state = {
        key: sum(w * c["state_dict"][key].float() for w, c in zip(weights, checkpoints)).to(first["state_dict"][key].dtype)
        for key in first["state_dict"]
    }
    return {"state_dict": state, "taps": {**first["taps"], "averaged_from": [str(p) for p in paths], "averaging_weights": weights}}


def write_average(paths: list[str | Path], weights: list[float] | None, output: str | Path) -> Path:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(average_checkpoints(paths, weights), output)
    return output
