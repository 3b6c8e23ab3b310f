"""Files that later runs trust: written whole or not at all, one writer at a time, leftovers of the dead removed.

Every file or directory taps-train publishes is written under a temporary name beside its final one and renamed
into place when complete, so a kill, a full disk or an error never leaves a half-written file under a name that a
later run reads. Temporaries name their writer (`.<name>.<host>.<pid>.tmp`, staging directories
`.<name>.<host>.<pid>.<random>.partial`, directories moved aside while replaced `... .old`): `writer_gone` tells a dead
writer's leftovers from a live one's, and only this host's can be told (a shared filesystem may hold another
machine's work in progress).
"""

import errno
import fcntl
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from taps_train.errors import TapsError, first_line
from taps_train.units import size


def _owner() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


# --- files -----------------------------------------------------------------------------------------------------------


def temporary_path(path: Path) -> Path:
    """Where this process writes `path` before renaming it into place."""
    return path.with_name(f".{path.name}.{_owner()}.tmp")


@contextmanager
def atomic_file(path: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write to; it replaces `path` when the block ends without error and is
    removed otherwise (after a kill, by the next `remove_dead_leftovers` of its directory). A write that fills the disk
    ends in `DiskFull`, whatever the writing library raised; `needed`, where the writer knows it, is the file's size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with full_disk_reported(tmp, path, needed):
            yield tmp
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    data = text.encode()
    with atomic_file(path, len(data)) as tmp:
        tmp.write_bytes(data)


def save_torch(path: Path, content: object) -> None:
    """`torch.save` through `atomic_file`, into an open file: the archive inside is then named `archive`, not after
    the temporary file, so equal content gives equal bytes whatever process wrote it."""
    import torch

    with atomic_file(path) as tmp, tmp.open("wb") as handle:
        torch.save(content, handle)


# --- a full disk -----------------------------------------------------------------------------------------------------

FULL = 64 * 1024  # free bytes below which a failed write is taken for a full disk, whatever the library said


class DiskFull(TapsError):
    """A write that ran out of space: one line naming the file, what it needs and what is free."""


@contextmanager
def full_disk_reported(partial: Path, target: Path, needed: int | None = None) -> Iterator[None]:
    """Whatever the block raises because the disk under `partial` (what is being written for `target`) filled, as
    `DiskFull`; anything else as it was."""
    try:
        yield
    except TapsError:
        raise  # refusals of their own, never mistaken for a full disk
    except Exception as err:
        full = _disk_full(err, partial, needed, target)
        if full is None:
            raise
        raise full from err


def _disk_full(err: BaseException, partial: Path, needed: int | None, target: Path) -> DiskFull | None:
    """`err` as a `DiskFull` when the disk under `partial` (a file or a staging directory) filled (errno 28 or 122, a
    library's message of it, or no room left at all: torch.save reports a full disk as a bare position mismatch); None
    for any other failure."""
    said = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(err) or "os error 28" in str(err)
    try:
        free = shutil.disk_usage(partial.parent).free
        written = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file()) if partial.is_dir() else partial.stat().st_size
    except OSError:
        written = 0
        try:
            free = shutil.disk_usage(partial.parent).free
        except OSError:
            return None
    if not said and free >= FULL:
        return None
    room = free + written  # once the partial file is removed
    what = f"needs {size(needed)}" if needed else f"needs more than the {size(written)} written when the disk filled"
    reason = f" ({first_line(err)})" if said else ""
    return DiskFull(f"no space left for {target}{reason}: it {what} and its device has {size(room)} free; free space there, or choose "
                    "another place for it (files under $TAPS_HOME: set TAPS_HOME). Nothing half-written was kept; rerun to write it")


# --- dead writers ----------------------------------------------------------------------------------------------------


def writer_gone(name: str, target: str | None = None) -> bool:
    """Whether `name`, a temporary file or staging directory named as this module names them (of `target`, when
    given), was left by a process of this host that no longer runs. Other hosts' leftovers, and names without an
    owner, are never gone."""
    target_pattern = re.escape(target) if target is not None else ".+"
    match = re.fullmatch(rf"\.{target_pattern}\.{re.escape(socket.gethostname())}\.(?P<pid>\d+)(?:\.[^.]+)?\.(?:tmp|partial|old)", name)
    if match is None:
        return False
    try:
        os.kill(int(match["pid"]), 0)  # signal 0 only asks whether the process exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive but another user's, or no possible pid
        pass
    return False


def remove_dead_leftovers(paths: list[Path], target: str | None = None) -> tuple[int, int]:
    """Remove those of `paths` that dead writers (of `target`, when given) of this host left; (how many, bytes freed)."""
    removed = freed = 0
    for path in paths:
        if not writer_gone(path.name, target):
            continue
        if path.is_dir():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path, ignore_errors=True)
        else:
            freed += path.stat().st_size
            path.unlink(missing_ok=True)
        removed += 1
    return removed, freed


# --- directories -----------------------------------------------------------------------------------------------------


def _retired(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}.*.old"), key=lambda p: p.stat().st_mtime) if target.parent.is_dir() else []


def recover_directory(target: Path, what: str = "write") -> list[str]:
    """Undo what writers of `target` killed mid-way left: a previous directory moved aside and not put back (a kill
    between `atomic_directory`'s two renames) returns, dead writers' staging directories go. What was done, in words
    (`what` names a writer's work: "export")."""
    done = []
    retired = _retired(target)
    if retired and not target.exists():
        retired[-1].rename(target)
        done.append(f"restored the previous {what} at {target} (an earlier {what} was interrupted while replacing it)")
    if target.parent.is_dir():
        leftovers = [p for p in target.parent.glob(f".{target.name}.*") if p.suffix in (".partial", ".old") and p.is_dir()]
        count, _ = remove_dead_leftovers(leftovers if target.exists() else [p for p in leftovers if p.suffix == ".partial"], target.name)
        if count:
            done.append(f"removed {count} staging director{'y' if count == 1 else 'ies'} of interrupted {what}s to {target}")
    return done


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty staging directory beside `target` to fill; when the block ends without error it replaces
    `target` (an existing one is moved aside first and deleted only after), otherwise it is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{_owner()}.", suffix=".partial", dir=target.parent))
    try:
        with full_disk_reported(staging, target):
            yield staging
            staging.chmod(0o755)
            _replace_directory(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def replace(new: Path, target: Path) -> None:
    """Put the finished file or directory `new` in `target`'s place (a directory: the old one moved aside first)."""
    if new.is_dir():
        _replace_directory(new, target)
    else:
        os.replace(new, target)


def _replace_directory(new: Path, target: Path) -> None:
    if not target.exists():
        new.rename(target)
        return
    retired = new.with_suffix(".old")
    target.rename(retired)
    try:
        new.rename(target)
    except OSError:
        retired.rename(target)
        raise
    shutil.rmtree(retired)


# --- one writer at a time --------------------------------------------------------------------------------------------


@contextmanager
def exclusive(lock_file: Path, waiting_for: str) -> Iterator[None]:
    """Hold the lock `lock_file` while the block runs, across processes and (on a shared filesystem) nodes: an
    exclusive advisory lock (flock). `waiting_for` ("another build of <dir>") says, once, why a process waits.

    The lock file names its holder (host:pid), so a waiter can say whom it waits for. It is removed on release; a
    waiter that got the lock on a file removed meanwhile takes it again on the new one, so two holders never hold
    different files of one path."""
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
        os.write(fd, f"{socket.gethostname()}:{os.getpid()}".encode())
        yield
    finally:
        lock_file.unlink(missing_ok=True)  # still held here, so nobody can take the removed file's lock and believe it current
        os.close(fd)


def exclusive_beside(target: Path, waiting_for: str) -> AbstractContextManager[None]:
    """`exclusive` on `<target>.lock` next to `target`: for a file or directory that is replaced whole, so the lock
    cannot live inside it."""
    return exclusive(target.with_name(target.name + ".lock"), waiting_for)


def _read_holder(fd: int) -> str:
    return os.pread(fd, 256, 0).decode(errors="replace").strip() or "holder unknown"


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except FileNotFoundError:
        return False
