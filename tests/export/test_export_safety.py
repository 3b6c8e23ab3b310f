"""`export` never deletes what it did not write, never follows a symlinked --out, fails in one line on an
unwritable parent, and puts back an old export left aside by an export killed mid-replacement."""

import pytest

from taps_train.cli import main
from tests.export.test_export import make_drafter, save_checkpoint


@pytest.fixture
def checkpoint(random_verifier_dir, tmp_path):
    from taps_train.verifier.fingerprint import verifier_fingerprint
    from taps_train.verifier.loading import load_verifier

    loaded = load_verifier(str(random_verifier_dir), "cpu", "float32")
    return save_checkpoint(make_drafter(loaded.model, 3, fc_bias=False), verifier_fingerprint(loaded.path, loaded.tokenizer), tmp_path / "d.ckpt")


def _export(checkpoint, out, *extra):
    main(["export", checkpoint, "--out", str(out), "--dtype", "float32", *extra])


def _one_line_error(capsys, call) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("taps-train: error:")
    return err[0]


def test_overwrite_refuses_to_delete_user_files(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    _export(checkpoint, out)
    (out / "notes.txt").write_text("mine")
    assert "notes.txt" in _one_line_error(capsys, lambda: _export(checkpoint, out, "--overwrite"))
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    (out / "notes.txt").unlink()
    _export(checkpoint, out, "--overwrite")  # a plain export is still replaceable


def test_symlinked_out_is_refused(checkpoint, tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert "symbolic link" in _one_line_error(capsys, lambda: _export(checkpoint, tmp_path / "link"))


def test_unwritable_parent_is_one_line(checkpoint, tmp_path, capsys):
    (tmp_path / "file").write_text("x")  # a parent that cannot hold directories (read-only parents fail the same way, as non-root)
    assert "cannot write next to" in _one_line_error(capsys, lambda: _export(checkpoint, tmp_path / "file" / "out"))


def test_export_killed_between_renames_is_recovered(checkpoint, tmp_path, capsys):
    out = tmp_path / "export"
    _export(checkpoint, out)
    out.rename(tmp_path / ".export.abc123.partial.old")  # what a kill after the first rename leaves
    assert not out.exists()
    _export(checkpoint, out, "--overwrite")
    assert "restored the previous export" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".export.*.old"))
