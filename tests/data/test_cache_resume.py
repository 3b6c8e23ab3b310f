"""Resuming inside a shard: a build killed in the middle of its first shard keeps the batches it saved, the next
build (another process) computes only the rest, and the cache ends byte-identical to an uninterrupted build.

Shards of 12 samples cut into six batches of 1-3 (`batch_tokens` 256 at max_length 128) stand in for 1024-sample
shards of hundreds of batches; `checkpoint_s=0` saves after every batch, a fake clock checks the interval itself.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from taps_train.data import feature_cache, prepare
from taps_train.data.feature_cache import CacheSettings, FeatureCache, SavedBatches, remove_stale_temporaries
from taps_train.data.prepare import PreparedSource, RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.features import EAGLE_FEATURES, FeatureContract
from tests.conftest import write_source

SETTINGS = {"shard_samples": 12, "batch_tokens": 256}
KILL_AT_CALL = 3  # the third verifier call of the build: two batches of the first shard are saved, the third dies
ENTRY = f'''
import functools, os, signal
from taps_train.data import feature_cache, prepare
from taps_train.cli import main

feature_cache.CacheSettings = functools.partial(feature_cache.CacheSettings, checkpoint_s=0, **{SETTINGS!r})
real, calls = feature_cache.verifier_features, []


def dies_in_the_first_shard(*args):
    calls.append(1)
    if len(calls) == {KILL_AT_CALL}:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args)


feature_cache.verifier_features = dies_in_the_first_shard
main()
'''


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


@pytest.fixture
def recipe(tmp_path) -> Path:
    data = write_source(tmp_path / "data.jsonl", 18, seed=61)
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: resume\nseed: 0\nmax_length: 128\nsources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: 2, count: 14}}\n")
    return path  # 16 samples: shards 0:12 and 12:16


def preparer(recipe: Path, verifier: Path, cache_dir: Path, contract: FeatureContract = EAGLE_FEATURES, **settings) -> RecipePreparer:
    return RecipePreparer(load_recipe(recipe), str(verifier), cache_dir, CacheSettings(**{**SETTINGS, **settings}), contract=contract)


def build(recipe: Path, verifier: Path, cache_dir: Path, **settings) -> list[FeatureCache]:
    p = preparer(recipe, verifier, cache_dir, **settings)
    return p.build(p.sources())


def contents(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, hidden ones included, with its bytes."""
    return {str(f.relative_to(directory)): f.read_bytes() for f in sorted(directory.rglob("*")) if f.is_file()}


class Calls:
    """Counts verifier batches and samples; raises KeyboardInterrupt (an injected kill) at call `die_at`."""

    def __init__(self, monkeypatch, die_at: int | None = None):
        self.batches, self.samples, self.die_at, self.real = 0, 0, die_at, feature_cache.verifier_features
        monkeypatch.setattr(feature_cache, "verifier_features", self)

    def __call__(self, model, samples, *args):
        if self.batches + 1 == self.die_at:
            raise KeyboardInterrupt
        self.batches += 1
        self.samples += len(samples)
        return self.real(model, samples, *args)


def first_shard_plan(p: RecipePreparer) -> tuple[SavedBatches, PreparedSource]:
    [source] = p.sources()
    return SavedBatches.plan(source.directory, (0, 12), source.samples[:12], p.settings), source


def test_a_build_killed_inside_its_first_shard_resumes_from_its_saved_batches(recipe, random_verifier_dir, tmp_path, taps_home, monkeypatch):
    entry = tmp_path / "entry.py"
    entry.write_text(ENTRY)
    command = [sys.executable, str(entry), "cache", "--recipe", str(recipe), "--verifier", str(random_verifier_dir), "--cache-dir", str(tmp_path / "cache")]
    killed = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                            env={**os.environ, "TAPS_HOME": str(taps_home), "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -9, killed.stderr[-3000:]

    p = preparer(recipe, random_verifier_dir, tmp_path / "cache")
    saved, source = first_shard_plan(p)
    assert len(saved.batches) == 6  # the kill came inside the first shard, with batches left to do
    assert sorted(f.name for f in saved.folder.iterdir()) == ["batches-00000-00001.safetensors", "batches-00001-00002.safetensors"]
    assert not (source.directory / "shard-00000.safetensors").exists() and not (source.directory / "manifest.json").exists()
    total = sum(len(s.input_ids) for s in source.samples)
    assert p.estimate([source])[0]["pending_tokens"] == total - sum(saved.tokens[:2])  # a dry run counts the saved batches as done

    calls = Calls(monkeypatch)
    [resumed] = p.build([source])
    samples_saved = sum(len(batch) for batch in saved.batches[:2])
    assert calls.samples == 16 - samples_saved  # the saved batches were read back, not recomputed
    assert calls.batches == len(saved.batches) - 2 + len(SavedBatches.plan(source.directory, (12, 16), source.samples[12:], p.settings).batches)

    monkeypatch.undo()
    [reference] = build(recipe, random_verifier_dir, tmp_path / "reference", checkpoint_s=3600)  # never saves batches
    assert contents(resumed.directory) == contents(reference.directory)  # byte for byte; no saved batches or temporaries left
    assert resumed.shards == reference.shards


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8_e4m3"])
def test_resumed_shards_are_byte_identical_for_every_stored_tensor(recipe, random_verifier_dir, tmp_path, monkeypatch, dtype):
    """fp8 stores scales beside the values, a multi-layer contract `targets` beside the `features`: all read back exactly."""
    contract = FeatureContract((0, 1, 2))
    Calls(monkeypatch, die_at=3)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, random_verifier_dir, tmp_path / "cache", contract=contract, dtype=dtype, checkpoint_s=0)
    monkeypatch.undo()
    calls = Calls(monkeypatch)
    [resumed] = build(recipe, random_verifier_dir, tmp_path / "cache", contract=contract, dtype=dtype, checkpoint_s=0)
    saved, _ = first_shard_plan(preparer(recipe, random_verifier_dir, tmp_path / "cache", contract=contract, dtype=dtype))
    assert calls.samples == 16 - len(saved.batches[0]) - len(saved.batches[1])
    monkeypatch.undo()
    [reference] = build(recipe, random_verifier_dir, tmp_path / "reference", contract=contract, dtype=dtype)
    assert contents(resumed.directory) == contents(reference.directory)


def test_batches_are_saved_once_checkpoint_s_of_work_has_passed(recipe, random_verifier_dir, tmp_path, monkeypatch):
    """Each verifier batch takes 25 s on a fake clock: with checkpoint_s 50 a save follows every second batch (never the
    shard's last: the shard itself follows) and holds only the batches since the previous save, so a kill loses under
    50 s of work plus the batch it interrupts."""
    clock = {"now": 0.0}
    monkeypatch.setattr(feature_cache.time, "monotonic", lambda: clock["now"])
    real = feature_cache.verifier_features

    def slow(*args):
        clock["now"] += 25.0
        return real(*args)

    monkeypatch.setattr(feature_cache, "verifier_features", slow)
    Calls(monkeypatch, die_at=6)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, random_verifier_dir, tmp_path / "cache", checkpoint_s=50)
    saved, _ = first_shard_plan(preparer(recipe, random_verifier_dir, tmp_path / "cache"))
    assert len(saved.batches) == 6
    assert sorted(f.name for f in saved.folder.iterdir()) == ["batches-00000-00002.safetensors", "batches-00002-00004.safetensors"]
    assert [(start, end) for start, end, _ in saved.chain()] == [(0, 2), (2, 4)]


def test_saved_batches_of_another_plan_are_discarded_and_the_shard_rebuilt(recipe, random_verifier_dir, tmp_path, monkeypatch):
    """A different batch budget cuts the shard into other batches: what was saved under the old plan is not mixed in."""
    Calls(monkeypatch, die_at=3)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, random_verifier_dir, tmp_path / "cache", checkpoint_s=0)
    monkeypatch.undo()
    old, _ = first_shard_plan(preparer(recipe, random_verifier_dir, tmp_path / "cache"))
    assert len(old.chain()) == 2
    new, source = first_shard_plan(preparer(recipe, random_verifier_dir, tmp_path / "cache", batch_tokens=512))
    assert new.folder == old.folder and new.batches != old.batches and new.chain() == []
    calls = Calls(monkeypatch)
    [rebuilt] = build(recipe, random_verifier_dir, tmp_path / "cache", batch_tokens=512)
    assert calls.samples == 16
    monkeypatch.undo()
    [reference] = build(recipe, random_verifier_dir, tmp_path / "reference", batch_tokens=512)
    assert contents(rebuilt.directory) == contents(reference.directory)


def test_saved_batches_left_beside_a_finished_shard_are_removed_without_verifier_work(recipe, random_verifier_dir, tmp_path, monkeypatch):
    """A kill between writing a shard and removing its saved batches: the next build adopts the shard and tidies up."""
    [reference] = build(recipe, random_verifier_dir, tmp_path / "reference")
    [built] = build(recipe, random_verifier_dir, tmp_path / "cache")
    (built.directory / "manifest.json").unlink()
    leftover = built.directory / ".shard-00000.partial"
    leftover.mkdir()
    (leftover / "batches-00000-00001.safetensors").write_bytes(b"saved before the shard was written")
    Calls(monkeypatch, die_at=1)
    build(recipe, random_verifier_dir, tmp_path / "cache")
    assert contents(built.directory) == contents(reference.directory)


def test_a_dead_writers_temporary_among_saved_batches_is_removed(tmp_path):
    folder = tmp_path / ".shard-00003.partial"
    folder.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = folder / f".batches-00004-00009.safetensors.{socket.gethostname()}.{gone.pid}.tmp"
    dead.write_bytes(b"\0" * 1000)
    kept = folder / "batches-00000-00004.safetensors"
    kept.write_bytes(b"progress")
    assert remove_stale_temporaries(tmp_path) == (1, 1000)
    assert not dead.exists() and kept.exists()


def test_a_larger_build_killed_after_writing_its_shards_leaves_the_smaller_cache_readable_and_resumes(recipe, random_verifier_dir, tmp_path, monkeypatch):
    """A learning curve's smaller size cached first (shards 0:12, 12:14), then the full recipe (0:12, 12:16) killed
    before its manifest: the smaller cache, whose manifest is still the directory's, opens and reads as before (its
    short last shard is not overwritten by the larger build's 12:16), and the next build of the full recipe resumes
    from what is on disk with no verifier work; once finished, no file of the smaller build is left."""
    smaller = tmp_path / "smaller.yaml"
    smaller.write_text(recipe.read_text().replace("count: 14", "count: 12"))
    [first] = build(smaller, random_verifier_dir, tmp_path / "cache")
    assert [(s["start"], s["end"]) for s in first.shards] == [(0, 12), (12, 14)]
    before = [first[position]["features"] for position in range(len(first))]

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, random_verifier_dir, tmp_path / "cache")
    monkeypatch.undo()
    [again] = build(smaller, random_verifier_dir, tmp_path / "cache")
    assert len(again) == 14 and all(again[p]["features"].equal(features) for p, features in enumerate(before))
    calls = Calls(monkeypatch)
    [resumed] = build(recipe, random_verifier_dir, tmp_path / "cache")
    assert resumed.directory == first.directory and calls.batches == 0
    monkeypatch.undo()
    [reference] = build(recipe, random_verifier_dir, tmp_path / "reference")
    assert contents(resumed.directory) == contents(reference.directory)
    assert len(build(smaller, random_verifier_dir, tmp_path / "cache")[0]) == 16  # the smaller recipe reads the larger cache
