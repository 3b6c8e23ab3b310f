"""The configs and data recipes taps-train ships inside its package (`taps_train/configs`, `taps_train/data_recipes`;
a clone links them at the repository root), so that an installed wheel can run them from any directory.

A relative path that names a shipped file (`data_recipes/tiny_math.yaml`, `configs/smol/eagle2_math.yaml`) is read
from the current directory when it exists there, else from the package: a user's own copy always wins.
`taps-train configs ls` lists the shipped configs and `taps-train configs cp` copies one into a working directory
together with every shipped file it names (a study's fit configs, a fit config's recipe), to edit and run there.
"""

import re
import shutil
from pathlib import Path

from taps_train.errors import TapsError

PACKAGE = Path(__file__).resolve().parent
SHIPPED_DIRS = ("configs", "data_recipes")
_NAMED = re.compile(r"\b(?:configs|data_recipes)/[\w./-]+?\.ya?ml\b")  # a shipped path inside a config's text


def shipped_path(path: str | Path) -> Path:
    """`path` as given when it exists, else the package's file of that relative path when there is one, else `path`
    (so the caller's own "not found" names what the user wrote)."""
    given = Path(path).expanduser()
    if given.exists() or given.is_absolute():
        return given
    packaged = PACKAGE / given
    return packaged if packaged.is_file() and given.parts[0] in SHIPPED_DIRS else given


def shipped_configs() -> list[str]:
    """Every shipped config, as the path `cp` takes (relative to `configs/`)."""
    root = PACKAGE / "configs"
    return sorted(str(path.relative_to(root)) for path in root.rglob("*.yaml"))


def with_named_files(relative: str) -> list[str]:
    """A shipped file (relative to the package) and, recursively, every shipped file its text names."""
    found, queue = [], [relative]
    while queue:
        current = queue.pop()
        if current in found:
            continue
        found.append(current)
        queue += [named for named in _NAMED.findall((PACKAGE / current).read_text(encoding="utf-8")) if (PACKAGE / named).is_file()]
    return found


def copy_config(name: str, destination: Path) -> list[Path]:
    """Copy shipped config `name` (as `ls` lists it) and the shipped files it names under `destination`, keeping their
    relative paths so the copy runs as written. A file already there with other content is left alone and refused."""
    relative = f"configs/{name.removeprefix('configs/')}"
    if not (PACKAGE / relative).is_file():
        raise TapsError(f"no shipped config {name!r}; `taps-train configs ls` lists them")
    files = with_named_files(relative)
    clashes = [f for f in files if (destination / f).exists() and (destination / f).read_bytes() != (PACKAGE / f).read_bytes()]
    if clashes:
        raise TapsError(f"{', '.join(str(destination / f) for f in clashes)} already exist with other content; "
                        "move them away or copy into another directory (taps-train configs cp NAME DIR)")
    written = []
    for file in files:
        target = destination / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE / file, target)
        written.append(target)
    return written
