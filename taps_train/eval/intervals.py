"""How much of a τ is noise: jackknife t-intervals over prompts.

τ is a ratio of sums over a benchmark's prompts (Σ new tokens / Σ verifier calls), and rounds within one
prompt are not independent (one hard passage lowers many), so the unit of the sample is the prompt. Evaluations
decode few prompts (8 per benchmark in the shipped studies), and at such n the percentile bootstrap is too narrow:
it takes the spread of 8 values at face value. Here the standard error of a statistic is the jackknife's (leave one
prompt out, the classic estimate for a ratio) and the interval is Student's t with n - 1 degrees of freedom.
Simulated at n = 8 (tests/eval/test_intervals.py), a nominal 95% covers 93.5% of the time; the percentile
bootstrap 88.5%. (A studentized bootstrap covers ~95% on that simulation but is erratic on real counts: a benchmark
whose prompts all emit 31 tokens in 18-26 calls gets a lower bound of 0.81, below the least τ there is.) Two
strategies decoded on the same prompts are compared on their difference, prompt left out from both at once (a
paired interval), which cancels what the prompts share; benchmarks are independent, so their variances add
(Welch-Satterthwaite degrees of freedom). Nothing is random: an interval is a function of the counts.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

LEVEL = 0.95
METHOD = "jackknife t-interval over prompts"  # named in reports beside every interval


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


Statistic = Callable[..., float]  # a benchmark's arrays, indexed by prompt -> the statistic


def tau_interval(counts: PromptCounts, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of Σ new / Σ calls over the prompts; None below two prompts (no spread to estimate)."""
    return mean_tau_interval([counts], level)


def mean_tau_interval(benchmarks: Sequence[PromptCounts], level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of the mean over benchmarks of their τ (a report's average); None when a benchmark has fewer than two
    prompts."""
    return _jackknife([counts.arrays() for counts in benchmarks], _ratio, level)


def paired_difference_interval(pairs: Sequence[tuple[PromptCounts, PromptCounts]], level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of τ_A - τ_B averaged over benchmarks: one (A, B) pair of counts per benchmark, index i of both the
    same prompt. None when a benchmark has fewer than two prompts."""
    parts = []
    for a, b in pairs:
        if len(a.new_tokens) != len(b.new_tokens):
            raise ValueError(f"a paired comparison needs the same prompts: {len(a.new_tokens)} vs {len(b.new_tokens)}")
        parts.append((*a.arrays(), *b.arrays()))
    return _jackknife(parts, lambda a_new, a_calls, b_new, b_calls: _ratio(a_new, a_calls) - _ratio(b_new, b_calls), level)


def speedup_interval(speeds: PromptSpeeds, level: float = LEVEL) -> tuple[float, float] | None:
    """Interval of (Σ tokens / Σ seconds) / (Σ baseline tokens / Σ baseline seconds), each prompt decoded both ways on
    the machine in the same state: the log speedup's interval, taken back by exp. None below two prompts."""
    arrays = speeds.arrays()
    if len(arrays[2]) != len(arrays[0]):
        raise ValueError(f"a speedup needs both decodings of every prompt: {len(arrays[0])} vs {len(arrays[2])}")
    if min(values.sum() for values in arrays) <= 0:
        return None
    interval = _jackknife([arrays], _log_speedup, level)
    return None if interval is None else (math.exp(interval[0]), math.exp(interval[1]))


def t_quantile(p: float, freedom: float) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, the Cornish-Fisher expansion in 1/ν above
    (Abramowitz & Stegun 26.7.5: within 0.2% at ν = 3, 5e-5 at ν = 7); a fractional ν below 3 rounds down (wider)."""
    if freedom < 3:
        freedom = max(1, math.floor(freedom))
        return math.tan(math.pi * (p - 0.5)) if freedom == 1 else (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = NormalDist().inv_cdf(p)
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(term / freedom ** (power + 1) for power, term in enumerate(terms))


def _ratio(new: np.ndarray, calls: np.ndarray) -> float:
    """Σ new / Σ calls (no calls at all: 0, no tokens either)."""
    return float(new.sum() / calls.sum()) if calls.sum() > 0 else 0.0


def _log_speedup(tokens: np.ndarray, seconds: np.ndarray, baseline_tokens: np.ndarray, baseline_seconds: np.ndarray) -> float:
    sums = [values.sum() for values in (tokens, seconds, baseline_tokens, baseline_seconds)]
    return math.log(sums[0] / sums[1] * sums[3] / sums[2]) if min(sums) > 0 else math.nan  # nan: no interval


def _jackknife(parts: Sequence[tuple[np.ndarray, ...]], statistic: Statistic, level: float) -> tuple[float, float] | None:
    """t-interval of the mean over `parts` (benchmarks, independent) of `statistic`, each part's standard error its
    jackknife over prompts; None without parts, when a part has fewer than two prompts, or when leaving a prompt out
    leaves the statistic undefined (a speedup of prompts that emitted nothing)."""
    if not parts or any(len(arrays[0]) < 2 for arrays in parts):
        return None
    estimates, variances, freedoms = [], [], []
    for arrays in parts:
        n = len(arrays[0])
        left_out = np.array([statistic(*(np.delete(values, i) for values in arrays)) for i in range(n)])
        estimates.append(statistic(*arrays))
        if not (np.isfinite(left_out).all() and math.isfinite(estimates[-1])):
            return None
        variances.append((n - 1) / n * float(((left_out - left_out.mean()) ** 2).sum()))
        freedoms.append(n - 1)
    estimate, variance = sum(estimates) / len(parts), sum(variances) / len(parts) ** 2
    half = t_quantile((1 + level) / 2, _welch_freedom(variances, freedoms)) * math.sqrt(variance)
    return estimate - half, estimate + half


def _welch_freedom(variances: list[float], freedoms: list[int]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent variance estimates (all zero: the smallest ν)."""
    denominator = sum(v * v / f for v, f in zip(variances, freedoms))
    return sum(variances) ** 2 / denominator if denominator > 0 else float(min(freedoms))
