"""Combining specialist drafters at inference time (TAPS RQ3).

Every drafter drafts its own tree from the same prefix each round; a strategy decides what the
verifier sees:

- route-confidence / route-entropy: one tree, the one with the highest mean node confidence
  (lowest mean draft entropy);
- merge (the paper's): all trees under one shared root, each subtree attending only to the root and
  its own ancestors; costs about N times the verifier tokens of one tree;
- merge-union: the trie union, so a continuation several drafters propose is verified once (never
  more tokens than `merge`, and the same accepted path at T=0);
- merge-budget: the union trimmed to the `total_tokens - 1` most confident nodes, the verifier budget
  of a single tree.
"""

import torch

from taps_train.errors import TapsError
from taps_train.decoding.tree import DraftTree, TreeConfig, best_nodes

MERGED = -1  # "chosen" value when several drafters contribute to the verified tree


def _need_several(trees: list[DraftTree], name: str) -> None:
    if len(trees) < 2:
        raise TapsError(f"strategy '{name}' combines several drafters; got {len(trees)} (use --strategy single for one)")


def route_confidence(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    _need_several(trees, "route-confidence")
    scores = [tree.mean_confidence() for tree in trees]
    chosen = max(range(len(trees)), key=lambda i: scores[i])
    return trees[chosen], chosen


def route_entropy(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    _need_several(trees, "route-entropy")
    scores = [tree.mean_entropy() for tree in trees]
    chosen = min(range(len(trees)), key=lambda i: scores[i])
    return trees[chosen], chosen


def merge_trees(trees: list[DraftTree]) -> DraftTree:
    """Concatenate the trees' non-root nodes under the first tree's root (all roots are the same token)."""
    parts = {name: [getattr(trees[0], name)[:1]] for name in ("tokens", "parents", "depths", "probs", "confidence", "entropy")}
    sources = [torch.tensor([-1])]
    offset = 0
    for index, tree in enumerate(trees):
        parents = tree.parents[1:]
        parts["parents"].append(torch.where(parents > 0, parents + offset, parents))
        for name in ("tokens", "depths", "probs", "confidence", "entropy"):
            parts[name].append(getattr(tree, name)[1:])
        sources.append(torch.full((len(tree) - 1,), index))
        offset += len(tree) - 1
    return DraftTree(**{name: torch.cat(values) for name, values in parts.items()}, source=torch.cat(sources))


def union_trees(trees: list[DraftTree]) -> DraftTree:
    """Trie union: nodes with the same root-to-node token path become one node, keeping the highest
    confidence among the copies (and that copy's probability, entropy and source)."""
    root = trees[0]
    rows = [[int(root.tokens[0]), -1, 0, 1.0, 1.0, 0.0, -1]]
    index_of: dict[tuple[int, int], int] = {}
    for source, tree in enumerate(trees):
        local = {0: 0}
        tokens, parents, depths = tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist()
        probs, confidence, entropy = tree.probs.tolist(), tree.confidence.tolist(), tree.entropy.tolist()
        for node in range(1, len(tree)):
            key = (local[parents[node]], tokens[node])
            row = [key[1], key[0], depths[node], probs[node], confidence[node], entropy[node], source]
            if key not in index_of:
                index_of[key] = len(rows)
                rows.append(row)
            elif row[4] > rows[index_of[key]][4]:
                rows[index_of[key]] = row
            local[node] = index_of[key]
    columns = list(zip(*rows))
    return DraftTree(
        tokens=torch.tensor(columns[0]), parents=torch.tensor(columns[1]), depths=torch.tensor(columns[2]),
        probs=torch.tensor(columns[3]), confidence=torch.tensor(columns[4]), entropy=torch.tensor(columns[5]),
        source=torch.tensor(columns[6]),
    )


def merge(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    _need_several(trees, "merge")
    return merge_trees(trees), MERGED


def merge_union(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    _need_several(trees, "merge-union")
    return union_trees(trees), MERGED


def merge_budget(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    _need_several(trees, "merge-budget")
    return best_nodes(union_trees(trees), config.total_tokens - 1), MERGED
