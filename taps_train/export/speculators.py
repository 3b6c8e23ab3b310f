"""The `speculators` layout of an EAGLE-3 draft (the `speculators` library's format; vLLM serves it with
`vllm serve DIR`, taking the verifier from the config).

`config.json` nests the drafter's Llama config under `transformer_layer_config` (its `vocab_size` is the
verifier's) next to `speculators_model_type: "eagle3"`, `draft_vocab_size`, `target_hidden_size`,
`norm_before_residual` and `eagle_aux_hidden_state_layer_ids` (indices into the verifier's hidden states: the
inputs of decoder layers, as taps-train counts them), and a `speculators_config` naming the algorithm, one greedy
proposal method and the verifier. Weights are the EAGLE-3 checkpoint's with the decoder layer named `layers.0.`
instead of `midlayer.`; `d2t` holds offsets (verifier id = draft id + d2t) as in every EAGLE-3 draft.

taps-train's drafter keeps the residual before `hidden_norm` (`norm_before_residual: false`) and builds two of the
variants' extra norms, `norm_before_fc` and `norm_output` (speculators' own defaults for EAGLE-3), written as trained;
drafts that use the others (`norm_before_residual`, `fc_norm`) are refused on reading.
"""

from collections.abc import Mapping

import torch
from transformers import LlamaConfig

from taps_train.drafter import DrafterBackbone
from taps_train.drafter.eagle3 import NORM_VARIANTS, UNBUILT_VARIANTS, norm_variants
from taps_train.errors import TapsError
from taps_train.export.layout import Layout, register

MODEL_TYPE = "eagle3"
LAYOUT_VERSION = "0.9.0"  # the speculators release whose config schema this layout follows
SPECULATIVE_TOKENS = 3  # the greedy chain length vLLM drafts when the serving command does not say
LAYER_PREFIX, SPECULATORS_LAYER_PREFIX = "midlayer.", "layers.0."


@register
class SpeculatorsLayout(Layout):
    name = "speculators"
    engine = "the speculators library's format, served by `vllm serve DIR` alone"
    served_alone = True

    def vllm_method(self, backbone: type[DrafterBackbone]) -> str | None:
        return backbone.vllm_method

    def recognizes(self, config: dict) -> bool:
        return "speculators_model_type" in config

    def files(self, config, tensors, drafter, verifier, verifier_architectures, dtype):
        return speculators_config(config, drafter, verifier, verifier_architectures, dtype), to_speculators_names(tensors)

    def read(self, config, tensors, verifier_layers, where):
        return from_speculators(config, tensors, verifier_layers, where)


def speculators_config(llama: dict, config: LlamaConfig, verifier: str, verifier_architectures: list[str], dtype: str) -> dict:
    """config.json for the EAGLE-3 drafter `config`, whose serving Llama config is `llama`."""
    layer_config = {key: value for key, value in llama.items() if key not in ("architectures", "eagle_config", "draft_vocab_size",
                                                                               "target_hidden_size", "bias", "fc_bias", *NORM_VARIANTS)}
    return {
        "architectures": llama["architectures"],
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": LAYOUT_VERSION,
        "transformer_layer_config": layer_config,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.eagle_config["eagle_aux_hidden_state_layer_ids"]),
        **dict.fromkeys(UNBUILT_VARIANTS, False),
        **norm_variants(config),
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": SPECULATIVE_TOKENS}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def to_speculators_names(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {_renamed(key, LAYER_PREFIX, SPECULATORS_LAYER_PREFIX): value for key, value in tensors.items()}


def from_speculators(config_dict: dict, tensors: Mapping[str, torch.Tensor], num_verifier_layers: int,
                     where: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """A speculators EAGLE-3 draft as the flat config (vLLM layer ids) and `midlayer.` tensors taps-train reads.
    Layer ids left out mean the speculators default for the verifier: 2, L/2 and L-3."""
    if config_dict.get("speculators_model_type") != MODEL_TYPE:
        raise TapsError(f"{where}: speculators_model_type is {config_dict.get('speculators_model_type')!r}; "
                        f"taps-train reads speculators drafts of type {MODEL_TYPE!r} only")
    layer_config = config_dict.get("transformer_layer_config")
    if not isinstance(layer_config, dict):
        raise TapsError(f"{where}: config.json has no transformer_layer_config object; it is not a speculators draft")
    if not isinstance(config_dict.get("draft_vocab_size"), int):
        raise TapsError(f"{where}: config.json has no integer draft_vocab_size; an EAGLE-3 draft needs one")
    variants = [flag for flag in UNBUILT_VARIANTS if config_dict.get(flag)]
    if variants:
        raise TapsError(f"{where}: the draft sets {variants}; taps-train's EAGLE-3 drafter has no such norms and would draft differently")
    layers = config_dict.get("eagle_aux_hidden_state_layer_ids")
    if layers is None:
        layers = [2, num_verifier_layers // 2, num_verifier_layers - 3]
        if not 0 <= min(layers) <= max(layers) <= num_verifier_layers:
            raise TapsError(f"{where}: config.json names no eagle_aux_hidden_state_layer_ids, and the speculators default "
                            f"{layers} (2, L/2, L-3) does not exist in a {num_verifier_layers}-layer verifier; add the ids the draft was trained on")
    flat = {**layer_config, "draft_vocab_size": config_dict.get("draft_vocab_size"),
            "target_hidden_size": config_dict.get("target_hidden_size"), **{flag: bool(config_dict.get(flag)) for flag in NORM_VARIANTS},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}
    return flat, {_renamed(key, SPECULATORS_LAYER_PREFIX, LAYER_PREFIX): value for key, value in tensors.items()}


def _renamed(key: str, old: str, new: str) -> str:
    return new + key.removeprefix(old) if key.startswith(old) else key
