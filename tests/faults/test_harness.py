"""The fault harness itself, sized for CI (a couple of minutes): every fault on the fastest jobs, on the tiny verifier.
bench/faults.py runs the whole table (20 kills per job and every long job); its figures are in docs/results/faults.md."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults  # on the tiny verifier (built on first use, as the integration tests build it)

REPO = Path(__file__).resolve().parents[2]


def test_export_average_and_regeneration_survive_kills_a_full_disk_two_writers_and_memory_limits(tmp_path, tiny_verifier_dir):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([sys.executable, str(REPO / "bench" / "faults.py"), "--jobs", "export,average,regenerate", "--kills", "3", "--disk", "0.1,0.95",
                           "--verifier", str(tiny_verifier_dir), "--work", str(tmp_path)], capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert all(f"| {job} (" in done.stdout for job in ("export", "average", "regenerate"))
