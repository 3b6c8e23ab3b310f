"""The output directory of an export: written whole (`files.atomic_directory`), replaced only when it holds an export.

--overwrite replaces an export, never a directory that is not one, nor files a user put inside one. Two exports to one
directory take turns (a lock beside it): the checks and the replacement are one step, so neither can find the
directory absent and then collide with the other's finished one.
"""

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import TypeVar

from taps_train import files
from taps_train.errors import TapsError

T = TypeVar("T")
MARKERS = ("taps_export.json", "bundle.json")  # what makes a directory safe to replace with --overwrite


@contextmanager
def export_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty staging directory to fill; on success it replaces `out_dir`, on failure it is removed and
    `out_dir` stays as it was."""
    if out_dir.is_symlink():
        raise TapsError(f"export target {out_dir} is a symbolic link; pass the real directory ({out_dir.resolve()}) as --out")
    if out_dir.exists() and not out_dir.is_dir():
        raise TapsError(f"export target {out_dir} is a file; pass a directory for --out")
    with ExitStack() as stack:
        _enter_beside(stack, files.exclusive_beside(out_dir, f"another export to {out_dir}"), out_dir)
        for line in files.recover_directory(out_dir, "export"):
            print(line)
        if out_dir.exists() and any(out_dir.iterdir()):
            if not overwrite:
                raise TapsError(f"export directory {out_dir} is not empty; pass --overwrite to replace it or choose another --out")
            if not any((out_dir / marker).is_file() for marker in MARKERS):
                raise TapsError(f"refusing to replace {out_dir}: it is not a taps-train export (no {' or '.join(MARKERS)}); "
                                "remove it yourself or choose another --out")
        staging = _enter_beside(stack, files.atomic_directory(out_dir), out_dir)
        yield staging
        _refuse_foreign_files(out_dir, staging)


def _enter_beside(stack: ExitStack, context: AbstractContextManager[T], out_dir: Path) -> T:
    """Enter `context`, which writes next to `out_dir`; a parent directory that cannot take files is a usage error."""
    try:
        return stack.enter_context(context)
    except OSError as err:
        raise TapsError(f"cannot write next to {out_dir}: {err.strerror or err}; choose an --out in a writable directory") from err


def _refuse_foreign_files(out_dir: Path, staging: Path) -> None:
    """Everything in the old directory must be something this export writes too."""
    if not out_dir.is_dir():
        return
    ours = {p.relative_to(staging) for p in staging.rglob("*")} | {Path(m) for m in MARKERS}
    foreign = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.relative_to(out_dir) not in ours)
    if foreign:
        raise TapsError(f"refusing to replace {out_dir}: it holds files an export does not write ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}); move them out or choose another --out")
