"""Model directories that ship Python (`auto_map`) are refused in one line by every command that reads a
verifier, before transformers could import the code or ask on the terminal whether to."""

import json
import shutil
import sys

import pytest

from taps_train.cli import main
from taps_train.errors import TapsError
from taps_train.verifier.loading import load_verifier, read_verifier_files, resolve_verifier_path

AUTO_MAP = {"AutoConfig": "evil.Config", "AutoModelForCausalLM": "evil.Model", "AutoTokenizer": ["evil.Tok", None]}


@pytest.fixture(params=["config.json", "tokenizer_config.json"])
def custom_code_dir(request, tmp_path, random_verifier_dir):
    path = tmp_path / "verifier"
    shutil.copytree(random_verifier_dir, path)
    content = json.loads((path / request.param).read_text())
    content["auto_map"] = AUTO_MAP
    (path / request.param).write_text(json.dumps(content))
    # Code that would leave a trace if it ever ran.
    (path / "evil.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    return path


@pytest.mark.parametrize("load", [resolve_verifier_path, read_verifier_files, lambda p: load_verifier(p, "cpu", "float32")],
                         ids=["resolve", "files", "load"])
def test_loaders_refuse_a_directory_with_its_own_code(custom_code_dir, load):
    with pytest.raises(TapsError, match="ships its own Python code .*auto_map.*does not run code"):
        load(str(custom_code_dir))
    assert not (custom_code_dir.parent / "ran").exists()


@pytest.mark.parametrize("command", [
    ["cache", "--recipe", "data_recipes/tiny_math.yaml", "--dry-run", "--verifier"],
    ["verifier", "info", "--verifier"],
    ["eval", "--drafters", "missing.ckpt", "--verifier"],
])
def test_commands_refuse_it_in_one_line_without_prompting(custom_code_dir, command, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", None)  # a prompt would fail here instead of waiting
    with pytest.raises(SystemExit) as exit_info:
        main([*command, str(custom_code_dir)])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("taps-train: error:") and "auto_map" in err[0]
    assert not (custom_code_dir.parent / "ran").exists()


def test_broken_config_json_is_one_line(tmp_path, random_verifier_dir):
    path = tmp_path / "verifier"
    shutil.copytree(random_verifier_dir, path)
    (path / "config.json").write_text("[" * 100_000)
    with pytest.raises(TapsError, match="config.json is not valid JSON"):
        resolve_verifier_path(str(path))
