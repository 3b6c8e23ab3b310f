"""Content fingerprints of a verifier and its tokenizer, so caches built for one verifier are never
silently used with another."""

import hashlib
import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from taps_train.files import write_text
from taps_train.hashing import file_sha256
from taps_train.home import taps_home

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def verifier_fingerprint(path: str, tokenizer: PreTrainedTokenizerBase, revision: str | None = None) -> dict:
    """Path, weights hash (local directory) or hub id + revision, and tokenizer/chat-template hash."""
    weights = _weights_hash(Path(path)) if Path(path).is_dir() else f"hub:{path}@{revision or 'main'}"
    return {"path": path, "weights": weights, "tokenizer": tokenizer_hash(tokenizer)}


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = tokenizer.backend_tokenizer.to_str() if tokenizer.is_fast else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    blob = json.dumps({"backend": backend, "chat_template": tokenizer.chat_template, "special": tokenizer.all_special_tokens})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _weights_hash(directory: Path) -> str:
    """SHA-256 over the weight files (each memoized, see `memoized_sha256`)."""
    files = sorted(f for f in directory.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
    digest = hashlib.sha256()
    for file, file_digest in zip(files, memoized_sha256(files)):
        digest.update(f"{file.name}:{file_digest}".encode())
    return digest.hexdigest()[:16]


def memoized_sha256(files: list[Path]) -> list[str]:
    """SHA-256 of each file, memoized because 8B checkpoints are 16 GB. The memo key is (path, size, mtime)
    plus a hash of sampled blocks (the header, 16 evenly spaced 4 KB blocks, the end): a file rewritten with
    other weights of the same size and a restored mtime no longer passes as the old one. A change confined to
    bytes between the samples still does; delete the memo file to rehash."""
    memo_path = taps_home() / "weights_hashes.json"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    digests, changed = [], False
    for file in files:
        stat = file.stat()
        key = f"{file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{_sampled_hash(file, stat.st_size)}"
        if key not in memo:
            memo[key] = file_sha256(file)
            changed = True
        digests.append(memo[key])
    if changed:
        write_text(memo_path, json.dumps(memo))
    return digests


def _sampled_hash(path: Path, size: int, head: int = 1 << 16, block: int = 1 << 12, blocks: int = 16) -> str:
    """Hash of a file's first 64 KB, `blocks` evenly spaced blocks and last 64 KB: ~200 KB read whatever the size."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for offset in [0, *(size * i // (blocks + 1) for i in range(1, blocks + 1)), max(0, size - head)]:
            file.seek(offset)
            digest.update(file.read(head if offset in (0, max(0, size - head)) else block))
    return digest.hexdigest()[:16]
