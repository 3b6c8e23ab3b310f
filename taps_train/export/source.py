"""What an export reads: trained drafter checkpoints, and the verifier they must fit."""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, PretrainedConfig

from taps_train.drafter import drafter_config
from taps_train.drafter.checkpoint import check_verifier, read_checkpoint, trained_drafter
from taps_train.errors import TapsError
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import VerifierFiles, read_verifier_files

VERIFIER_FIELDS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim")


@dataclass
class Source:
    """A checkpoint with its drafter config and trainable weights (keys without `drafter.`)."""

    path: Path
    where: str
    checkpoint: dict
    config: LlamaConfig
    weights: dict[str, torch.Tensor]


def read_source(path: str | Path) -> Source:
    """A `fit` or `average` checkpoint; `read_checkpoint` has checked its config and weights."""
    checkpoint = read_checkpoint(path)
    _, config, weights = trained_drafter(checkpoint)
    return Source(Path(path), f"checkpoint {path}", checkpoint, config, weights)


def resolve_verifier(sources: list[Source], verifier: str | None, include_embeddings: bool) -> VerifierFiles | None:
    """Read the verifier's config and tokenizer when needed (never its layers) and refuse drafters that do not fit it.

    `verifier` (name or path) defaults to the one recorded in the checkpoints; it is read when the embedding is exported
    or when given explicitly, and must be the verifier the drafters were trained for."""
    trained = sources[0].checkpoint["taps"]["verifier"]
    for source in sources[1:]:
        if source.checkpoint["taps"]["verifier"] != trained:
            raise TapsError(f"{source.where} was trained against verifier {source.checkpoint['taps']['verifier']['path']}, "
                            f"{sources[0].where} against {trained['path']}; a bundle serves one verifier")
    if verifier is None and not include_embeddings:
        return None
    try:
        loaded = read_verifier_files(verifier or trained["path"])
    except TapsError as err:
        if verifier:
            raise
        raise TapsError(f"{err} (the verifier recorded in {sources[0].where}); pass --verifier, or --no-embeddings to export without it") from err
    fingerprint = verifier_fingerprint(loaded.path, loaded.tokenizer)
    for source in sources:
        check_fits_verifier(source.config, loaded.config, source.where, f"verifier {loaded.path}")
        check_verifier(source.checkpoint, fingerprint, source.where)
    return loaded


def check_fits_verifier(config: PretrainedConfig, verifier_config: PretrainedConfig, where: str, verifier: str) -> None:
    """The sizes the verifier's features, embedding and LM head impose on the drafter."""
    expected = drafter_config(verifier_config)
    for field in VERIFIER_FIELDS:
        if getattr(config, field) != getattr(expected, field):
            raise TapsError(f"{where}: drafter {field} is {getattr(config, field)} but {verifier} has {getattr(expected, field)}; "
                            "it was trained for another verifier")
