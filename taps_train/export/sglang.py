"""The `eagle` layout: SGLang (`--speculative-algorithm EAGLE|EAGLE3 --speculative-draft-model-path DIR`).

SGLang's EAGLE-1/2 draft (`LlamaForCausalLMEagle`) always has an fc bias, so a drafter trained without one gets an
explicit zero `fc.bias` (the same function). SGLang numbers EAGLE-3's fused states by decoder-layer *output*, one
less than taps-train's `hidden_states` indices (decoder-layer inputs). It takes the embedding and LM head from the
target model; an exported embedding is for engines and reference code that read it from the draft checkpoint.
Its EAGLE-3 draft has neither of the norm variants (`norm_before_fc`, `norm_output`), so drafters trained with one
are refused here.
"""

import torch

from taps_train.drafter.eagle3 import NORM_VARIANTS
from taps_train.export.layout import Layout, register

ALWAYS_BIASED = "LlamaForCausalLMEagle"


@register
class SglangLayout(Layout):
    name = "eagle"
    engine = "SGLang (LlamaForCausalLMEagle/Eagle3)"
    layer_offset = -1
    unread_flags = NORM_VARIANTS  # its LlamaForCausalLMEagle3 builds neither (and drops an input_norm weight unread)

    def recognizes(self, config: dict) -> bool:
        return bool(set(config.get("architectures") or []) & {"LlamaForCausalLMEagle", "LlamaForCausalLMEagle3"})

    def engine_tensors(self, tensors: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
        if architecture == ALWAYS_BIASED and "fc.bias" not in tensors:
            weight = tensors["fc.weight"]
            tensors = {**tensors, "fc.bias": torch.zeros(weight.shape[0], dtype=weight.dtype)}
        return tensors
