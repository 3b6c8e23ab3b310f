"""The feature cache built by several processes: `taps-train cache` under torchrun (2 gloo CPU ranks)
splits the shards and ends byte-identical to one process, a killed distributed build resumes, a
2-rank DDP `fit` builds a missing cache on both ranks, and ranks that do not share the cache dir
(two "nodes" with their own disks) are refused.

The subprocesses run `entry.py` (written by `entry` below) instead of `-m taps_train`: it is the same
`taps_train.cli.main`, with cache shards of 4 samples instead of 1024, so a recipe of a few dozen
samples spans several shards and both ranks get some. Lightning's DDP launcher re-runs the same
script for its second rank, so `fit` gets the small shards on both ranks too.
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from taps_train.data import feature_cache
from taps_train.data.datamodule import DrafterDataModule
from taps_train.data.feature_cache import CacheSettings
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe
from tests.conftest import write_source

SHARD_SAMPLES = 4
ENTRY = f'''
import functools, os, signal
from taps_train.data import datamodule, feature_cache
from taps_train.cli import main

feature_cache.CacheSettings = datamodule.CacheSettings = functools.partial(feature_cache.CacheSettings, shard_samples={SHARD_SAMPLES})
if os.environ.get("DIE_ON_RANK", "none") == os.environ.get("RANK"):  # a kill right after this rank's first shard
    write_shard = feature_cache._write_shard

    def write_then_die(*args):
        write_shard(*args)
        os.kill(os.getpid(), signal.SIGKILL)

    feature_cache._write_shard = write_then_die
main()
'''


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


@pytest.fixture
def entry(tmp_path) -> Path:
    path = tmp_path / "entry.py"
    path.write_text(ENTRY)
    return path


@pytest.fixture
def recipe(tmp_path) -> Path:
    """Two sources, 13 and 9 samples: shards 0-3 and 4-6 of the recipe; rank 0 builds 0, 2, 4, 6, rank 1 builds 1, 3, 5."""
    math, chat = write_source(tmp_path / "math.jsonl", 14, seed=41), write_source(tmp_path / "chat.jsonl", 10, seed=42)
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "name: split\nseed: 0\nmax_length: 96\nsources:\n"
        f"  - {{source: jsonl, args: {{path: {math}}}, heldout: 2, count: 11}}\n"
        f"  - {{source: jsonl, args: {{path: {chat}}}, heldout: 1, count: 8}}\n"
    )
    return path


def environment(home: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TAPS_HOME": str(home), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def torchrun(entry: Path, *args, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(entry), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=entry.parent)


def preparer(recipe: Path, verifier: Path, cache_dir: Path) -> RecipePreparer:
    return RecipePreparer(load_recipe(recipe), str(verifier), cache_dir, CacheSettings(shard_samples=SHARD_SAMPLES))


def single_process_build(recipe: Path, verifier: Path, cache_dir: Path) -> list[feature_cache.FeatureCache]:
    p = preparer(recipe, verifier, cache_dir)
    return p.build(p.sources())


def first_source_cache(recipe: Path, verifier: Path, cache_dir: Path) -> Path:
    return preparer(recipe, verifier, cache_dir).sources(regenerate=False)[0].directory


def contents(root: Path) -> dict[str, bytes]:
    """Every file under `root`, hidden ones included, with its bytes."""
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_torchrun_splits_the_shards_and_matches_a_single_process_build(entry, recipe, random_verifier_dir, tmp_path, taps_home):
    args = ("cache", "--recipe", recipe, "--verifier", random_verifier_dir, "--cache-dir", tmp_path / "two")
    result = torchrun(entry, *args, env=environment(taps_home))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("total: ") == 1 and result.stdout.count("ready: ") == 2  # rank 0 alone prints the summary
    assert "2 ranks share the build" in result.stdout
    for rank, shards in ((0, 4), (1, 3)):  # both ranks ran the verifier on their own shards
        assert f"rank {rank}: caching features" in result.stderr
        assert f"rank {rank}: {shards} shards on disk; waiting for the other ranks" in result.stderr
    single_process_build(recipe, random_verifier_dir, tmp_path / "one")
    two, one = contents(tmp_path / "two"), contents(tmp_path / "one")
    assert len(one) == 2 + 7 and two == one  # 2 manifests + 7 shards, byte for byte; no temporary files


def test_a_killed_distributed_build_resumes_shard_by_shard(entry, recipe, random_verifier_dir, tmp_path, taps_home, monkeypatch):
    args = ("cache", "--recipe", recipe, "--verifier", random_verifier_dir, "--cache-dir", tmp_path / "two")
    killed = torchrun(entry, *args, env=environment(taps_home, DIE_ON_RANK="1"))
    assert killed.returncode != 0
    # Rank 1's first shard, complete before the kill; rank 0 was stopped wherever it was.
    survivor = first_source_cache(recipe, random_verifier_dir, tmp_path / "two") / "shard-00001.safetensors"
    assert survivor.is_file() and not list((tmp_path / "two").rglob("manifest.json"))
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    single_process_build(recipe, random_verifier_dir, tmp_path / "reference")
    reference = contents(tmp_path / "reference")

    before = survivor.stat()
    resumed = torchrun(entry, *args, env=environment(taps_home))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert contents(tmp_path / "two") == reference
    assert (survivor.stat().st_ino, survivor.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # adopted, not rebuilt

    computed, real = [], feature_cache._write_shard

    def counted(model, contract, samples, *rest):
        computed.append(len(samples))
        return real(model, contract, samples, *rest)

    monkeypatch.setattr(feature_cache, "_write_shard", counted)
    single_process_build(recipe, random_verifier_dir, tmp_path / "one")  # the same killed state, resumed by one process
    assert contents(tmp_path / "one") == reference
    assert 0 < sum(computed) <= 13 + 9 - SHARD_SAMPLES  # only missing shards were computed


def test_ddp_fit_builds_a_missing_cache_on_both_ranks_and_trains(entry, random_verifier_dir, tmp_path, taps_home):
    recipe = tmp_path / "ddp.yaml"
    recipe.write_text("name: ddp\nseed: 0\nmax_length: 128\nsources:\n  - {source: gsm_symbolic, args: {size: 40, seed: 5}, heldout: 4, count: 24}\n")
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_steps": 2, "logger": False, "enable_progress_bar": False,
            "limit_val_batches": 1, "val_check_interval": 2, "num_sanity_val_steps": 0, "default_root_dir": str(tmp_path / "run"),
            "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                           "init_args": {"dirpath": str(tmp_path / "run"), "save_last": True}}],
        },
        "model": {"class_path": "taps_train.training.HassModule", "init_args": {"verifier": str(random_verifier_dir), "lr": 1e-3}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe), "batch_size": 4}},
    }
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, str(entry), "fit", "--config", str(tmp_path / "fit.yaml")],
                            capture_output=True, text=True, timeout=300, env=environment(taps_home), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in result.stderr
    for rank in (0, 1):  # 28 samples = 7 shards: 4 on rank 0, 3 on rank 1
        assert f"rank {rank}: caching features" in result.stderr
        assert f"rank {rank}: {4 - rank} shards on disk; waiting for the other ranks" in result.stderr
    [cache] = (taps_home / "features").iterdir()
    assert sorted(f.name for f in cache.iterdir()) == ["manifest.json", *(f"shard-0000{i}.safetensors" for i in range(7))]
    assert torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)["global_step"] == 2


def free_ports(count: int) -> list[int]:
    """Distinct free ports (every socket held open until all are picked)."""
    probes = [socket.socket() for _ in range(count)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in probes]
    for probe in probes:
        probe.close()
    return ports


def two_nodes(job: Path, port: int, entry: Path, *args) -> list[subprocess.Popen]:
    """Rank 0 and rank 1 of one job as if on two nodes with their own disks: torch.distributed variables set by
    hand (what torchrun or a cluster scheduler sets), one TAPS_HOME, hence one default cache dir, per node."""
    job.mkdir()
    return [
        subprocess.Popen([sys.executable, str(entry), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=job,
                         env=environment(job / f"node{rank}", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                                         RANK=str(rank), NODE_RANK=str(rank), LOCAL_RANK="0"))
        for rank in (0, 1)
    ]


def last_error_lines(processes: list[subprocess.Popen]) -> list[str]:
    lines = []
    for process in processes:
        try:
            _, stderr = process.communicate(timeout=240)
        finally:
            process.kill()
        assert process.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
        lines.append(stderr.strip().splitlines()[-1])
    return lines


def test_ranks_that_do_not_share_the_cache_dir_are_refused(entry, recipe, random_verifier_dir, tmp_path):
    config = {
        "trainer": {"accelerator": "cpu", "devices": 1, "num_nodes": 2, "strategy": "ddp", "max_steps": 1, "logger": False},
        "model": {"class_path": "taps_train.training.HassModule", "init_args": {"verifier": str(random_verifier_dir)}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": str(recipe)}},
    }
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(config))
    # Both jobs at once: each waits out the grace a network filesystem gets before a rank gives up on a file.
    cache_port, fit_port = free_ports(2)
    cache_job = two_nodes(tmp_path / "cache", cache_port, entry, "cache", "--recipe", recipe, "--verifier", random_verifier_dir)
    fit_job = two_nodes(tmp_path / "fit", fit_port, entry, "fit", "--config", tmp_path / "fit.yaml")

    def refusal(job: Path) -> str:
        unseen = first_source_cache(recipe, random_verifier_dir, job / "node0" / "features") / "shard-00001.safetensors"  # rank 1's
        return (f"taps-train: error: rank 0 cannot see {unseen}, which rank 1 has (waited 30 s): "
                "the feature cache dir must be on a filesystem shared by all nodes")

    assert last_error_lines(cache_job) == [refusal(tmp_path / "cache")] * 2  # every rank stops with the same one-line error
    command = f"torchrun --nproc_per_node 1 -m taps_train cache --recipe {recipe} --verifier {random_verifier_dir}"
    assert last_error_lines(fit_job) == [f"{refusal(tmp_path / 'fit')} (or build the cache before fit with `{command}` and copy it to every node)"] * 2
    assert not list(tmp_path.rglob("manifest.json"))


def test_the_suggested_cache_command_repeats_the_datamodule_settings(recipe, random_verifier_dir, tmp_path):
    dm = DrafterDataModule(str(recipe), verifier=str(random_verifier_dir), cache_dir=str(tmp_path / "my cache"), feature_dtype="fp8_e4m3",
                           verifier_dtype="float32")
    assert dm.cache_command(8) == (f"torchrun --nproc_per_node 8 -m taps_train cache --recipe {recipe} --verifier {random_verifier_dir} "
                                   f"--cache-dir '{tmp_path / 'my cache'}' --verifier-dtype float32 --dtype fp8_e4m3")
    plain = DrafterDataModule(str(recipe), verifier="taps-tiny")
    assert plain.cache_command(2) == f"torchrun --nproc_per_node 2 -m taps_train cache --recipe {recipe} --verifier taps-tiny"
