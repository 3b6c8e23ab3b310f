"""Damaged, foreign and malicious drafter checkpoint files: one line naming the file, nothing unpickled."""

import argparse

import pytest
import torch

from taps_train.cli import main
from taps_train.drafter.checkpoint import read_checkpoint
from taps_train.errors import TapsError

GOOD_TAPS = {"drafter_config": {}, "verifier": {"path": "v", "weights": "w", "tokenizer": "t"}}


def _saved(obj):
    def write(path):
        torch.save(obj, path)
    return write


CASES = {
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "garbage": (lambda p: p.write_bytes(b"\x80\x02garbage" * 10), "cannot read drafter checkpoint"),
    "text": (lambda p: p.write_text("model: best\n"), "cannot read drafter checkpoint"),
    "pickled object": (_saved({"taps": GOOD_TAPS, "state_dict": {}, "x": argparse.Namespace(a=1)}), "refusing to load it"),
    "not a dict": (_saved([1, 2, 3]), "no 'taps' section"),
    "taps empty": (_saved({"taps": {}, "state_dict": {}}), "taps.drafter_config"),
    "taps a string": (_saved({"taps": "hass", "state_dict": {}}), "no 'taps' section"),
    "no verifier": (_saved({"taps": {"drafter_config": {}}, "state_dict": {}}), "taps.verifier"),
    "verifier without weights": (_saved({"taps": {**GOOD_TAPS, "verifier": {"path": "v"}}, "state_dict": {}}), "taps.verifier"),
    "no state_dict": (_saved({"taps": GOOD_TAPS}), "'state_dict'"),
    "state_dict not tensors": (_saved({"taps": GOOD_TAPS, "state_dict": {"drafter.fc.weight": [1.0]}}), "'state_dict'"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_checkpoint_files_are_one_line(case, tmp_path):
    write, message = CASES[case]
    path = tmp_path / "bad.ckpt"
    write(path)
    with pytest.raises(TapsError, match=message) as info:
        read_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert "weights_only=False" not in str(info.value)


def test_missing_checkpoint_is_one_line(tmp_path):
    with pytest.raises(TapsError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.ckpt")


@pytest.mark.parametrize("command", [["export", "{ckpt}", "--out", "{out}"], ["average", "--drafters", "{ckpt}", "{ckpt}", "--output", "{out}/a.ckpt"]],
                         ids=["export", "average"])
def test_commands_print_one_line(command, tmp_path, capsys):
    path = tmp_path / "bad.ckpt"
    CASES["pickled object"][0](path)
    with pytest.raises(SystemExit) as info:
        main([part.format(ckpt=path, out=tmp_path / "out") for part in command])
    assert info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("taps-train: error:") and str(path) in err[0]
