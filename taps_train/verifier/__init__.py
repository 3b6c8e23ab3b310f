"""Verifiers: load any HF causal LM frozen, or build the offline tiny one."""

from taps_train.verifier.loading import (
    TINY_VERIFIER,
    LoadedVerifier,
    load_verifier,
    resolve_verifier_path,
)

__all__ = ["TINY_VERIFIER", "LoadedVerifier", "load_verifier", "resolve_verifier_path"]
