"""Every reader of eval reports (`taps-train report`, `export --eval-report`, W&B eval logging) refuses a hostile
report in one line naming the file and the field, and a valid report survives reading and writing unchanged."""

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.errors import TapsError
from taps_train.eval.report import MAX_REPORT_BYTES, read_report
from taps_train.tracking import log_eval_reports
from tests.eval.test_report import CHAT, MATH, report, write_reports


def valid() -> dict:
    data = report([MATH, CHAT], "route-confidence", 0.0, 4.5, 3.5, routing=True)
    items = list(data["benchmarks"]["gsm8k"].items())
    data["benchmarks"]["gsm8k"] = dict([*items[:4], ("prompts_skipped_too_long", 0), *items[4:]])  # where the writer puts it
    return data


def edited(edit: Callable[[dict], None]) -> bytes:
    data = valid()
    edit(data)
    return json.dumps(data).encode()


def without(*keys: str) -> bytes:
    """The valid report without the field at this key path."""
    def edit(data: dict) -> None:
        for key in keys[:-1]:
            data = data[key]
        del data[keys[-1]]
    return edited(edit)


def setting(value, *keys: str | int) -> bytes:
    """The valid report with the field at this key path set to `value`."""
    def edit(data: dict) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = copy.deepcopy(value)
    return edited(edit)


GSM = ("benchmarks", "gsm8k")
TOP_LEVEL = ["verifier", "drafters", "strategy", "temperature", "tree", "benchmarks", "average_acceptance_length"]
PER_BENCHMARK = ["acceptance_length", "verify_calls", "new_tokens", "prompts", "mean_tree_tokens", "accept_rate_by_depth", "wall_time_s"]

# (file contents, what the error line must say)
HOSTILE = {
    **{f"missing {key}": (without(key), f"field `{key}` is missing") for key in TOP_LEVEL},
    **{f"missing benchmark {key}": (without(*GSM, key), f"field `benchmarks.gsm8k.{key}` is missing") for key in PER_BENCHMARK},
    "missing tree depth": (without("tree", "depth"), "field `tree.depth` is missing"),
    "benchmarks a list": (setting([1.0], "benchmarks"), "field `benchmarks` must be a JSON object"),
    "no benchmarks": (setting({}, "benchmarks"), "field `benchmarks` must hold at least one benchmark"),
    "benchmark a number": (setting(3.2, *GSM), "field `benchmarks.gsm8k` must be a JSON object"),
    "tau a string": (setting("3.2", *GSM, "acceptance_length"), 'field `benchmarks.gsm8k.acceptance_length` must be a finite number >= 0, got "3.2"'),
    "tau NaN": (setting(float("nan"), *GSM, "acceptance_length"), "field `benchmarks.gsm8k.acceptance_length` must be a finite number"),
    "tau infinite": (setting(float("inf"), *GSM, "acceptance_length"), "field `benchmarks.gsm8k.acceptance_length` must be a finite number"),
    "tau negative": (setting(-1.0, "average_acceptance_length"), "field `average_acceptance_length` must be a finite number >= 0"),
    "temperature hot": (setting("hot", "temperature"), 'field `temperature` must be a finite number >= 0, got "hot"'),
    "temperature negative": (setting(-0.5, "temperature"), "field `temperature` must be a finite number >= 0"),
    "verify calls negative": (setting(-1, *GSM, "verify_calls"), "field `benchmarks.gsm8k.verify_calls` must be an integer >= 0"),
    "new tokens fractional": (setting(2.5, *GSM, "new_tokens"), "field `benchmarks.gsm8k.new_tokens` must be an integer"),
    "prompts a boolean": (setting(True, *GSM, "prompts"), "field `benchmarks.gsm8k.prompts` must be an integer >= 1"),
    "prompts zero": (setting(0, *GSM, "prompts"), "field `benchmarks.gsm8k.prompts` must be an integer >= 1"),
    "skipped prompts negative": (setting(-2, *GSM, "prompts_skipped_too_long"), "field `benchmarks.gsm8k.prompts_skipped_too_long`"),
    "depth rates a string": (setting("0.5", *GSM, "accept_rate_by_depth"), "field `benchmarks.gsm8k.accept_rate_by_depth` must be a JSON list"),
    "depth rate above one": (setting([0.5, 1.5], *GSM, "accept_rate_by_depth"), "field `benchmarks.gsm8k.accept_rate_by_depth[1]` must be a finite number in [0, 1]"),
    "depth rate null": (setting([None], *GSM, "accept_rate_by_depth"), "field `benchmarks.gsm8k.accept_rate_by_depth[0]`"),
    "routing a list": (setting([1, 2], *GSM, "routing"), "field `benchmarks.gsm8k.routing` must be a JSON object"),
    "routing count negative": (setting({MATH: -3}, *GSM, "routing"), f"field `benchmarks.gsm8k.routing.{MATH}` must be an integer >= 0"),
    "entropy a string": (setting({"accepted": "low", "rejected": None}, *GSM, "draft_entropy"), "field `benchmarks.gsm8k.draft_entropy.accepted`"),
    "wall time a list": (setting([1.5], *GSM, "wall_time_s"), "field `benchmarks.gsm8k.wall_time_s` must be a finite number"),
    "no drafters": (setting([], "drafters"), "field `drafters` must name at least one drafter"),
    "drafter a number": (setting([MATH, 7], "drafters"), "field `drafters[1]` must be a non-empty string, got 7"),
    "drafters a string": (setting(MATH, "drafters"), "field `drafters` must be a JSON list"),
    "empty verifier": (setting("", "verifier"), 'field `verifier` must be a non-empty string, got ""'),
    "strategy a number": (setting(1, "strategy"), "field `strategy` must be a non-empty string"),
    "tree a list": (setting([60, 5, 10], "tree"), "field `tree` must be a JSON object"),
    "tree top-k zero": (setting(0, "tree", "top_k"), "field `tree.top_k` must be an integer >= 1"),
    "weights of another count": (edited(lambda d: d.update(strategy="average", weights=[1.0])), "field `weights` must hold one weight per drafter (2), got 1"),
    "weight NaN": (edited(lambda d: d.update(strategy="average", weights=[float("nan"), 0.5])), "field `weights[0]` must be a finite number"),
    "not an object": (b"[1, 2, 3]", "the file must be a JSON object, got a JSON list"),
    "a bare number": (b"4.2", "the file must be a JSON object, got 4.2"),
    "deep nesting": (b"[" * 100_000 + b"]" * 100_000, "the file is JSON nested too deeply"),
    "binary garbage": (bytes(range(128, 256)) * 8, "the file is not UTF-8 text"),
    "empty file": (b"", "the file is not valid JSON"),
    "truncated": (json.dumps(valid()).encode()[:200], "the file is not valid JSON"),
    "huge": (b" " * (MAX_REPORT_BYTES + 1), "the file is larger than 16 MiB"),
}


def run_report(path: Path, tmp_path: Path) -> None:
    main(["report", str(path), "--out", str(tmp_path / "out")])


def run_export(path: Path, tmp_path: Path) -> None:
    """The reports are read before any checkpoint: this one need not exist."""
    main(["export", str(tmp_path / "d.ckpt"), "--out", str(tmp_path / "export"), "--eval-report", str(path)])


def one_line_error(capsys, call: Callable[[], None]) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taps-train: error:"), lines
    return lines[0]


@pytest.mark.parametrize("command", [run_report, run_export], ids=["report", "export"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_report_is_one_line_naming_file_and_field(case, command, tmp_path, capsys):
    contents, message = HOSTILE[case]
    path = tmp_path / "bad report.json"
    path.write_bytes(contents)
    line = one_line_error(capsys, lambda: command(path, tmp_path))
    assert str(path) in line and message in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "export").exists()


@pytest.mark.parametrize("case", ["missing benchmarks", "tau a string", "deep nesting", "binary garbage"])
def test_wandb_logging_checks_reports_before_starting(case, tmp_path, monkeypatch):
    import wandb

    monkeypatch.setattr(wandb, "init", lambda **_: pytest.fail("W&B started for a bad report"))
    contents, message = HOSTILE[case]
    (tmp_path / "good.json").write_text(json.dumps(valid()))
    (tmp_path / "bad.json").write_bytes(contents)
    with pytest.raises(TapsError, match="bad.json") as info:
        log_eval_reports("taps-test", [tmp_path / "good.json", tmp_path / "bad.json"])
    assert message in str(info.value)


def test_folder_without_reports_and_missing_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert f"no eval reports (*.json) in {tmp_path / 'empty'}" in one_line_error(capsys, lambda: run_report(tmp_path / "empty", tmp_path))
    line = one_line_error(capsys, lambda: run_export(tmp_path / "empty", tmp_path))
    assert f"cannot read eval report {tmp_path / 'empty'}" in line
    line = one_line_error(capsys, lambda: run_report(tmp_path / "gone.json", tmp_path))
    assert f"cannot read eval report {tmp_path / 'gone.json'}: No such file" in line


def test_valid_reports_round_trip_exactly(tmp_path):
    written = tmp_path / "written.json"
    written.write_text(read_report(_write(tmp_path / "valid.json", valid())).to_json())
    assert written.read_text() == json.dumps(valid(), indent=2)  # the writer's own output, byte for byte
    assert read_report(written).to_json() == written.read_text()
    for path in sorted(write_reports(tmp_path / "reports").glob("*.json")):  # older reports: no prompts_skipped_too_long
        assert read_report(path).as_dict() == json.loads(path.read_text())


def test_unknown_fields_are_ignored_and_null_weights_mean_uniform(tmp_path):
    data = valid() | {"strategy": "average", "weights": None, "from_the_future": {"x": 1}}
    loaded = read_report(_write(tmp_path / "r.json", data))
    assert loaded.weights is None and "from_the_future" not in loaded.as_dict()
    assert loaded.benchmarks["gsm8k"].routing == {MATH: 40, CHAT: 10} and loaded.temperature == 0.0


def _write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=2))
    return path
