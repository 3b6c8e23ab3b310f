"""Checks on where `eval` and `report` write, made before any expensive work: a file standing where a
directory must be created would otherwise surface as a FileExistsError after the models have run."""

from pathlib import Path


def file_in_the_way(directory: Path) -> Path | None:
    """The file that stops `directory` from being used or created as a directory (it, or the nearest of
    its parents that exists), else None."""
    existing = next(path for path in (directory, *directory.parents) if path.exists())
    return None if existing.is_dir() else existing
