"""`--tree auto`: the draft tree that maximises expected tokens/s on the machine at hand, plain decoding included.

Tokens/s of a tree shape = τ(shape) / (verifier call of its size + drafting at its depth and width + committing).
Both sides are measured here, never assumed: on a GPU a call of 60 tokens costs about what a call of one does,
so the paper's wide trees win; on a CPU the cost grows with every token and small trees or chains win. Plain decoding
(τ 1 at the cost of a 1-token call) is a candidate too: where no tree is expected to beat it, it is the choice.

- Costs: every cost is timed in interleaved rounds (each round times every size once, so a slow spell of the
  machine falls on all sizes alike) and its median kept, with its spread (interquartile range / median); rounds are
  added while a spread stays above `STABLE`. The verifier is timed at every size a searched shape has, not on a
  ladder: its cost need not grow with the tokens of a call. On this project's 2-core CPU (torch 2.13, fp32
  SmolLM2) a call of 2 or 3 tokens costs more than one of 4 or 8 (57, 97, 118, 88, 83 ms for 1, 2, 3, 4, 8
  tokens, reproducibly: the BLAS kernels for few rows are slower), so neither interpolation between sizes nor a
  monotone fit would be true there.
- τ: on a few calibration prompts the verifier's greedy continuation is the path any tree must hold to be
  accepted at T=0. At each position of it the drafter drafts, for every top_k searched, the whole tree of the
  largest depth (no node dropped). A shape (total tokens, depth, top_k) is then exactly that tree's first
  depth + 1 levels (EAGLE-2 chooses each level's frontier from the levels above only) cut to its most confident
  total tokens - 1 nodes (`rerank_order`, the rule drafting itself applies), so the acceptance of every shape is
  replayed exactly, position by position, without drafting each shape.

The verifier and drafter states used are the decoder's own (`VerifierSession`, `DrafterState`), so the
replay sees the drafts decoding will see.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel

from taps_train.drafter import DrafterBackbone
from taps_train.errors import TapsError
from taps_train.decoding.baseline import plain_generate
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.gate import GateConfig
from taps_train.decoding.tree import PLAIN, DraftTree, TreeConfig, chain, pack, rerank_order
from taps_train.decoding.verify import VerifierSession

TOP_KS = (1, 2, 3, 4, 6, 8, 10, 12, 16)
TOTAL_TOKENS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 60, 64, 80, 96, 128)
ROUNDS = 7  # interleaved timing rounds after a warm-up one; the median of each cost is kept
STABLE = 0.1  # rounds are added (up to MAX_ROUNDS) while a cost's interquartile range exceeds this share of its median
MAX_ROUNDS = 21


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
class CostModel:
    """Milliseconds of a round's parts as measured: a verifier call by its tokens (every searched size measured;
    other sizes, such as a composition's merged tree, interpolated), drafting by (depth, top_k), and committing an
    accepted path."""

    call_ms: dict[int, float]
    draft_ms: dict[tuple[int, int], float]
    commit_ms: float

    def call(self, tokens: int) -> float:
        sizes = sorted(self.call_ms)
        return float(np.interp(tokens, sizes, [self.call_ms[s] for s in sizes]))

    def round_ms(self, tree: TreeConfig, drafters: int = 1, tokens: int | None = None) -> float:
        """One round of `tree` drafted by `drafters` drafters, verifying `tokens` tokens (default: the tree's size);
        the plain tree is one verifier call of one token."""
        if tree.plain:
            return self.call(1)
        return self.call(tokens or tree.total_tokens) + drafters * self.draft_ms[tree.depth, tree.top_k] + self.commit_ms

    def gate(self, tree: TreeConfig, expected_tau: float, drafters: int = 1, tokens: int | None = None) -> GateConfig | None:
        """The speculation gate of `tree`: speculate while rounds emit more than round cost / plain step cost."""
        if tree.plain:
            return None
        return GateConfig(break_even=self.round_ms(tree, drafters, tokens) / self.call(1), expected=expected_tau)

    @classmethod
    def from_calibration(cls, calibration: dict, where: str) -> "CostModel":
        """The costs an eval report's `tree_calibration` recorded (`TreeCalibration.as_dict`)."""
        try:
            return cls({int(size): float(ms) for size, ms in calibration["call_ms_by_tokens"].items()},
                       {tuple(map(int, key.split(","))): float(ms) for key, ms in calibration["draft_ms_by_depth_top_k"].items()},
                       float(calibration["commit_ms"]))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise TapsError(f"{where}: its tree_calibration has no usable costs ({err}); calibrate again with `taps-train eval --tree auto`") from err


@dataclass(frozen=True)
class TreeCalibration:
    """What `--tree auto` measured and chose; the eval report keeps it as `tree_calibration`."""

    choice: Candidate
    plain: Candidate  # plain decoding, the candidate every tree must beat
    costs: CostModel
    call_ms_spread: dict[int, float]  # interquartile range / median of each call cost
    draft_ms_spread: float  # the largest spread among the drafting costs
    positions: int  # continuation positions the acceptance was replayed at
    ranking: list[Candidate]  # the best shapes, best first

    def gate(self) -> GateConfig | None:
        return self.costs.gate(self.choice.tree, self.choice.expected_tau)

    def as_dict(self) -> dict:
        return {
            "choice": self.choice.as_dict(),
            "plain_chosen": self.choice.tree.plain,
            "plain_tokens_per_s": round(self.plain.tokens_per_s, 3),
            "call_ms_by_tokens": {str(size): round(ms, 3) for size, ms in self.costs.call_ms.items()},
            "call_ms_spread": {str(size): round(spread, 4) for size, spread in self.call_ms_spread.items()},
            "draft_ms_by_depth_top_k": {f"{depth},{k}": round(ms, 3) for (depth, k), ms in self.costs.draft_ms.items()},
            "draft_ms_largest_spread": round(self.draft_ms_spread, 4),
            "commit_ms": round(self.costs.commit_ms, 3),
            "positions": self.positions,
            "ranking": [candidate.as_dict() for candidate in self.ranking],
        }


@dataclass
class Replay:
    """One position of the continuation: for each depth, what keeping the b most confident nodes accepts.

    `budgets[depth][j]` is the fewest non-root nodes a tree of that depth (and this replay's top_k) must keep to
    accept j + 1 continuation tokens; a tree keeping b nodes accepts the entries <= b."""

    budgets: dict[int, list[int]]

    @classmethod
    def of(cls, tree: DraftTree, continuation: list[int], depth: int) -> "Replay":
        """`tree`: drafted with `depth` and no node dropped; `continuation`: the verifier's greedy tokens after its root."""
        child = {(int(parent), int(token)): node for node, (parent, token) in enumerate(zip(tree.parents.tolist(), tree.tokens.tolist()))}
        path, node = [], 0
        for token in continuation[: depth + 1]:
            node = child.get((node, token))
            if node is None:
                break
            path.append(node)
        order, depths = rerank_order(tree).tolist(), tree.depths.tolist()
        budgets = {}
        for d in range(1, depth + 1):
            rank = {n: r for r, n in enumerate(n for n in order if depths[n] <= d + 1)}
            needed, worst = [], -1
            for n in path[: d + 1]:
                worst = max(worst, rank[n])
                needed.append(worst + 1)
            budgets[d] = needed
        return cls(budgets)

    def accepted(self, shape: TreeConfig) -> int:
        return sum(b <= shape.total_tokens - 1 for b in self.budgets[shape.depth])


def top_ks(bound: TreeConfig) -> list[int]:
    return sorted({k for k in TOP_KS if k <= bound.top_k} | {bound.top_k})


def shapes(bound: TreeConfig) -> list[TreeConfig]:
    """Every shape searched: depth 1..bound, top_k and total tokens from fixed ladders up to the bounds (each
    bound itself included), total tokens no more than the tree can hold and enough for every level drafted."""
    totals = sorted({n for n in TOTAL_TOKENS if n <= bound.total_tokens} | {bound.total_tokens})
    found = []
    for depth in range(1, bound.depth + 1):
        for k in top_ks(bound):
            for total in (n for n in totals if n > depth):
                found.append(TreeConfig(min(total, capacity(depth, k)), depth, k))
                if total >= capacity(depth, k):
                    break
    return list(dict.fromkeys(found))


def capacity(depth: int, top_k: int) -> int:
    """Nodes of a whole EAGLE-2 tree: the root, its top_k children, then top_k frontier nodes x top_k children per level."""
    return 1 + top_k + depth * top_k * top_k


def calibrate_tree(model: PreTrainedModel, drafter: DrafterBackbone, prompts: list[list[int]], eos: set[int], bound: TreeConfig,
                   continuation_tokens: int = 48, keep: int = 10) -> TreeCalibration:
    """Measure costs and acceptance on `prompts` (token ids) and choose the shape within `bound` of most tokens/s, or
    plain decoding where no shape is expected to beat it."""
    if not prompts:
        raise TapsError("--tree auto needs at least one calibration prompt")
    hidden_indices = drafter.feature_contract().hidden_state_indices
    replays: dict[int, list[Replay]] = {k: [] for k in top_ks(bound)}
    for ids in prompts:
        continuation = plain_generate(model, ids, continuation_tokens, eos)
        for k, found in _record_replays(model, drafter, hidden_indices, ids, continuation, bound).items():
            replays[k] += found
    positions = len(replays[bound.top_k])
    if not positions:
        raise TapsError("--tree auto: the calibration prompts' greedy replies are too short to measure acceptance; "
                        "use other benchmarks or a larger --max-new-tokens")
    call_medians, call_spread = _call_costs(model, hidden_indices, prompts[0], call_sizes(bound))
    draft_medians, draft_spread, commit_ms = _draft_costs(model, drafter, hidden_indices, prompts[0], bound)
    costs = CostModel(call_medians, draft_medians, commit_ms)
    plain = Candidate(PLAIN, 1.0, costs.round_ms(PLAIN))
    scored = [Candidate(shape, 1 + float(np.mean([r.accepted(shape) for r in replays[shape.top_k]])), costs.round_ms(shape))
              for shape in shapes(bound)]
    ranking = sorted([plain, *scored], key=lambda c: -c.tokens_per_s)
    return TreeCalibration(ranking[0], plain, costs, call_spread, max(draft_spread.values()), positions, ranking[:keep])


@torch.no_grad()
def _record_replays(model, drafter, hidden_indices, ids: list[int], continuation: list[int], bound: TreeConfig) -> dict[int, list[Replay]]:
    """For every top_k searched, the replay of the whole tree of the largest depth drafted at every position of the
    greedy continuation, the drafter fed the verifier's hidden states of the committed text as decoding feeds them."""
    session = VerifierSession(model, tuple(hidden_indices))
    _, hidden = session.prefill(torch.tensor(ids + continuation))
    n = len(ids)
    state = DrafterState(drafter)
    state.extend({i: h[:n] for i, h in hidden.items()}, torch.tensor(ids[1:] + continuation[:1]))
    whole = {k: TreeConfig(capacity(bound.depth, k), bound.depth, k) for k in top_ks(bound)}
    replays: dict[int, list[Replay]] = {k: [] for k in whole}
    for position in range(len(continuation) - bound.levels - 1):  # positions with the whole window of continuation
        window = continuation[position + 1 : position + 1 + bound.levels]
        for k, tree in whole.items():
            replays[k].append(Replay.of(state.draft(continuation[position], tree), window, bound.depth))
        state.extend({i: h[n + position : n + position + 1] for i, h in hidden.items()}, torch.tensor(continuation[position + 1 : position + 2]))
    return replays


def _timed(runs: dict) -> tuple[dict, dict]:
    """Median milliseconds of every run and its spread (interquartile range / median), timed in interleaved rounds
    after one warm-up round: `ROUNDS`, then more while a spread exceeds `STABLE`, up to `MAX_ROUNDS`."""
    times = {key: [] for key in runs}
    for round_index in range(MAX_ROUNDS + 1):
        for key, run in runs.items():
            began = time.perf_counter()
            run()
            if round_index:
                times[key].append(1000 * (time.perf_counter() - began))
        if round_index >= ROUNDS and max(_spread(values) for values in times.values()) <= STABLE:
            break
    return {key: statistics.median(values) for key, values in times.items()}, {key: _spread(values) for key, values in times.items()}


def _spread(values: list[float]) -> float:
    low, median, high = statistics.quantiles(values, n=4)
    return (high - low) / median if median > 0 else 0.0


def call_sizes(bound: TreeConfig) -> list[int]:
    """The verifier call sizes to time: one token (plain decoding) and every size a searched shape has."""
    return sorted({1} | {shape.total_tokens for shape in shapes(bound)})


@torch.no_grad()
def _call_costs(model, hidden_indices, ids: list[int], sizes: list[int]) -> tuple[dict[int, float], dict[int, float]]:
    """Milliseconds of one tree call of each size after the prompt (the cache cut back after each), and their
    spread."""
    session = VerifierSession(model, tuple(hidden_indices))
    session.prefill(torch.tensor(ids))
    prefix = session.length

    def call(packed) -> Callable[[], None]:
        def run():
            session.tree_forward(packed)
            session.commit([])

        return run

    return _timed({size: call(pack(chain((ids * size)[:size]), prefix)) for size in sizes})


@torch.no_grad()
def _draft_costs(model, drafter, hidden_indices, ids: list[int], bound: TreeConfig) -> tuple[dict[tuple[int, int], float], dict, float]:
    """Milliseconds of drafting each (depth, top_k) searched (with their spread), and of committing a two-token
    accepted path, after the prompt (the values drafted do not matter here, only the shapes)."""
    session = VerifierSession(model, tuple(hidden_indices))
    logits, hidden = session.prefill(torch.tensor(ids))
    root = int(logits.argmax())
    state = DrafterState(drafter)
    state.extend({i: h[:-2] for i, h in hidden.items()}, torch.tensor(ids[1:-1]))
    state.catch_up()
    committed = state.committed

    def draft(shape: TreeConfig) -> Callable[[], None]:
        return lambda: state.draft(root, shape)

    def commit():
        state.committed = committed
        state.extend({i: h[-2:] for i, h in hidden.items()}, torch.tensor(ids[-1:] + [root]))
        state.catch_up()

    runs = {(shape.depth, shape.top_k): draft(shape) for shape in shapes(bound)}
    medians, spread = _timed({**runs, "commit": commit})
    commit_ms = medians.pop("commit")
    spread.pop("commit")
    return medians, spread, commit_ms
