"""A real full disk: a tmpfs of a chosen size (mounting one needs root; the tests skip where it is refused)."""

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Callable[[int], Path]]:
    """`small_disk(bytes)`: a new folder on a filesystem of that size, unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); the disk-full tests need root")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], check=False)

