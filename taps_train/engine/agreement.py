"""Does vLLM draft and accept what taps-train does, for the same drafter, prompts and chain length (T=0)?

Both sides draft a greedy chain of k tokens per verifier step. A step is identified by its position: how many output
tokens were committed before it (the first output token comes from the prefill, so the first step sits at 1). At
T=0 the output tokens are the verifier's greedy tokens, so a step's accepted count is the length of the common
prefix of its chain and the output from its position; vLLM's own counters are checked against that reconstruction.

Agreement is judged on three levels, from coarse to sharp: the T=0 outputs (vLLM's, with and without the draft, must
equal the verifier's greedy output and taps-train's), the acceptance (τ with a paired interval of its
difference over prompts, and accepted tokens per chain position), and the drafts themselves (at every step both sides
took, which must be nearly all of taps-train's steps: the chain and the probability the draft gave each token it
drafted). Acceptance alone has little power with a weak drafter (most chains fail at position 1 whatever the export
got wrong); the drafts have it: a wrong layer id, RoPE base or norm changes the draft's probabilities at every step,
a wrong token map changes its tokens. Each check fails on its own (`Agreement.problems`), so every broken-export
control names the check that must catch it.
"""

import math
from dataclasses import dataclass, field

from taps_train.eval.intervals import PromptCounts, paired_difference_interval
from taps_train.decoding.decoder import SpeculativeDecoder, single
from taps_train.decoding.tree import DraftTree, TreeConfig

CHAINS_AGREE = 0.98  # share of compared steps whose whole chain must be identical (draft near-ties may flip)
LOG_PROBABILITY_TOLERANCE = 0.02  # largest |Δ log probability| of a token both sides drafted at the same step (~2%)
STEPS_COVERED = 0.9  # share of taps-train's steps vLLM must also have taken: fewer, and the drafts were compared on too few


@dataclass
class ChainTrace:
    """One prompt decoded with greedy chains: the output and, per verifier step, its position and chain."""

    tokens: list[int]
    steps: list[tuple[int, list[int], list[float]]] = field(default_factory=list)  # (position, tokens, probabilities)
    counted: list[int] | None = None  # the engine's own accepted count per step (it may pass where the output was cut)

    def accepted(self) -> list[int]:
        return [_common_prefix(chain, self.tokens[position:]) for position, chain, _ in self.steps]

    def counts(self) -> tuple[int, int]:
        """(tokens emitted by the steps, steps): τ's numerator and denominator, the bonus token counted."""
        accepted = self.accepted()
        return sum(accepted) + len(accepted), len(accepted)


def chain_config(k: int) -> TreeConfig:
    """taps-train's tree options for a greedy chain of k draft tokens (one token: `tree_problems` says why depth 1)."""
    return TreeConfig(total_tokens=k + 1, depth=max(k - 1, 1), top_k=1)


def taps_chains(verifier, drafter, prompts: list[list[int]], k: int, max_new_tokens: int, eos: list[int]) -> list[ChainTrace]:
    """taps-train's own greedy-chain decoding of every prompt, with the chain of every step."""
    trees: list[DraftTree] = []

    def recording(drafted: list[DraftTree], config: TreeConfig):
        tree, chosen = single(drafted, config)
        trees.append(tree)
        return tree, chosen

    decoder = SpeculativeDecoder(verifier, [drafter], chain_config(k), recording, 0.0, eos_token_ids=eos)
    traces = []
    for ids in prompts:
        trees.clear()
        generation = decoder.generate(ids, max_new_tokens)
        trace, position = ChainTrace(generation.tokens, counted=[]), 1
        for tree, stats in zip(trees, generation.rounds):
            trace.steps.append((position, tree.tokens[1:].tolist(), tree.probs[1:].tolist()))
            trace.counted.append(stats.accepted)
            position += stats.accepted + 1
        traces.append(trace)
    return traces


def vllm_chains(prompts: list[dict], k: int) -> list[ChainTrace]:
    """vLLM's steps from a worker result with recorded drafts: k (token, probability) pairs per proposal, of which
    the first `spec.drafts` were verified (the last proposal of a request may not be)."""
    traces = []
    for prompt in prompts:
        trace, position = ChainTrace(prompt["tokens"]), 1
        proposals = [prompt["drafts"][i:i + k] for i in range(0, len(prompt["drafts"]), k)]
        for proposal in proposals[: prompt["spec"]["drafts"]]:
            chain = [token for token, _ in proposal]
            trace.steps.append((position, chain, [p for _, p in proposal]))
            position += _common_prefix(chain, trace.tokens[position:]) + 1
        traces.append(trace)
    return traces


def _common_prefix(chain: list[int], output: list[int]) -> int:
    count = 0
    for drafted, emitted in zip(chain, output):
        if drafted != emitted:
            break
        count += 1
    return count


def accepted_by_position(traces: list[ChainTrace], k: int) -> list[int]:
    """Steps whose chain was accepted at least up to position i (vLLM's `accepted_tokens_per_pos`), by the engine's own
    count where the trace has one."""
    return [sum(a > i for trace in traces for a in (trace.accepted() if trace.counted is None else trace.counted)) for i in range(k)]


@dataclass
class Agreement:
    """How one export served by vLLM compares with taps-train's drafter on the same prompts."""

    prompts: int
    k: int
    vllm_tau: float
    taps_tau: float
    tau_difference_ci95: tuple[float, float] | None  # vLLM - taps-train, paired over prompts (None: one prompt)
    vllm_accepted_by_position: list[int]
    taps_accepted_by_position: list[int]
    vllm_steps: int
    taps_steps: int
    outputs_equal_greedy: int  # prompts whose vLLM output with the draft equals vLLM's plain greedy output
    outputs_equal_taps: int  # prompts whose vLLM output equals taps-train's
    counters_match: bool  # vLLM's counters equal the acceptance reconstructed from its drafts and output
    steps_compared: int  # taps-train's steps that vLLM also took (same position in the same prompt)
    chains_identical: float  # share of compared steps with the same chain
    max_log_probability_difference: float
    first_difference: str | None
    load_problems: list[str]

    def problems(self) -> list[tuple[str, str]]:
        """(check, what it found) for every check that failed; none when the export agrees. Each failure kind has a check
        of its own, so a test can say which one must catch it (engine/controls.py)."""
        found = [("load", problem) for problem in self.load_problems]
        if not self.counters_match:
            found.append(("counters", "vLLM's counters differ from its drafts"))
        if self.outputs_equal_greedy < self.prompts:
            found.append(("greedy", f"{self.prompts - self.outputs_equal_greedy} outputs differ from greedy"))
        if self.outputs_equal_taps < self.prompts:
            found.append(("outputs", f"{self.prompts - self.outputs_equal_taps} outputs differ from taps-train's"))
        # one prompt has no interval: its τ must then be equal
        low, high = self.tau_difference_ci95 or (self.vllm_tau - self.taps_tau,) * 2
        if not low <= 0 <= high:
            found.append(("tau", f"τ differs ({self.vllm_tau:.3f} vs {self.taps_tau:.3f}, interval [{low:+.3f}, {high:+.3f}])"))
        if self.steps_compared < STEPS_COVERED * self.taps_steps:
            found.append(("coverage", f"only {self.steps_compared} of taps-train's {self.taps_steps} steps were also vLLM's"))
        if self.chains_identical < CHAINS_AGREE:
            found.append(("chains", f"only {self.chains_identical:.1%} of chains identical"))
        if self.max_log_probability_difference > LOG_PROBABILITY_TOLERANCE:
            found.append(("log_probabilities", f"draft log-probabilities differ by up to {self.max_log_probability_difference:.3f}"))
        spread, unmatched = [abs(a - b) for a, b in zip(self.vllm_accepted_by_position, self.taps_accepted_by_position)], self.unmatched_steps()
        if max(spread, default=0) > unmatched:
            found.append(("positions", f"accepted by position {self.vllm_accepted_by_position} (vLLM) vs {self.taps_accepted_by_position} "
                                       f"(taps-train): more apart than the {unmatched} steps whose chains differ explain"))
        return found

    def unmatched_steps(self) -> int:
        """Steps of either engine not matched by an identical chain of the other: a near-tie that flips one draft token
        may move each position's acceptance count by one per such step, and by no more."""
        return max(self.vllm_steps, self.taps_steps) - round(self.chains_identical * self.steps_compared)

    @property
    def agrees(self) -> bool:
        return not self.problems()

    def verdict(self) -> str:
        problems = self.problems()
        return "differs: " + "; ".join(message for _, message in problems) if problems else "agrees"


def compare(vllm: list[ChainTrace], taps: list[ChainTrace], result: dict, k: int, load_problems: list[str]) -> Agreement:
    """`result` is the worker's (for the counters and plain outputs); both trace lists cover the same prompts in order."""
    prompts = result["prompts"]
    counters = [sum(p["spec"]["accepted_per_position"][i] if i < len(p["spec"]["accepted_per_position"]) else 0 for p in prompts) for i in range(k)]
    vllm_counts = PromptCounts(*zip(*(trace.counts() for trace in vllm)))
    taps_counts = PromptCounts(*zip(*(trace.counts() for trace in taps)))
    compared, identical, worst, first = 0, 0, 0.0, None
    for index, (ours, theirs) in enumerate(zip(taps, vllm)):
        at = {position: (chain, probs) for position, chain, probs in theirs.steps}
        for position, chain, probs in ours.steps:
            if position not in at:
                continue
            compared += 1
            their_chain, their_probs = at[position]
            identical += chain == their_chain
            if chain != their_chain and first is None:
                first = f"prompt {index}, output position {position}: taps-train drafted {chain}, vLLM {their_chain}"
            for a, b, p, q in zip(chain, their_chain, probs, their_probs):
                if a != b:
                    break
                worst = max(worst, abs(math.log(max(p, 1e-30)) - math.log(max(q, 1e-30))))
    return Agreement(
        prompts=len(prompts), k=k,
        vllm_tau=_tau(vllm_counts), taps_tau=_tau(taps_counts),
        tau_difference_ci95=paired_difference_interval([(vllm_counts, taps_counts)]),
        vllm_accepted_by_position=counters, taps_accepted_by_position=accepted_by_position(taps, k),
        vllm_steps=sum(vllm_counts.verify_calls), taps_steps=sum(taps_counts.verify_calls),
        outputs_equal_greedy=sum(p["tokens"] == p["baseline_tokens"] for p in prompts),
        outputs_equal_taps=sum(a.tokens == b.tokens for a, b in zip(vllm, taps)),
        counters_match=all(_counters_explain(p["spec"], trace, k) for p, trace in zip(prompts, vllm)),
        steps_compared=compared, chains_identical=identical / compared if compared else 0.0,
        max_log_probability_difference=worst, first_difference=first, load_problems=load_problems,
    )


def _counters_explain(spec: dict, trace: ChainTrace, k: int) -> bool:
    """vLLM's counters of one prompt equal the acceptance reconstructed from its drafts and output, except that the
    output may end inside the last step (the token budget or a stop token cut it), where the counters may count more."""
    accepted = trace.accepted()
    if spec["drafts"] != len(accepted):
        return False
    counted = (spec["accepted_per_position"] + [0] * k)[:k]
    before_last = [sum(a > i for a in accepted[:-1]) for i in range(k)]
    last = [c - b for c, b in zip(counted, before_last)]
    seen = sum(last)
    return last == [1] * seen + [0] * (k - seen) and seen >= (accepted[-1] if accepted else 0)


def _tau(counts: PromptCounts) -> float:
    calls = sum(counts.verify_calls)
    return sum(counts.new_tokens) / calls if calls else 0.0
