"""The verifier feature cache on the random verifier: what it stores (the post-norm last hidden
state), how compactly, and that builds are resumable, idempotent, checked, shared by mixtures and
extensible."""

import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from taps_train.cli import main
from taps_train.data import feature_cache
from taps_train.data.feature_cache import (
    CacheSettings,
    FeatureCache,
    ShardWriter,
    bytes_per_token,
    length_batches,
    shard_ranges,
)
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.features import EAGLE_FEATURES
from taps_train.errors import TapsError
from taps_train.verifier.fingerprint import verifier_fingerprint
from tests.conftest import write_source

HIDDEN = 32  # the random verifier's hidden size
MAX_LENGTH = 128


@pytest.fixture(autouse=True)
def taps_home(tmp_path, monkeypatch) -> Path:
    """Weight-hash memos and default caches go to a temporary home, never ~/.cache."""
    home = tmp_path / "home"
    monkeypatch.setenv("TAPS_HOME", str(home))
    return home


def write_recipe(directory: Path, name: str, sources: list[tuple[Path, int, int]]) -> Path:
    """A recipe over jsonl files: (path, heldout, count) per source."""
    lines = [f"name: {name}", "seed: 0", f"max_length: {MAX_LENGTH}", "sources:"]
    lines += [f"  - {{source: jsonl, args: {{path: {p}}}, heldout: {h}, count: {c}}}" for p, h, c in sources]
    path = directory / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def data(tmp_path) -> dict[str, Path]:
    return {"math": write_source(tmp_path / "math.jsonl", 16, seed=11), "chat": write_source(tmp_path / "chat.jsonl", 14, seed=12)}


def preparer(recipe: Path, verifier_dir: Path, cache: Path, **settings) -> RecipePreparer:
    return RecipePreparer(load_recipe(recipe), str(verifier_dir), cache, CacheSettings(**settings))


def build(recipe: Path, verifier_dir: Path, cache: Path, **settings) -> list[FeatureCache]:
    p = preparer(recipe, verifier_dir, cache, **settings)
    return p.build(p.sources())


def files(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `root` with (size, mtime_ns, inode): any rewrite changes it."""
    return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns, f.stat().st_ino) for f in sorted(root.rglob("*")) if f.is_file()}


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.glob("shard-*.safetensors"))}


class ForwardCounter:
    """Wraps `verifier_features` to count the samples the verifier actually ran on."""

    def __init__(self, monkeypatch, fail: bool = False):
        self.samples, self.fail, self.real = 0, fail, feature_cache.verifier_features
        monkeypatch.setattr(feature_cache, "verifier_features", self)

    def __call__(self, model, samples, *args):
        if self.fail:
            raise AssertionError("the verifier ran although everything was cached")
        self.samples += len(samples)
        return self.real(model, samples, *args)


def test_stored_feature_is_the_post_norm_last_hidden_state_and_the_lm_head_reproduces_logits(tmp_path, data, random_verifier_dir):
    p = preparer(write_recipe(tmp_path, "math", [(data["math"], 3, 9)]), random_verifier_dir, tmp_path / "cache")
    [source] = p.sources()
    [cache] = p.build([source])
    model = p.verifier.model
    lengths = [len(s.input_ids) for s in source.samples]
    assert len(set(lengths)) > 4 and max(lengths) == MAX_LENGTH  # padded batches of mixed lengths, some truncated
    assert len(length_batches(lengths, CacheSettings().batch_tokens)) == 1
    pre_norm = {}
    model.model.layers[-1].register_forward_hook(lambda module, args, output: pre_norm.update(state=output[0] if isinstance(output, tuple) else output))
    for position, sample in enumerate(source.samples):
        item = cache[position]
        assert item["input_ids"].tolist() == sample.input_ids and item["loss_mask"].tolist() == [bool(m) for m in sample.loss_mask]
        assert item["features"].dtype == torch.float32 and item["features"].shape == (len(sample.input_ids), HIDDEN)
        with torch.no_grad():
            out = model(input_ids=torch.tensor([sample.input_ids]), output_hidden_states=True)
            post_norm = model.model.norm(pre_norm["state"])[0]
        torch.testing.assert_close(out.hidden_states[-1][0], post_norm)  # transformers: hidden_states[-1] is post-norm
        torch.testing.assert_close(item["features"], post_norm.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-5)
        assert not torch.allclose(item["features"], pre_norm["state"][0], rtol=0.1, atol=0.1)
        logits = model.lm_head(item["features"])
        scale = out.logits.abs().max()
        assert (logits - out.logits[0]).abs().max() < 0.02 * scale
        assert (logits.argmax(-1) == out.logits[0].argmax(-1)).float().mean() > 0.95


def test_fp8_round_trip_error_is_small_and_its_files_smaller(tmp_path, data, random_verifier_dir):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    p = preparer(recipe, random_verifier_dir, tmp_path / "cache")
    [source] = p.sources()
    [bf16] = p.build([source])
    [fp8] = build(recipe, random_verifier_dir, tmp_path / "cache", dtype="fp8_e4m3")
    assert fp8.directory != bf16.directory
    errors = {"bf16": [], "fp8": []}
    for position, sample in enumerate(source.samples):
        with torch.no_grad():
            true = p.verifier.model.model(input_ids=torch.tensor([sample.input_ids])).last_hidden_state[0]
        for name, cache in (("bf16", bf16), ("fp8", fp8)):
            assert cache[position]["features"].dtype == torch.float32
            errors[name].append(((cache[position]["features"] - true).norm() / true.norm()).item())
    assert max(errors["bf16"]) < 0.005
    assert max(errors["fp8"]) < 0.05
    assert sum(errors["fp8"]) > sum(errors["bf16"])  # it really is stored in 8 bits
    sizes = {name: sum(s["bytes"] for s in c.shards) for name, c in (("bf16", bf16), ("fp8", fp8))}
    assert sizes["fp8"] / sizes["bf16"] == pytest.approx(bytes_per_token([HIDDEN], "fp8_e4m3") / bytes_per_token([HIDDEN], "bfloat16"), abs=0.01)


def test_bytes_per_token_formula_and_files_on_disk(tmp_path, data, random_verifier_dir):
    assert bytes_per_token([HIDDEN], "bfloat16") == 2 * HIDDEN + 4 + 1  # features + int32 id + uint8 mask
    assert bytes_per_token([HIDDEN], "fp8_e4m3") == HIDDEN + 4 + 4 + 1  # + float32 per-token scale
    for hidden in (128, 4096):  # the tiny verifier, Llama-3-8B
        assert bytes_per_token([hidden], "bfloat16") / (2 * hidden) <= 1.05
        assert bytes_per_token([hidden], "fp8_e4m3") / bytes_per_token([hidden], "bfloat16") <= 0.55
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    for dtype in ("bfloat16", "fp8_e4m3"):
        [cache] = build(recipe, random_verifier_dir, tmp_path / "cache", dtype=dtype, shard_samples=5)
        assert len(cache.shards) == 3
        for shard in cache.shards:
            size = (cache.directory / shard["file"]).stat().st_size
            payload = shard["tokens"] * bytes_per_token([HIDDEN], dtype) + 8 * (shard["end"] - shard["start"] + 1)  # + int64 offsets
            assert size == shard["bytes"]
            assert payload <= size <= payload + 1024  # a small safetensors header, nothing per sample
        assert not list(cache.directory.glob("*.tmp")) and not list(cache.directory.glob(".*tmp"))


def test_killed_build_resumes_to_a_byte_identical_cache(tmp_path, data, random_verifier_dir, monkeypatch):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    [reference] = build(recipe, random_verifier_dir, tmp_path / "uninterrupted", shard_samples=4)
    assert len(reference.shards) == 3

    real_write, calls = feature_cache._write_shard, []

    def dies_after_the_first_shard(model, contract, samples, directory, span, *rest):
        if calls:
            (directory / f".shard-0000{len(calls)}.safetensors.999.tmp").write_bytes(b"half a shard")  # what a kill leaves
            raise KeyboardInterrupt
        calls.append(span)
        return real_write(model, contract, samples, directory, span, *rest)

    monkeypatch.setattr(feature_cache, "_write_shard", dies_after_the_first_shard)
    with pytest.raises(KeyboardInterrupt):
        build(recipe, random_verifier_dir, tmp_path / "resumed", shard_samples=4)
    directory = tmp_path / "resumed" / reference.directory.name
    assert sorted(f.name for f in directory.iterdir()) == [".shard-00001.safetensors.999.tmp", "shard-00000.safetensors"]  # no manifest yet
    p = preparer(recipe, random_verifier_dir, tmp_path / "resumed", shard_samples=4)
    [row] = p.estimate(p.sources())
    assert row["pending_tokens"] == row["tokens"] - reference.shards[0]["tokens"]  # the dry run's count: the shard on disk is done

    monkeypatch.setattr(feature_cache, "_write_shard", real_write)
    counter = ForwardCounter(monkeypatch)
    [resumed] = build(recipe, random_verifier_dir, tmp_path / "resumed", shard_samples=4)
    assert counter.samples == 12 - 4  # the complete shard file is adopted; only the missing shards ran through the verifier
    assert resumed.directory == directory
    assert {f.name: f.read_bytes() for f in directory.iterdir()} == {f.name: f.read_bytes() for f in reference.directory.iterdir()}
    assert resumed.shards == reference.shards and len(resumed) == 12


def test_a_shard_file_of_another_span_is_rebuilt_not_adopted(tmp_path, data, random_verifier_dir, monkeypatch):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    [reference] = build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    first = reference.directory / "shard-00000.safetensors"
    (reference.directory / "manifest.json").unlink()
    shutil.copy(reference.directory / "shard-00001.safetensors", first)  # complete, but covers positions 4:8
    counter = ForwardCounter(monkeypatch)
    [rebuilt] = build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    assert counter.samples == 4
    assert rebuilt.shards == reference.shards


def test_second_build_is_a_no_op(tmp_path, data, random_verifier_dir, monkeypatch):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    build(recipe, random_verifier_dir, tmp_path / "cache")
    before = files(tmp_path / "cache")
    ForwardCounter(monkeypatch, fail=True)
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("verifier loaded for a cached recipe"))
    [cache] = build(recipe, random_verifier_dir, tmp_path / "cache")
    assert len(cache) == 12
    assert files(tmp_path / "cache") == before


def test_a_cache_built_for_another_setup_is_refused(tmp_path, data, random_verifier_dir):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    p = preparer(recipe, random_verifier_dir, tmp_path / "cache")
    [source] = p.sources()
    [cache] = p.build([source])
    for field, value in (("max_length", 64), ("dtype", "fp8_e4m3"), ("source", "another-selection")):
        with pytest.raises(TapsError, match=f"built for a different setup \\(differs in: {field}\\); refusing"):
            FeatureCache(cache.directory, {**source.fingerprint, field: value})
        with pytest.raises(TapsError, match="refusing to use it"):
            writer = ShardWriter(lambda: p.verifier.model, EAGLE_FEATURES, HIDDEN, CacheSettings(), 0)
            writer.fill(source.samples, cache.directory, {**source.fingerprint, field: value}, shard_ranges(len(source.samples), 1024))


def test_fingerprint_follows_weights_and_chat_template(tmp_path, random_verifier_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    base = verifier_fingerprint(str(random_verifier_dir), tokenizer)
    retrained = tmp_path / "retrained"
    shutil.copytree(random_verifier_dir, retrained)
    model = LlamaForCausalLM.from_pretrained(retrained)
    with torch.no_grad():
        model.lm_head.weight.add_(1e-3)
    model.save_pretrained(retrained)
    other_weights = verifier_fingerprint(str(retrained), tokenizer)
    assert other_weights["weights"] != base["weights"] and other_weights["tokenizer"] == base["tokenizer"]
    tokenizer.chat_template = tokenizer.chat_template.replace("| trim", "")
    assert verifier_fingerprint(str(random_verifier_dir), tokenizer)["tokenizer"] != base["tokenizer"]
    assert (tmp_path / "home" / "weights_hashes.json").is_file()  # memoized under TAPS_HOME


def test_corrupt_shard_is_refused_on_first_read_with_the_rebuild_command(tmp_path, data, random_verifier_dir):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    [cache] = build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    shard = cache.directory / "shard-00001.safetensors"
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
    reopened = FeatureCache(cache.directory)  # same size: opening is cheap and succeeds
    assert reopened[0]["input_ids"].numel() > 0  # other shards still read
    with pytest.raises(TapsError, match=f"shard {shard} fails its checksum \\(corrupt\\); delete {cache.directory} and rebuild it with `taps-train cache"):
        reopened[5]
    with pytest.raises(TapsError, match="fails its checksum"):
        FeatureCache(cache.directory).verify()


def test_truncated_or_missing_shard_is_refused_at_open_and_the_hint_rebuilds_it(tmp_path, data, random_verifier_dir):
    recipe = write_recipe(tmp_path, "math", [(data["math"], 3, 9)])
    [cache] = build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    original = shard_bytes(cache.directory)
    shard = cache.directory / "shard-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    hint = f"delete {cache.directory} and rebuild it with `taps-train cache"
    with pytest.raises(TapsError, match=f"shard {shard} is missing or truncated; {hint}"):
        FeatureCache(cache.directory)
    with pytest.raises(TapsError, match="is missing or truncated"):  # a build does not trust it either
        build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    (cache.directory / "shard-00000.safetensors").unlink()
    with pytest.raises(TapsError, match=f"shard-00000.safetensors is missing or truncated; {hint}"):
        FeatureCache(cache.directory)
    shutil.rmtree(cache.directory)  # what the hint says
    [rebuilt] = build(recipe, random_verifier_dir, tmp_path / "cache", shard_samples=4)
    assert rebuilt.directory == cache.directory and shard_bytes(rebuilt.directory) == original


def test_mixture_reuses_its_sources_caches_without_writing_a_byte(tmp_path, data, random_verifier_dir, monkeypatch):
    cache_root = tmp_path / "cache"
    [math] = build(write_recipe(tmp_path, "math", [(data["math"], 3, 12)]), random_verifier_dir, cache_root, shard_samples=4)
    [chat] = build(write_recipe(tmp_path, "chat", [(data["chat"], 2, 10)]), random_verifier_dir, cache_root, shard_samples=4)
    before = files(cache_root)
    ForwardCounter(monkeypatch, fail=True)
    mixed = write_recipe(tmp_path, "mixed", [(data["math"], 3, 6), (data["chat"], 2, 5)])
    p = preparer(mixed, random_verifier_dir, cache_root, shard_samples=4)
    sources = p.sources()
    assert [row["new_bytes"] for row in p.estimate(sources)] == [0, 0]
    caches = p.build(sources)
    assert [c.directory for c in caches] == [math.directory, chat.directory]
    assert files(cache_root) == before
    assert sorted(d.name for d in cache_root.iterdir()) == sorted([math.directory.name, chat.directory.name])
    # The mixture's samples are the first positions of the single-source caches.
    for source, cache in zip(sources, caches):
        for position in [*source.heldout_positions, *source.train_positions]:
            assert cache[position]["input_ids"].tolist() == source.samples[position].input_ids


def test_growing_a_count_extends_the_cache_and_reuses_complete_shards(tmp_path, data, random_verifier_dir, monkeypatch):
    cache_root = tmp_path / "cache"
    [small] = build(write_recipe(tmp_path, "small", [(data["math"], 3, 3)]), random_verifier_dir, cache_root, shard_samples=4)
    assert [(s["start"], s["end"]) for s in small.shards] == [(0, 4), (4, 6)]
    first = files(small.directory)["shard-00000.safetensors"]
    counter = ForwardCounter(monkeypatch)
    [large] = build(write_recipe(tmp_path, "large", [(data["math"], 3, 9)]), random_verifier_dir, cache_root, shard_samples=4)
    assert large.directory == small.directory and len(large) == 12
    assert [(s["start"], s["end"]) for s in large.shards] == [(0, 4), (4, 8), (8, 12)]
    assert files(large.directory)["shard-00000.safetensors"] == first  # untouched
    assert counter.samples == 8  # the partial shard (4, 6) is redone as (4, 8), then (8, 12)
    [scratch] = build(write_recipe(tmp_path, "large", [(data["math"], 3, 9)]), random_verifier_dir, tmp_path / "scratch", shard_samples=4)
    assert shard_bytes(large.directory) == shard_bytes(scratch.directory)


def test_too_little_disk_fails_before_writing(tmp_path, data, random_verifier_dir, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(feature_cache.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    ForwardCounter(monkeypatch, fail=True)
    # in units that fit the size (issue 36; it read "needs ~0.00 GB but only 0.00 GB are free")
    with pytest.raises(TapsError, match=r"needs ~\d[\d.,]* (kB|MB) but only 1 kB are free; free space, choose another cache_dir"):
        build(write_recipe(tmp_path, "math", [(data["math"], 3, 9)]), random_verifier_dir, tmp_path / "cache")
    assert not [f for f in (tmp_path / "cache").rglob("*") if f.is_file()]


def test_dry_run_prints_tokens_and_size_and_writes_nothing(tmp_path, data, random_verifier_dir, monkeypatch, capsys):
    recipe = write_recipe(tmp_path, "mixed", [(data["math"], 3, 9), (data["chat"], 2, 6)])
    p = preparer(recipe, random_verifier_dir, tmp_path / "cache")
    tokens = [sum(len(s.input_ids) for s in source.samples) for source in p.sources()]
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("dry run loaded the verifier"))
    main(["cache", "--recipe", str(recipe), "--verifier", str(random_verifier_dir), "--cache-dir", str(tmp_path / "cache"), "--dry-run", "--no-time"])
    out = capsys.readouterr().out
    megabytes = sum(tokens) * bytes_per_token([HIDDEN], "bfloat16") / 1e6
    assert f"total: {sum(tokens):,} tokens, {megabytes:,.1f} MB to write (bfloat16)" in out
    assert f"jsonl[0]: 12 samples, {tokens[0]:,} tokens" in out and f"jsonl[1]: 8 samples, {tokens[1]:,} tokens" in out
    assert not list((tmp_path / "cache").rglob("*.safetensors")) and not list((tmp_path / "cache").rglob("manifest.json"))


def test_index_reads_and_no_file_per_sample(tmp_path, data, random_verifier_dir):
    """Samples are slices of packed shards at the offsets the index gives."""
    [cache] = build(write_recipe(tmp_path, "math", [(data["math"], 3, 9)]), random_verifier_dir, tmp_path / "cache", shard_samples=5)
    lengths = [cache.length(p) for p in range(len(cache))]
    assert [len(cache[p]["input_ids"]) for p in range(len(cache))] == lengths
    assert sum(lengths) == sum(s["tokens"] for s in cache.shards)
    with pytest.raises(IndexError):
        cache[len(cache)]
    assert len(os.listdir(cache.directory)) == 1 + len(cache.shards)  # manifest + shards, no file per sample
