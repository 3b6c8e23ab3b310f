"""Drafter backbones: the interface every drafter network offers, and the registry that builds them.

A backbone is an `nn.Module` class registered under the architecture name its config carries
(`config.architectures[0]`, the name serving engines dispatch on too). Checkpoints store the drafter
config, so `build_drafter(config)` is the one place a drafter is made, whether for training, from a
checkpoint, or from an export; nothing else names a drafter class.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig

from taps_train.features import FeatureContract
from taps_train.errors import TapsError


class DrafterBackbone(nn.Module, ABC):
    """What training, tree drafting, checkpoints and export need of a drafter.

    A drafter reads, per position t, the next token x_{t+1} and a feature of position t (verifier
    features at committed positions, its own predicted state inside a draft) and predicts a hidden
    state whose `logits` guess x_{t+2} in the verifier's vocabulary.
    """

    config: PretrainedConfig
    config_class: type[PretrainedConfig] = LlamaConfig
    architecture: ClassVar[str]  # set by `register`
    label: ClassVar[str]  # what users call it: "EAGLE-3"
    # How serving engines know this backbone: the architecture name each export layout (`taps_train.export`) writes
    # for it, where that layout can serve it, and vLLM's speculative method for it.
    serving: ClassVar[dict[str, str]] = {}
    vllm_method: ClassVar[str | None] = None
    # Saved tensors and config keys that only taps-train's own decoder uses; export layouts leave them out.
    decoder_only: ClassVar[tuple[str, ...]] = ()
    # The submodule that is a Llama decoder layer (attention, post-attention norm, MLP), which `layer_init: verifier`
    # starts from the verifier's last layer; None: the backbone has none.
    decoder_layer: ClassVar[str | None] = None

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

    def chosen_vocabulary_size(self) -> int | None:
        """How many tokens this drafter proposes when it picks them from its training data (`set_vocabulary`, which
        training calls with the most frequent ones); None: it proposes from the whole verifier vocabulary."""
        return None

    def set_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Propose only the verifier ids `token_ids` (distinct, `chosen_vocabulary_size()` of them)."""
        raise TapsError(f"this {self.label} drafter proposes from the whole verifier vocabulary; it has no vocabulary to set")

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

    @classmethod
    def variant_flags(cls, config: PretrainedConfig | dict) -> dict[str, bool]:
        """Config flags that change what the network computes without changing its weights' names or shapes: drafters
        that differ in one are different networks (averaging must refuse them)."""
        return {}

    def load_verifier_parts(self, verifier: nn.Module) -> None:
        """Share a loaded verifier's input embedding and LM head."""
        self.use_verifier_parts(verifier.get_input_embeddings().weight, verifier.get_output_embeddings().weight)

    @classmethod
    def trained_as(cls, config: PretrainedConfig) -> str:
        """The training method's name (`eagle2`, `hass`, ...) as far as the drafter config tells it; the training
        hyper-parameters, where a checkpoint has them, say it exactly (`training.base.method_of`)."""
        return cls.architecture

    # --- serving: what export layouts write and read back --------------------------------------------------------

    @classmethod
    def serving_fields(cls, config: PretrainedConfig, layer_offset: int) -> dict:
        """Config keys engines need beyond the Llama layer's; fused verifier states are numbered `layer_offset` away
        from taps-train's `hidden_states` indices (the layout's convention)."""
        return {}

    @classmethod
    def check_servable(cls, config: PretrainedConfig, verifier_layers: int | None, where: str) -> None:
        """Refuse a trained drafter that engines cannot serve as trained (`verifier_layers`: None when unknown)."""

    @classmethod
    def reads(cls, config_dict: dict) -> bool:
        """Whether a serving config.json written elsewhere (no taps_export.json names its backbone) is this backbone's."""
        return False

    @classmethod
    def from_serving(cls, config_dict: dict, tensors: dict[str, torch.Tensor], verifier_config: PretrainedConfig, where: str,
                     layer_offset: int) -> tuple[PretrainedConfig, dict[str, torch.Tensor]]:
        """This backbone's config and tensors from a serving config (the Llama keys, flat) and its files' tensors, checked."""
        config = cls.config_class.from_dict({**config_dict, "architectures": [cls.architecture]})
        check_tensors(tensors, cls.tensor_shapes(config, bias="fc.bias" in tensors, embeddings="embed_tokens.weight" in tensors), where,
                      cls.index_tensors())
        return config, tensors

    # --- averaging -----------------------------------------------------------------------------------------------

    @classmethod
    def align_for_averaging(cls, states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict:
        """Make the checkpoints' weights (`drafter.`-prefixed state dicts, edited in place) correspond entry for entry
        before they are averaged; the drafter config keys that change. Nothing to do where rows mean the same things."""
        return {}


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], where: str,
                  index_tensors: dict[str, torch.dtype] | None = None) -> None:
    """Exactly the expected keys, each with its shape; finite floating-point weights, and `index_tensors` (token
    maps) in their dtype: what decoding, export and averaging rely on."""
    missing = [key for key in expected if key not in tensors]
    if missing:
        raise TapsError(f"{where} lacks {missing[0]} (expected shape {list(expected[missing[0]])})"
                        + (f" and {len(missing) - 1} more" if len(missing) > 1 else "") + "; it is not a complete drafter")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise TapsError(f"{where} has tensors this drafter does not: {unexpected}")
    for key, shape in expected.items():
        tensor = tensors[key]
        if tuple(tensor.shape) != shape:
            raise TapsError(f"{where}: {key} has shape {list(tensor.shape)}, expected {list(shape)} from the drafter config")
        if key in (index_tensors or {}):
            if tensor.dtype != index_tensors[key]:
                raise TapsError(f"{where}: {key} is {tensor.dtype}, expected {index_tensors[key]}; it does not hold a drafter's token map")
            continue
        if not tensor.is_floating_point():
            raise TapsError(f"{where}: {key} is {tensor.dtype}, not floating point; it does not hold a drafter's weights")
        if not torch.isfinite(tensor).all():
            raise TapsError(f"{where}: {key} has non-finite values (NaN/inf); the checkpoint is corrupt or training diverged")


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
