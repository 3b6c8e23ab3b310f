"""Run speculative decoding over benchmark prompts and pool the statistics into the eval report.

The same function serves `taps-train eval` and the validation callback, so τ during training is the
τ of the final evaluation, on fewer prompts.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from taps_train.data.chat_format import render_chat
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import Prompt
from taps_train.eval.intervals import PromptCounts, PromptSpeeds, tau_interval
from taps_train.eval.report import BenchmarkResult, Signals
from taps_train.decoding.baseline import plain_generate
from taps_train.decoding.greedy_check import check_greedy_reply, not_lossless, too_many_ties
from taps_train.decoding.compose import MERGED
from taps_train.decoding.decoder import Generation, RoundStats, SpeculativeDecoder


@dataclass
class BenchmarkTally:
    """Round statistics pooled over a benchmark's prompts (τ = Σ new tokens / Σ verifier calls)."""

    new_tokens: int = 0
    verify_calls: int = 0
    tree_tokens: int = 0
    plain_rounds: int = 0  # rounds that verified the root alone
    plain_round_tokens: int = 0
    prompts: int = 0
    skipped_too_long: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    reached_by_depth: list[int] = field(default_factory=list)
    routing: dict[int, int] = field(default_factory=dict)
    entropy: dict[str, list[float]] = field(default_factory=lambda: {"accepted": [], "rejected": []})
    confidence: dict[str, list[float]] = field(default_factory=lambda: {"accepted": [], "rejected": []})
    prompt_new_tokens: list[int] = field(default_factory=list)
    prompt_verify_calls: list[int] = field(default_factory=list)
    speed: PromptSpeeds = field(default_factory=PromptSpeeds)
    wall_time_s: float = 0.0
    label: str = ""
    max_new_tokens: int = 0
    baseline: bool = False  # prompts are also decoded plainly, for the speedup
    greedy_compared: int = 0  # prompts whose T=0 output was checked (greedy_check) and compared with plain greedy decoding
    greedy_parted: int = 0  # ... whose output was not plain greedy decoding's (they parted at a near-tie)
    greedy_checked_tokens: int = 0  # tokens the complete check went over
    greedy_ties: int = 0  # ... that were tied with the verifier's argmax within rounding, not the argmax
    plain_checked_tokens: int = 0  # the same of plain decoding's outputs (with a baseline): how often rounding ties
    plain_ties: int = 0

    def add_prompt(self, generations: list[Generation], seconds: float) -> None:
        """One decoded prompt (its turns' generations and the seconds they took), the unit intervals resample."""
        new_before, calls_before = self.new_tokens, self.verify_calls
        for generation in generations:
            for stats in generation.rounds:
                self._add_round(stats)
        self.prompts += 1
        self.prompt_new_tokens.append(self.new_tokens - new_before)
        self.prompt_verify_calls.append(self.verify_calls - calls_before)
        self.speed.tokens.append(sum(len(g.tokens) for g in generations))
        self.speed.seconds.append(seconds)

    def add_baseline(self, tokens: int, seconds: float) -> None:
        """The same prompt's plain decoding: tokens emitted and seconds taken."""
        self.speed.baseline_tokens.append(tokens)
        self.speed.baseline_seconds.append(seconds)

    def _add_round(self, stats: RoundStats) -> None:
        self.new_tokens += stats.new_tokens
        self.verify_calls += 1
        self.tree_tokens += stats.tree_tokens
        if stats.tree_tokens == 1:
            self.plain_rounds += 1
            self.plain_round_tokens += stats.new_tokens
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
            routing=None if drafter_names is None else {_routed_to(drafter_names, i): n for i, n in sorted(self.routing.items())},
            prompt_new_tokens=tuple(self.prompt_new_tokens),
            prompt_verify_calls=tuple(self.prompt_verify_calls),
            tau_ci95=tau_interval(PromptCounts(self.prompt_new_tokens, self.prompt_verify_calls)),
            plain_rounds=self.plain_rounds,
            plain_round_tokens=self.plain_round_tokens,
            **self._speed_fields(),
        )

    def _speed_fields(self) -> dict:
        """Tokens/s of speculative decoding, and with a baseline its plain decoding's and the speedup with its interval."""
        fields = self.speed.report_fields(self.baseline)
        if self.greedy_compared:
            plain = (self.plain_ties, self.plain_checked_tokens) if self.baseline else None
            problem = too_many_ties(f"benchmark {self.label or '(unnamed)'}", self.greedy_ties, self.greedy_checked_tokens, plain)
            if problem:
                raise problem
            fields["identical_to_greedy"] = self.greedy_parted == 0
            fields["greedy_ties"] = self.greedy_ties
            fields["greedy_checked_tokens"] = self.greedy_checked_tokens
        return fields


def _routed_to(drafter_names: list[str], chosen: int) -> str:
    return drafter_names[chosen] if chosen >= 0 else "merged" if chosen == MERGED else "plain"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    text = render_chat(tokenizer, messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def first_turn_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """The chat-formatted ids of a prompt's opening user turn (what calibration and benches decode)."""
    return chat_ids(tokenizer, [{"role": "user", "content": prompt.turns[0]}])


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
        self.advance(stats.new_tokens)

    def end_prompt(self, budget: int) -> None:
        """Fill the rest of a finished prompt's budget: each turn's prefill token, an early stop, a skipped prompt."""
        self.done += 1
        self.budget += budget
        self.advance(self.budget - self.shown)

    def advance(self, tokens: int) -> None:
        self.shown += tokens
        tau = self.new_tokens / self.verify_calls if self.verify_calls else 0.0
        self.bar.set_postfix_str(f"{self.done}/{self.prompts} prompts, τ {tau:.2f}", refresh=False)
        self.bar.update(tokens)


def run_benchmark(decoder: SpeculativeDecoder, tokenizer: PreTrainedTokenizerBase, prompts: list[Prompt], max_new_tokens: int,
                  seed: int = 0, label: str = "", progress: bool = True, baseline: bool = False) -> BenchmarkTally:
    """Decode every prompt (multi-turn prompts turn by turn, each later turn after the model's answer).

    With `baseline`, every prompt is also decoded by plain autoregressive decoding of the same verifier, the
    order alternating per prompt so that drift of the machine's speed cancels; at T=0 the output is
    checked token by token (`_check_lossless`). The bar counts tokens against a budget of `max_new_tokens` per turn and decoding.
    """
    tally = BenchmarkTally(label=label, max_new_tokens=max_new_tokens, baseline=baseline)
    began = time.perf_counter()
    passes = 2 if baseline else 1
    total = sum(len(p.turns) for p in prompts) * max_new_tokens * passes
    if baseline and prompts:
        _warm_up(decoder, tokenizer, prompts[0])
    with tqdm(total=total, desc=f"decoding {label}", unit="tok", disable=not progress, leave=False) as bar:
        meter = TokenProgress(bar, len(prompts))
        for index, prompt in enumerate(prompts):
            _decode_prompt(decoder, tokenizer, prompt, index, max_new_tokens, seed * 100_003 + index * 10, tally, meter)
            meter.end_prompt(len(prompt.turns) * max_new_tokens * passes)
    tally.wall_time_s = time.perf_counter() - began
    return tally


def _warm_up(decoder: SpeculativeDecoder, tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> None:
    """A few untimed tokens of both decodings, so that one-time costs (kernel selection, allocator growth, thread
    start-up) fall on neither side of the first timed prompt."""
    ids = first_turn_ids(tokenizer, prompt)
    try:
        decoder.generate(ids, 4)
        plain_generate(decoder.verifier, ids, 4, decoder.eos)
    except TapsError:  # a prompt too long for the context is skipped by the timed run, and counted there
        pass


@dataclass
class Turns:
    """One decoding of a prompt's turns: each turn's input ids and reply, and the seconds spent decoding."""

    inputs: list[list[int]] = field(default_factory=list)
    replies: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0


def _decode_prompt(decoder: SpeculativeDecoder, tokenizer: PreTrainedTokenizerBase, prompt: Prompt, index: int, max_new_tokens: int,
                   seed: int, tally: BenchmarkTally, meter: TokenProgress) -> None:
    """All turns of one prompt into `tally` (and its plain decoding when the tally keeps a baseline); a prompt that
    outgrows the verifier's context is counted as skipped."""
    generations: list[Generation] = []

    def speculative(ids: list[int], turn: int) -> list[int]:
        generations.append(decoder.generate(ids, max_new_tokens, seed=seed + turn, on_round=meter.on_round))
        return generations[-1].tokens

    def plain(ids: list[int], turn: int) -> list[int]:
        tokens = plain_generate(decoder.verifier, ids, max_new_tokens, decoder.eos, decoder.temperature, decoder.top_p, seed + turn)
        meter.advance(len(tokens))
        return tokens

    order = [speculative, plain] if index % 2 == 0 else [plain, speculative]
    try:
        runs = {decode: _decode_turns(tokenizer, prompt.turns, decode) for decode in (order if tally.baseline else [speculative])}
    except TapsError as err:
        if "exceeds the verifier's context" not in str(err):
            raise
        tally.skipped_too_long += 1
        return
    tally.add_prompt(generations, runs[speculative].seconds)
    if tally.baseline:
        tally.add_baseline(sum(map(len, runs[plain].replies)), runs[plain].seconds)
        if decoder.temperature == 0:
            _check_lossless(decoder, runs[speculative], runs[plain], tally, prompt)


def _decode_turns(tokenizer: PreTrainedTokenizerBase, turns: list[str], decode: Callable[[list[int], int], list[int]]) -> Turns:
    """Each turn decoded, a later turn asked after the earlier replies."""
    messages, done = [], Turns()
    for turn_index, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        done.inputs.append(chat_ids(tokenizer, messages))
        began = time.perf_counter()
        done.replies.append(decode(done.inputs[-1], turn_index))
        done.seconds += time.perf_counter() - began
        messages.append({"role": "assistant", "content": tokenizer.decode(done.replies[-1], skip_special_tokens=True)})
    return done


def _check_lossless(decoder: SpeculativeDecoder, speculative: Turns, plain: Turns, tally: BenchmarkTally, prompt: Prompt) -> None:
    """At T=0: every token of every turn of the speculative output passes the complete check (greedy_check), its ties
    counted in `tally`; where it is not plain greedy decoding's output, the plain output must pass too (a baseline
    that is not greedy makes the reference and every speedup wrong). A divergence is an error naming the prompt."""
    where = f"benchmark {tally.label or '(unnamed)'}, prompt {prompt.id!r}"
    tally.greedy_compared += 1
    tokens, ties = _check_turns(decoder, speculative, tally.max_new_tokens, where, "speculative decoding")
    tally.greedy_checked_tokens += tokens
    tally.greedy_ties += ties
    if speculative.replies != plain.replies:
        tally.greedy_parted += 1
        tokens, ties = _check_turns(decoder, plain, tally.max_new_tokens, where, "plain decoding")
    tally.plain_checked_tokens += tokens
    tally.plain_ties += ties


def _check_turns(decoder: SpeculativeDecoder, turns: Turns, max_new_tokens: int, where: str, decoding: str) -> tuple[int, int]:
    """(tokens checked, ties) over every turn of one decoding; raises at a divergence."""
    tokens = ties = 0
    for turn, (inputs, reply) in enumerate(zip(turns.inputs, turns.replies)):
        check = check_greedy_reply(decoder.verifier, inputs, reply, decoder.eos, max_new_tokens)
        if check.divergence is not None:
            raise not_lossless(f"{where}, turn {turn + 1}", decoding, check.divergence)
        tokens, ties = tokens + check.tokens, ties + check.ties
    return tokens, ties
