"""Hostile input to every command: a bad $TAPS_HOME, outputs where results cannot go, YAML alias bombs, duplicate keys
and dates, report cells that try to be markdown. Each class of failure a hostile user found (issue 24) is fixed at its
root; one case or two per class here, bench/hostile.py throws many more."""


import pytest

from taps_train.errors import TapsError
from taps_train.eval.plots import markdown_cell
from taps_train.paths import output_file, writable_directory
from taps_train.user_yaml import MAX_ALIASES, read_yaml
from tests.conftest import BOMB, one_line_error


@pytest.mark.parametrize("home", ["file", "/proc/taps-home", "/dev/null/taps"])
def test_a_bad_taps_home_is_one_line_for_every_command(tmp_path, monkeypatch, capsys, home):
    if home == "file":
        home = tmp_path / "a-file"
        home.write_text("x")
    monkeypatch.setenv("TAPS_HOME", str(home))
    for argv in (["report", str(tmp_path), "--out", str(tmp_path / "r")], ["verifier", "info"], ["eval", "--drafters", "x.ckpt"]):
        assert "TAPS_HOME" in one_line_error(capsys, argv)


def test_output_checks_name_the_option(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TapsError, match=r"--cache-dir .*file is a file, not a directory"):
        writable_directory(tmp_path / "file" / "cache", "--cache-dir", "fix")
    with pytest.raises(TapsError, match=r"--output /proc/x/r.json: folder /proc/x is not a writable directory"):
        output_file("/proc/x/r.json", "--output")
    with pytest.raises(TapsError, match="is a directory"):
        output_file(tmp_path, "--output")


def test_where_results_go_is_checked_before_work(tmp_path, capsys, taps_home):
    (tmp_path / "file").write_text("x")
    assert "--out" in one_line_error(capsys, ["report", str(tmp_path), "--out", str(tmp_path / "file")])
    assert "--output" in one_line_error(capsys, ["average", "--drafters", "a.ckpt", "b.ckpt", "--output", "/proc/x/avg.ckpt"])
    assert "filesystem root" in one_line_error(capsys, ["consolidate", "/"])


def test_report_cells_are_inert_text():
    assert markdown_cell("a|b\n## c <img src=x> [link](http://x) `code`") == "a\\|b ## c \\<img src=x\\> \\[link\\](http://x) \\`code\\`"


def test_yaml_alias_bombs_duplicate_keys_and_dates(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(TapsError, match=f"more than {MAX_ALIASES} aliases"):
        read_yaml(tmp_path / "bomb.yaml", "study file", "fix")
    (tmp_path / "twice.yaml").write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(TapsError, match="duplicate key 'a'"):
        read_yaml(tmp_path / "twice.yaml", "study file", "fix")
    (tmp_path / "date.yaml").write_text("when: 2024-01-02\nat: 2024-01-02 10:00:00\n")
    assert read_yaml(tmp_path / "date.yaml", "x", "fix") == {"when": "2024-01-02", "at": "2024-01-02 10:00:00"}
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(TapsError, match="is not UTF-8 text"):
        read_yaml(tmp_path / "latin1.yaml", "recipe", "fix")

