"""Verifier directories taps-train writes itself (the tiny verifier, converted GGUF models).

Each is written in a staging directory (`files.atomic_directory`), gets a manifest with the SHA-256 of every file
written last, and is renamed into place; every use checks the files against the manifest, so a damaged build is refused
with the command that rebuilds it instead of running with other weights.
"""

import json
from pathlib import Path

from taps_train.errors import TapsError
from taps_train.hashing import file_sha256


def file_digests(directory: Path) -> dict[str, str]:
    return {f.name: file_sha256(f) for f in sorted(directory.iterdir()) if f.is_file()}


def write_manifest(staging: Path, manifest_name: str, manifest: dict) -> None:
    """The manifest of a staged build, with the hashes of the files staged so far (write it last)."""
    manifest = {**manifest, "files": file_digests(staging)}
    (staging / manifest_name).write_text(json.dumps(manifest, indent=2))


def check_files(path: Path, manifest_name: str, what: str, fix: str) -> dict:
    """The manifest of the build at `path` after checking every listed file's SHA-256; raise if anything is off."""
    try:
        manifest = json.loads((path / manifest_name).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise TapsError(f"{what} at {path} has no readable {manifest_name} ({err}); {fix}") from err
    for name, digest in files.items():
        file = path / name
        if not file.is_file():
            raise TapsError(f"{what} at {path} is missing {name}; {fix}")
        if file_sha256(file) != digest:
            raise TapsError(f"{what} at {path} has a corrupt {name} (checksum mismatch); {fix}")
    return manifest
