"""Reading DeepSpeed checkpoint directories safely: hostile or broken directories are refused in one
line, and nothing but tensors, builtins and an allow-list of DeepSpeed classes is ever unpickled.
(Real ZeRO-2/3 directories written by `fit` are tested in tests/training/test_deepspeed.py.)"""

import argparse
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from taps_train.cli import main  # noqa: E402
from taps_train.drafter.checkpoint import read_checkpoint  # noqa: E402
from taps_train.errors import TapsError  # noqa: E402


def _directory(tmp_path: Path, client: object = None, tag: str = "checkpoint") -> Path:
    directory = tmp_path / "last.ckpt"
    (directory / tag).mkdir(parents=True)
    (directory / "latest").write_text(tag)
    if client is not None:
        torch.save(client, directory / tag / "mp_rank_00_model_states.pt")
    return directory


def test_a_directory_without_latest_is_not_a_deepspeed_checkpoint(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(TapsError, match="not a DeepSpeed checkpoint \\(no 'latest' file\\)"):
        read_checkpoint(tmp_path / "run")


@pytest.mark.parametrize("tag", ["../../etc", "..", "a/b", "", "x" * 10 + "\n\x00"])
def test_latest_naming_a_path_outside_the_directory_is_refused(tmp_path, tag):
    directory = tmp_path / "last.ckpt"
    directory.mkdir()
    (directory / "latest").write_text(tag)
    with pytest.raises(TapsError, match="invalid tag"):
        read_checkpoint(directory)


def test_latest_naming_a_missing_tag_is_refused(tmp_path):
    directory = tmp_path / "last.ckpt"
    directory.mkdir()
    (directory / "latest").write_text("global_step7")
    with pytest.raises(TapsError, match="names tag 'global_step7' but .* does not exist"):
        read_checkpoint(directory)


def test_missing_or_garbage_model_states_are_refused(tmp_path):
    directory = _directory(tmp_path)
    with pytest.raises(TapsError, match="no model states file"):
        read_checkpoint(directory)
    (directory / "checkpoint" / "mp_rank_00_model_states.pt").write_bytes(b"\x80garbage")
    with pytest.raises(TapsError, match="cannot read DeepSpeed checkpoint"):
        read_checkpoint(directory)


def test_arbitrary_pickled_objects_are_never_unpickled(tmp_path):
    directory = _directory(tmp_path, {"taps": {}, "module": {}, "payload": argparse.Namespace(x=1)})
    with pytest.raises(TapsError, match="cannot read DeepSpeed checkpoint .*mp_rank_00_model_states.pt"):
        read_checkpoint(directory)


def test_a_foreign_deepspeed_checkpoint_without_taps_section_is_refused(tmp_path):
    directory = _directory(tmp_path, {"module": {"fc.weight": torch.zeros(2, 2)}})
    with pytest.raises(TapsError, match="not a taps-train drafter checkpoint"):
        read_checkpoint(directory)


def test_missing_zero_partitions_are_refused_in_one_line(tmp_path):
    directory = _directory(tmp_path, {"taps": {}, "module": {}, "buffer_names": [], "param_shapes": [], "ds_version": "0.19.8"})
    with pytest.raises(TapsError, match="cannot merge the ZeRO partitions"):
        read_checkpoint(directory)


def test_consolidate_refuses_files_and_directory_outputs(tmp_path, capsys):
    (tmp_path / "file.ckpt").write_bytes(b"x")
    with pytest.raises(SystemExit):
        main(["consolidate", str(tmp_path / "file.ckpt")])
    assert "not a DeepSpeed checkpoint directory" in capsys.readouterr().err
    directory = _directory(tmp_path, {"taps": {}})
    (tmp_path / "out").mkdir()
    with pytest.raises(SystemExit):
        main(["consolidate", str(directory), "--output", str(tmp_path / "out")])
    assert "is a directory" in capsys.readouterr().err
