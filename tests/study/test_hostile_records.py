"""Hostile study folders: damaged outputs, records replaced by directories, records of older versions."""

import json
import os
from pathlib import Path

import pytest

from taps_train.errors import TapsError
from taps_train.study.plan import Cell
from taps_train.study.plan import plan
from taps_train.study.run import _State, damaged_fits
from tests.study.test_study import study  # noqa: F401 (fixture)


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


def test_a_damaged_fit_is_reported_even_when_its_evaluations_are_done(study, tmp_path):  # noqa: F811
    cells = plan(study)
    fit = next(cell for cell in cells if cell.kind == "fit")
    state = _State(study.out_dir)
    fit.outputs[0].parent.mkdir(parents=True, exist_ok=True)
    fit.outputs[0].write_bytes(b"weights" * 100)
    state.record(fit, 1.0)
    assert damaged_fits(cells, [], state) == []
    fit.outputs[0].write_bytes(b"weights" * 10)  # truncated by hand
    assert damaged_fits(cells, [], state) == [fit]
    fit.outputs[0].unlink()  # not kept: a study resumed from its records alone
    assert damaged_fits(cells, [], state) == []


def test_the_study_plan_warns_of_a_damaged_fit(study, capsys):  # noqa: F811
    from taps_train.study.run import run_study

    cells = plan(study)
    fit = next(cell for cell in cells if cell.kind == "fit")
    fit.outputs[0].parent.mkdir(parents=True, exist_ok=True)
    fit.outputs[0].write_bytes(b"weights" * 100)
    _State(study.out_dir).record(fit, 1.0)
    for cell in cells:
        if cell.kind == "eval":
            for output in cell.outputs:
                output.parent.mkdir(parents=True, exist_ok=True)
                output.write_text("{}")
            _State(study.out_dir).record(cell, 1.0)
    fit.outputs[0].write_bytes(b"damaged")
    run_study(study, dry_run=True)
    err = capsys.readouterr().err
    assert "".join(f"warning: {fit.outputs[0]} is no longer what fit".split()) in "".join(err.split())  # the console wraps lines
