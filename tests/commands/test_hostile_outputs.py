"""A file standing where `eval --output` or `report --out` must create a directory is one line naming
it, found before any model or report is read."""

from pathlib import Path

import pytest

from taps_train.cli import main


def one_line_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("below", ["report.json", "sub/report.json"])
def test_eval_output_under_a_file_is_refused_before_loading_models(below, random_verifier_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("taps_train.commands.eval.load_verifier", lambda *a, **k: pytest.fail("verifier loaded"))
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    output = afile / below
    error = one_line_error(["eval", "--drafters", str(tmp_path / "d.ckpt"), "--verifier", str(random_verifier_dir),
                            "--output", str(output)], capsys)
    assert f"--output {output}: {afile} is a file" in error
    assert afile.read_text() == "keep me\n"


@pytest.mark.parametrize("out", ["f.txt", "f.txt/sub"])
def test_report_out_that_is_a_file_is_refused_before_reading_reports(out, tmp_path: Path, capsys):
    file = tmp_path / "f.txt"
    file.write_text("keep me\n")
    error = one_line_error(["report", str(tmp_path / "not-read.json"), "--out", str(tmp_path / out)], capsys)
    assert f"{file} is a file, not a directory" in error
    assert file.read_text() == "keep me\n"
