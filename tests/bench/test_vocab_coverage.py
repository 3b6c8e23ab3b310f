"""bench/vocab_coverage.py: the held-out share a draft vocabulary of N tokens can propose."""

import pytest
import torch

from tests.conftest import bench_script, write_source

vocab_coverage = bench_script("vocab_coverage")


@pytest.mark.parametrize("size, expected", [(1, 0.5), (2, 0.625), (3, 0.75), (4, 0.875), (5, 1.0)])
def test_coverage_counts_heldout_occurrences_of_the_most_frequent_training_tokens(size, expected):
    train = torch.tensor([0, 9, 0, 5, 1])  # ranked 1, 3, 4, then the unseen 0 and 2 (ties: lower id first)
    heldout = torch.tensor([1, 4, 1, 1, 1])  # 8 occurrences, token 1 half of them; 0 and 2 never seen in training
    assert vocab_coverage.coverage(train, heldout, size) == pytest.approx(expected)


def test_no_heldout_tokens_is_no_coverage_not_a_division_by_zero():
    assert vocab_coverage.coverage(torch.tensor([3, 1]), torch.zeros(2, dtype=torch.long), 1) == 0.0


@pytest.mark.usefixtures("taps_home")
def test_a_recipe_that_holds_nothing_out_is_refused_in_one_line(random_verifier_dir, tmp_path, monkeypatch):
    source = write_source(tmp_path / "chat.jsonl", 6, seed=1)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: r\nseed: 0\nmax_length: 128\nsources:\n  - {{source: jsonl, args: {{path: {source}}}, heldout: 0, count: 6}}\n")
    monkeypatch.setattr("sys.argv", ["vocab_coverage.py", "--recipe", str(recipe), "--verifier", str(random_verifier_dir), "--sizes", "4"])
    with pytest.raises(SystemExit, match="holds out no samples"):
        vocab_coverage.main()
