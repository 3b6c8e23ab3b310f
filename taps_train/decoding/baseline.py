"""Plain autoregressive decoding of the verifier: the baseline a speedup is measured against.

One verifier call per token with the model's own KV cache and causal mask, the tokens chosen exactly as
speculative decoding chooses its first one (argmax at T=0, a draw from the same distribution at T>0), so
at T=0 its output is the reference that lossless speculative decoding must reproduce token for token.
"""

import torch
from transformers import DynamicCache, PreTrainedModel

from taps_train.decoding.accept import next_token


@torch.no_grad()
def plain_generate(model: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, eos: set[int],
                   temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> list[int]:
    """Up to `max_new_tokens` tokens after `prompt_ids`, stopping after the first token in `eos`."""
    generator = torch.Generator().manual_seed(seed)
    device = input_device(model)
    cache, ids, output = DynamicCache(), torch.tensor([prompt_ids], device=device), []
    while len(output) < max_new_tokens and not (output and output[-1] in eos):
        logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        output.append(next_token(logits.float(), temperature, top_p, generator))
        ids = torch.tensor([[output[-1]]], device=device)
    return output


def input_device(model: PreTrainedModel) -> torch.device:
    """Where input ids go: the embedding's device (the first of a verifier sharded over several)."""
    return model.get_input_embeddings().weight.device
