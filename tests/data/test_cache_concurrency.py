"""Builds that meet: two `taps-train cache` runs of one recipe take turns (the second waits, then finds
the shards done), a build removes the temporaries killed builds left on this host and nothing else,
regeneration into one file takes turns, and a no-op start tokenizes nothing."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from taps_train.data import prepare
from taps_train.data import regenerate as regen
from taps_train.verifier.generation import stop_token_ids
from taps_train.data.conversation import Conversation
from taps_train.data.feature_cache import CacheSettings
from taps_train.files import exclusive
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import Regenerate, load_recipe
from taps_train.verifier import load_verifier
from tests.conftest import wait_for, write_source

SHARD_SAMPLES = 4
ENTRY = f'''
import functools, os, time
from pathlib import Path
from taps_train.data import datamodule, feature_cache
from taps_train.cli import main

feature_cache.CacheSettings = datamodule.CacheSettings = functools.partial(feature_cache.CacheSettings, shard_samples={SHARD_SAMPLES})
write_shard = feature_cache._write_shard


def logged(model, contract, samples, directory, span, *rest):
    """Logs each shard the verifier computes, and holds the first until the test says go."""
    with open(os.environ["SHARD_LOG"], "a") as log:
        log.write(f"{{os.getpid()}} {{directory.name}} {{span[0]}}:{{span[1]}}\\n")
    while not Path(os.environ["GO"]).exists():
        time.sleep(0.05)
    return write_shard(model, contract, samples, directory, span, *rest)


feature_cache._write_shard = logged
main()
'''


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


def write_recipe(directory: Path, name: str, heldout: int, count: int) -> Path:
    data = directory / "data.jsonl"
    if not data.exists():
        write_source(data, 16, seed=51)
    path = directory / f"{name}.yaml"
    path.write_text(f"name: {name}\nseed: 0\nmax_length: 96\nsources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: {heldout}, count: {count}}}\n")
    return path


def preparer(recipe: Path, verifier: Path, cache_dir: Path) -> RecipePreparer:
    return RecipePreparer(load_recipe(recipe), str(verifier), cache_dir, CacheSettings(shard_samples=SHARD_SAMPLES))


def test_a_second_build_waits_for_the_first_and_computes_nothing(random_verifier_dir, tmp_path, taps_home):
    recipe = write_recipe(tmp_path, "both", heldout=2, count=9)  # 11 samples: 3 shards
    entry, log, go = tmp_path / "entry.py", tmp_path / "shards.log", tmp_path / "go"
    entry.write_text(ENTRY)
    env = {**os.environ, "TAPS_HOME": str(taps_home), "OMP_NUM_THREADS": "1", "SHARD_LOG": str(log), "GO": str(go)}
    command = [sys.executable, str(entry), "cache", "--recipe", str(recipe), "--verifier", str(random_verifier_dir), "--cache-dir", str(tmp_path / "cache")]

    def start(name: str) -> subprocess.Popen:
        return subprocess.Popen(command, stdout=open(tmp_path / f"{name}.out", "w"), stderr=open(tmp_path / f"{name}.err", "w"), env=env, cwd=tmp_path)

    first = start("first")
    try:
        wait_for(log.exists, "the first build to start its first shard")  # it holds the lock now
        second = start("second")
        try:
            wait_for(lambda: "waiting for another build of" in (tmp_path / "second.err").read_text(), "the second build to wait")
            go.touch()
            assert first.wait(timeout=120) == 0, (tmp_path / "first.err").read_text()[-3000:]
            assert second.wait(timeout=120) == 0, (tmp_path / "second.err").read_text()[-3000:]
        finally:
            second.kill()
    finally:
        go.touch()
        first.kill()

    directory = preparer(recipe, random_verifier_dir, tmp_path / "cache").sources()[0].directory
    computed = log.read_text().splitlines()
    assert sorted(computed) == [f"{first.pid} {directory.name} {a}:{b}" for a, b in ((0, 4), (4, 8), (8, 11))]  # each shard once, all by the first
    waited = (tmp_path / "second.err").read_text()
    assert waited.count("waiting for another build of") == 1 and f"{directory} ({socket.gethostname()}:{first.pid})" in waited
    ready = f"ready: {directory} (11 samples)"
    assert ready in (tmp_path / "first.out").read_text() and ready in (tmp_path / "second.out").read_text()
    assert sorted(f.name for f in directory.iterdir()) == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors", "shard-00002-11.safetensors"]


def test_a_build_removes_only_the_temporaries_of_dead_writers_on_this_host(random_verifier_dir, tmp_path, capsys):
    p = preparer(write_recipe(tmp_path, "small", heldout=2, count=6), random_verifier_dir, tmp_path / "cache")
    sources = p.sources()
    directory = sources[0].directory
    directory.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    sleeper = subprocess.Popen(["sleep", "60"])
    host = socket.gethostname()
    try:
        # Shards 7 and 8 of an earlier, larger build, killed mid-write: this build never rewrites them.
        dead = directory / f".shard-00007.safetensors.{host}.{gone.pid}.tmp"
        alive = directory / f".shard-00008.safetensors.{host}.{sleeper.pid}.tmp"
        elsewhere = directory / f".shard-00007.safetensors.other-node.{gone.pid}.tmp"
        for path in (dead, alive, elsewhere):
            path.write_bytes(b"\0" * 300_000)
        p.build(sources)
        assert not dead.exists() and alive.exists() and elsewhere.exists()
        assert f"removed 1 temporary files (0.3 MB) that killed builds left in {directory}" in capsys.readouterr().err
        assert not (directory / ".lock").exists()  # released and removed
    finally:
        sleeper.kill()
        sleeper.wait()


def test_regeneration_into_one_file_waits_for_the_holder(random_verifier_dir, tmp_path, capsys):
    verifier = load_verifier(str(random_verifier_dir))
    items = [Conversation(f"c{i}", [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": "two"}]) for i in range(3)]
    path = tmp_path / "regen.jsonl"
    spec = Regenerate(temperature=0.0, max_new_tokens=4, seed=0)
    worker = threading.Thread(target=regen.regenerate, args=(items, regen.transformers_generator(verifier.model, verifier.tokenizer), verifier.tokenizer,
                                                                      stop_token_ids(verifier.model, verifier.tokenizer), spec, 128, path))
    with exclusive(path.with_name("regen.jsonl.lock"), "the test"):
        worker.start()
        wait_for(lambda: "waiting for another regeneration into" in capsys.readouterr().err, "the regeneration to wait", timeout_s=30)
        time.sleep(0.3)
        assert worker.is_alive() and not path.exists()
    worker.join(timeout=60)
    assert not worker.is_alive() and len(path.read_text().splitlines()) == 3


def test_a_no_op_start_reports_the_same_counts_without_tokenizing(random_verifier_dir, tmp_path, monkeypatch):
    small, large = write_recipe(tmp_path, "small", heldout=2, count=7), write_recipe(tmp_path, "large", heldout=2, count=10)
    cache = tmp_path / "cache"
    p = preparer(small, random_verifier_dir, cache)
    tokenized = p.estimate(p.sources())  # nothing cached yet: counted by tokenizing
    built = preparer(large, random_verifier_dir, cache)
    built.build(built.sources())  # 12 samples; the small recipe needs 9 of them, into its third shard

    monkeypatch.setattr(prepare, "tokenize_conversation", lambda *a: pytest.fail("tokenized for a complete cache"))
    again = preparer(small, random_verifier_dir, cache)
    sources = again.sources()
    assert again.estimate(sources) == [row | {"pending_tokens": 0, "new_bytes": 0} for row in tokenized]
    assert tokenized[0]["new_bytes"] > 0 and 0 < tokenized[0]["assistant_tokens"] < tokenized[0]["tokens"] == tokenized[0]["pending_tokens"]
    [cache_of_small] = again.build(sources)
    assert len(cache_of_small) == 12
