"""Export layouts: the directory one serving engine loads a drafter from, and how taps-train reads it back.

Each layout is a module of this package that registers a `Layout`. An export records its layout (and the drafter's
backbone) in `taps_export.json`, so reading it back never guesses; a draft exported elsewhere is read by the layout
that recognizes its config. What a backbone is called in a layout is the backbone's fact (`DrafterBackbone.serving`);
what the engine expects of the files (names, nesting, biases) is the layout's.
"""

from typing import ClassVar

import torch
from transformers import PretrainedConfig

from taps_train.drafter import DrafterBackbone, backbone_class
from taps_train.errors import TapsError
from taps_train.verifier.portable import portable_config


class Layout:
    """How one engine loads drafts. Subclasses override what their engine does differently."""

    name: ClassVar[str]  # the `--format` value
    engine: ClassVar[str]  # who loads it and how, for `--format`'s help
    layer_offset: ClassVar[int] = 0  # fused verifier states as the engine numbers them, minus taps-train's indices
    served_alone: ClassVar[bool] = False  # whether vLLM serves the directory as the model itself (its config names the verifier)
    fallback: ClassVar[bool] = False  # drafts from elsewhere that no layout recognizes are read in this one
    unread_flags: ClassVar[tuple[str, ...]] = ()  # drafter config flags the engine ignores: drafters that set one are refused

    def architecture(self, backbone: type[DrafterBackbone]) -> str | None:
        """The architecture name this layout writes for `backbone`'s drafts; None where its engine cannot serve them."""
        return backbone.serving.get(self.name)

    def vllm_method(self, backbone: type[DrafterBackbone]) -> str | None:
        """vLLM's speculative method for this layout's drafts of `backbone`; None where vLLM does not serve the layout."""
        return None

    def recognizes(self, config: dict) -> bool:
        """Whether a config.json written elsewhere (without taps_export.json) is in this layout."""
        return False

    def engine_tensors(self, tensors: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
        """The checked drafter tensors as the engine expects them (before the config is written)."""
        return tensors

    def files(self, config: dict, tensors: dict[str, torch.Tensor], drafter: PretrainedConfig, verifier: str,
              verifier_architectures: list[str], dtype: str) -> tuple[dict, dict[str, torch.Tensor]]:
        """config.json and the tensors as the layout names them, from the flat serving config."""
        return config, tensors

    def read(self, config: dict, tensors: dict[str, torch.Tensor], verifier_layers: int, where: str) -> tuple[dict, dict[str, torch.Tensor]]:
        """`files` undone: the flat serving config and the drafter's tensor names."""
        return config, tensors


LAYOUTS: dict[str, Layout] = {}


def register(layout: type[Layout]) -> type[Layout]:
    """Class decorator: offer the layout as `--format <its name>`."""
    LAYOUTS[layout.name] = layout()
    return layout


def layout_named(name: str) -> Layout:
    if name not in LAYOUTS:
        raise TapsError(f"unknown export format {name!r}; use one of {sorted(LAYOUTS)}")
    return LAYOUTS[name]


def serving_config(config: PretrainedConfig, layout: str | Layout, dtype: str, bias: bool) -> dict:
    """The drafter's Llama config as `layout`'s engine reads it, with the legacy RoPE keys next to `rope_parameters`
    (written both the transformers-5 way and the way engines pinned to transformers 4 read it). `bias` says whether
    `fc.bias` is in the weights (the EAGLE configs' key), `fc_bias` whether the drafter was trained with one."""
    layout = layout_named(layout) if isinstance(layout, str) else layout
    backbone = backbone_class(config)
    result = {key: value for key, value in config.to_dict().items() if key not in backbone.decoder_only}
    result.update(architectures=[layout.architecture(backbone)], model_type="llama", num_hidden_layers=1, tie_word_embeddings=False,
                  bias=bias, fc_bias=getattr(config, "fc_bias", False), dtype=dtype)
    return {**portable_config(result), **backbone.serving_fields(config, layout.layer_offset)}

