"""One writer at a time per cache directory or regeneration file, across processes and (on a shared
filesystem) across nodes: an exclusive advisory lock (flock) on a lock file beside what it guards.

The lock file names its holder (host:pid), so a waiting process can say whom it waits for. It is
removed on release, leaving caches as clean as before; a waiter that got the lock on a file removed
meanwhile takes it again on the new one, so two holders never hold different files of one path.
"""

import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _holder() -> str:
    """This process as a lock holder: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


@contextmanager
def exclusive(lock_file: Path, waiting_for: str) -> Iterator[None]:
    """Hold the lock `lock_file` while the block runs; `waiting_for` ("another build of <dir>") says, once, why a
    process waits."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    announced = False
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not announced:
                print(f"waiting for {waiting_for} ({_read_holder(fd)}) ...", file=sys.stderr, flush=True)
                announced = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        if _still_at(fd, lock_file):
            break
        os.close(fd)  # the previous holder removed this file on release: lock the current one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, _holder().encode())
        yield
    finally:
        lock_file.unlink(missing_ok=True)  # still held here, so nobody can take the removed file's lock and believe it current
        os.close(fd)


def _read_holder(fd: int) -> str:
    return os.pread(fd, 256, 0).decode(errors="replace").strip() or "holder unknown"


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False
