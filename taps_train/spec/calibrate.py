"""`--tree auto`: the draft tree that maximises expected tokens/s on the machine at hand.

Tokens/s of a tree shape = τ(shape) / (verifier call of its size + drafting at its depth and width + committing).
Both sides are measured here, never assumed: on a GPU a call of 60 tokens costs about what a call of one does,
so the paper's wide trees win; on a CPU the cost grows with every token and small trees or chains win.

- Costs: the verifier's tree call timed for a ladder of sizes after a real prompt (interpolated between them),
  the drafter's drafting timed for every (depth, top_k) searched, and one commit of an accepted path.
- τ: on a few calibration prompts the verifier's greedy continuation is the path any tree must hold to be
  accepted at T=0. At each position of it the drafter drafts the largest tree searched (EAGLE-2 with the
  upper bounds of total tokens, depth and top_k); every smaller shape's tree is replayed from it exactly as
  EAGLE-2 would select it (top-k children, top-k frontier per level, then the most confident nodes), and
  accepts the longest prefix of the continuation it contains.

The verifier and drafter states used are the decoder's own (`VerifierSession`, `DrafterState`), so the
replay sees the drafts decoding will see.
"""

import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from taps_train.drafter import DrafterBackbone
from taps_train.errors import TapsError
from taps_train.spec.baseline import plain_generate
from taps_train.spec.draft import DrafterState
from taps_train.spec.tree import DraftTree, TreeConfig, chain, pack
from taps_train.spec.verify import VerifierSession

CALL_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
TOP_KS = (1, 2, 3, 4, 6, 8, 10, 12, 16)
TOTAL_TOKENS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 60, 64, 80, 96, 128)
REPEATS = 3


@dataclass(frozen=True)
class Candidate:
    tree: TreeConfig
    expected_tau: float
    round_ms: float

    @property
    def tokens_per_s(self) -> float:
        return 1000 * self.expected_tau / self.round_ms

    def as_dict(self) -> dict:
        return {"total_tokens": self.tree.total_tokens, "depth": self.tree.depth, "top_k": self.tree.top_k,
                "expected_tau": round(self.expected_tau, 4), "round_ms": round(self.round_ms, 3),
                "expected_tokens_per_s": round(self.tokens_per_s, 3)}


@dataclass(frozen=True)
class TreeCalibration:
    """What `--tree auto` measured and chose; the eval report keeps it as `tree_calibration`."""

    choice: Candidate
    call_ms: dict[int, float]  # verifier call by tokens per call (1: a plain decoding step)
    draft_ms: dict[tuple[int, int], float]  # drafting by (depth, top_k)
    commit_ms: float
    positions: int  # continuation positions the acceptance was replayed at
    ranking: list[Candidate]  # the best shapes, best first

    def as_dict(self) -> dict:
        return {
            "choice": self.choice.as_dict(),
            "plain_tokens_per_s": round(1000 / self.call_ms[1], 3),
            "call_ms_by_tokens": {str(size): round(ms, 3) for size, ms in self.call_ms.items()},
            "draft_ms_by_depth_top_k": {f"{depth},{k}": round(ms, 3) for (depth, k), ms in self.draft_ms.items()},
            "commit_ms": round(self.commit_ms, 3),
            "positions": self.positions,
            "ranking": [candidate.as_dict() for candidate in self.ranking],
        }


@dataclass
class RecordedDraft:
    """One drafted tree as plain lists (replays run many small steps), with the continuation to accept."""

    children: list[list[int]]  # per node, most probable first
    confidence: list[float]
    depth: list[int]
    token: list[int]
    continuation: list[int]

    @classmethod
    def of(cls, tree: DraftTree, continuation: list[int]) -> "RecordedDraft":
        return cls([tree.children(node) for node in range(len(tree))], tree.confidence.tolist(), tree.depths.tolist(),
                   tree.tokens.tolist(), continuation)

    def budgets(self, depth: int, top_k: int) -> list[int]:
        """Entry j: the fewest non-root nodes an EAGLE-2 tree of this depth and top_k (replayed from this larger
        tree: top-k children, top-k frontier per level, then the most confident nodes) keeps to accept j + 1
        continuation tokens. Non-decreasing; a tree keeping b nodes accepts the entries <= b."""
        selected, frontier = [], [0]
        for _ in range(depth + 1):
            candidates = [child for node in frontier for child in self.children[node][:top_k]]
            selected += candidates
            frontier = sorted(candidates, key=lambda n: -self.confidence[n])[:top_k]
        rank = {node: r for r, node in enumerate(sorted(selected, key=lambda n: (-self.confidence[n], self.depth[n])))}
        budgets, node, worst = [], 0, -1
        for token in self.continuation:
            node = next((c for c in self.children[node] if c in rank and self.token[c] == token), None)
            if node is None:
                break
            worst = max(worst, rank[node])
            budgets.append(worst + 1)
        return budgets


def shapes(bound: TreeConfig) -> list[TreeConfig]:
    """Every shape searched: depth 1..bound, top_k and total tokens from fixed ladders up to the bounds (each
    bound itself included), total tokens no more than the tree can hold."""
    top_ks = sorted({k for k in TOP_KS if k <= bound.top_k} | {bound.top_k})
    totals = sorted({n for n in TOTAL_TOKENS if n <= bound.total_tokens} | {bound.total_tokens})
    found = []
    for depth in range(1, bound.depth + 1):
        for k in top_ks:
            capacity = 1 + k + depth * k * k  # root, the root's k children, then k frontier nodes x k children per level
            for total in totals:
                found.append(TreeConfig(min(total, capacity), depth, k))
                if total >= capacity:
                    break
    return list(dict.fromkeys(found))


def calibrate_tree(model: PreTrainedModel, drafter: DrafterBackbone, prompts: list[list[int]], eos: set[int], bound: TreeConfig,
                   continuation_tokens: int = 48, keep: int = 10) -> TreeCalibration:
    """Measure costs and acceptance on `prompts` (token ids) and choose the shape within `bound` of most tokens/s."""
    if not prompts:
        raise TapsError("--tree auto needs at least one calibration prompt")
    hidden_indices = drafter.feature_contract().hidden_state_indices
    drafts = []
    for ids in prompts:
        continuation = plain_generate(model, ids, continuation_tokens, eos)
        drafts += _record_drafts(model, drafter, hidden_indices, ids, continuation, bound)
    if not drafts:
        raise TapsError("--tree auto: the calibration prompts' greedy replies are too short to measure acceptance; "
                        "use other benchmarks or a larger --max-new-tokens")
    call_ms = _call_costs(model, hidden_indices, prompts[0], bound.total_tokens)
    draft_ms, commit_ms = _draft_costs(model, drafter, hidden_indices, prompts[0], bound)
    budgets = {}
    scored = []
    for shape in shapes(bound):
        if (shape.depth, shape.top_k) not in budgets:
            budgets[shape.depth, shape.top_k] = [draft.budgets(shape.depth, shape.top_k) for draft in drafts]
        tau = 1 + float(np.mean([sum(b <= shape.total_tokens - 1 for b in needed) for needed in budgets[shape.depth, shape.top_k]]))
        scored.append(Candidate(shape, tau, _interpolate(call_ms, shape.total_tokens) + draft_ms[shape.depth, shape.top_k] + commit_ms))
    ranking = sorted(scored, key=lambda c: -c.tokens_per_s)
    return TreeCalibration(ranking[0], call_ms, draft_ms, commit_ms, len(drafts), ranking[:keep])


@torch.no_grad()
def _record_drafts(model, drafter, hidden_indices, ids: list[int], continuation: list[int], bound: TreeConfig) -> list[RecordedDraft]:
    """The largest tree drafted at every position of the greedy continuation, the drafter fed the verifier's
    hidden states of the committed text as decoding feeds them."""
    session = VerifierSession(model, tuple(hidden_indices))
    _, hidden = session.prefill(torch.tensor(ids + continuation))
    n = len(ids)
    state = DrafterState(drafter)
    state.extend({i: h[:n] for i, h in hidden.items()}, torch.tensor(ids[1:] + continuation[:1]))
    widest = TreeConfig(1 + bound.top_k + bound.depth * bound.top_k**2, bound.depth, bound.top_k)
    drafts = []
    for position in range(len(continuation) - widest.levels - 1):  # positions with the whole window of continuation
        tree = state.draft(continuation[position], widest)
        drafts.append(RecordedDraft.of(tree, continuation[position + 1 : position + 1 + widest.levels]))
        state.extend({i: h[n + position : n + position + 1] for i, h in hidden.items()}, torch.tensor(continuation[position + 1 : position + 2]))
    return drafts


def _best_ms(run) -> float:
    times = []
    for _ in range(REPEATS + 1):  # the first call warms up
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1000 * min(times[1:])


@torch.no_grad()
def _call_costs(model, hidden_indices, ids: list[int], largest: int) -> dict[int, float]:
    """Milliseconds of one tree call of each ladder size after the prompt (the cache cut back after each)."""
    session = VerifierSession(model, tuple(hidden_indices))
    session.prefill(torch.tensor(ids))
    prefix = session.length
    costs = {}
    for size in sorted({s for s in CALL_SIZES if s <= largest} | {largest}):
        packed = pack(chain((ids * size)[:size]), prefix)

        def call():
            session.tree_forward(packed)
            session.commit([])

        costs[size] = _best_ms(call)
    return costs


@torch.no_grad()
def _draft_costs(model, drafter, hidden_indices, ids: list[int], bound: TreeConfig) -> tuple[dict[tuple[int, int], float], float]:
    """Milliseconds of drafting each (depth, top_k) searched, and of committing a two-token accepted path, after the
    prompt (the values drafted do not matter here, only the shapes)."""
    session = VerifierSession(model, tuple(hidden_indices))
    logits, hidden = session.prefill(torch.tensor(ids))
    root = int(logits.argmax())
    state = DrafterState(drafter)
    state.extend({i: h[:-2] for i, h in hidden.items()}, torch.tensor(ids[1:-1]))
    committed = state.committed
    costs = {}
    for shape in shapes(bound):
        if (shape.depth, shape.top_k) not in costs:
            costs[shape.depth, shape.top_k] = _best_ms(lambda: state.draft(root, shape))

    def commit():
        state.committed = committed
        state.extend({i: h[-2:] for i, h in hidden.items()}, torch.tensor(ids[-1:] + [root]))

    return costs, _best_ms(commit)


def _interpolate(costs: dict[int, float], size: int) -> float:
    sizes = sorted(costs)
    return float(np.interp(size, sizes, [costs[s] for s in sizes]))
