"""Drafter backbones: the interface every drafter network offers, and the registry that builds them.

A backbone is an `nn.Module` class registered under the architecture name its config carries
(`config.architectures[0]`, the name serving engines dispatch on too). Checkpoints store the drafter
config, so `build_drafter(config)` is the one place a drafter is made, whether for training, from a
checkpoint, or from an export; nothing else names a drafter class.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig

from taps_train.drafter.features import FeatureContract
from taps_train.errors import TapsError


class DrafterBackbone(nn.Module, ABC):
    """What training, tree drafting, checkpoints and export need of a drafter.

    A drafter reads, per position t, the next token x_{t+1} and a feature of position t (verifier
    features at committed positions, its own predicted state inside a draft) and predicts a hidden
    state whose `logits` guess x_{t+2} in the verifier's vocabulary.
    """

    config: PretrainedConfig
    config_class: type[PretrainedConfig] = LlamaConfig

    @classmethod
    @abstractmethod
    def config_for(cls, verifier_config: PretrainedConfig, **options) -> PretrainedConfig:
        """This backbone's config for a verifier (the sizes its features, embedding and head impose)."""

    @classmethod
    @abstractmethod
    def tensor_shapes(cls, config: PretrainedConfig, bias: bool, embeddings: bool) -> dict[str, tuple[int, ...]]:
        """Every trained tensor (and the embedding, when `embeddings`) with the shape `config` implies: what a
        checkpoint must hold and an export writes."""

    @abstractmethod
    def feature_contract(self) -> FeatureContract:
        """Which verifier hidden states this drafter reads."""

    @classmethod
    @abstractmethod
    def frozen_parameter_names(cls) -> list[str]:
        """Parameters taken from the verifier: never trained, never in checkpoints."""

    @abstractmethod
    def use_verifier_parts(self, embedding: torch.Tensor, lm_head: torch.Tensor) -> None:
        """Adopt the verifier's input embedding and LM head ([V, H] each), shared, not copied."""

    @abstractmethod
    def cast_verifier_parts(self, dtype: torch.dtype) -> None:
        """Keep the frozen verifier parts in the dtype training computes in."""

    @abstractmethod
    def forward(self, next_ids: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor,
                cache=None) -> torch.Tensor:
        """One drafting step over new positions with a KV cache: predicted hidden states [B, T, H]."""

    @abstractmethod
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the verifier's vocabulary for predicted hidden states."""

    def proposal_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits over the tokens this drafter can propose, and their verifier ids (None: the whole verifier
        vocabulary in order). Drafting ranks these; a reduced draft vocabulary never widens to the full one."""
        return self.logits(hidden), None

    @abstractmethod
    def unroll(self, next_ids: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training: the drafter run `steps` times over whole sequences, each pass on its own earlier
        predictions as at drafting time; the predicted hidden states [B, T, H] of every pass."""

    @staticmethod
    def target_lag(step: int) -> int:
        """How many positions after the first pass's targets the targets of pass `step` (0-based) lie."""
        return 0

    @classmethod
    def index_tensors(cls) -> dict[str, torch.dtype]:
        """Saved tensors that are not weights (token maps), with their dtypes."""
        return {}

    def load_verifier_parts(self, verifier: nn.Module) -> None:
        """Share a loaded verifier's input embedding and LM head."""
        self.use_verifier_parts(verifier.get_input_embeddings().weight, verifier.get_output_embeddings().weight)


BACKBONES: dict[str, type[DrafterBackbone]] = {}


def register(architecture: str) -> Callable[[type[DrafterBackbone]], type[DrafterBackbone]]:
    """Class decorator: build drafters whose config names `architecture` with this class."""
    def add(cls: type[DrafterBackbone]) -> type[DrafterBackbone]:
        BACKBONES[architecture] = cls
        cls.architecture = architecture
        return cls
    return add


def backbone_class(config: PretrainedConfig | dict) -> type[DrafterBackbone]:
    """The registered class for a drafter config (a config object or its dict, as checkpoints store it)."""
    architectures = (config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)) or [None]
    if architectures[0] not in BACKBONES:
        raise TapsError(f"drafter architecture {architectures[0]!r} is not a registered backbone (known: {', '.join(sorted(BACKBONES))})")
    return BACKBONES[architectures[0]]


def build_drafter(config: PretrainedConfig | dict) -> DrafterBackbone:
    """A new drafter of the registered backbone `config` names (untrained, verifier parts not yet adopted)."""
    cls = backbone_class(config)
    return cls(cls.config_class.from_dict(config) if isinstance(config, dict) else config)
