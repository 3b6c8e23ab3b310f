import json

import pytest

from taps_train.data.corpora import read_conversations, sharegpt_package_path
from taps_train.data.records import ReadReport, read_records
from taps_train.errors import TapsError

GOOD = {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}


def test_truncated_json_array_keeps_every_complete_record(tmp_path):
    records = [dict(GOOD, id=str(i)) for i in range(5)]
    text = json.dumps(records, indent=2)
    cut = text[: text.index('"id": "4"') + 12]  # stop in the middle of the last record
    path = tmp_path / "cut.json"
    path.write_text(cut)
    report = ReadReport(str(path))
    got = list(read_records(path, report))
    assert [r["id"] for r in got] == ["0", "1", "2", "3"]
    assert report.records == 4 and report.truncated_tail_chars > 0


def test_sharegpt_package_file_yields_all_complete_records():
    conversations, report = read_conversations(sharegpt_package_path())
    assert report.records == 17_671
    assert report.truncated_tail_chars > 0
    assert len(conversations) + sum(report.problems.values()) == 17_671
    assert len(conversations) > 17_000


def test_jsonl_bad_lines_and_invalid_utf8_are_counted_not_fatal(tmp_path):
    path = tmp_path / "data.jsonl"
    bad_utf8 = json.dumps(dict(GOOD, id="b")).encode().replace(b"hello", b"hel\xfflo")
    path.write_bytes(b"\n".join([json.dumps(GOOD).encode(), b"{not json", bad_utf8, json.dumps(dict(GOOD, id="c")).encode()]))
    conversations, report = read_conversations(path)
    assert [c.id for c in conversations] == ["a", "c"]
    assert report.problems == {"invalid JSON line": 1, "invalid UTF-8 text": 1}


def test_unreadable_file_is_a_clear_error(tmp_path):
    with pytest.raises(TapsError, match="cannot read data file .*missing.json"):
        list(read_records(tmp_path / "missing.json"))


def test_non_json_file_is_a_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("this is not json")
    with pytest.raises(TapsError, match="x.json is not valid JSON"):
        list(read_records(path))
