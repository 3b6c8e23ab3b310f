"""A drafter's incremental decoding state and EAGLE-2 dynamic tree drafting."""

import torch

from taps_train.drafter import DrafterBackbone, KVCache
from taps_train.features import FEATURES
from taps_train.decoding.verify import HiddenStates
from taps_train.decoding.tree import DraftTree, TreeConfig, best_nodes


class DrafterState:
    """One drafter across decoding rounds: the KV cache of committed positions (position t consumed
    (f_t, x_{t+1})) and its predicted feature for the position after the newest committed token.

    Committed positions are queued and run through the drafter when it next drafts, in one pass: rounds decoded
    without drafting (plain decoding, `decoding/gate.py`) cost the drafter nothing, and it catches up at once."""

    def __init__(self, drafter: DrafterBackbone):
        self.drafter = drafter
        self.cache = KVCache()
        self.committed = 0
        self._root_feature: torch.Tensor | None = None
        self._queued: list[tuple[torch.Tensor, torch.Tensor]] = []  # (features [m, F], next ids [m]) not yet run

    def extend(self, hidden: HiddenStates, next_ids: torch.Tensor) -> None:
        """Commit positions: the verifier's hidden states there ([m, H] each; the drafter takes the ones its
        feature contract names) and the tokens that followed them [m]."""
        self._queued.append((self.drafter.feature_contract().extract(hidden)[FEATURES], next_ids))

    @property
    def root_feature(self) -> torch.Tensor:
        self.catch_up()
        return self._root_feature

    @torch.no_grad()
    def catch_up(self) -> None:
        """Run the queued positions through the drafter, all in one forward."""
        if not self._queued:
            return
        features = torch.cat([f for f, _ in self._queued])
        next_ids = torch.cat([ids for _, ids in self._queued])
        self._queued = []
        self._truncate()
        m = len(next_ids)
        device = self.drafter.fc.weight.device
        positions = torch.arange(self.committed, self.committed + m, device=device)[None]
        mask = torch.ones(m, self.committed + m, dtype=torch.bool, device=device)
        mask[:, self.committed :] = torch.ones(m, m, dtype=torch.bool, device=device).tril()
        out = self.drafter(next_ids.to(device)[None], features.to(device, self.drafter.fc.weight.dtype)[None], positions, mask, self.cache)
        self.committed += m
        self._root_feature = out[0, -1]

    def _truncate(self) -> None:
        """Drop the speculative tree entries of the last round."""
        self.cache.crop(self.committed)

    @torch.no_grad()
    def draft(self, root_token: int, config: TreeConfig) -> DraftTree:
        """EAGLE-2: expand the top-k children of every frontier node, score candidates by confidence
        (cumulative draft probability), carry the best k of each level forward, draft `depth + 1`
        levels, then keep the `total_tokens - 1` most confident nodes."""
        root_feature = self.root_feature
        self._truncate()
        device = root_feature.device
        one = torch.ones(1, device=device)
        columns = {"tokens": [torch.tensor([root_token], device=device)], "parents": [torch.tensor([-1], device=device)],
                   "depths": [torch.zeros(1, dtype=torch.long, device=device)], "probs": [one], "confidence": [one], "entropy": [0 * one]}
        size = 1
        frontier = torch.tensor([0], device=device)
        frontier_conf, frontier_features = one, root_feature[None]
        parents_so_far = torch.tensor([-1], device=device)
        cached_nodes = torch.empty(0, dtype=torch.long, device=device)
        for level in range(1, config.levels + 1):
            logits, vocabulary = self.drafter.proposal_logits(frontier_features)
            p = torch.softmax(logits.float(), dim=-1)
            k = min(config.top_k, p.shape[-1])  # a draft vocabulary may be smaller than top_k
            top_p, top_tokens = p.topk(k, dim=-1)
            if vocabulary is not None:
                top_tokens = vocabulary[top_tokens]
            candidate_conf = (frontier_conf[:, None] * top_p).flatten()
            count = candidate_conf.numel()
            columns["tokens"].append(top_tokens.flatten())
            columns["parents"].append(frontier.repeat_interleave(k))
            columns["depths"].append(torch.full((count,), level, device=device))
            columns["probs"].append(top_p.flatten())
            columns["confidence"].append(candidate_conf)
            columns["entropy"].append(torch.special.entr(p).sum(-1).repeat_interleave(k))  # entr(0) = 0: underflow adds nothing
            parents_so_far = torch.cat([parents_so_far, columns["parents"][-1]])
            if level == config.levels:
                break
            chosen = candidate_conf.topk(min(k, count)).indices
            frontier = size + chosen
            frontier_conf = candidate_conf[chosen]
            ancestors = _ancestors(frontier, parents_so_far, level)
            frontier_features = self._expand(columns["tokens"][-1][chosen], frontier_features[chosen // k], level,
                                             cached_nodes, ancestors)
            cached_nodes = torch.cat([cached_nodes, frontier])
            size += count
        tree = DraftTree(**{name: torch.cat(parts).cpu() for name, parts in columns.items()})
        return best_nodes(tree, config.total_tokens - 1)

    def _expand(self, tokens: torch.Tensor, parent_features: torch.Tensor, level: int, cached_nodes: torch.Tensor,
                ancestors: torch.Tensor) -> torch.Tensor:
        """Run the drafter on one level's chosen nodes; each attends to the committed context, its
        drafted ancestors (`ancestors`: [k, level] node ids) and itself. Returns features [k, H]."""
        device = parent_features.device
        k = len(tokens)
        drafted = (cached_nodes[None, :, None] == ancestors[:, None, :]).any(-1)  # [k, cached]
        mask = torch.cat([torch.ones(k, self.committed, dtype=torch.bool, device=device), drafted,
                          torch.eye(k, dtype=torch.bool, device=device)], dim=1)
        positions = torch.full((1, k), self.committed + level - 1, device=device)
        return self.drafter(tokens[None], parent_features[None], positions, mask, self.cache)[0]


def _ancestors(nodes: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
    """[k, depth] ancestors of nodes at `depth` (parent first; the root appears as 0)."""
    chain, current = [], nodes
    for _ in range(depth):
        current = parents[current].clamp_min(0)
        chain.append(current)
    return torch.stack(chain, dim=1)
