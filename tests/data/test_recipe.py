"""Recipes: shipped YAMLs validate; bad recipes fail early naming file and field; selections are
seeded, disjoint, prefix-stable and de-duplicated; bad records are counted, good ones kept."""

import json
from pathlib import Path

import pytest

from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import Regenerate, load_recipe, select
from taps_train.data.sources import GsmSymbolic, MathInstruct, ShareGPT
from taps_train.errors import TapsError

RECIPES = sorted((Path(__file__).parents[2] / "data_recipes").glob("*.yaml"))
HUB_RECIPES = {"mathinstruct_70k", "sharegpt_70k", "mixed_35k_35k", "mixed_70k_70k"}


def conversation(i: int, form: str = "sharegpt") -> dict:
    if form == "sharegpt":
        return {"id": f"s{i}", "conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}]}
    return {"id": f"o{i}", "messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_recipe(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_every_shipped_recipe_parses_and_validates(path):
    recipe = load_recipe(path)  # hub recipes: validated only, their data is never fetched
    assert recipe.name == path.stem
    assert recipe.sources and all(s.count > 0 and s.heldout > 0 for s in recipe.sources)
    assert isinstance(recipe.max_length, int) and recipe.max_length >= 256
    if recipe.name in HUB_RECIPES:
        assert {s.source for s in recipe.sources} <= {"mathinstruct", "sharegpt"}
        assert not any(s.args for s in recipe.sources)
    else:
        assert all(s.source in ("gsm_symbolic", "sharegpt") for s in recipe.sources)


def test_paper_and_offline_mixtures_are_prefixes_of_their_single_source_recipes():
    """Same source args, seed, held-out size and max length: mixtures reuse the single-source caches."""
    recipes = {p.stem: load_recipe(p) for p in RECIPES}

    for mixture, singles in {
        "mixed_35k_35k": ("mathinstruct_70k", "sharegpt_70k"),
        "mixed_70k_70k": ("mathinstruct_70k", "sharegpt_70k"),
        "tiny_mixed": ("tiny_math", "tiny_chat"),
        "tiny_mixed_large": ("tiny_math", "tiny_chat"),
        "tiny_mixed3": ("tiny_math", "tiny_prose", "tiny_code"),
    }.items():
        for single in singles:
            source = recipes[single].sources[0]
            matching = [s for s in recipes[mixture].sources if (s.source, s.args) == (source.source, source.args)]
            assert len(matching) == 1, f"{mixture} has no source like {single}'s"
            assert [(s.heldout, s.regenerate) for s in matching] == [(source.heldout, source.regenerate)]
            assert (recipes[mixture].seed, recipes[mixture].max_length) == (recipes[single].seed, recipes[single].max_length)
            assert matching[0].count <= source.count


def test_offline_recipes_fit_their_pools():
    recipe = load_recipe(next(p for p in RECIPES if p.stem == "tiny_mixed_large"))
    for selection in recipe.sources:
        selected = select(selection, recipe.seed)
        assert (len(selected.heldout), len(selected.train)) == (selection.heldout, selection.count)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nsources:\n  - {source: nosuch, count: 3}\n", r"sources\[0\]: unknown source 'nosuch'; known sources: sharegpt"),
        ("name: x\nepochs: 3\nsources:\n  - {source: gsm_symbolic, count: 3}\n", r"unknown field\(s\) \['epochs'\]"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, cuont: 3}\n", r"sources\[0\]: unknown field\(s\) \['cuont'\]"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: -5}\n", r"sources\[0\]\.count must be a non-negative integer, got -5"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: 2, heldout: -1}\n", r"sources\[0\]\.heldout must be a non-negative integer, got -1"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: 2.5}\n", r"sources\[0\]\.count must be a non-negative integer, got 2.5"),
        ("name: x\nsources:\n  - {source: gsm_symbolic}\n", r"sources\[0\]: set 'count'"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: 2, args: {sise: 3}}\n", r"sources\[0\]\.args: unknown field\(s\) \['sise'\]"),
        ("name: x\nsources:\n  - {source: jsonl, count: 2, args: {path: /no/such/file.jsonl}}\n", r"sources\[0\]\.args\.path /no/such/file.jsonl does not exist"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: 2, regenerate: {temprature: 1}}\n", r"sources\[0\]\.regenerate: unknown field\(s\) \['temprature'\]"),
        ("name: x\nsources:\n  - {source: gsm_symbolic, count: 2, regenerate: often}\n", r"sources\[0\]\.regenerate must be true, false or a mapping"),
        ("name: x\nmax_length: 1\nsources:\n  - {source: gsm_symbolic, count: 2}\n", r"max_length must be an integer >= 2"),
        ("name: x\nsources: []\n", r"'sources' must be a non-empty list"),
        ("- just a list\n", r"must be a mapping"),
        ("name: [unclosed\n", r"is not valid YAML"),
    ],
)
def test_bad_recipe_names_the_file_and_the_field(tmp_path, text, message):
    path = write_recipe(tmp_path, text)
    with pytest.raises(TapsError, match=message) as error:
        load_recipe(path)
    assert str(path) in str(error.value)


def test_missing_recipe_file(tmp_path):
    with pytest.raises(TapsError, match=f"cannot read recipe {tmp_path}/absent.yaml"):
        load_recipe(tmp_path / "absent.yaml")


def test_regenerate_option_forms(tmp_path):
    path = write_recipe(tmp_path, "sources:\n  - {source: gsm_symbolic, count: 2, regenerate: true}\n"
                        "  - {source: gsm_symbolic, count: 2, regenerate: false}\n"
                        "  - {source: gsm_symbolic, count: 2, regenerate: {temperature: 0.7, seed: 3}}\n")
    recipe = load_recipe(path)
    assert recipe.name == "recipe"
    assert [s.regenerate for s in recipe.sources] == [Regenerate(), None, Regenerate(temperature=0.7, seed=3)]


def test_counts_larger_than_the_pool_fail_before_any_verifier_work(tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "data.jsonl", [conversation(i) for i in range(3)])
    path = write_recipe(tmp_path, f"sources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: 1, count: 3}}\n")
    recipe = load_recipe(path)
    monkeypatch.setattr("taps_train.data.prepare.load_verifier", lambda *a, **k: pytest.fail("verifier loaded"))
    with pytest.raises(TapsError, match=r"has 3 usable samples but the recipe asks for 1 held-out \+ 3 training; lower the counts"):
        RecipePreparer(recipe, verifier=str(tmp_path / "no-verifier-here"), cache_root=tmp_path / "cache")


def pool_selection(tmp_path: Path, size: int, heldout: int, count: int, seed: int = 0):
    data = tmp_path / "pool.jsonl"
    if not data.exists():
        write_jsonl(data, [conversation(i, "sharegpt" if i % 2 else "openai") for i in range(size)])
    path = write_recipe(tmp_path, f"seed: {seed}\nsources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: {heldout}, count: {count}}}\n",
                        name=f"r{heldout}-{count}-{seed}.yaml")
    recipe = load_recipe(path)
    return select(recipe.sources[0], recipe.seed)


def test_heldout_and_train_never_overlap_and_smaller_counts_are_prefixes(tmp_path):
    full = pool_selection(tmp_path, 40, heldout=6, count=34)
    small = pool_selection(tmp_path, 40, heldout=6, count=10)
    train_ids, heldout_ids = [c.id for c in full.train], [c.id for c in full.heldout]
    assert len(heldout_ids) == 6 and len(train_ids) == 34
    assert not set(train_ids) & set(heldout_ids)
    assert sorted(train_ids + heldout_ids) == sorted({f"s{i}" if i % 2 else f"o{i}" for i in range(40)})
    assert [c.id for c in small.heldout] == heldout_ids
    assert [c.id for c in small.train] == train_ids[:10]
    assert small.key == full.key  # one cache serves both counts
    assert train_ids != sorted(train_ids)  # seeded shuffle, not file order


def test_selection_key_depends_on_seed_and_heldout_but_not_count(tmp_path):
    base = pool_selection(tmp_path, 20, heldout=4, count=8)
    assert pool_selection(tmp_path, 20, heldout=4, count=16).key == base.key
    assert pool_selection(tmp_path, 20, heldout=5, count=8).key != base.key
    other_seed = pool_selection(tmp_path, 20, heldout=4, count=8, seed=1)
    assert other_seed.key != base.key
    assert [c.id for c in other_seed.heldout + other_seed.train] != [c.id for c in base.heldout + base.train]


def test_duplicate_conversations_are_dropped_and_counted(tmp_path):
    records = [conversation(i) for i in range(5)]
    records += [dict(records[1], id="dup-a"), dict(records[3], id="dup-b"), conversation(1, "openai")]  # same messages, other ids/forms
    data = write_jsonl(tmp_path / "dups.jsonl", records)
    selected = select(load_recipe(write_recipe(tmp_path, f"sources:\n  - {{source: jsonl, args: {{path: {data}}}, count: 5}}\n")).sources[0], 0)
    assert selected.duplicates == 3
    assert sorted(c.id for c in selected.train) == ["s0", "s1", "s2", "s3", "s4"]
    with pytest.raises(TapsError, match="has 5 usable samples"):
        select(load_recipe(write_recipe(tmp_path, f"sources:\n  - {{source: jsonl, args: {{path: {data}}}, count: 6}}\n", "six.yaml")).sources[0], 0)


def test_bad_records_are_skipped_and_counted_by_reason_without_losing_good_ones(tmp_path):
    good = [conversation(i, "sharegpt" if i % 2 else "openai") for i in range(8)]
    bad_lines = [
        json.dumps({"id": "b1", "text": "no turns"}),
        json.dumps({"id": "b2", "conversations": [{"from": "robot", "value": "beep"}, {"from": "gpt", "value": "x"}]}),
        json.dumps({"id": "b3", "messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": "x"}]}),
        json.dumps({"id": "b4", "messages": [{"role": "user", "content": ["not", "a", "string"]}, {"role": "assistant", "content": "x"}]}),
        json.dumps({"id": "b5", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}),
        '{"id": "b6", "messages": [{"role": "user", "content": "trunc',
        json.dumps([1, 2, 3]),
    ]
    lines = [json.dumps(r).encode() for r in good]
    mixed = []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i < len(bad_lines):
            mixed.append(bad_lines[i].encode())
    mixed.insert(3, json.dumps(conversation(99)).encode().replace(b"answer 99", b"answer \xff\xfe 99"))
    data = tmp_path / "messy.jsonl"
    data.write_bytes(b"\n".join(mixed))
    selected = select(load_recipe(write_recipe(tmp_path, f"sources:\n  - {{source: jsonl, args: {{path: {data}}}, heldout: 2, count: 6}}\n")).sources[0], 0)
    assert sorted(c.id for c in selected.heldout + selected.train) == sorted(r["id"] for r in good)
    assert dict(selected.report.problems) == {
        "no 'conversations' or 'messages' list": 1,
        "unknown role": 1,
        "empty or non-string turn": 2,
        "no assistant turn": 1,
        "invalid JSON line": 1,
        "record is not an object": 1,
        "invalid UTF-8 text": 1,
    }
    summary = selected.report.summary()
    assert summary.startswith(f"16 records read from {data}") and "1 skipped: unknown role" in summary  # the undecodable line counts


def test_truncated_json_file_keeps_every_complete_record(tmp_path):
    records = [conversation(i) for i in range(6)]
    text = json.dumps(records, indent=1)
    data = tmp_path / "cut.json"
    data.write_text(text[: text.index('"s5"') + 30])  # cut inside the last record
    selected = select(load_recipe(write_recipe(tmp_path, f"sources:\n  - {{source: jsonl, args: {{path: {data}}}, count: 5}}\n")).sources[0], 0)
    assert sorted(c.id for c in selected.train) == [f"s{i}" for i in range(5)]
    assert selected.report.truncated_tail_chars > 0
    assert "truncated tail" in selected.report.summary()


def test_local_sharegpt_and_mathinstruct_files(tmp_path):
    sharegpt = write_jsonl(tmp_path / "sg.jsonl", [conversation(i) for i in range(3)])
    conversations, report = ShareGPT(location=str(sharegpt)).load()
    assert [c.id for c in conversations] == ["s0", "s1", "s2"] and report.records == 3
    math = tmp_path / "math.json"
    math.write_text(json.dumps([{"instruction": "1+1?", "output": "2"}, {"instruction": "no output"}, {"instruction": "2+2?", "output": "4"}]))
    conversations, report = MathInstruct(location=str(math)).load()
    assert [c.messages for c in conversations] == [
        [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    ]
    assert dict(report.problems) == {"empty or non-string turn": 1}
    with pytest.raises(TapsError, match="does not exist or is not a file"):
        ShareGPT(location=str(tmp_path / "absent.json")).path()


def test_gsm_symbolic_pool_is_seeded():
    first, _ = GsmSymbolic(size=5, seed=3).load()
    again, _ = GsmSymbolic(size=5, seed=3).load()
    other, _ = GsmSymbolic(size=5, seed=4).load()
    assert [c.messages for c in first] == [c.messages for c in again] != [c.messages for c in other]
    assert all([m["role"] for m in c.messages] == ["user", "assistant"] for c in first)
