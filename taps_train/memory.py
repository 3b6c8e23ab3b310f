"""A process's memory limit (`ulimit -v`), checked before work that would exceed it. Past the limit some native code
does not fail with an error but aborts or segfaults (OpenBLAS loading PyTorch below ~0.7 GB; GGUF dequantisation),
so what is known to need more is refused up front, in one line saying what needs how much."""

import resource
from pathlib import Path

from taps_train.errors import TapsError
from taps_train.units import size

MIN_ADDRESS_SPACE = 1 << 30  # below ~0.7 GB, importing PyTorch itself fails (OpenBLAS aborts, libraries fail to map)


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes; None when unlimited."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def address_space_used() -> int:
    """This process's address space now (Linux VmSize; 0 where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_loadable() -> None:
    """Refuse a limit too small to load PyTorch at all, where the failure would be an abort, not an error."""
    limit = address_space_limit()
    if limit is not None and limit < MIN_ADDRESS_SPACE:
        raise TapsError(f"this process may use {size(limit)} of memory (ulimit -v) and taps-train needs at least {size(MIN_ADDRESS_SPACE)} "
                        "to load PyTorch; raise the limit")


def check_address_space(need: int, what: str) -> None:
    """Refuse `what` when `need` more bytes of address space do not fit under the limit."""
    limit, used = address_space_limit(), address_space_used()
    if limit is not None and used + need > limit:
        raise TapsError(f"{what} needs about {size(need)} more memory and this process may use {size(limit)} (ulimit -v), {size(used)} of "
                        "it already in use; raise the limit or run it on a machine with more memory")
