"""bench/vocab_coverage.py: the held-out share a draft vocabulary of N tokens can propose."""

import importlib.util
from pathlib import Path

import pytest
import torch

SPEC = importlib.util.spec_from_file_location("vocab_coverage", Path(__file__).parents[2] / "bench" / "vocab_coverage.py")
vocab_coverage = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(vocab_coverage)


@pytest.mark.parametrize("size, expected", [(1, 0.5), (2, 0.625), (3, 0.75), (4, 0.875), (5, 1.0)])
def test_coverage_counts_heldout_occurrences_of_the_most_frequent_training_tokens(size, expected):
    train = torch.tensor([0, 9, 0, 5, 1])  # ranked 1, 3, 4, then the unseen 0 and 2 (ties: lower id first)
    heldout = torch.tensor([1, 4, 1, 1, 1])  # 8 occurrences, token 1 half of them; 0 and 2 never seen in training
    assert vocab_coverage.coverage(train, heldout, size) == pytest.approx(expected)


def test_no_heldout_tokens_is_no_coverage_not_a_division_by_zero():
    assert vocab_coverage.coverage(torch.tensor([3, 1]), torch.zeros(2, dtype=torch.long), 1) == 0.0
