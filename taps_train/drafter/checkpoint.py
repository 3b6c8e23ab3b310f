"""Reading drafter weights out of taps-train checkpoints, refusing any trained for another verifier.

A Lightning checkpoint from `fit` holds the trainable drafter weights under `drafter.*`, plus a
`taps` section with the drafter config and the verifier fingerprint. It is a file (DDP, one device,
`taps-train consolidate`) or, under DeepSpeed, a directory of ZeRO partitions; both read into the
same dict. Loading is `weights_only`: checkpoints are untrusted files.
"""

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from taps_train.drafter.deepspeed_checkpoint import is_deepspeed_checkpoint, read_deepspeed_checkpoint
from taps_train.drafter.model import Drafter
from taps_train.errors import TapsError


def read_checkpoint(path: str | Path) -> dict:
    if is_deepspeed_checkpoint(path):
        return read_deepspeed_checkpoint(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - arbitrary bytes make the unpickler fail in arbitrary ways
        raise TapsError(f"cannot read drafter checkpoint {path}: {str(err).splitlines()[0]}") from err
    if not isinstance(checkpoint, dict) or "taps" not in checkpoint:
        raise TapsError(f"{path} is not a taps-train drafter checkpoint (no 'taps' section); pass a checkpoint written by `taps-train fit`")
    return checkpoint


def check_verifier(checkpoint: dict, fingerprint: dict, where: str) -> None:
    """Same weights and tokenizer, or a clear refusal naming both verifiers."""
    trained = checkpoint["taps"]["verifier"]
    if trained["weights"] != fingerprint["weights"] or trained["tokenizer"] != fingerprint["tokenizer"]:
        raise TapsError(
            f"{where} was trained against verifier {trained['path']} (weights {trained['weights']}), "
            f"not {fingerprint['path']} (weights {fingerprint['weights']}); use the verifier it was trained for"
        )


def load_drafter_weights(drafter: Drafter, checkpoint: dict, where: str) -> None:
    weights = {k.removeprefix("drafter."): v for k, v in checkpoint["state_dict"].items() if k.startswith("drafter.")}
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - set(drafter.frozen_parameter_names()):
        raise TapsError(f"{where} does not match this drafter (missing {missing}, unexpected {unexpected})")


def load_drafter(path: str | Path, verifier: nn.Module, fingerprint: dict) -> Drafter:
    """A ready-to-decode drafter from a checkpoint, with the verifier's embedding and LM head."""
    checkpoint = read_checkpoint(path)
    check_verifier(checkpoint, fingerprint, f"drafter checkpoint {path}")
    return drafter_from_checkpoint(checkpoint, verifier, f"drafter checkpoint {path}")


def drafter_from_checkpoint(checkpoint: dict, verifier: nn.Module, where: str) -> Drafter:
    """Trained weights in float32 next to the verifier's LM head (the device its features come out
    on); embedding and head are the verifier's own tensors, shared, not copied."""
    drafter = Drafter(LlamaConfig.from_dict(checkpoint["taps"]["drafter_config"]))
    drafter.load_verifier_parts(verifier)
    load_drafter_weights(drafter, checkpoint, where)
    return drafter.to(verifier.get_output_embeddings().weight.device).eval()
