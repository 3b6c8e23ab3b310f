"""A damaged feature-cache manifest or a replaced shard: plain `taps-train cache` says so in one line
(it checks what `fit` checks) instead of reporting the cache ready."""

import json

import pytest

from tests.data.test_cache_cli import cache, recipe  # noqa: F401 (fixtures)

MANIFEST_DAMAGE = {
    "empty object": lambda m: {},
    "a list": lambda m: [],
    "no shards": lambda m: {**m, "shards": []},
    "shards a string": lambda m: {**m, "shards": "all"},
    "samples a string": lambda m: {**m, "samples": "10"},
    "samples negative": lambda m: {**m, "samples": -1},
    "path out of the cache": lambda m: {**m, "shards": [{**m["shards"][0], "file": "../../escape.safetensors"}]},
    "shard without checksum": lambda m: {**m, "shards": [{k: v for k, v in m["shards"][0].items() if k != "sha256"}]},
    "shard with a gap": lambda m: {**m, "shards": [{**m["shards"][0], "start": 1}]},
    "bool as a count": lambda m: {**m, "shards": [{**m["shards"][0], "bytes": True}]},
    "fingerprint missing": lambda m: {k: v for k, v in m.items() if k != "fingerprint"},
}


def _built(recipe, verifier, tmp_path, capsys):
    cache(recipe, verifier, "--cache-dir", str(tmp_path / "cache"))
    capsys.readouterr()
    [manifest] = (tmp_path / "cache").glob("*/manifest.json")
    return manifest


def _one_line_error(capsys, call) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE, ids=list(MANIFEST_DAMAGE))
def test_damaged_manifest_is_one_line(damage, recipe, random_verifier_dir, tmp_path, capsys):  # noqa: F811
    manifest = _built(recipe, random_verifier_dir, tmp_path, capsys)
    manifest.write_text(json.dumps(MANIFEST_DAMAGE[damage](json.loads(manifest.read_text()))))
    line = _one_line_error(capsys, lambda: cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache")))
    assert line.startswith(f"taps-train: error: feature cache manifest {manifest} is damaged") or "corrupt" in line, line


def test_replaced_shard_of_the_same_size_is_caught_by_plain_cache(recipe, random_verifier_dir, tmp_path, capsys):  # noqa: F811
    manifest = _built(recipe, random_verifier_dir, tmp_path, capsys)
    [shard] = manifest.parent.glob("shard-00000*.safetensors")  # a short last shard is named by its end too
    blob = bytearray(shard.read_bytes())
    blob[-3] ^= 0x40
    shard.write_bytes(bytes(blob))
    line = _one_line_error(capsys, lambda: cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache")))
    assert "fails its checksum" in line
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"), "--no-verify")  # the opt-out skips the check
    assert "ready: " in capsys.readouterr().out


def test_disk_check_counts_headers_and_offsets(recipe, random_verifier_dir, tmp_path, capsys):  # noqa: F811
    """The space check before a build is an upper bound of what the shards take (it used to leave out the
    safetensors header and the offsets, so a nearly full disk failed mid-shard after the check passed)."""
    from taps_train.data.feature_cache import shard_bytes_bound

    manifest = json.loads(_built(recipe, random_verifier_dir, tmp_path, capsys).read_text())
    hidden = json.loads((random_verifier_dir / "config.json").read_text())["hidden_size"]
    for shard in manifest["shards"]:
        bound = shard_bytes_bound(shard["tokens"], shard["end"] - shard["start"], 1, [hidden], manifest["fingerprint"]["dtype"])
        assert shard["bytes"] <= bound <= shard["bytes"] * 1.05 + 8192
