"""Benchmarks: hub layouts parse from local fixtures and through the hub code path; bad records are
counted, empty sets and unknown names are clear errors; offline held-out sets never hold a training
prompt; generated sets are deterministic."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taps_train.data.recipe import load_recipe, select
from taps_train.data.records import read_records
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import (
    OFFLINE_SEED,
    Prompt,
    load_benchmark,
    make_benchmark,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"
REPO = Path(__file__).parents[2]
HUB_FIXTURES = {"mt_bench": "mt_bench.jsonl", "gsm8k": "gsm8k.jsonl", "math500": "math500.jsonl", "svamp": "svamp.json"}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mt_bench_fixture_gives_both_turns_in_order():
    prompts, report = load_benchmark(f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}")
    assert [p.id for p in prompts] == ["11111111", "22222222", "33333333", "44444444"]
    assert all(len(p.turns) == 2 for p in prompts)
    turns = ["A shop sells pens at 3 for $2. How much do 12 pens cost?", "And how many pens can you buy with $10?"]
    assert prompts[1] == Prompt("22222222", turns, "$8")
    assert prompts[0].reference is None
    assert report.records == 4 and not report.problems


@pytest.mark.parametrize(
    ("name", "ids", "first_turn", "references"),
    [
        ("gsm8k", ["gsm8k:0", "gsm8k:1", "gsm8k:2"], "Mia has 4 boxes with 6 apples in each box.", ["19", "220", "8"]),
        ("math500", ["test/number_theory/9001.json", "test/prealgebra/9002.json", "test/algebra/9003.json"], "What is the remainder when", ["2", "\\frac{2}{3}", "5"]),
        ("svamp", ["chal-901", "chal-902", "chal-903"], "There are 14 birds on a fence. 6 more birds land on the fence . How many birds", ["20", "18", "5.333333333333333"]),
    ],
)
def test_single_turn_fixtures_parse_to_question_and_gold_answer(name, ids, first_turn, references):
    prompts, report = load_benchmark(f"{name}:{FIXTURES / HUB_FIXTURES[name]}")
    assert [p.id for p in prompts] == ids
    assert [p.reference for p in prompts] == references
    assert all(len(p.turns) == 1 for p in prompts)
    assert prompts[0].turns[0].startswith(first_turn)
    assert report.records == 3 and not report.problems


def test_svamp_prompt_is_body_then_question():
    prompt = load_benchmark(f"svamp:{FIXTURES / 'svamp.json'}")[0][1]
    assert prompt.turns == ["Sara had 30 stickers. She gave 12 stickers to her friend . How many stickers does Sara have left?"]


@pytest.mark.parametrize("name", sorted(HUB_FIXTURES))
def test_hub_load_goes_through_the_same_parser_as_a_local_copy(name, monkeypatch):
    """The hub path (datasets rows) and the local-file path give the same prompts for the same records."""
    import datasets

    calls = []

    def fake_load_dataset(path, config=None, *, split=None, revision=None):
        calls.append((path, config, split, revision))
        return datasets.Dataset.from_list(list(read_records(FIXTURES / HUB_FIXTURES[name])))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    benchmark = make_benchmark(name)
    from_hub = benchmark.load()
    assert calls == [(benchmark.location, benchmark.config, benchmark.split, None)]
    assert from_hub == load_benchmark(f"{name}:{FIXTURES / HUB_FIXTURES[name]}")[0]
    assert benchmark.report.records == len(from_hub) and benchmark.report.path.startswith(f"hub dataset {benchmark.location}")


def test_hub_ids_and_splits_are_the_published_ones():
    got = {name: (b.location, b.config, b.split) for name in HUB_FIXTURES for b in [make_benchmark(name)]}
    assert got == {
        "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
        "gsm8k": ("openai/gsm8k", "main", "test"),
        "math500": ("HuggingFaceH4/MATH-500", None, "test"),
        "svamp": ("ChilleD/SVAMP", None, "test"),
    }


def test_unreachable_hub_is_one_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):  # what datasets raises with HF_HUB_OFFLINE=1 or no network
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(TapsError, match=r"^benchmark gsm8k: cannot load hub dataset openai/gsm8k \(main config, test split\) \(ConnectionError: .*'gsm8k:path/to/file.jsonl'"):
        load_benchmark("gsm8k")


def test_limit_takes_the_first_prompts():
    everything, _ = load_benchmark(f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}")
    assert load_benchmark(f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}", limit=2)[0] == everything[:2]
    assert load_benchmark(f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}", limit=99)[0] == everything
    with pytest.raises(TapsError, match="benchmark mt_bench: limit must be a positive integer or None, got 0"):
        load_benchmark(f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}", limit=0)


def test_damaged_records_are_skipped_and_counted():
    prompts, report = load_benchmark(f"gsm8k:{FIXTURES / 'gsm8k_damaged.jsonl'}")
    assert [p.reference for p in prompts] == ["6", "12"]
    assert [p.id for p in prompts] == ["gsm8k:0", "gsm8k:4"]  # ids follow the record, not the survivors
    assert report.records == 5
    assert report.problems == {
        "invalid JSON line": 1,
        "record is not an object": 1,
        "missing or empty 'question'": 1,
        "'answer' has no final '#### <number>'": 1,
    }
    assert "1 skipped: missing or empty 'question'" in report.summary()


@pytest.mark.parametrize(
    ("name", "bad", "reason"),
    [
        ("mt_bench", {"prompt": "one string, not a list", "prompt_id": 1}, "'prompt' is not a non-empty list of turns"),
        ("mt_bench", {"prompt": ["fine", ""], "prompt_id": 1}, "'prompt' has an empty, non-string or invalid UTF-8 turn"),
        ("math500", {"problem": "What is 1 + 1?", "unique_id": "x"}, "missing or empty 'answer'"),
        ("svamp", {"ID": "x", "Body": "A story .", "Question": "How many?", "Answer": "seven"}, "'Answer' is not a number"),
    ],
)
def test_malformed_record_is_counted_under_its_field(tmp_path, name, bad, reason):
    good = list(read_records(FIXTURES / HUB_FIXTURES[name]))[:1]
    prompts, report = load_benchmark(f"{name}:{write_jsonl(tmp_path / 'b.jsonl', good + [bad])}")
    assert len(prompts) == 1 and report.problems == {reason: 1}


def test_empty_benchmark_is_an_error(tmp_path):
    with pytest.raises(TapsError, match=r"^benchmark svamp: no usable prompts \(0 records read from .*empty.jsonl\); point it at a file in the svamp field layout"):
        load_benchmark(f"svamp:{write_jsonl(tmp_path / 'empty.jsonl', [])}")
    with pytest.raises(TapsError, match=r"benchmark gsm8k: no usable prompts \(1 records read .*; 1 skipped: missing or empty 'question'\)"):
        load_benchmark(f"gsm8k:{write_jsonl(tmp_path / 'wrong.jsonl', [{'Body': 'svamp layout', 'Answer': 1}])}")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: load_benchmark("gsm9k"), r"^unknown benchmark 'gsm9k'; known benchmarks: mt_bench, gsm8k, math500, svamp, chat_heldout, code_heldout, prose_heldout, math_heldout, arith_offline, legs_offline$"),
        (lambda: make_benchmark("gsm9k"), r"^unknown benchmark 'gsm9k'; known benchmarks: mt_bench, gsm8k"),
        (lambda: load_benchmark("arith_offline:some/file.jsonl"), r"^benchmark arith_offline is generated offline and takes no file"),
        (lambda: load_benchmark("gsm8k:"), r"^benchmark spec 'gsm8k:' has nothing after ':'"),
        (lambda: load_benchmark("gsm8k:./missing.jsonl"), r"^benchmark gsm8k: ./missing.jsonl is not a file; give a JSON/JSONL file"),
        (lambda: make_benchmark("gsm8k", locaton="x"), r"^bad arguments for benchmark 'gsm8k': .*'locaton'; allowed: location, config, split, revision$"),
        (lambda: make_benchmark("legs_offline", size=0).load(), r"^benchmark legs_offline: size must be a positive integer, got 0$"),
        (lambda: make_benchmark("arith_offline", generator="no_such_generator").load(), r"^benchmark arith_offline: reasoning-gym cannot make 'no_such_generator'"),
        (lambda: load_benchmark("chat_heldout:nowhere.yaml"), r"^benchmark chat_heldout: recipe nowhere.yaml not found"),
    ],
)
def test_bad_names_arguments_and_paths_are_one_line_errors(call, message):
    with pytest.raises(TapsError, match=message):
        call()


@pytest.fixture(scope="module", params=["chat_heldout", "code_heldout", "prose_heldout", "math_heldout"])
def heldout(request):
    """A shipped offline recipe's held-out benchmark with its recipe split, computed independently."""
    benchmark = make_benchmark(request.param)
    prompts = benchmark.load()
    recipe = load_recipe(REPO / benchmark.recipe)
    (selected,) = [select(s, recipe.seed) for s in recipe.sources]
    return benchmark, prompts, selected


def test_heldout_prompts_are_the_recipes_heldout_openings(heldout):
    benchmark, prompts, selected = heldout
    by_id, kept = {c.id: c for c in selected.heldout}, {p.id for p in prompts}
    assert len(by_id) == len(selected.heldout) and [p.id for p in prompts] == [c.id for c in selected.heldout if c.id in kept]
    for prompt in prompts:
        messages = [m for m in by_id[prompt.id].messages if m["role"] != "system"]  # a system prompt is context, not the opening
        assert messages[0]["role"] == "user"
        assert prompt.turns == [messages[0]["content"]]
        assert prompt.reference == messages[1]["content"]
    assert len(prompts) + sum(benchmark.report.problems.values()) == len(selected.heldout) == benchmark.report.records


def test_heldout_prompts_never_appear_in_training(heldout):
    _, prompts, selected = heldout
    trained = {m["content"] for c in selected.train for m in c.messages if m["role"] == "user"}
    assert not trained & {p.turns[0] for p in prompts}
    assert not {c.id for c in selected.train} & {p.id for p in prompts}
    assert len({p.turns[0] for p in prompts}) == len(prompts)


def test_shipped_heldout_sizes(heldout):
    benchmark, prompts, _ = heldout
    if benchmark.name == "math_heldout":  # gsm_symbolic problems are all fresh openings with a CoT answer
        assert len(prompts) == 200 and not benchmark.report.problems
        assert all(p.reference.rstrip().rpartition("####")[2].strip() for p in prompts)
    else:  # ShareGPT splits long chats: fragments that open with the assistant are counted, not used
        assert 100 <= len(prompts) < 200
        assert benchmark.report.problems["starts mid-conversation (first turn is not the user's)"] > 0
    if benchmark.name in ("code_heldout", "prose_heldout"):  # the topic of the whole conversation, not only the opening's reply
        assert sum("```" in p.reference for p in prompts) > (len(prompts) // 2 if benchmark.name == "code_heldout" else -1)
        assert benchmark.name == "code_heldout" or not any("```" in p.reference for p in prompts)


def test_heldout_recipe_resolves_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(load_benchmark("math_heldout", limit=3)[0]) == 3


def _recipe(tmp_path: Path, conversations: list[list[tuple[str, str]]], heldout: int, count: int) -> Path:
    records = [{"id": f"c{i}", "messages": [{"role": r, "content": t} for r, t in turns]} for i, turns in enumerate(conversations)]
    data = write_jsonl(tmp_path / "pool.jsonl", records)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: r\nsources:\n  - source: jsonl\n    args: {{path: {data}}}\n    heldout: {heldout}\n    count: {count}\n")
    return recipe


def test_fragments_and_repeated_openings_are_counted(tmp_path):
    recipe = _recipe(
        tmp_path,
        [
            [("user", "q1"), ("assistant", "a1")],
            [("assistant", "an answer to something earlier"), ("user", "continue"), ("assistant", "more")],
            [("user", "q1"), ("assistant", "another a1")],
            [("system", "be brief"), ("user", "q2"), ("assistant", "a2")],
        ],
        heldout=4,
        count=0,
    )
    prompts, report = load_benchmark(f"chat_heldout:{recipe}")
    assert sorted((p.turns, p.reference is not None) for p in prompts) == [(["q1"], True), (["q2"], True)]
    assert report.problems == {"starts mid-conversation (first turn is not the user's)": 1, "repeated opening turn": 1}


def test_heldout_opening_that_is_a_training_prompt_is_never_used(tmp_path):
    pool = [[("user", "same question"), ("assistant", "answer one")], [("user", "same question"), ("assistant", "answer two")]]
    recipe = _recipe(tmp_path, pool, heldout=1, count=1)
    with pytest.raises(TapsError, match=r"^benchmark math_heldout: no usable prompts \(1 records read .*1 skipped: opening turn is also a training prompt\)"):
        load_benchmark(f"math_heldout:{recipe}")


@pytest.mark.parametrize("name", ["arith_offline", "legs_offline"])
def test_generated_sets_are_deterministic_and_unseeded_by_training(name):
    benchmark = make_benchmark(name)
    prompts = benchmark.load()
    assert len(prompts) == 200 and prompts == make_benchmark(name).load()
    assert benchmark.seed == OFFLINE_SEED and OFFLINE_SEED not in (1, *range(10_000, 30_000))
    assert make_benchmark(name, seed=OFFLINE_SEED + 1).load(limit=20) != prompts[:20]
    assert all(p.reference and p.turns[0].strip() for p in prompts)


def test_generated_sets_match_across_processes():
    """Another interpreter with another hash seed draws the same problems (no set-order dependence)."""
    code = "from taps_train.eval.benchmarks import load_benchmark; print(repr([load_benchmark(n)[0] for n in ('arith_offline', 'legs_offline')]))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr([load_benchmark(n)[0] for n in ("arith_offline", "legs_offline")])
