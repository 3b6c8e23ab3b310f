"""`taps-train cache`: build, no-op second call, dry run, fp8, checks, and one-line errors."""

import json
import re
from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.data import feature_cache
from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.data.feature_cache import CacheSettings, length_batches
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe

ROOT = Path(__file__).parents[2]


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


@pytest.fixture
def recipe(tmp_path) -> Path:
    data = tmp_path / "data.jsonl"
    records = [{"id": c.id, "messages": [m | {"content": m["content"][:120]} for m in c.messages]} for c in gsm_symbolic_conversations(12, seed=31)]
    data.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"messages": [{"role": "user", "content": "no reply"}]}\n')
    path = tmp_path / "recipe.yaml"
    path.write_text(f"name: cli\nmax_length: 96\nsources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: 2, count: 8}}\n")
    return path


def cache(recipe: Path, verifier: Path, *extra: str) -> None:
    main(["cache", "--recipe", str(recipe), "--verifier", str(verifier), *extra])


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(root.rglob("*")) if f.is_file()}


def test_build_then_second_call_is_a_no_op(recipe, random_verifier_dir, tmp_path, capsys):
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    out = capsys.readouterr().out
    assert "jsonl: 13 records read" in out and "1 skipped: no assistant turn" in out and "0 duplicates dropped" in out
    assert "ready: " in out and "(10 samples)" in out
    assert " 0.0 MB to write" not in out.split("total:")[1]
    before = snapshot(tmp_path / "cache")
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    out = capsys.readouterr().out
    assert "total:" in out and "0.0 MB to write (bfloat16)" in out and "ready: " in out
    assert snapshot(tmp_path / "cache") == before


def test_default_cache_dir_is_under_taps_home(recipe, random_verifier_dir, taps_home, capsys):
    cache(recipe, random_verifier_dir)
    assert f"ready: {taps_home / 'features'}" in capsys.readouterr().out
    assert len(list((taps_home / "features").glob("*/manifest.json"))) == 1


def test_fp8_cache_is_a_separate_smaller_cache(recipe, random_verifier_dir, tmp_path):
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"), "--dtype", "fp8_e4m3")
    manifests = {json.loads(m.read_text())["fingerprint"]["dtype"]: json.loads(m.read_text()) for m in (tmp_path / "cache").glob("*/manifest.json")}
    assert set(manifests) == {"bfloat16", "fp8_e4m3"}
    size = {dtype: sum(s["bytes"] for s in m["shards"]) for dtype, m in manifests.items()}
    assert size["fp8_e4m3"] < 0.7 * size["bfloat16"]


def test_dry_run_without_time_loads_no_verifier(recipe, random_verifier_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("dry run loaded the verifier"))
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"), "--dry-run", "--no-time")
    out = capsys.readouterr().out
    assert "jsonl[0]: 10 samples" in out and "MB to write (bfloat16)" in out and "ready" not in out and "build time" not in out
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


def test_dry_run_times_a_batch_of_the_build_and_estimates_the_time_left(recipe, random_verifier_dir, tmp_path, monkeypatch, capsys):
    batches, real = [], feature_cache.verifier_features

    def recorded(model, samples, *args):
        batches.append([len(s.input_ids) for s in samples])
        return real(model, samples, *args)

    monkeypatch.setattr(feature_cache, "verifier_features", recorded)
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"), "--dry-run")
    out = capsys.readouterr().out
    total = int(re.search(r"total: ([\d,]+) tokens", out)[1].replace(",", ""))
    rate, tokens, samples, batch_samples = re.search(r"jsonl\[0\]: ([\d,]+) tokens/s, measured on ([\d,]+) tokens "
                                                     r"\((\d+) of a batch of (\d+) samples\) in [\d.]+ s after a warm-up", out).groups()
    seconds, pending = re.search(r"estimated build time: ([\d.e+-]+) s for ([\d,]+) tokens still to compute "
                                 r"\(verifier loading not included\)", out).groups()
    assert float(seconds) > 0 and int(pending.replace(",", "")) == total  # nothing built yet
    assert float(seconds) == pytest.approx(total / float(rate.replace(",", "")), rel=0.06)  # printed to 2 significant digits
    assert len(batches[0]) == 1 and len(batches[-1]) == int(samples) and sum(batches[-1]) == int(tokens.replace(",", ""))  # a warm-up, then the batch
    [source] = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache").sources()
    lengths = [len(s.input_ids) for s in source.samples]
    plan = [[lengths[i] for i in batch] for batch in length_batches(lengths, CacheSettings().batch_tokens)]
    assert int(samples) == int(batch_samples) and batches[-1] in plan  # a whole batch of the build (the tiny verifier is fast)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))


def test_dry_run_of_a_complete_cache_estimates_no_time_and_loads_no_verifier(recipe, random_verifier_dir, tmp_path, monkeypatch, capsys):
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    capsys.readouterr()
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("dry run loaded the verifier"))
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"), "--dry-run")
    assert "estimated build time: 0 s (every shard is on disk)" in capsys.readouterr().out


def test_verify_reports_a_corrupt_shard_as_one_line_with_the_rebuild_command(recipe, random_verifier_dir, tmp_path, capsys):
    cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    [shard] = (tmp_path / "cache").glob("*/shard-00000*.safetensors")  # a short last shard is named by its end too
    blob = bytearray(shard.read_bytes())
    blob[-10] ^= 0x01
    shard.write_bytes(bytes(blob))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        cache(recipe, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]  # progress bars may precede it
    assert line.startswith(f"taps-train: error: feature cache shard {shard} fails its checksum") and "taps-train cache --recipe" in line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sources:\n  - {source: nosuch, count: 3}\n", "sources[0]: unknown source 'nosuch'"),
        ("sources:\n  - {source: gsm_symbolic, args: {size: 5, seed: 0}, count: 9}\n", "has 5 usable samples but the recipe asks for 0 held-out + 9 training"),
    ],
)
def test_bad_recipe_is_one_line_before_any_verifier_work(tmp_path, random_verifier_dir, capsys, monkeypatch, text, message):
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("verifier loaded"))
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        cache(path, random_verifier_dir, "--cache-dir", str(tmp_path / "cache"))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("taps-train: error: ") and message in err  # no progress bar: nothing ran


@pytest.mark.integration
def test_tiny_mixed_builds_and_a_second_call_is_a_no_op(tiny_verifier_dir, tmp_path, capsys, monkeypatch):
    recipe = ROOT / "data_recipes" / "tiny_mixed.yaml"
    args = ["cache", "--recipe", str(recipe), "--verifier", str(tiny_verifier_dir), "--cache-dir", str(tmp_path / "cache")]  # TAPS_HOME is a tmp dir here
    main(args)
    out = capsys.readouterr().out
    assert out.count("ready: ") == 2 and "(1200 samples)" in out
    assert "sharegpt: 17671 records read" in out and "truncated tail" in out
    before = snapshot(tmp_path / "cache")
    monkeypatch.setattr(feature_cache, "verifier_features", lambda *a: pytest.fail("second call ran the verifier"))
    main(args)
    assert "0.0 MB to write (bfloat16)" in capsys.readouterr().out
    assert snapshot(tmp_path / "cache") == before
