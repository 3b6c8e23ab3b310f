"""Verifiers: load any HF causal LM frozen, or build the offline tiny one."""

from taps_train.verifier.loading import (
    DEFAULT_VERIFIER,
    TINY_VERIFIER,
    LoadedVerifier,
    load_verifier,
    resolve_verifier_path,
)

__all__ = ["DEFAULT_VERIFIER", "TINY_VERIFIER", "LoadedVerifier", "load_verifier", "resolve_verifier_path"]
