"""Reading drafter weights out of taps-train checkpoints, refusing any trained for another verifier.

A Lightning checkpoint from `fit` holds the trainable drafter weights under `drafter.*`, plus a
`taps` section with the drafter config and the verifier fingerprint. It is a file (DDP, one device,
`taps-train consolidate`) or, under DeepSpeed, a directory of ZeRO partitions; both read into the
same dict. Loading is `weights_only`: checkpoints are untrusted files.
"""

import pickle
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from taps_train.drafter.backbone import DrafterBackbone, backbone_class, build_drafter, check_tensors
from taps_train.drafter.deepspeed_checkpoint import is_deepspeed_checkpoint, read_deepspeed_checkpoint
from taps_train.errors import TapsError, first_line


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint file or DeepSpeed directory, checked to have the layout every reader relies on."""
    path = Path(path)
    if not path.exists():
        raise TapsError(f"drafter checkpoint {path} does not exist; pass a checkpoint written by `taps-train fit` (e.g. checkpoints/<run>/last.ckpt)")
    checkpoint = read_deepspeed_checkpoint(path) if is_deepspeed_checkpoint(path) else _load_file(path)
    _check_layout(checkpoint, path)
    return checkpoint


def _load_file(path: Path) -> dict:
    if path.stat().st_size == 0:
        raise TapsError(f"drafter checkpoint {path} is empty (an interrupted write?); pass a complete checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported global" in str(err):
            raise TapsError(f"drafter checkpoint {path} holds pickled objects other than tensors and plain data; refusing to load it "
                            "(it was not unpickled). Pass a checkpoint written by `taps-train fit`") from err
        raise TapsError(f"cannot read drafter checkpoint {path}: not a PyTorch checkpoint (corrupt, truncated or another format)") from err
    except Exception as err:  # noqa: BLE001 - arbitrary bytes make the unpickler fail in arbitrary ways
        raise TapsError(f"cannot read drafter checkpoint {path}: {first_line(err)}") from err


def _check_layout(checkpoint: object, path: Path) -> None:
    def refuse(what: str) -> TapsError:
        return TapsError(f"{path} is not a taps-train drafter checkpoint ({what}); pass a checkpoint written by `taps-train fit`")

    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("taps"), dict):
        raise refuse("no 'taps' section")
    taps = checkpoint["taps"]
    if not isinstance(taps.get("drafter_config"), dict):
        raise refuse("'taps.drafter_config' missing or not a mapping")
    verifier = taps.get("verifier")
    if not isinstance(verifier, dict) or not all(isinstance(verifier.get(key), str) for key in ("path", "weights", "tokenizer")):
        raise refuse("'taps.verifier' must record path, weights and tokenizer")
    weights = checkpoint.get("state_dict")
    if not isinstance(weights, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()):
        raise refuse("'state_dict' missing or not a mapping of names to tensors")
    try:
        cls, config, trained = trained_drafter(checkpoint)
    except Exception as err:  # noqa: BLE001 - transformers validates config fields with many error types
        raise refuse(f"'taps.drafter_config' is not a valid drafter config: {first_line(err)}") from err
    check_tensors(trained, cls.tensor_shapes(config, bias=config.fc_bias, embeddings=False), f"drafter checkpoint {path}", cls.index_tensors())


def trained_drafter(checkpoint: dict) -> tuple[type[DrafterBackbone], PretrainedConfig, dict[str, torch.Tensor]]:
    """A checkpoint's backbone, its config, and its trained weights (names without `drafter.`; the verifier's
    parts left out even where a checkpoint carries them)."""
    cls = backbone_class(checkpoint["taps"]["drafter_config"])
    config = cls.config_class.from_dict(checkpoint["taps"]["drafter_config"])
    config.fc_bias = bool(getattr(config, "fc_bias", False))
    names = {key: key.removeprefix("drafter.") for key in checkpoint["state_dict"]}
    return cls, config, {names[key]: value for key, value in checkpoint["state_dict"].items() if names[key] not in cls.frozen_parameter_names()}


def check_verifier(checkpoint: dict, fingerprint: dict, where: str) -> None:
    """Same weights and tokenizer, or a clear refusal naming both verifiers."""
    trained = checkpoint["taps"]["verifier"]
    if trained["weights"] != fingerprint["weights"] or trained["tokenizer"] != fingerprint["tokenizer"]:
        raise TapsError(
            f"{where} was trained against verifier {trained['path']} (weights {trained['weights']}), "
            f"not {fingerprint['path']} (weights {fingerprint['weights']}); use the verifier it was trained for"
        )


def load_drafter_weights(drafter: DrafterBackbone, checkpoint: dict, where: str) -> None:
    weights = {k.removeprefix("drafter."): v for k, v in checkpoint["state_dict"].items() if k.startswith("drafter.")}
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - set(drafter.frozen_parameter_names()):
        raise TapsError(f"{where} does not match this drafter (missing {missing}, unexpected {unexpected})")


def load_drafter(path: str | Path, verifier: nn.Module, fingerprint: dict) -> DrafterBackbone:
    """A ready-to-decode drafter from a checkpoint, with the verifier's embedding and LM head."""
    checkpoint = read_checkpoint(path)
    check_verifier(checkpoint, fingerprint, f"drafter checkpoint {path}")
    return drafter_from_checkpoint(checkpoint, verifier, f"drafter checkpoint {path}")


def drafter_from_checkpoint(checkpoint: dict, verifier: nn.Module, where: str) -> DrafterBackbone:
    """Trained weights in float32 next to the verifier's LM head (the device its features come out
    on); embedding and head are the verifier's own tensors, shared, not copied."""
    drafter = build_drafter(checkpoint["taps"]["drafter_config"])
    drafter.load_verifier_parts(verifier)
    load_drafter_weights(drafter, checkpoint, where)
    return drafter.to(verifier.get_output_embeddings().weight.device).eval()
