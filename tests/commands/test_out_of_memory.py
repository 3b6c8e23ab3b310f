"""Running out of memory is one line (issue 36): what was asked, where the error says it, and the process's limit."""

import mmap
import subprocess
import sys

import pytest

from taps_train.cli import out_of_memory
from taps_train.memory import address_space_used


@pytest.mark.parametrize("error, asked", [
    (MemoryError(), None),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1327104 bytes. "
                  "Error code 12 (Cannot allocate memory)"), "1.33 MB"),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)"), "2.00 GiB"),
    (OSError(12, "Cannot allocate memory"), None),
])
def test_allocation_failures_read_as_one_line(error, asked):
    line = out_of_memory(error, "fit")
    assert line.startswith("out of memory in `taps-train fit`") and "\n" not in line
    assert (f"it asked for {asked} more" in line) if asked else "asked" not in line


def test_a_failure_wrapped_by_a_reader_or_a_parser_is_found_and_others_are_not():
    try:
        try:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes")
        except RuntimeError as inner:
            raise ValueError("could not instantiate the model") from inner
    except ValueError as outer:
        assert "4.1 kB" in out_of_memory(outer, "fit")
    assert out_of_memory(ValueError("plain"), "fit") is None and out_of_memory(None, "fit") is None


def test_a_limit_too_small_for_pytorch_is_refused_before_anything_starts():
    done = subprocess.run(["bash", "-c", f"ulimit -v 800000; {sys.executable} -m taps_train configs ls"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "may use 819 MB of memory (ulimit -v)" in done.stderr and "to load PyTorch" in done.stderr


def test_the_address_space_in_use_grows_with_what_is_mapped():
    before = address_space_used()
    block = mmap.mmap(-1, 64 << 20)  # 64 MB mapped, not touched
    assert address_space_used() - before >= 32 << 20  # margin for other threads unmapping meanwhile
    block.close()
