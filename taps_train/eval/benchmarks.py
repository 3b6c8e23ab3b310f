"""Evaluation prompts: the paper's hub benchmarks and offline sets this machine can run.

Every benchmark turns its records into `Prompt`s in a fixed order, so the first N prompts are the
same on every run and τ measured on a `limit` is comparable across drafters. Damaged records are
skipped, counted in `Benchmark.report` and said on stderr in one line (public dumps are messy and one
bad row must not end an evaluation, but a set smaller than its source must not be silent either); a
benchmark that yields nothing is an error: a τ over zero prompts means nothing.
Hub benchmarks accept a local JSON/JSONL copy in the hub's field layout, because the hub is often
unreachable where drafters are evaluated.
"""

import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from taps_train.data.conversation import BadRecord, Conversation
from taps_train.data.recipe import load_recipe, select
from taps_train.data.records import ReadReport, contains_invalid_utf8, read_records
from taps_train.errors import TapsError
from taps_train.shipped import PACKAGE, shipped_path

# Differs from every seed of the training data (gsm_symbolic seed 1, tiny verifier 10000+ and 20000+).
OFFLINE_SEED = 31337


@dataclass(frozen=True)
class Prompt:
    """One evaluation item: the user turns in order (a later turn is asked after the model's answer
    to the earlier ones) and the gold answer when the set has one, for reports only."""

    id: str
    turns: list[str]
    reference: str | None = None


class Benchmark(ABC):
    """Base of every benchmark: `load` applies the limit and the checks; subclasses only `_read`."""

    name: ClassVar[str]
    path_arg: ClassVar[str | None] = None  # the field that `name:path` sets; None: takes no file
    report: ReadReport | None = None  # what the last `load` read and skipped, by reason

    def load(self, limit: int | None = None) -> list[Prompt]:
        """The first `limit` prompts (all when None) in the benchmark's fixed order."""
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise TapsError(f"benchmark {self.name}: limit must be a positive integer or None, got {limit!r}")
        try:
            prompts, self.report = self._read()
        except TapsError as err:
            raise TapsError(f"benchmark {self.name}: {err}") from err
        if not prompts:
            raise TapsError(
                f"benchmark {self.name}: no usable prompts ({self.report.summary()}); "
                f"point it at a file in the {self.name} field layout"
            )
        _say_skipped(self.name, len(prompts), self.report, limit)
        return prompts[:limit]

    @abstractmethod
    def _read(self) -> tuple[list[Prompt], ReadReport]:
        """Every usable prompt in order, and the report counting what was skipped and why."""


def _say_skipped(name: str, usable: int, report: ReadReport, limit: int | None) -> None:
    """One stderr line when records were skipped, e.g. chat_heldout's ShareGPT fragments: 123 usable of 200."""
    if not (report.problems or report.truncated_tail_chars):
        return
    used = f"; using the first {limit}" if limit is not None and limit < usable else ""
    print(f"{name}: {usable} usable prompts of {report.summary()}{used}", file=sys.stderr, flush=True)


def _text(record: dict, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadRecord(f"missing or empty '{key}'")
    if contains_invalid_utf8(value):
        raise BadRecord(f"invalid UTF-8 in '{key}'")
    return value


def _number(record: dict, key: str) -> str:
    """A numeric answer as text, `8` rather than `8.0` for whole numbers."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"'{key}' is not a number")
    return str(int(value)) if float(value).is_integer() else str(value)


def _record_id(record: dict, key: str, fallback: str) -> str:
    return fallback if record.get(key) is None else str(record[key])


@dataclass
class HubBenchmark(Benchmark):
    """A benchmark published as a hub dataset; `location` may name a local JSON/JSONL copy instead."""

    location: str
    config: str | None = None
    split: str = "test"
    revision: str | None = None
    path_arg: ClassVar[str | None] = "location"

    def _read(self) -> tuple[list[Prompt], ReadReport]:
        rows, report = self._rows()
        prompts = []
        for index, row in enumerate(rows):
            try:
                if not isinstance(row, dict):
                    raise BadRecord("record is not an object")
                prompts.append(self._prompt(row, f"{self.name}:{index}"))
            except BadRecord as reason:
                report.problems[str(reason)] += 1
        return prompts, report

    def _rows(self) -> tuple[list[object], ReadReport]:
        path = Path(self.location).expanduser()
        if path.is_file():
            report = ReadReport(str(path))
            return list(read_records(path, report)), report
        if path.exists() or self.location.startswith((".", "/", "~")) or path.suffix in (".json", ".jsonl"):
            raise TapsError(f"{self.location} is not a file; give a JSON/JSONL file in the hub's field layout or a hub dataset id")
        return self._hub_rows()

    def _hub_rows(self) -> tuple[list[object], ReadReport]:
        import datasets

        where = f"hub dataset {self.location} ({self.config or 'default'} config, {self.split} split)"
        try:
            dataset = datasets.load_dataset(self.location, self.config, split=self.split, revision=self.revision)
        except Exception as err:  # offline, missing and renamed datasets raise many types; all mean "not here"
            raise TapsError(
                f"cannot load {where} ({type(err).__name__}: {err}); download it as JSON/JSONL and use "
                f"'{self.name}:path/to/file.jsonl', or pick an offline benchmark"
            ) from err
        return list(dataset), ReadReport(where, records=len(dataset))

    @abstractmethod
    def _prompt(self, record: dict, fallback_id: str) -> Prompt:
        """One record in this benchmark's field layout, or `BadRecord` naming the bad field."""


@dataclass
class MtBench(HubBenchmark):
    """MT-Bench: 80 questions of two user turns; the second is asked after the model's first answer."""

    name: ClassVar[str] = "mt_bench"
    location: str = "HuggingFaceH4/mt_bench_prompts"
    split: str = "train"

    def _prompt(self, record: dict, fallback_id: str) -> Prompt:
        turns = record.get("prompt")
        if not isinstance(turns, list) or not turns:
            raise BadRecord("'prompt' is not a non-empty list of turns")
        if not all(isinstance(t, str) and t.strip() and not contains_invalid_utf8(t) for t in turns):
            raise BadRecord("'prompt' has an empty, non-string or invalid UTF-8 turn")
        # `reference` lists per-turn gold answers for math/reasoning/coding questions and is empty otherwise
        references = [r for r in record.get("reference") or [] if isinstance(r, str) and r.strip()]
        return Prompt(_record_id(record, "prompt_id", fallback_id), turns, references[0] if references else None)


@dataclass
class Gsm8k(HubBenchmark):
    """GSM8K test; the reference is the number after the answer's final `####`."""

    name: ClassVar[str] = "gsm8k"
    location: str = "openai/gsm8k"
    config: str | None = "main"

    def _prompt(self, record: dict, fallback_id: str) -> Prompt:
        question, answer = _text(record, "question"), _text(record, "answer")
        _, marker, final = answer.rpartition("####")
        if not marker or not final.strip():
            raise BadRecord("'answer' has no final '#### <number>'")
        return Prompt(fallback_id, [question], final.strip())


@dataclass
class Math500(HubBenchmark):
    """MATH-500 (the PRM800K subset of MATH test problems)."""

    name: ClassVar[str] = "math500"
    location: str = "HuggingFaceH4/MATH-500"

    def _prompt(self, record: dict, fallback_id: str) -> Prompt:
        return Prompt(_record_id(record, "unique_id", fallback_id), [_text(record, "problem")], _text(record, "answer"))


@dataclass
class Svamp(HubBenchmark):
    """SVAMP test: a story (`Body`) and a question about it, with a numeric answer."""

    name: ClassVar[str] = "svamp"
    location: str = "ChilleD/SVAMP"

    def _prompt(self, record: dict, fallback_id: str) -> Prompt:
        question = f"{_text(record, 'Body').strip()} {_text(record, 'Question').strip()}"
        return Prompt(_record_id(record, "ID", fallback_id), [question], _number(record, "Answer"))


@dataclass
class RecipeHeldout(Benchmark):
    """The opening user turn of each held-out conversation of a recipe (never trained on).

    A conversation whose first turn is the assistant's is a fragment of a longer chat (ShareGPT
    splits long chats) and its first user turn ("continue") is no prompt; such conversations, repeated
    openings and openings that are also a user turn of the recipe's training split are skipped and
    counted, so the set stays out of the training data even where the pool has near-duplicates.
    """

    recipe: str
    path_arg: ClassVar[str | None] = "recipe"

    def _read(self) -> tuple[list[Prompt], ReadReport]:
        path = self._recipe_path()
        recipe = load_recipe(path)
        selected = [select(selection, recipe.seed) for selection in recipe.sources]
        trained = {m["content"] for s in selected for c in s.train for m in c.messages if m["role"] == "user"}
        report = ReadReport(f"held-out split of recipe {path}")
        prompts, seen = [], set()
        for conversation in (c for s in selected for c in s.heldout):
            report.records += 1
            try:
                prompt = _opening(conversation)
                if prompt.turns[0] in trained:
                    raise BadRecord("opening turn is also a training prompt")
                if prompt.turns[0] in seen:
                    raise BadRecord("repeated opening turn")
            except BadRecord as reason:
                report.problems[str(reason)] += 1
                continue
            seen.add(prompt.turns[0])
            prompts.append(prompt)
        return prompts, report

    def _recipe_path(self) -> Path:
        """As given if it exists, else the shipped recipe of that name (so it works from any directory)."""
        path = shipped_path(self.recipe)
        if not path.is_file():
            raise TapsError(f"recipe {self.recipe} not found (looked in the current directory and among the shipped recipes in "
                            f"{PACKAGE / 'data_recipes'}); give a recipe YAML path")
        return path


def _opening(conversation: Conversation) -> Prompt:
    """The first user turn, with the assistant's reply to it as the reference."""
    messages = [m for m in conversation.messages if m["role"] != "system"]
    if messages[0]["role"] != "user":
        raise BadRecord("starts mid-conversation (first turn is not the user's)")
    reply = messages[1]["content"] if len(messages) > 1 and messages[1]["role"] == "assistant" else None
    return Prompt(conversation.id, [messages[0]["content"]], reply)


@dataclass
class ChatHeldout(RecipeHeldout):
    """Held-out ShareGPT openings of the offline chat recipe."""

    name: ClassVar[str] = "chat_heldout"
    recipe: str = "data_recipes/tiny_chat.yaml"


@dataclass
class CodeHeldout(RecipeHeldout):
    """Held-out ShareGPT openings answered with fenced code (the offline code recipe)."""

    name: ClassVar[str] = "code_heldout"
    recipe: str = "data_recipes/tiny_code.yaml"


@dataclass
class ProseHeldout(RecipeHeldout):
    """Held-out ShareGPT openings of conversations without code (the offline prose-chat recipe)."""

    name: ClassVar[str] = "prose_heldout"
    recipe: str = "data_recipes/tiny_prose.yaml"


@dataclass
class MathHeldout(RecipeHeldout):
    """Held-out gsm_symbolic problems of the offline math recipe; reference = chain-of-thought answer."""

    name: ClassVar[str] = "math_heldout"
    recipe: str = "data_recipes/tiny_math.yaml"


@dataclass
class ReasoningGymSet(Benchmark):
    """`size` seeded problems from a reasoning-gym generator: math that no training recipe draws on."""

    generator: str
    size: int = 200
    seed: int = OFFLINE_SEED

    def _read(self) -> tuple[list[Prompt], ReadReport]:
        import reasoning_gym

        if not isinstance(self.size, int) or self.size < 1:
            raise TapsError(f"size must be a positive integer, got {self.size!r}")
        try:
            items = list(reasoning_gym.create_dataset(self.generator, size=self.size, seed=self.seed))
        except ValueError as err:
            raise TapsError(f"reasoning-gym cannot make {self.generator!r} ({err}); pick a name from reasoning_gym.factory.DATASETS") from err
        report = ReadReport(f"reasoning-gym {self.generator}(size={self.size}, seed={self.seed})", records=len(items))
        prompts = []
        for index, item in enumerate(items):
            try:
                prompts.append(Prompt(f"{self.generator}:{self.seed}:{index}", [_text(item, "question")], _text(item, "answer")))
            except BadRecord as reason:
                report.problems[str(reason)] += 1
        return prompts, report


@dataclass
class ArithOffline(ReasoningGymSet):
    """Integer arithmetic expressions ("Calculate -110 + -573 - -75."), answered with one number."""

    name: ClassVar[str] = "arith_offline"
    generator: str = "basic_arithmetic"


@dataclass
class LegsOffline(ReasoningGymSet):
    """Grade-school word problems: count the legs of a list of animals."""

    name: ClassVar[str] = "legs_offline"
    generator: str = "leg_counting"


BENCHMARKS: dict[str, type[Benchmark]] = {
    cls.name: cls for cls in (MtBench, Gsm8k, Math500, Svamp, ChatHeldout, CodeHeldout, ProseHeldout, MathHeldout, ArithOffline, LegsOffline)
}


def _registered(name: str) -> type[Benchmark]:
    if name not in BENCHMARKS:
        raise TapsError(f"unknown benchmark {name!r}; known benchmarks: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def make_benchmark(name: str, **args: object) -> Benchmark:
    """Instantiate a registered benchmark; errors name it, the bad argument and the allowed ones."""
    cls = _registered(name)
    try:
        return cls(**args)
    except TypeError as err:
        raise TapsError(f"bad arguments for benchmark {name!r}: {err}; allowed: {', '.join(f.name for f in fields(cls))}") from err


def parse_benchmark(spec: str) -> Benchmark:
    """`name`, or `name:path` to point a benchmark at a local file (or another hub id / recipe)."""
    name, colon, path = spec.partition(":")
    cls = _registered(name)
    if not colon:
        return cls()
    if cls.path_arg is None:
        raise TapsError(f"benchmark {name} is generated offline and takes no file; use '{name}' without ':{path}'")
    if not path:
        raise TapsError(f"benchmark spec {spec!r} has nothing after ':'; use '{name}' or '{name}:path/to/file'")
    return make_benchmark(name, **{cls.path_arg: path})


def load_benchmark(spec: str, limit: int | None = None) -> tuple[list[Prompt], ReadReport]:
    """The prompts of `spec` (see `parse_benchmark`) and the report of what was read and skipped."""
    benchmark = parse_benchmark(spec)
    return benchmark.load(limit), benchmark.report
