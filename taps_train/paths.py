"""Where taps-train writes, checked before any work: `$TAPS_HOME`, cache folders and every command's output.

One check for every writer, so that a file standing where a folder must be, a pseudo-filesystem (`/proc`), a
read-only or full disk, or a path naming a folder where a file goes, is one line naming the variable or option
and the fix, before a model has run, never an OSError after hours.
"""

import tempfile
from pathlib import Path

from taps_train.errors import TapsError, first_line
from taps_train.home import taps_home


def file_in_the_way(directory: Path) -> Path | None:
    """The file that stops `directory` from being used or created as a directory (it, or the nearest of
    its parents that exists), else None."""
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    return None if existing.is_dir() else existing


def read_at_most(path: Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it holds more than `limit` (a hostile file is never read whole); OSError passes."""
    with path.open("rb") as file:
        raw = file.read(limit + 1)
    return None if len(raw) > limit else raw


def writable_directory(directory: str | Path, label: str, fix: str) -> Path:
    """`directory` if it is, or can be created as, a writable directory: no file stands in its way and the nearest
    existing folder on its path takes a probe file. Nothing is created (a command that fails later leaves no folder);
    `label` names the option or variable."""
    directory = Path(directory).expanduser()
    blocker = file_in_the_way(directory)
    if blocker is not None:
        raise TapsError(f"{label} {directory}: {blocker} is a file, not a directory; {fix}")
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        where = "" if existing == directory else f" (its nearest existing folder {existing} is not writable)"
        raise TapsError(f"{label} {directory} is not a writable directory{where}: {err.strerror or first_line(err)}; {fix}") from None
    return directory


def output_file(path: str | Path, label: str) -> Path:
    """A file path to write later: not a directory, in a directory that exists (or is created now) and is writable."""
    path = Path(path).expanduser()
    if path.is_dir() or str(path).endswith(("/", "\\")):
        raise TapsError(f"{label} {path} is a directory; pass a file path such as {path / 'out'}")
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise TapsError(f"{label} {path}: {blocker} is a file, not a directory; pass a path under a directory")
    writable_directory(path.parent, f"{label} {path}: folder", "pass a path in a writable folder")
    return path


def checked_home() -> Path:
    """`$TAPS_HOME` (or its default), usable; every command checks it first."""
    return writable_directory(taps_home(), "TAPS_HOME", "set TAPS_HOME to a writable directory, or unset it to use ~/.cache/taps-train")
