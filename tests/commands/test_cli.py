import subprocess
import sys

import pytest

from taps_train.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taps_train", *args], capture_output=True, text=True, timeout=120)


def test_top_level_help_lists_the_commands(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    for command in ("fit", "validate", "test", "verifier"):
        assert f"  {command} " in out


@pytest.mark.parametrize("command", ["fit", "validate", "test"])
def test_lightning_subcommands_are_lightning_cli(command, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["taps-train", command, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--trainer.max_epochs" in out and "--model" in out and "--data" in out


def test_verifier_help_describes_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["verifier", "--help"])
    out = capsys.readouterr().out
    assert "build" in out and "generate" in out and "info" in out


def test_unknown_command_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["frobnicate"])
    assert exit_info.value.code == 2


def test_bad_verifier_path_is_one_line_without_traceback(tmp_path):
    result = run_cli("verifier", "info", "--verifier", str(tmp_path / "missing"))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"taps-train: error: verifier path {tmp_path}/missing does not exist")


def test_verifier_generate_on_a_local_model(random_verifier_dir):
    result = run_cli("verifier", "generate", "--verifier", str(random_verifier_dir), "2+2?", "--max_new_tokens", "5")
    assert result.returncode == 0, result.stderr
