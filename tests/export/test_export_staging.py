"""Staging directories of exports killed mid-write are removed by the next export to the same --out, but only
when their owner is a process of this host that no longer runs."""

import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from taps_train.files import exclusive
from tests.conftest import wait_for
from tests.export.test_export_safety import _export, checkpoint  # noqa: F401 (fixture)


def staging(parent, out_name: str, host: str, pid: int):
    """What an export with this host and pid leaves when killed before its rename."""
    path = parent / f".{out_name}.{host}.{pid}.k3x_9q2a.partial"
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"half-written")
    return path


@pytest.fixture
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child.pid
    child.kill()
    child.wait()


def test_a_dead_exports_staging_is_removed_and_counted(checkpoint, tmp_path, dead_pid, capsys):
    stale = staging(tmp_path, "export", socket.gethostname(), dead_pid)
    _export(checkpoint, tmp_path / "export")
    assert not stale.exists() and (tmp_path / "export" / "model.safetensors").is_file()
    assert f"removed 1 staging directory of interrupted exports to {tmp_path / 'export'}" in capsys.readouterr().out
    assert not list(tmp_path.glob(".export.*"))  # the export's own staging is gone too


def test_live_foreign_and_other_staging_is_kept(checkpoint, tmp_path, dead_pid, live_pid, capsys):
    kept = [staging(tmp_path, "export", socket.gethostname(), live_pid),  # an export in progress
            staging(tmp_path, "export", "other-host.example.org", dead_pid),  # a pid this host cannot judge
            staging(tmp_path, "export.v2", socket.gethostname(), dead_pid),  # another --out's
            tmp_path / ".export.abc123.partial"]  # an older version's name, without an owner
    kept[-1].mkdir()
    _export(checkpoint, tmp_path / "export")
    assert all(path.is_dir() for path in kept) and "removed" not in capsys.readouterr().out
    _export(checkpoint, tmp_path / "export.v2")
    assert not kept[2].exists() and all(path.is_dir() for path in kept[:2] + kept[3:])


def test_staging_names_its_host_and_process(checkpoint, tmp_path, monkeypatch):
    seen = []
    real_rename = os.rename

    def spy(src, dst):
        seen.append(os.path.basename(src))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", spy)
    _export(checkpoint, tmp_path / "export")
    assert seen and seen[0].startswith(f".export.{socket.gethostname()}.{os.getpid()}.") and seen[0].endswith(".partial")


def test_an_export_waits_for_another_to_the_same_out_and_then_replaces_its_finished_one(checkpoint, tmp_path, capsys):
    """The race CI met: a second export found --out absent, and the first one's finished directory then stood where
    its rename went. Now the second waits for the first, and with --overwrite replaces what it finished."""
    out, finished = tmp_path / "export", tmp_path / "finished"
    _export(checkpoint, finished)
    capsys.readouterr()
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_export(checkpoint, out, "--overwrite")))
    with exclusive(out.with_name("export.lock"), "the test"):
        worker.start()
        wait_for(lambda: f"waiting for another export to {out}" in capsys.readouterr().err, "the export to wait", timeout_s=60)
        assert worker.is_alive() and not out.exists()
        shutil.copytree(finished, out)  # the other export finishes while this one waits
    worker.join(timeout=120)
    assert outcome == [None] and (out / "model.safetensors").read_bytes() == (finished / "model.safetensors").read_bytes()
    assert not list(tmp_path.glob(".export.*")) and not out.with_name("export.lock").exists()
