"""Hostile study folders: damaged outputs, records replaced by directories, records of older versions."""

import json
import os
from pathlib import Path

import pytest

from taps_train.errors import TapsError
from taps_train.study.plan import Cell
from taps_train.study.run import _State


def _cell(tmp_path: Path) -> Cell:
    output = tmp_path / "fits" / "last.ckpt"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(b"weights" * 100)
    return Cell(key="fit_x_a", kind="fit", backbone="x", label="a", args=[], outputs=[output], fingerprint="f", log=tmp_path / "logs" / "x.log")


def test_a_damaged_output_is_not_a_finished_cell(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.record(cell, 1.0)
    assert state.finished(cell)
    cell.outputs[0].write_bytes(b"")  # truncated to 0 bytes
    assert not state.finished(cell)
    cell.outputs[0].write_bytes(b"weightz" * 100)  # same size, other bytes
    assert not state.finished(cell)
    cell.outputs[0].write_bytes(b"weights" * 100)
    os.utime(cell.outputs[0], ns=(1, 1))  # restored content, other time: the hash decides
    assert state.finished(cell)


def test_a_cell_record_replaced_by_a_directory_is_one_line(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.path(cell).mkdir(parents=True)
    with pytest.raises(TapsError, match="is a directory, where taps-train keeps a cell's record"):
        state.finished(cell)


def test_records_of_older_versions_still_count_when_outputs_are_not_empty(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.directory.mkdir(parents=True)
    state.path(cell).write_text(json.dumps({"fingerprint": "f", "outputs": [str(cell.outputs[0])]}))
    assert state.finished(cell)
    cell.outputs[0].write_bytes(b"")
    assert not state.finished(cell)

