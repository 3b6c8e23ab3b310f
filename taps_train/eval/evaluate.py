"""Run speculative decoding over benchmark prompts and pool the statistics into the eval report.

The same function serves `taps-train eval` and the validation callback, so τ during training is the
τ of the final evaluation, on fewer prompts.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from taps_train.errors import TapsError
from taps_train.eval.benchmarks import Prompt
from taps_train.eval.intervals import PromptCounts, tau_interval
from taps_train.eval.report import BenchmarkResult, Signals
from taps_train.spec.decoder import Generation, RoundStats, SpeculativeDecoder


@dataclass
class BenchmarkTally:
    """Round statistics pooled over a benchmark's prompts (τ = Σ new tokens / Σ verifier calls)."""

    new_tokens: int = 0
    verify_calls: int = 0
    tree_tokens: int = 0
    prompts: int = 0
    skipped_too_long: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    reached_by_depth: list[int] = field(default_factory=list)
    routing: dict[int, int] = field(default_factory=dict)
    entropy: dict[str, list[float]] = field(default_factory=lambda: {"accepted": [], "rejected": []})
    confidence: dict[str, list[float]] = field(default_factory=lambda: {"accepted": [], "rejected": []})
    prompt_new_tokens: list[int] = field(default_factory=list)
    prompt_verify_calls: list[int] = field(default_factory=list)
    wall_time_s: float = 0.0
    label: str = ""
    max_new_tokens: int = 0

    def add(self, generation: Generation) -> None:
        for stats in generation.rounds:
            self._add_round(stats)

    def add_prompt(self, new_tokens: int, verify_calls: int) -> None:
        """One decoded prompt's totals (all turns), the unit the τ interval resamples."""
        self.prompts += 1
        self.prompt_new_tokens.append(new_tokens)
        self.prompt_verify_calls.append(verify_calls)

    def _add_round(self, stats: RoundStats) -> None:
        self.new_tokens += stats.new_tokens
        self.verify_calls += 1
        self.tree_tokens += stats.tree_tokens
        self.routing[stats.chosen] = self.routing.get(stats.chosen, 0) + 1
        for depth, reached in enumerate(stats.depth_reached):
            while len(self.reached_by_depth) <= depth:
                self.reached_by_depth.append(0)
                self.accepted_by_depth.append(0)
            self.reached_by_depth[depth] += reached
            self.accepted_by_depth[depth] += stats.accepted > depth
        self.entropy["accepted"] += stats.accepted_entropy
        self.entropy["rejected"] += stats.rejected_entropy
        self.confidence["accepted"] += stats.accepted_confidence
        self.confidence["rejected"] += stats.rejected_confidence

    @property
    def acceptance_length(self) -> float:
        return self.new_tokens / self.verify_calls if self.verify_calls else 0.0

    def report(self, drafter_names: list[str] | None = None) -> BenchmarkResult:
        """The benchmark's entry in the eval report; a benchmark with no decoded prompt has no τ and is refused."""
        if self.prompts == 0:
            name = self.label or "(unnamed)"
            if self.skipped_too_long:
                raise TapsError(f"benchmark {name}: none of its prompts was decoded (all {self.skipped_too_long} plus "
                                f"--max-new-tokens {self.max_new_tokens} exceed the verifier's context); lower --max-new-tokens or use shorter prompts")
            raise TapsError(f"benchmark {name}: no prompts to decode; check the benchmark file and --prompts")
        return BenchmarkResult(
            acceptance_length=self.acceptance_length,
            verify_calls=self.verify_calls,
            new_tokens=self.new_tokens,
            prompts=self.prompts,
            prompts_skipped_too_long=self.skipped_too_long,
            mean_tree_tokens=self.tree_tokens / self.verify_calls if self.verify_calls else 0.0,
            accept_rate_by_depth=tuple(a / r if r else 0.0 for a, r in zip(self.accepted_by_depth, self.reached_by_depth)),
            draft_entropy=Signals(**{k: _mean(v) for k, v in self.entropy.items()}),
            draft_confidence=Signals(**{k: _mean(v) for k, v in self.confidence.items()}),
            wall_time_s=round(self.wall_time_s, 3),
            routing=None if drafter_names is None else {drafter_names[i] if i >= 0 else "merged": n for i, n in sorted(self.routing.items())},
            prompt_new_tokens=tuple(self.prompt_new_tokens),
            prompt_verify_calls=tuple(self.prompt_verify_calls),
            tau_ci95=tau_interval(PromptCounts(self.prompt_new_tokens, self.prompt_verify_calls)),
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class TokenProgress:
    """Advances a benchmark's bar by the tokens each decoding round emits, so a verifier that takes minutes
    per prompt still shows progress; the postfix says how many prompts are done and the running τ."""

    def __init__(self, bar: tqdm, prompts: int):
        self.bar = bar
        self.prompts = prompts
        self.done = 0
        self.new_tokens = 0
        self.verify_calls = 0
        self.shown = 0  # tokens the bar has advanced by
        self.budget = 0  # token budget of the finished prompts

    def on_round(self, stats: RoundStats) -> None:
        self.new_tokens += stats.new_tokens
        self.verify_calls += 1
        self._advance(stats.new_tokens)

    def end_prompt(self, budget: int) -> None:
        """Fill the rest of a finished prompt's budget: each turn's prefill token, an early stop, a skipped prompt."""
        self.done += 1
        self.budget += budget
        self._advance(self.budget - self.shown)

    def _advance(self, tokens: int) -> None:
        self.shown += tokens
        tau = self.new_tokens / self.verify_calls if self.verify_calls else 0.0
        self.bar.set_postfix_str(f"{self.done}/{self.prompts} prompts, τ {tau:.2f}", refresh=False)
        self.bar.update(tokens)


def run_benchmark(decoder: SpeculativeDecoder, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], max_new_tokens: int,
                  seed: int = 0, label: str = "", progress: bool = True) -> BenchmarkTally:
    """Decode every prompt (multi-turn prompts turn by turn, each later turn after the model's answer).

    The bar counts tokens against a budget of `max_new_tokens` per turn, advanced after every round.
    """
    tally = BenchmarkTally(label=label, max_new_tokens=max_new_tokens)
    began = time.perf_counter()
    total = sum(len(p.turns) for p in prompts) * max_new_tokens
    with tqdm(total=total, desc=f"decoding {label}", unit="tok", disable=not progress, leave=False) as bar:
        meter = TokenProgress(bar, len(prompts))
        for index, prompt in enumerate(prompts):
            _decode_prompt(decoder, tokenizer, prompt, max_new_tokens, seed * 100_003 + index * 10, tally, meter.on_round)
            meter.end_prompt(len(prompt.turns) * max_new_tokens)
    tally.wall_time_s = time.perf_counter() - began
    return tally


def _decode_prompt(decoder: SpeculativeDecoder, tokenizer: PreTrainedTokenizerBase, prompt: Prompt, max_new_tokens: int, seed: int,
                   tally: BenchmarkTally, on_round: Callable[[RoundStats], None]) -> None:
    """All turns of one prompt into `tally`; a prompt that outgrows the verifier's context is counted as skipped."""
    messages, new_before, calls_before = [], tally.new_tokens, tally.verify_calls
    try:
        for turn_index, turn in enumerate(prompt.turns):
            messages.append({"role": "user", "content": turn})
            generation = decoder.generate(chat_ids(tokenizer, messages), max_new_tokens, seed=seed + turn_index, on_round=on_round)
            tally.add(generation)
            messages.append({"role": "assistant", "content": tokenizer.decode(generation.tokens, skip_special_tokens=True)})
    except TapsError as err:
        if "exceeds the verifier's context" not in str(err):
            raise
        tally.skipped_too_long += 1
        return
    tally.add_prompt(tally.new_tokens - new_before, tally.verify_calls - calls_before)
