"""Record files read by content, not extension; one broken element never hides the ones after it; BOMs,
Unicode line separators and deep nesting are handled and counted by their true reason."""

import pytest

from taps_train.data.records import ReadReport, read_records

CASES = {
    "jsonl named .json": ("d.json", '{"a": 1}\n{"a": 2}\n{"a": 3}\n', [1, 2, 3], {}, 0),
    "json array named .jsonl": ("d.jsonl", '[{"a": 1}, {"a": 2}]', [1, 2], {}, 0),
    "pretty single object named .jsonl": ("d.jsonl", '{\n  "a": 1\n}\n', [1], {}, 0),
    "broken element mid-array": ("d.json", '[{"a": 1}, {"a": 2,, "x": 0}, {"a": 3}, {"a": 4}]', [1, 3, 4], {"invalid JSON array element": 1}, 0),
    "bare invalid value mid-array": ("d.json", '[{"a": 1}, tru, {"a": 2}]', [1, 2], {"invalid JSON array element": 1}, 0),
    "brackets inside strings": ("d.json", '[{"a": 1, "s": "}]{["}, {"a": 2,,}, {"a": 3}]', [1, 3], {"invalid JSON array element": 1}, 0),
    "unbalanced element swallows no neighbour": ("d.json", '[{"a": 1}, {"messages": [}, {"a": 2}, {"a": 3}]', [1, 2, 3], {"invalid JSON array element": 1}, 0),
    "unbalanced last element": ("d.json", '[{"a": 1}, {"messages": [}]', [1], {"invalid JSON array element": 1}, 0),
    "bracket closed by the wrong closer": ("d.json", '[{"a": 1}, {"a": 2]}, {"a": 3}]', [1, 3], {"invalid JSON array element": 1}, 0),
    "stray closing brace": ("d.json", '[{"a": 1}, }, {"a": 2}]', [1, 2], {"invalid JSON array element": 1}, 0),
    "stray closing bracket mid-array": ("d.json", '[{"a": 1}, x], {"a": 2}]', [1, 2], {"invalid JSON array element": 1}, 0),
    "truncated tail": ("d.json", '[{"a": 1}, {"a": 2}, {"a": 3, "s": "cut', [1, 2], {}, 18),
    "bom before array": ("d.json", '\ufeff[{"a": 1}, {"a": 2}]', [1, 2], {}, 0),
    "bom before jsonl": ("d.jsonl", '\ufeff{"a": 1}\n{"a": 2}\n', [1, 2], {}, 0),
    "unicode separators in jsonl strings": ("d.jsonl", '{"a": 1, "s": "x\u2028y\u2029z\u0085w"}\n{"a": 2}\n', [1, 2], {}, 0),
    "crlf jsonl": ("d.jsonl", '{"a": 1}\r\n{"a": 2}\r\n', [1, 2], {}, 0),
    "bad jsonl line": ("d.jsonl", '{"a": 1}\n{"a": \n{"a": 2}\n', [1, 2], {"invalid JSON line": 1}, 0),
    "deep nesting in jsonl": ("d.jsonl", '{"a": 1}\n' + "[" * 200_000 + "]" * 200_000 + '\n{"a": 2}\n', [1, 2], {"JSON nested too deeply": 1}, 0),
    "deep nesting in array": ("d.json", "[" + "[" * 200_000 + "]" * 200_000 + ', {"a": 2}]', [2], {"JSON nested too deeply": 1}, 0),
}


@pytest.mark.timeout(60)  # a stray closing bracket once sent the reader into an endless loop
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_records_are_read_by_content_and_counted(case, tmp_path):
    name, content, values, problems, tail = CASES[case]
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8"))
    report = ReadReport(str(path))
    records = list(read_records(path, report))
    assert [r["a"] for r in records] == values
    assert report.records == len(values) and dict(report.problems) == problems and report.truncated_tail_chars == tail
