"""The eval report of `taps-train eval` (design.md, "Eval report"): its types, its writer and its one reader.

`taps-train report`, `taps-train export --eval-report` and the W&B eval logging all read reports through
`read_report`, so a hand-edited, truncated or foreign file fails the same way everywhere: one `TapsError`
naming the file and the field. Fields the reader does not know are ignored, so reports written by a
newer taps-train stay readable.
"""

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from taps_train.errors import TapsError
from taps_train.paths import read_at_most
from taps_train.eval.intervals import PromptCounts, mean_tau_interval, tau_interval
from taps_train.decoding.tree import TreeConfig

MAX_REPORT_BYTES = 16 * 2**20  # a report of many benchmarks is a few KB; more is not a report


@dataclass(frozen=True)
class Signals:
    """Mean draft entropy or confidence of accepted and rejected draft tokens (None: no such token)."""

    accepted: float | None
    rejected: float | None


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark's statistics pooled over its prompts (τ = new tokens / verifier calls).

    `prompts_skipped_too_long` and the signals are absent from reports of older versions; `routing`
    (verifier calls per drafter, or `merged`) is present for routed strategies only. The per-prompt counts
    (decoded prompts, in benchmark order; a prompt skipped at a later turn leaves its earlier rounds in the
    pooled sums only) and `tau_ci95`, the 95% interval over prompts (eval.intervals; reports before the jackknife
    t-interval hold a percentile bootstrap's), are absent from older reports.

    `tokens_per_s` counts every emitted token over the seconds spent decoding (prefills included). With a baseline
    (`taps-train eval` without `--no-baseline`) the same prompts' plain decoding gives `baseline_tokens_per_s`,
    `speedup` (the ratio of the two) and `speedup_ci95` (its interval over prompts). At T=0 `identical_to_greedy` says
    whether every output equalled plain greedy decoding, and the complete check (taps_train/decoding/greedy_check.py) went
    over `greedy_checked_tokens` tokens of every turn, of which `greedy_ties` were not the verifier's argmax but tied
    with it within its dtype's rounding (any other token, or more ties than rounding explains, stops the eval:
    greedy_check.too_many_ties). Reports written before the complete check counted in `greedy_ties` the prompts that
    parted at a near-tie, and have no `greedy_checked_tokens`.

    `plain_rounds` (and `plain_round_tokens`, what they emitted) count the rounds decoded without a drafter: every
    round of the plain tree `--tree auto` may choose, and those the speculation gate (taps_train/decoding/gate.py) decoded
    plainly while speculation did not pay; τ pools them with the speculative rounds.
    """

    acceptance_length: float
    verify_calls: int
    new_tokens: int
    prompts: int
    prompts_skipped_too_long: int | None
    mean_tree_tokens: float
    accept_rate_by_depth: tuple[float, ...]
    draft_entropy: Signals | None
    draft_confidence: Signals | None
    wall_time_s: float
    routing: Mapping[str, int] | None = None
    prompt_new_tokens: tuple[int, ...] | None = None
    prompt_verify_calls: tuple[int, ...] | None = None
    tau_ci95: tuple[float, float] | None = None
    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    speedup: float | None = None
    speedup_ci95: tuple[float, float] | None = None
    identical_to_greedy: bool | None = None
    greedy_ties: int | None = None
    greedy_checked_tokens: int | None = None
    plain_rounds: int | None = None  # rounds that verified the root alone (plain decoding: the gate or a plain tree)
    plain_round_tokens: int | None = None  # the tokens they emitted

    @property
    def prompt_counts(self) -> PromptCounts | None:
        """What a paired comparison pairs; None for reports written before per-prompt counts."""
        if self.prompt_new_tokens is None or self.prompt_verify_calls is None:
            return None
        return PromptCounts(self.prompt_new_tokens, self.prompt_verify_calls)

    def as_dict(self) -> dict:
        """The benchmark's JSON object; optional fields that are None are left out (never null)."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items() if value is not None}


@dataclass(frozen=True)
class EvalReport:
    """One `taps-train eval` call at one temperature. `weights` (None: uniform) belongs to `average` only."""

    verifier: str
    drafters: tuple[str, ...]
    strategy: str
    temperature: float
    tree: TreeConfig  # the draft tree the report was measured with
    benchmarks: Mapping[str, BenchmarkResult]
    average_acceptance_length: float
    weights: tuple[float, ...] | None = None
    tree_calibration: Mapping[str, Any] | None = None  # what `--tree auto` measured and chose (its `tree` is the choice)
    engine: Mapping[str, Any] | None = None  # `--engine vllm`: the engine, its version and how it served the drafter
    speculation_gate: Mapping[str, Any] | None = None  # when rounds could fall back to plain decoding: the gate's settings
    machine: Mapping[str, Any] | None = None  # what timed it (taps_train/machine.py); absent from older reports

    def as_dict(self) -> dict:
        """The JSON object of the file, keys in the order the contract lists them."""
        data = {"verifier": self.verifier, "drafters": list(self.drafters), "strategy": self.strategy, "temperature": self.temperature,
                "tree": asdict(self.tree), "benchmarks": {name: result.as_dict() for name, result in self.benchmarks.items()},
                "average_acceptance_length": self.average_acceptance_length}
        if self.strategy == "average":
            data["weights"] = None if self.weights is None else list(self.weights)
        if self.tree_calibration is not None:
            data["tree_calibration"] = self.tree_calibration
        if self.engine is not None:
            data["engine"] = self.engine
        if self.speculation_gate is not None:
            data["speculation_gate"] = self.speculation_gate
        if self.machine is not None:
            data["machine"] = self.machine
        return data

    def to_json(self) -> str:
        """The report file's text, as `taps-train eval` writes it."""
        return json.dumps(self.as_dict(), indent=2)


def tau_cell(result: dict) -> str:
    """τ with its 95% interval (when the report can give one), verified tree tokens per call, and the speedup over
    plain decoding with its interval (when the report has a baseline)."""
    speedup = speedup_cell(result)
    return f"{tau_only_cell(result)} ({result['mean_tree_tokens']:.0f})" + (f" {speedup}" if speedup != "–" else "")


def tau_only_cell(result: dict) -> str:
    """`2.50 [2.40, 2.60]`: τ and its interval (`tau_interval_of`), or τ alone."""
    interval = tau_interval_of(result)
    return f"{result['acceptance_length']:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def tau_interval_of(result: dict) -> tuple[float, float] | None:
    """A benchmark's τ interval by this version's method (eval.intervals) from its per-prompt counts, so that every
    interval of a page comes from one method where the counts allow; the recorded `tau_ci95` for reports without them."""
    if result.get("prompt_new_tokens") is not None and result.get("prompt_verify_calls") is not None:
        return tau_interval(PromptCounts(result["prompt_new_tokens"], result["prompt_verify_calls"]))
    return tuple(result["tau_ci95"]) if result.get("tau_ci95") else None


def average_tau_interval(report: dict) -> tuple[float, float] | None:
    """The interval of a report's average τ over its benchmarks; None unless every benchmark has per-prompt counts."""
    results = report["benchmarks"].values()
    if not results or any(r.get("prompt_new_tokens") is None or r.get("prompt_verify_calls") is None for r in results):
        return None
    return mean_tau_interval([PromptCounts(r["prompt_new_tokens"], r["prompt_verify_calls"]) for r in results])


def speedup_cell(result: dict) -> str:
    """`1.16× [1.09, 1.22]`, or – for a report decoded without the plain baseline."""
    if result.get("speedup") is None:
        return "–"
    low, high = result.get("speedup_ci95") or (None, None)
    return f"{result['speedup']:.2f}×" + (f" [{low:.2f}, {high:.2f}]" if low is not None else "")


def report_path(path: Path, temperature: float, count: int) -> Path:
    """Where `taps-train eval --output path` writes the report of one of `count` temperatures."""
    return path if count == 1 else path.with_name(f"{path.stem}_T{temperature:g}{path.suffix}")


def read_report(path: str | Path) -> EvalReport:
    """Read and check one report file: every field the contract names, with its type and range."""
    path = Path(path)
    try:
        raw = read_at_most(path, MAX_REPORT_BYTES)
    except OSError as err:
        raise TapsError(f"cannot read eval report {path}: {err.strerror or err}; pass a JSON file written by `taps-train eval`") from err
    if raw is None:
        raise _Field(path).error(f"is larger than {MAX_REPORT_BYTES // 2**20} MiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise _Field(path).error(f"is not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise _Field(path).error("is JSON nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, or an integer too long to convert
        raise _Field(path).error(f"is not valid JSON ({err})") from None
    return _eval_report(_Field(path).object(data))


class _Field:
    """Where a value sits in a report (file plus dotted field name), to name it in errors, and its checks."""

    def __init__(self, path: Path, name: str = ""):
        self.path, self.name = path, name

    def at(self, key: str | int) -> "_Field":
        if isinstance(key, int):
            return _Field(self.path, f"{self.name}[{key}]")
        return _Field(self.path, f"{self.name}.{key}" if self.name else key)

    def error(self, problem: str) -> TapsError:
        what = f"field `{self.name}` {problem}" if self.name else f"the file {problem}"
        return TapsError(f"{self.path} is not a `taps-train eval` report: {what}; pass a JSON file written by `taps-train eval`")

    def object(self, value: Any) -> "_Object":
        if not isinstance(value, dict):
            raise self.error(f"must be a JSON object, got {_kind(value)}")
        return _Object(value, self)

    def number(self, value: Any, minimum: float = 0.0, maximum: float = math.inf) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and minimum <= value <= maximum):
            bounds = f">= {minimum:g}" if maximum == math.inf else f"in [{minimum:g}, {maximum:g}]"
            raise self.error(f"must be a finite number {bounds}, got {_kind(value)}")
        return float(value)

    def integer(self, value: Any, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(f"must be an integer >= {minimum}, got {_kind(value)}")
        return value

    def text(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise self.error(f"must be a non-empty string, got {_kind(value)}")
        return value


class _Object:
    """A JSON object of a report read field by field: a missing field is an error, an unknown one is ignored."""

    def __init__(self, data: dict, where: _Field):
        self.data, self.where = data, where

    def present(self, key: str) -> bool:
        """The field is there and not null (how optional fields are absent)."""
        return self.data.get(key) is not None

    def number(self, key: str, minimum: float = 0.0, maximum: float = math.inf) -> float:
        return self._field(key).number(self.data[key], minimum, maximum)

    def integer(self, key: str, minimum: int = 0) -> int:
        return self._field(key).integer(self.data[key], minimum)

    def text(self, key: str) -> str:
        return self._field(key).text(self.data[key])

    def object(self, key: str) -> "_Object":
        return self._field(key).object(self.data[key])

    def items(self, key: str) -> list[tuple[Any, _Field]]:
        """The elements of a list field, each with its place (`field[i]`)."""
        where, value = self._field(key), self.data[key]
        if not isinstance(value, list):
            raise where.error(f"must be a JSON list, got {_kind(value)}")
        return [(item, where.at(index)) for index, item in enumerate(value)]

    def entries(self) -> list[tuple[str, Any, _Field]]:
        return [(key, value, self.where.at(key)) for key, value in self.data.items()]

    def _field(self, key: str) -> _Field:
        if key not in self.data:
            raise self.where.at(key).error("is missing")
        return self.where.at(key)


def _eval_report(report: _Object) -> EvalReport:
    drafters = tuple(where.text(name) for name, where in report.items("drafters"))
    if not drafters:
        raise report.where.at("drafters").error("must name at least one drafter, got an empty list")
    results = {name: _benchmark(where.object(value)) for name, value, where in report.object("benchmarks").entries()}
    if not results:
        raise report.where.at("benchmarks").error("must hold at least one benchmark, got none")
    strategy = report.text("strategy")
    tree = report.object("tree")
    try:
        shape = TreeConfig(total_tokens=tree.integer("total_tokens", 1), depth=tree.integer("depth"), top_k=tree.integer("top_k", 1))
    except TapsError as err:
        raise report.where.at("tree").error(str(err)) from None
    return EvalReport(
        verifier=report.text("verifier"),
        drafters=drafters,
        strategy=strategy,
        temperature=report.number("temperature"),
        tree=shape,
        benchmarks=results,
        average_acceptance_length=report.number("average_acceptance_length"),
        weights=_weights(report, len(drafters)) if strategy == "average" else None,
        tree_calibration=report.object("tree_calibration").data if report.present("tree_calibration") else None,
        engine=report.object("engine").data if report.present("engine") else None,
        speculation_gate=report.object("speculation_gate").data if report.present("speculation_gate") else None,
        machine=report.object("machine").data if report.present("machine") else None,
    )


def _weights(report: _Object, drafters: int) -> tuple[float, ...] | None:
    """λ of an `average` report: absent or null is uniform, else one finite non-negative weight per drafter."""
    if not report.present("weights"):
        return None
    weights = tuple(where.number(value) for value, where in report.items("weights"))
    if len(weights) != drafters:
        raise report.where.at("weights").error(f"must hold one weight per drafter ({drafters}), got {len(weights)}")
    return weights


def _benchmark(result: _Object) -> BenchmarkResult:
    return BenchmarkResult(
        acceptance_length=result.number("acceptance_length"),
        verify_calls=result.integer("verify_calls"),
        new_tokens=result.integer("new_tokens"),
        prompts=result.integer("prompts", 1),
        prompts_skipped_too_long=result.integer("prompts_skipped_too_long") if result.present("prompts_skipped_too_long") else None,
        mean_tree_tokens=result.number("mean_tree_tokens"),
        accept_rate_by_depth=tuple(where.number(rate, maximum=1.0) for rate, where in result.items("accept_rate_by_depth")),
        draft_entropy=_signals(result, "draft_entropy"),
        draft_confidence=_signals(result, "draft_confidence"),
        wall_time_s=result.number("wall_time_s"),
        routing=({drafter: where.integer(rounds) for drafter, rounds, where in result.object("routing").entries()}
                 if result.present("routing") else None),
        **_prompt_counts(result),
        **_speed(result),
    )


def _prompt_counts(result: _Object) -> dict:
    """Per-prompt counts and the τ interval, checked against the pooled fields they break down."""
    fields = {}
    for key, total in (("prompt_new_tokens", "new_tokens"), ("prompt_verify_calls", "verify_calls")):
        if result.present(key):
            counts = tuple(where.integer(count) for count, where in result.items(key))
            if len(counts) != result.data["prompts"] or sum(counts) > result.data[total]:
                raise result.where.at(key).error(f"must hold one count per decoded prompt ({result.data['prompts']}) "
                                                 f"summing to at most {total} ({result.data[total]})")
            fields[key] = counts
    for key in ("tau_ci95", "speedup_ci95"):
        if result.present(key):
            fields[key] = _interval(result, key)
    return fields


def _speed(result: _Object) -> dict:
    """Tokens/s, the baseline's and the speedup (absent from reports of older versions or without a baseline)."""
    fields = {key: result.number(key) for key in ("tokens_per_s", "baseline_tokens_per_s", "speedup") if result.present(key)}
    for key in ("greedy_ties", "greedy_checked_tokens", "plain_rounds", "plain_round_tokens"):
        if result.present(key):
            fields[key] = result.integer(key)
    if result.present("identical_to_greedy"):
        value = result.data["identical_to_greedy"]
        if not isinstance(value, bool):
            raise result.where.at("identical_to_greedy").error(f"must be true or false, got {_kind(value)}")
        fields["identical_to_greedy"] = value
    return fields


def _interval(result: _Object, key: str) -> tuple[float, float]:
    bounds = tuple(where.number(value) for value, where in result.items(key))
    if len(bounds) != 2 or bounds[0] > bounds[1]:
        raise result.where.at(key).error(f"must be [low, high] with low <= high, got {list(bounds)}")
    return bounds


def _signals(result: _Object, key: str) -> Signals | None:
    if not result.present(key):
        return None
    signals = result.object(key)
    return Signals(*(signals.number(kind) if signals.present(kind) else None for kind in ("accepted", "rejected")))


def _kind(value: Any) -> str:
    """A short description of a wrong value for an error line (never the whole value)."""
    if isinstance(value, dict | list):
        return f"a JSON {'object' if isinstance(value, dict) else 'list'}"
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def tau_table(paths: list[str | Path]) -> list[dict]:
    """The acceptance lengths of `taps-train eval` reports, as an export records them."""
    table = []
    for path in paths:
        report = read_report(path).as_dict()
        table.append({
            "report": str(path),
            **{key: report[key] for key in ("strategy", "temperature", "drafters", "tree")},
            "acceptance_length": {name: result["acceptance_length"] for name, result in report["benchmarks"].items()},
        })
    return table
