"""The `vllm` layout: vLLM (`speculative_config={"method": "eagle"|"eagle3", "model": DIR, ...}`).

The architecture is `LlamaForCausalLM`: vLLM prefixes a draft's architecture with `Eagle`/`Eagle3` itself. vLLM's
EAGLE-1 Llama draft builds `fc` without a bias and its loader drops `fc.bias` silently, so an fc-bias (HASS-style)
drafter is written with the bias folded into attention biases (`fold_fc_bias`, `attention_bias: true`): the same
function. `bias` is false there, since vLLM reads `bias: true` as attention biases. vLLM shares the embedding with
the target when the draft runs without pipeline parallelism.
"""

import torch

from taps_train.drafter import DrafterBackbone
from taps_train.errors import TapsError
from taps_train.export.layout import Layout, register

FOLDED_BIAS = "layers.0.self_attn.o_proj.bias"  # where a folded fc bias is kept


@register
class VllmLayout(Layout):
    name = "vllm"
    engine = "vLLM (method eagle/eagle3, LlamaForCausalLM)"
    fallback = True  # plain Llama names: how other EAGLE drafts are read too

    def vllm_method(self, backbone: type[DrafterBackbone]) -> str | None:
        return backbone.vllm_method

    def recognizes(self, config: dict) -> bool:
        return config.get("architectures") == ["LlamaForCausalLM"]

    def engine_tensors(self, tensors: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
        return fold_fc_bias(tensors) if "fc.bias" in tensors else tensors

    def files(self, config, tensors, drafter, verifier, verifier_architectures, dtype):
        return {**config, "attention_bias": FOLDED_BIAS in tensors}, tensors

    def read(self, config, tensors, verifier_layers, where):
        if config.get("attention_bias") and FOLDED_BIAS in tensors:
            tensors = unfold_fc_bias(tensors, where)
        return config, tensors


def fold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same drafter without `fc.bias`, for vLLM's EAGLE-1 Llama draft, which has no fc bias but builds q/k/v/o
    biases when the config says `attention_bias`. The layer has no input norm, so fc's bias b reaches attention only
    through q, k and v (biases W_q b, W_k b, W_v b) and the output only through the residual (o_proj's bias b): the
    function is unchanged up to rounding (computed in float64)."""
    tensors = dict(tensors)
    bias = tensors.pop("fc.bias").double()
    dtype = tensors["fc.weight"].dtype
    for name in ("q", "k", "v"):
        weight = tensors[f"layers.0.self_attn.{name}_proj.weight"]
        tensors[f"layers.0.self_attn.{name}_proj.bias"] = (weight.double() @ bias).to(dtype)
    tensors[FOLDED_BIAS] = bias.to(dtype)
    return tensors


def unfold_fc_bias(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """`fold_fc_bias` undone: attention biases that are not a folded fc bias are refused (taps-train's drafter has none)."""
    tensors = dict(tensors)
    bias = tensors.pop(FOLDED_BIAS).double()
    for name in ("q", "k", "v"):
        key = f"layers.0.self_attn.{name}_proj.bias"
        if key not in tensors:
            raise TapsError(f"{where}: config.json says attention_bias but {key} is missing; re-export the drafter")
        folded = tensors[f"layers.0.self_attn.{name}_proj.weight"].double() @ bias
        if not torch.allclose(tensors.pop(key).double(), folded, rtol=2e-2, atol=1e-3 * (float(folded.abs().max()) + 1e-6)):
            raise TapsError(f"{where}: {key} is not the fc bias folded through {name}_proj (W b); taps-train's drafter has no "
                            "attention biases of its own, so this is not one of its exports")
    tensors["fc.bias"] = bias.to(tensors["fc.weight"].dtype)
    return tensors
