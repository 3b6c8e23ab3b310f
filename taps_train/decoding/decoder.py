"""`SpeculativeDecoder`: draft a tree, verify it in one verifier call, accept losslessly, repeat.

τ (acceptance length) = tokens emitted per verifier call over the decoding rounds (accepted draft
tokens + the verifier's bonus token). The prefill call, which emits the first token without any
draft, is not a round. A round may verify the root alone (plain decoding: the `PLAIN` tree, or the
speculation gate while drafting does not pay); such rounds count, with τ 1, and consult no drafter.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from taps_train.drafter import DrafterBackbone
from taps_train.errors import TapsError
from taps_train.decoding.accept import (
    Acceptance,
    accept_greedy,
    accept_sampling,
    next_token,
)
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.gate import Gate, GateConfig
from taps_train.decoding.tree import DraftTree, TreeConfig, pack, root_only

# A strategy turns the drafters' trees (one per drafter, same root) into the tree to verify, and
# says which drafter it credits (for routing counts; -1 when several contribute).
Strategy = Callable[[list[DraftTree], TreeConfig], tuple[DraftTree, int]]
NO_DRAFTER = -2  # "chosen" value of a round that verified the root alone (plain decoding)


def single(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
    if len(trees) != 1:
        raise TapsError(f"strategy 'single' takes exactly one drafter, got {len(trees)}")
    return trees[0], 0


@dataclass
class RoundStats:
    accepted: int  # draft tokens accepted (the accepted depth)
    new_tokens: int  # tokens emitted this round (accepted + bonus, cut at EOS / max_new_tokens)
    tree_tokens: int  # nodes sent to the verifier, root included
    tree_depth: int
    chosen: int
    accepted_confidence: list[float] = field(default_factory=list)
    accepted_entropy: list[float] = field(default_factory=list)
    rejected_confidence: list[float] = field(default_factory=list)
    rejected_entropy: list[float] = field(default_factory=list)
    depth_reached: list[bool] = field(default_factory=list)  # per depth d>=1: did the tree offer a candidate there


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[RoundStats]

    @property
    def acceptance_length(self) -> float:
        return sum(r.new_tokens for r in self.rounds) / max(1, len(self.rounds))


class SpeculativeDecoder:
    def __init__(
        self,
        verifier: PreTrainedModel,
        drafters: list[DrafterBackbone],
        tree: TreeConfig = TreeConfig(),
        strategy: Strategy = single,
        temperature: float = 0.0,
        top_p: float = 1.0,
        eos_token_ids: list[int] | None = None,
        gate: GateConfig | None = None,
    ):
        if temperature < 0:
            raise TapsError(f"temperature must be >= 0, got {temperature}")
        self.verifier = verifier
        self.drafters = drafters
        self.tree = tree
        self.strategy = strategy
        self.temperature = temperature
        self.top_p = top_p
        self.gate = gate
        eos = eos_token_ids if eos_token_ids is not None else verifier.generation_config.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else (eos or []))

    def _accept(self, tree: DraftTree, logits: torch.Tensor, generator: torch.Generator) -> Acceptance:
        if self.temperature == 0:
            return accept_greedy(tree, logits)
        return accept_sampling(tree, logits, self.temperature, generator, self.top_p)

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int = 0,
                 on_round: Callable[[RoundStats], None] | None = None) -> Generation:
        """Decode up to `max_new_tokens` after `prompt_ids`; `on_round` sees each round's statistics as it ends
        (progress for callers: a round of a real verifier on a CPU takes seconds)."""
        from taps_train.decoding.verify import VerifierSession

        drafters = [] if self.tree.plain else self.drafters  # the plain tree consults none: no states, no hidden states to keep
        session = VerifierSession(self.verifier, tuple(sorted({i for d in drafters for i in d.feature_contract().hidden_state_indices})))
        limit = session.max_length
        if limit is not None and len(prompt_ids) + max_new_tokens + self.tree.levels + 1 > limit:
            raise TapsError(
                f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the verifier's context of {limit}; "
                "shorten the prompt or lower max_new_tokens"
            )
        if not prompt_ids:
            raise TapsError("empty prompt")
        generator = torch.Generator().manual_seed(seed)
        prompt = torch.tensor(prompt_ids)
        logits, hidden = session.prefill(prompt)
        root = next_token(logits, self.temperature, self.top_p, generator)
        states = [DrafterState(d) for d in drafters]
        for state in states:
            state.extend(hidden, torch.tensor(prompt_ids[1:] + [root]))
        gate = Gate(self.gate) if self.gate is not None and states else None
        output, rounds = [root], []
        while len(output) < max_new_tokens and root not in self.eos:
            speculating = bool(states) and (gate is None or gate.speculate())
            if speculating:
                tree, chosen = self.strategy([s.draft(root, self.tree) for s in states], self.tree)
            else:
                tree, chosen = root_only(root), NO_DRAFTER
            logits, hidden = session.tree_forward(pack(tree, session.length))
            acceptance = self._accept(tree, logits, generator)
            session.commit(acceptance.path)
            new = [int(tree.tokens[n]) for n in acceptance.path[1:]] + [acceptance.bonus]
            for state in states:
                state.extend({index: h[acceptance.path] for index, h in hidden.items()}, torch.tensor(new))
            emitted = _until_stop(new, self.eos, max_new_tokens - len(output))
            output += emitted
            rounds.append(_round_stats(tree, acceptance, len(emitted), chosen))
            if gate is not None and speculating:
                gate.observe(len(new))
            if on_round is not None:
                on_round(rounds[-1])
            root = new[-1] if len(emitted) == len(new) else emitted[-1]
        return Generation(output, rounds)


def _until_stop(tokens: list[int], eos: set[int], room: int) -> list[int]:
    """Cut at the first end-of-sequence token (kept) and at the remaining token budget."""
    for index, token in enumerate(tokens[:room]):
        if token in eos:
            return tokens[: index + 1]
    return tokens[:room]


def _round_stats(tree: DraftTree, acceptance: Acceptance, emitted: int, chosen: int) -> RoundStats:
    accepted = acceptance.path[1:]
    max_depth = int(tree.depths.max())
    on_path_depth = len(acceptance.path) - 1
    reached = []
    for depth in range(1, max_depth + 1):
        # depth d was offered if the accepted path reached d-1 and that node had children
        if depth - 1 <= on_path_depth:
            reached.append(bool(tree.children(acceptance.path[depth - 1])))
    return RoundStats(
        accepted=len(accepted),
        new_tokens=emitted,
        tree_tokens=len(tree),
        tree_depth=max_depth,
        chosen=chosen,
        accepted_confidence=tree.confidence[accepted].tolist(),
        accepted_entropy=tree.entropy[accepted].tolist(),
        rejected_confidence=tree.confidence[acceptance.rejected].tolist(),
        rejected_entropy=tree.entropy[acceptance.rejected].tolist(),
        depth_reached=reached,
    )
