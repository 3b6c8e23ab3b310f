"""The verifier side of a round: a KV cache over the committed prefix, one forward pass over a packed
tree (4-D ancestor mask, depth-based positions), and compaction of the cache to the accepted path."""

import torch
from transformers import DynamicCache, PreTrainedModel

from taps_train.spec.tree import PackedTree


class VerifierSession:
    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.length = 0
        self.max_length = getattr(model.config, "max_position_embeddings", None)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompt [n]; returns logits [n, V] and post-norm last hidden states [n, H]."""
        out = self.model(input_ids=ids.to(self.device)[None], cache=self.cache, use_cache=True, output_hidden_states=True)
        self.length = len(ids)
        return out.logits[0].float(), out.hidden_states[-1][0].float()

    @torch.no_grad()
    def tree_forward(self, packed: PackedTree) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and hidden states of every tree node, one verifier call."""
        n = len(packed.input_ids)
        mask = torch.ones(n, self.length + n, dtype=torch.bool)
        mask[:, self.length :] = packed.tree_mask
        device = self.device
        out = self.model(
            input_ids=packed.input_ids.to(device)[None],
            position_ids=packed.position_ids.to(device)[None],
            attention_mask=mask.to(device)[None, None],
            cache=self.cache,
            use_cache=True,
            output_hidden_states=True,
        )
        return out.logits[0].float(), out.hidden_states[-1][0].float()

    def commit(self, path: list[int]) -> None:
        """Keep the committed prefix plus the accepted tree nodes `path` (root first) in the cache."""
        keep = torch.cat([torch.arange(self.length), self.length + torch.tensor(path, dtype=torch.long)]).to(self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        self.length += len(path)
