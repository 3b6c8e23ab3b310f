"""The weights-hash memo does not take a same-size rewrite with a restored mtime for the old file."""

import os
import shutil

import torch
from safetensors.torch import save_file

from taps_train.verifier.fingerprint import _weights_hash


def test_same_size_rewrite_with_restored_mtime_changes_the_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    save_file({"w": torch.zeros(1000, 300)}, weights)
    before, stat = _weights_hash(model), weights.stat()
    assert _weights_hash(model) == before  # memoized, same answer
    save_file({"w": torch.ones(1000, 300)}, tmp_path / "other.safetensors")
    shutil.copyfile(tmp_path / "other.safetensors", weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_size == stat.st_size and weights.stat().st_mtime_ns == stat.st_mtime_ns
    assert _weights_hash(model) != before
