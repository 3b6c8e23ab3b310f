"""A benchmark that skips records says so in one stderr line (usable of read, skipped by reason), so a
held-out set smaller than its recipe's split (chat_heldout: ShareGPT fragments) is never silent."""

from taps_train.eval.benchmarks import load_benchmark
from tests.eval.test_benchmarks import FIXTURES, _recipe


def test_recipe_heldout_says_how_many_openings_it_could_use(tmp_path, capsys):
    recipe = _recipe(tmp_path, [
        [("user", "q1"), ("assistant", "a1")],
        [("assistant", "an answer to something earlier"), ("user", "continue"), ("assistant", "more")],
        [("user", "q2"), ("assistant", "a2")],
        [("user", "q3"), ("assistant", "a3")],
    ], heldout=4, count=0)
    prompts, _ = load_benchmark(f"chat_heldout:{recipe}", limit=2)
    assert len(prompts) == 2
    assert capsys.readouterr().err == (
        f"chat_heldout: 3 usable prompts of 4 records read from held-out split of recipe {recipe}; "
        "1 skipped: starts mid-conversation (first turn is not the user's); using the first 2\n")


def test_local_file_with_bad_records_says_what_it_skipped(capsys):
    path = FIXTURES / "gsm8k_damaged.jsonl"
    load_benchmark(f"gsm8k:{path}")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gsm8k: 2 usable prompts of 6 records read from {path}; ")  # the undecodable line counts (issue 36)
    assert "1 skipped: invalid JSON line" in line and "1 skipped: record is not an object" in line and "using" not in line


def test_a_clean_benchmark_prints_nothing(capsys):
    load_benchmark(f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", limit=1)
    assert capsys.readouterr().err == ""
