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


def _valid_checkpoint() -> dict:
    """A complete checkpoint of a small random EAGLE drafter (the drafter's tensors only, as `fit` writes them)."""
    from transformers import LlamaConfig

    from taps_train.drafter import Drafter

    config = Drafter.config_for(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1))
    drafter = Drafter(config)
    state = {f"drafter.{k}": v for k, v in drafter.state_dict().items() if k not in Drafter.frozen_parameter_names()}
    return {"taps": {**GOOD_TAPS, "drafter_config": config.to_dict()}, "state_dict": state}


def _damaged(change):
    def write(path):
        checkpoint = _valid_checkpoint()
        change(checkpoint)
        torch.save(checkpoint, path)
    return write


def _set(key: str, value):
    return lambda c: c["state_dict"].__setitem__(key, value(c["state_dict"][key]))


WEIGHT_CASES = {
    "config field of the wrong type": (_damaged(lambda c: c["taps"]["drafter_config"].update(hidden_size="big")), "not a valid drafter config"),
    "unknown backbone": (_damaged(lambda c: c["taps"]["drafter_config"].update(architectures=["GPT2LMHeadModel"])), "not a registered backbone"),
    "no architecture": (_damaged(lambda c: c["taps"]["drafter_config"].pop("architectures")), "not a registered backbone"),
    "wrong shape": (_damaged(_set("drafter.layers.0.self_attn.q_proj.weight", lambda t: torch.zeros(3, 5))), "q_proj.weight has shape [3, 5]"),
    "integer weights": (_damaged(_set("drafter.fc.weight", lambda t: t.long())), "fc.weight is torch.int64, not floating point"),
    "nan weights": (_damaged(_set("drafter.fc.weight", lambda t: t * float("nan"))), "fc.weight has non-finite values"),
    "inf weights": (_damaged(_set("drafter.fc.weight", lambda t: t + float("inf"))), "fc.weight has non-finite values"),
    "missing tensor": (_damaged(lambda c: c["state_dict"].pop("drafter.fc.weight")), "lacks fc.weight"),
    "extra tensor": (_damaged(lambda c: c["state_dict"].__setitem__("drafter.layers.1.mlp.up_proj.weight", torch.zeros(2))), "layers.1.mlp.up_proj.weight"),
}


def test_the_valid_checkpoint_of_these_cases_reads(tmp_path):
    torch.save(_valid_checkpoint(), tmp_path / "good.ckpt")
    assert read_checkpoint(tmp_path / "good.ckpt")["state_dict"]


@pytest.mark.parametrize("case", WEIGHT_CASES, ids=list(WEIGHT_CASES))
def test_every_reader_refuses_a_checkpoint_whose_weights_do_not_fit_its_config(case, tmp_path):
    """eval, export, average and init_from all read through read_checkpoint, so one check covers them."""
    write, message = WEIGHT_CASES[case]
    path = tmp_path / "bad.ckpt"
    write(path)
    with pytest.raises(TapsError) as info:
        read_checkpoint(path)
    assert message in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)
