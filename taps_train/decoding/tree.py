"""Draft trees: the data structure, EAGLE-2 dynamic tree construction, and packing for the verifier.

Node 0 is the root: the newest committed token, which the verifier has not processed yet. Every other
node is a candidate continuation. A tree is plain tensors so that several trees can be merged,
rerouted or compared without knowing how they were drafted.
"""

from dataclasses import dataclass, field

import torch

from taps_train.errors import TapsError
from taps_train.ranges import int_problem


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 tree shape. `depth` means what it means in EAGLE-2's code: the drafter expands the
    frontier `depth` times after the root's own top-k, so trees reach `depth + 1` levels below the
    root (the paper-equivalent default, depth 5, drafts 6 levels). `total_tokens` counts the root.

    `PLAIN` (the root alone) is plain decoding: no drafter is consulted and every round emits the verifier's own
    token; `--tree auto` chooses it where no tree is expected to beat it. The defaults are the paper's tree; the
    range rule is `tree_problems`, the one every command and config that takes a tree applies."""

    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10

    def __post_init__(self):
        problems = tree_problems(self.total_tokens, self.depth, self.top_k)
        if problems:
            raise TapsError(f"tree parameters make no tree (total_tokens={self.total_tokens}, depth={self.depth}, top_k={self.top_k}): "
                            + "; ".join(f"{name} {problem}" for name, problem in problems.items()))

    @property
    def levels(self) -> int:
        return self.depth + 1

    @property
    def plain(self) -> bool:
        return self.total_tokens == 1


def tree_problems(total_tokens: object, depth: object, top_k: object, plain: bool = True) -> dict[str, str]:
    """The range rule of tree shapes, by field: total tokens hold the root and at least one draft token, the depth lies
    in 1..total tokens - 1 (more levels than draft tokens are levels it cannot keep), top-k is at least 1; (1, 0, 1)
    is plain decoding, where `plain` allows it. A chain of one token is (2, 1, 1): its second level is drafted but
    never kept (a child's confidence never exceeds its parent's, and ties keep the shallower node)."""
    if plain and (total_tokens, depth, top_k) == (1, 0, 1):
        return {}
    problems = {}
    for name, value, minimum, what in (("total_tokens", total_tokens, 2, "the root and at least one draft token"),
                                       ("depth", depth, 1, "at least 1"), ("top_k", top_k, 1, "at least 1")):
        problem = int_problem(value, minimum, what)
        if problem:
            problems[name] = problem
    if not problems and depth > total_tokens - 1:
        problems["depth"] = f"{depth} is out of range: need 1 <= depth <= total tokens - 1 = {total_tokens - 1}"
    return problems


PLAIN = TreeConfig(total_tokens=1, depth=0, top_k=1)


@dataclass
class DraftTree:
    """Nodes in topological order (parents before children). Per node: token, parent index (-1 for
    the root), depth, draft probability of the token given its parent, confidence (product of draft
    probabilities along the path) and entropy of the draft distribution the token was drawn from."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    probs: torch.Tensor
    confidence: torch.Tensor
    entropy: torch.Tensor
    source: torch.Tensor = field(default=None)  # which drafter proposed each node (composition strategies)
    _children: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.source is None:
            self.source = torch.zeros_like(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        """Children of `node`, most probable first (the order sampling verification tries them). All nodes' lists
        come from one sort, made on the first call (acceptance asks for several nodes' children per round)."""
        if self._children is None:
            by_probability = torch.argsort(self.probs, descending=True, stable=True)
            order = by_probability[torch.argsort(self.parents[by_probability], stable=True)]  # by parent, then probability
            counts = torch.bincount(self.parents[order].clamp_min(0), minlength=len(self)).tolist()
            counts[0] -= 1  # the root (parent -1, sorted first) is nobody's child
            nodes = order[1:].tolist()
            self._children, start = [], 0
            for count in counts:
                self._children.append(nodes[start : start + count])
                start += count
        return self._children[node]

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: node i may attend to node j iff j is i or one of its ancestors (built level by level)."""
        mask = torch.eye(len(self), dtype=torch.bool)
        for depth in range(1, int(self.depths.max()) + 1):
            nodes = (self.depths == depth).nonzero().flatten()
            mask[nodes] |= mask[self.parents[nodes]]
        return mask

    def mean_confidence(self) -> float:
        """The routing score of TAPS: mean confidence over the non-root nodes."""
        return float(self.confidence[1:].mean()) if len(self) > 1 else 0.0

    def mean_entropy(self) -> float:
        return float(self.entropy[1:].mean()) if len(self) > 1 else float("inf")


def root_only(token: int) -> DraftTree:
    one = torch.ones(1)
    return DraftTree(torch.tensor([token]), torch.tensor([-1]), torch.zeros(1, dtype=torch.long), one, one.clone(), torch.zeros(1))


def chain(tokens: list[int]) -> DraftTree:
    """A tree that is one path: the root (tokens[0]) and each next token the child of the one before."""
    n = len(tokens)
    return DraftTree(torch.tensor(tokens), torch.arange(-1, n - 1), torch.arange(n), torch.ones(n), torch.ones(n), torch.zeros(n))


@dataclass
class PackedTree:
    """What the verifier needs: ids, positions (prefix length + depth), and the tree part of the mask."""

    input_ids: torch.Tensor  # [N]
    position_ids: torch.Tensor  # [N]
    tree_mask: torch.Tensor  # [N, N], ancestors only


def pack(tree: DraftTree, prefix_length: int) -> PackedTree:
    return PackedTree(tree.tokens.clone(), prefix_length + tree.depths, tree.ancestor_mask())


def select_nodes(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The subtree of nodes `keep` (sorted, ancestor-closed, containing the root), re-indexed."""
    keep = torch.sort(keep).values
    new_index = torch.full((len(tree),), -1, dtype=torch.long)
    new_index[keep] = torch.arange(len(keep))
    parents = tree.parents[keep]
    parents = torch.where(parents >= 0, new_index[parents.clamp_min(0)], parents)
    if (parents[1:] < 0).any():
        raise ValueError("select_nodes needs an ancestor-closed set of nodes")
    return DraftTree(tree.tokens[keep], parents, tree.depths[keep], tree.probs[keep], tree.confidence[keep], tree.entropy[keep], tree.source[keep])


def best_nodes(tree: DraftTree, budget: int) -> DraftTree:
    """Keep the root and the `budget` most confident nodes (EAGLE-2's rerank).

    A child's confidence is its parent's times a probability <= 1, so it never exceeds the parent's
    (also in floating point); ranking ties by depth puts parents first, so the kept set is always
    ancestor-closed.
    """
    if len(tree) - 1 <= budget:
        return tree
    return select_nodes(tree, torch.cat([torch.tensor([0]), rerank_order(tree)[:budget]]))


def rerank_order(tree: DraftTree) -> torch.Tensor:
    """The non-root nodes in the order EAGLE-2's rerank keeps them: most confident first, ties shallower first, then
    in drafting order. `best_nodes` keeps a prefix of it; `--tree auto` replays smaller trees with it."""
    by_depth = torch.argsort(tree.depths[1:], stable=True) + 1
    return by_depth[torch.argsort(tree.confidence[by_depth], descending=True, stable=True)]
