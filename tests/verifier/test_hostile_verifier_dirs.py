"""Damaged verifier directories are one `TapsError` line naming the file and the fix, whichever command
reads them: `cache` shares `eval`'s guarded loader, and safetensors headers are checked before
transformers opens the weights."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.errors import TapsError
from taps_train.verifier.loading import load_verifier, read_config


def edit_config(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        change(config)
        (directory / "config.json").write_text(json.dumps(config))
    return mutate


def delete_tokenizer(directory: Path) -> None:
    for file in directory.iterdir():
        if "token" in file.name or file.name == "chat_template.jinja":
            file.unlink()


# mutation, text the one-line error must contain (besides the directory)
CONFIG_AND_TOKENIZER = {
    "config is a list": (lambda d: (d / "config.json").write_text("[]"), "not an object"),
    "config without model_type": (edit_config(lambda c: c.pop("model_type")), "model_type"),
    "config without hidden_size": (edit_config(lambda c: c.pop("hidden_size")), "config.json has no 'hidden_size'"),
    "config without vocab_size": (edit_config(lambda c: c.pop("vocab_size")), "config.json has no 'vocab_size'"),
    "config without num_attention_heads": (edit_config(lambda c: c.pop("num_attention_heads")), "config.json has no 'num_attention_heads'"),
    "tokenizer files deleted": (delete_tokenizer, "cannot load the tokenizer"),
    "tokenizer.json garbage": (lambda d: (d / "tokenizer.json").write_text("{not json"), "cannot load the tokenizer"),
}


def damaged_copy(source: Path, tmp_path: Path, mutate: Callable[[Path], None]) -> Path:
    directory = tmp_path / "verifier"
    shutil.copytree(source, directory)
    mutate(directory)
    return directory


@pytest.mark.parametrize("case", CONFIG_AND_TOKENIZER, ids=list(CONFIG_AND_TOKENIZER))
def test_cache_refuses_a_damaged_verifier_in_one_line(case, random_verifier_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    mutate, expected = CONFIG_AND_TOKENIZER[case]
    verifier = damaged_copy(random_verifier_dir, tmp_path, mutate)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: r\nmax_length: 96\nsources:\n  - {source: gsm_symbolic, args: {size: 5, seed: 0}, count: 3}\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", "--dry-run", "--recipe", str(recipe), "--verifier", str(verifier), "--cache-dir", str(tmp_path / "cache")])
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(verifier) in lines[0] and expected in lines[0], lines


def test_sizes_stored_under_another_name_are_accepted(tmp_path):
    """GPT-2 stores hidden_size as n_embd (its attribute_map); that is not a missing field."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 1, "vocab_size": 50}))
    assert read_config(str(tmp_path)).hidden_size == 32


WEIGHTS = {
    "truncated": lambda data: data[: len(data) // 2],
    "garbage": lambda data: b"\xff" * 64,
    "empty": lambda data: b"",
}


@pytest.mark.parametrize("case", WEIGHTS, ids=list(WEIGHTS))
def test_damaged_safetensors_are_named_before_transformers_loads_them(case, random_verifier_dir, tmp_path):
    weights = random_verifier_dir / "model.safetensors"
    verifier = damaged_copy(random_verifier_dir, tmp_path, lambda d: (d / weights.name).write_bytes(WEIGHTS[case](weights.read_bytes())))
    with pytest.raises(TapsError) as err:
        load_verifier(str(verifier), "cpu", "float32")
    message = str(err.value)
    assert len(message.splitlines()) == 1 and str(verifier / "model.safetensors") in message and "not a valid safetensors file" in message
