"""How much of a τ is noise: bootstrap intervals over prompts.

τ is a ratio of sums over a benchmark's prompts (Σ new tokens / Σ verifier calls), and rounds within one
prompt are not independent (one hard passage lowers many), so the unit to resample is the prompt: draw
prompts with replacement, recompute the ratio, take the percentiles. Two strategies decoded on the same
prompts are compared by resampling the prompts once for both (a paired bootstrap of τ_A - τ_B), which
cancels what the prompts share. Resamples are seeded, so a report's interval is reproducible.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class PromptCounts:
    """Per decoded prompt: tokens it emitted and verifier calls it took (all its turns)."""

    new_tokens: Sequence[int]
    verify_calls: Sequence[int]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.new_tokens, dtype=np.float64), np.asarray(self.verify_calls, dtype=np.float64)


@dataclass
class PromptSpeeds:
    """Per decoded prompt: tokens emitted and seconds taken by speculative decoding and, when the eval keeps a
    baseline, by plain decoding of the same prompt."""

    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    baseline_tokens: list[int] = field(default_factory=list)
    baseline_seconds: list[float] = field(default_factory=list)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.asarray(values, dtype=np.float64) for values in (self.tokens, self.seconds, self.baseline_tokens, self.baseline_seconds))

    def report_fields(self, baseline: bool) -> dict:
        """The eval report's speed fields: tokens/s and, with a baseline, its tokens/s and the speedup with its interval."""
        fields = {"tokens_per_s": _rate(self.tokens, self.seconds)}
        if baseline:
            fields["baseline_tokens_per_s"] = _rate(self.baseline_tokens, self.baseline_seconds)
            fields["speedup"] = fields["tokens_per_s"] / fields["baseline_tokens_per_s"] if fields["baseline_tokens_per_s"] else 0.0
            fields["speedup_ci95"] = speedup_interval(self)
        return fields


def _rate(tokens: list[int], seconds: list[float]) -> float:
    return sum(tokens) / sum(seconds) if sum(seconds) > 0 else 0.0


def speedup_interval(speeds: PromptSpeeds, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of (Σ tokens / Σ seconds) / (Σ baseline tokens / Σ baseline seconds), resampling
    prompts jointly for both decodings (each prompt was decoded by both, on the machine in the same state)."""
    tokens, seconds, baseline_tokens, baseline_seconds = speeds.arrays()
    if len(baseline_tokens) != len(tokens):
        raise ValueError(f"a speedup needs both decodings of every prompt: {len(tokens)} vs {len(baseline_tokens)}")
    picks = _resample_indices(len(tokens), resamples, seed)
    return _percentiles(_ratio(tokens[picks], seconds[picks]) / _ratio(baseline_tokens[picks], baseline_seconds[picks]), level)


def tau_interval(counts: PromptCounts, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of Σ new / Σ calls, resampling prompts."""
    new, calls = counts.arrays()
    picks = _resample_indices(len(new), resamples, seed)
    return _percentiles(_ratio(new[picks], calls[picks]), level)


def paired_difference_interval(pairs: Sequence[tuple[PromptCounts, PromptCounts]], resamples: int = RESAMPLES, level: float = LEVEL,
                               seed: int = 0) -> tuple[float, float]:
    """Interval of τ_A - τ_B averaged over benchmarks: one (A, B) pair of counts per benchmark, index i of both the
    same prompt. Prompts are resampled jointly for A and B, independently per benchmark."""
    samples = []
    for offset, (a, b) in enumerate(pairs):
        (a_new, a_calls), (b_new, b_calls) = a.arrays(), b.arrays()
        if len(a_new) != len(b_new):
            raise ValueError(f"a paired comparison needs the same prompts: {len(a_new)} vs {len(b_new)}")
        picks = _resample_indices(len(a_new), resamples, seed + offset)
        samples.append(_ratio(a_new[picks], a_calls[picks]) - _ratio(b_new[picks], b_calls[picks]))
    return _percentiles(np.mean(samples, axis=0), level)


def _resample_indices(prompts: int, resamples: int, seed: int) -> np.ndarray:
    if prompts == 0:
        raise ValueError("no prompts to resample")
    return np.random.default_rng(seed).integers(0, prompts, size=(resamples, prompts))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """Σ numerator / Σ denominator per resample (a zero denominator counts as 1: no calls, no tokens)."""
    return numerator.sum(axis=1) / np.where(denominator.sum(axis=1) > 0, denominator.sum(axis=1), 1.0)


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
