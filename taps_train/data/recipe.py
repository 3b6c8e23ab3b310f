"""Data recipes: which samples of which sources a drafter trains and is evaluated on.

Selection is a seeded permutation of each source's (de-duplicated) pool: the first `heldout` samples
are the evaluation split, the next `count` the training split. The two never overlap, and a smaller
count is a prefix of a larger one, so `mixed_35k_35k` reuses the feature caches of `sharegpt_70k` and
`mathinstruct_70k` without extra bytes.
"""

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn


from taps_train.data.conversation import Conversation
from taps_train.data.records import ReadReport
from taps_train.data.sources import SOURCES, Jsonl, describe, make_source
from taps_train.errors import TapsError
from taps_train.shipped import shipped_path
from taps_train.user_yaml import read_yaml


@dataclass(frozen=True)
class Regenerate:
    """Replace assistant turns with the verifier's own replies (EAGLE-3 / SpecForge style)."""

    temperature: float = 0.0
    max_new_tokens: int = 256
    seed: int = 0


@dataclass(frozen=True)
class SourceSelection:
    source: str
    args: dict = field(default_factory=dict)
    count: int = 0
    heldout: int = 0
    regenerate: Regenerate | None = None


@dataclass(frozen=True)
class Recipe:
    name: str
    sources: list[SourceSelection]
    max_length: int = 2048
    seed: int = 0


@dataclass
class SelectedSource:
    """One source's train and held-out conversations, plus what identifies them for caching."""

    selection: SourceSelection
    train: list[Conversation]
    heldout: list[Conversation]
    report: ReadReport
    duplicates: int
    key: str  # fingerprint of pool + seed + heldout: the same for any `count`


MAX_SEED = 2**63 - 1  # torch.manual_seed's range; larger seeds would fail deep inside regeneration

RECIPE_FIELDS = ("name", "sources", "max_length", "seed")
SELECTION_FIELDS = ("source", "args", "count", "heldout", "regenerate")
REGENERATE_FIELDS = ("temperature", "max_new_tokens", "seed")


class _Field:
    """What one field accepts, as (check, description): `check(value)` is true for an accepted value."""

    def __init__(self, check, expected: str):
        self.check, self.expected = check, expected


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML `yes`/`true` are bools, and bool is an int


NON_EMPTY_STR = _Field(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty string")
OPTIONAL_STR = _Field(lambda v: v is None or (isinstance(v, str) and v.strip() != ""), "a non-empty string or null (quote numeric revisions)")
POSITIVE_INT = _Field(lambda v: _is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT = _Field(lambda v: _is_int(v) and v >= 0, "a non-negative integer")
SEED = _Field(lambda v: _is_int(v) and 0 <= v <= MAX_SEED, f"an integer seed in [0, {MAX_SEED}]")
MAX_LENGTH = _Field(lambda v: _is_int(v) and v >= 2, "an integer >= 2")
TEMPERATURE = _Field(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                     "a finite number >= 0 (0 is greedy)")

# Type and range of every argument of every source (the dataclasses in taps_train.data.sources); a test
# keeps this table and the dataclass fields in step.
SOURCE_ARGS: dict[str, dict[str, _Field]] = {
    "sharegpt": {"location": NON_EMPTY_STR, "filename": NON_EMPTY_STR, "revision": OPTIONAL_STR, "topic": NON_EMPTY_STR},
    "mathinstruct": {"location": NON_EMPTY_STR, "filename": NON_EMPTY_STR, "revision": OPTIONAL_STR},
    "gsm_symbolic": {"size": POSITIVE_INT, "seed": SEED},
    "jsonl": {"path": NON_EMPTY_STR},
}
REQUIRED_ARGS = {"jsonl": ("path",)}
REGENERATE_ARGS = {"temperature": TEMPERATURE, "max_new_tokens": POSITIVE_INT, "seed": SEED}


def _shown(value: object) -> str:
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})" if value is not None else text


class _Checker:
    """Raises one-line TapsErrors that name the recipe file and the dotted field."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, message: str) -> NoReturn:
        raise TapsError(f"recipe {self.path}: {message}")

    def field(self, where: str, value: object, spec: _Field) -> object:
        if not spec.check(value):
            self.fail(f"{where} must be {spec.expected}, got {_shown(value)}")
        return value

    def keys(self, where: str, mapping: dict, allowed: tuple[str, ...]) -> None:
        odd = [k for k in mapping if not isinstance(k, str)]
        if odd:
            self.fail(f"{where or 'top level'}: field names must be strings, got {_shown(odd[0])}")
        unknown = sorted(set(mapping) - set(allowed))
        if unknown:
            self.fail(f"{where + ': ' if where else ''}unknown field(s) {unknown}; allowed: {', '.join(allowed)}")


def load_recipe(path: str | Path) -> Recipe:
    """Parse and validate a recipe YAML: the type and range of every field, unknown fields at every level.

    Every problem is one `TapsError` line naming the file, the field (`sources[1].args.size`) and what it
    must be; nothing reaches `select` or the cache keys unchecked (a `seed: null` would draw a new split
    on every run under one cache key)."""
    path = shipped_path(path)
    raw = read_yaml(path, "recipe", "see data_recipes/README.md")
    if not isinstance(raw, dict):
        raise TapsError(f"recipe {path} must be a mapping with 'name' and 'sources', got {_shown(raw)}")
    check = _Checker(path)
    check.keys("", raw, RECIPE_FIELDS)
    name = check.field("name", raw.get("name", path.stem), NON_EMPTY_STR)
    sources = raw.get("sources")
    if not isinstance(sources, list) or not sources:
        check.fail(f"'sources' must be a non-empty list of source mappings, got {_shown(sources)}")
    max_length = check.field("max_length", raw.get("max_length", 2048), MAX_LENGTH)
    seed = check.field("seed", raw.get("seed", 0), SEED)
    selections = [_selection(check, index, entry) for index, entry in enumerate(sources)]
    return Recipe(name=name, sources=selections, max_length=max_length, seed=seed)


def _selection(check: _Checker, index: int, entry: object) -> SourceSelection:
    where = f"sources[{index}]"
    if not isinstance(entry, dict):
        check.fail(f"{where} must be a mapping with 'source' and 'count', got {_shown(entry)}")
    check.keys(where, entry, SELECTION_FIELDS)
    name = entry.get("source")
    if not isinstance(name, str) or name not in SOURCES:
        check.fail(f"{where}: unknown source {name!r}; known sources: {', '.join(SOURCES)} (set {where}.source to one of them)")
    counts = {key: check.field(f"{where}.{key}", entry.get(key, 0), NON_NEGATIVE_INT) for key in ("count", "heldout")}
    if counts["count"] == 0 and counts["heldout"] == 0:
        check.fail(f"{where}: set 'count' (training samples) and/or 'heldout' (evaluation samples) to a positive integer")
    args = entry.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        check.fail(f"{where}.args must be a mapping of {name} arguments ({', '.join(SOURCE_ARGS.get(name, {}))}), got {_shown(args)}")
    specs = SOURCE_ARGS.get(name)
    if specs is not None:
        check.keys(f"{where}.args", args, tuple(specs))
        for required in REQUIRED_ARGS.get(name, ()):
            if required not in args:
                check.fail(f"{where}.args.{required} is required for source {name}")
        for key, value in args.items():
            check.field(f"{where}.args.{key}", value, specs[key])
    try:  # any remaining argument errors surface here, before any work
        source = make_source(name, args)
    except TapsError as err:
        check.fail(f"{where}: {err}")
    if isinstance(source, Jsonl) and not Path(source.path).expanduser().is_file():
        check.fail(f"{where}.args.path {source.path} does not exist or is not a file")
    return SourceSelection(name, args, counts["count"], counts["heldout"], _regenerate(check, where, entry.get("regenerate")))


def _regenerate(check: _Checker, where: str, value: object) -> Regenerate | None:
    """`regenerate: true` or a mapping of `Regenerate` fields; a typo must not pass as a traceback."""
    if value is None or value is False:
        return None
    if value is True:
        return Regenerate()
    where = f"{where}.regenerate"
    if not isinstance(value, dict):
        check.fail(f"{where} must be true, false or a mapping of {', '.join(REGENERATE_FIELDS)}; got {_shown(value)}")
    check.keys(where, value, REGENERATE_FIELDS)
    for key, item in value.items():
        check.field(f"{where}.{key}", item, REGENERATE_ARGS[key])
    options = dict(value)
    if "temperature" in options:
        options["temperature"] = float(options["temperature"])  # `1` and `1.0` share a cache key
    return Regenerate(**options)


def select(selection: SourceSelection, seed: int) -> SelectedSource:
    """Load the source, drop duplicate conversations, and take the held-out then training samples."""
    source = make_source(selection.source, selection.args)
    pool, report = source.load()
    unique, seen = [], set()
    for conversation in pool:
        digest = _content_hash(conversation)
        if digest not in seen:
            seen.add(digest)
            unique.append(conversation)
    wanted = selection.heldout + selection.count
    if wanted > len(unique):
        raise TapsError(
            f"source {selection.source} {selection.args or ''} has {len(unique)} usable samples but the recipe asks for "
            f"{selection.heldout} held-out + {selection.count} training; lower the counts ({report.summary()})"
        )
    order = list(range(len(unique)))
    random.Random(seed).shuffle(order)
    key_blob = json.dumps({"source": describe(source), "fingerprint": source.fingerprint(), "seed": seed, "heldout": selection.heldout,
                           "regenerate": selection.regenerate and vars(selection.regenerate)}, sort_keys=True, default=str)
    return SelectedSource(
        selection=selection,
        train=[unique[i] for i in order[selection.heldout : wanted]],
        heldout=[unique[i] for i in order[: selection.heldout]],
        report=report,
        duplicates=len(pool) - len(unique),
        key=hashlib.sha256(key_blob.encode()).hexdigest()[:16],
    )


def _content_hash(conversation: Conversation) -> str:
    return hashlib.sha256(json.dumps(conversation.messages, sort_keys=True).encode()).hexdigest()
