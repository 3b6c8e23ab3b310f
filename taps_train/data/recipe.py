"""Data recipes: which samples of which sources a drafter trains and is evaluated on.

Selection is a seeded permutation of each source's (de-duplicated) pool: the first `heldout` samples
are the evaluation split, the next `count` the training split. The two never overlap, and a smaller
count is a prefix of a larger one, so `mixed_35k_35k` reuses the feature caches of `sharegpt_70k` and
`mathinstruct_70k` without extra bytes.
"""

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from taps_train.data.conversation import Conversation
from taps_train.data.records import ReadReport
from taps_train.data.sources import SOURCES, Jsonl, describe, make_source
from taps_train.errors import TapsError


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


def load_recipe(path: str | Path) -> Recipe:
    """Parse and validate a recipe YAML; every problem names the file and the field."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise TapsError(f"cannot read recipe {path}: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise TapsError(f"recipe {path} is not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise TapsError(f"recipe {path} must be a mapping with 'name' and 'sources'")
    unknown = set(raw) - {"name", "sources", "max_length", "seed"}
    if unknown:
        raise TapsError(f"recipe {path}: unknown field(s) {sorted(unknown)}; allowed: name, sources, max_length, seed")
    if not isinstance(raw.get("sources"), list) or not raw["sources"]:
        raise TapsError(f"recipe {path}: 'sources' must be a non-empty list")
    selections = [_selection(path, index, entry) for index, entry in enumerate(raw["sources"])]
    recipe = Recipe(name=str(raw.get("name", path.stem)), sources=selections, max_length=raw.get("max_length", 2048), seed=raw.get("seed", 0))
    if not isinstance(recipe.max_length, int) or recipe.max_length < 2:
        raise TapsError(f"recipe {path}: max_length must be an integer >= 2, got {recipe.max_length!r}")
    return recipe


def _selection(path: Path, index: int, entry: object) -> SourceSelection:
    where = f"recipe {path}, sources[{index}]"
    if not isinstance(entry, dict):
        raise TapsError(f"{where} must be a mapping with 'source' and 'count'")
    unknown = set(entry) - {"source", "args", "count", "heldout", "regenerate"}
    if unknown:
        raise TapsError(f"{where}: unknown field(s) {sorted(unknown)}")
    if entry.get("source") not in SOURCES:
        raise TapsError(f"{where}: unknown source {entry.get('source')!r}; known sources: {', '.join(SOURCES)}")
    for name in ("count", "heldout"):
        value = entry.get(name, 0)
        if not isinstance(value, int) or value < 0:
            raise TapsError(f"{where}: '{name}' must be a non-negative integer, got {value!r}")
    if entry.get("count", 0) == 0 and entry.get("heldout", 0) == 0:
        raise TapsError(f"{where}: set 'count' (training samples) and/or 'heldout' (evaluation samples)")
    try:  # argument errors and missing local files surface here, before any work
        source = make_source(entry["source"], entry.get("args") or {})
    except TapsError as err:
        raise TapsError(f"{where}: {err}") from err
    if isinstance(source, Jsonl) and not Path(source.path).expanduser().is_file():
        raise TapsError(f"{where}: args.path {source.path} does not exist or is not a file")
    return SourceSelection(entry["source"], entry.get("args") or {}, entry.get("count", 0), entry.get("heldout", 0), _regenerate(where, entry.get("regenerate")))


def _regenerate(where: str, value: object) -> Regenerate | None:
    """`regenerate: true` or a mapping of `Regenerate` fields; a typo must not pass as a traceback."""
    if value is None or value is False:
        return None
    if value is True:
        return Regenerate()
    if not isinstance(value, dict):
        raise TapsError(f"{where}: 'regenerate' must be true or a mapping of temperature, max_new_tokens, seed; got {value!r}")
    try:
        return Regenerate(**value)
    except TypeError as err:
        raise TapsError(f"{where}: bad 'regenerate' options ({err}); allowed: temperature, max_new_tokens, seed") from err


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
