"""Composition strategies: lossless for every strategy, merged-tree invariance, union vs merge, averaging."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from taps_train.drafter.average import average_checkpoints
from taps_train.drafter.checkpoint import drafter_from_checkpoint
from taps_train.errors import TapsError
from taps_train.decoding.compose import merge_trees, union_trees
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.strategies import STRATEGIES
from taps_train.decoding.tree import TreeConfig, pack
from taps_train.decoding.verify import VerifierSession
from tests.decoding.test_spec import (
    PROMPTS,
    assert_same_distribution,
    greedy_reference,
    random_drafter,
    tiny_vocab_verifier,
)

MULTI = [name for name in STRATEGIES if name != "single"]


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def two_trees(verifier, prompt, config):
    session = VerifierSession(verifier)
    ids = torch.tensor(prompt)
    _, hidden = session.prefill(ids[:-1])
    trees = []
    for seed in (11, 12):
        state = DrafterState(random_drafter(verifier, seed))
        state.extend(hidden, ids[1:])
        trees.append(state.draft(int(ids[-1]), config))
    return session, trees


@pytest.mark.parametrize("strategy", MULTI)
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_every_strategy_is_greedy_exact(verifier, strategy, prompt):
    drafters = [random_drafter(verifier, 11), random_drafter(verifier, 12)]
    result = SpeculativeDecoder(verifier, drafters, TreeConfig(total_tokens=20, depth=3, top_k=4), STRATEGIES[strategy],
                                eos_token_ids=[]).generate(prompt, max_new_tokens=30)
    assert result.tokens == greedy_reference(verifier, prompt, 30, [])


@pytest.mark.parametrize("combine", [merge_trees, union_trees], ids=["merge", "union"])
def test_merged_node_logits_equal_standalone_tree_logits(verifier, combine):
    """TAPS Lemma A.2: packing under a shared root changes no node's verifier logits."""
    config = TreeConfig(total_tokens=16, depth=3, top_k=3)
    session, trees = two_trees(verifier, PROMPTS[2], config)
    alone = []
    for tree in trees:
        logits, _ = session.tree_forward(pack(tree, session.length))
        session.commit([])  # drop the tree entries again
        alone.append({_path(tree, n): logits[n] for n in range(len(tree))})
    combined = combine(trees)
    logits, _ = session.tree_forward(pack(combined, session.length))
    for node in range(len(combined)):
        expected = next(table[_path(combined, node)] for table in alone if _path(combined, node) in table)
        torch.testing.assert_close(logits[node], expected, atol=1e-5, rtol=1e-5)


def _path(tree, node) -> tuple[int, ...]:
    tokens = []
    while node >= 0:
        tokens.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return tuple(reversed(tokens))


def test_union_never_exceeds_merge_and_accepts_the_same_per_round(verifier):
    config = TreeConfig(total_tokens=20, depth=3, top_k=4)
    _, trees = two_trees(verifier, PROMPTS[0], config)
    same = [trees[0], trees[0]]
    assert len(union_trees(trees)) <= len(merge_trees(trees))
    assert len(union_trees(same)) == len(trees[0])  # identical trees collapse completely
    drafters = [random_drafter(verifier, 11), random_drafter(verifier, 12)]
    runs = {name: SpeculativeDecoder(verifier, drafters, config, STRATEGIES[name], eos_token_ids=[]).generate(PROMPTS[0], 40)
            for name in ("merge", "merge-union")}
    assert [r.new_tokens for r in runs["merge"].rounds] == [r.new_tokens for r in runs["merge-union"].rounds]
    assert all(u.tree_tokens <= m.tree_tokens for u, m in zip(runs["merge-union"].rounds, runs["merge"].rounds))


def test_merge_budget_keeps_the_single_tree_budget(verifier):
    config = TreeConfig(total_tokens=20, depth=3, top_k=4)
    _, trees = two_trees(verifier, PROMPTS[0], config)
    tree, _ = STRATEGIES["merge-budget"](trees, config)
    assert len(tree) <= config.total_tokens


@pytest.mark.parametrize("strategy", ["merge", "merge-budget", "route-confidence"])
def test_sampled_output_matches_the_verifier_distribution(strategy):
    verifier = tiny_vocab_verifier(seed=2)
    drafters = [random_drafter(verifier, 21), random_drafter(verifier, 22)]
    prompt, vocab = [2, 4, 1], verifier.config.vocab_size
    with torch.no_grad():
        from taps_train.decoding.accept import verifier_distribution

        first = verifier_distribution(verifier(torch.tensor([prompt])).logits[0, -1], 1.0)
        joint = torch.stack([first[a] * verifier_distribution(verifier(torch.tensor([prompt + [a]])).logits[0, -1], 1.0) for a in range(vocab)])
    decoder = SpeculativeDecoder(verifier, drafters, TreeConfig(total_tokens=8, depth=2, top_k=3), STRATEGIES[strategy], temperature=1.0, eos_token_ids=[])
    counts = torch.zeros(vocab * vocab)
    for seed in range(1500):
        tokens = decoder.generate(prompt, max_new_tokens=3, seed=seed).tokens
        counts[tokens[0] * vocab + tokens[1]] += 1
    assert_same_distribution(counts, joint.flatten())


def test_strategies_refuse_a_single_drafter(verifier):
    for name in MULTI:
        decoder = SpeculativeDecoder(verifier, [random_drafter(verifier, 1)], TreeConfig(total_tokens=8, depth=1, top_k=2), STRATEGIES[name])
        with pytest.raises(TapsError, match="combines several drafters"):
            decoder.generate(PROMPTS[0], 5)


def fake_checkpoint(drafter, fingerprint) -> dict:
    trainable = {f"drafter.{k}": v.clone() for k, v in drafter.state_dict().items() if k not in drafter.frozen_parameter_names()}
    return {"state_dict": trainable, "taps": {"drafter_config": drafter.config.to_dict(), "verifier": fingerprint}}


def test_average_with_weights_one_zero_reproduces_the_first_drafter(verifier, tmp_path):
    fingerprint = {"path": "v", "weights": "w", "tokenizer": "t"}
    a, b = random_drafter(verifier, 1), random_drafter(verifier, 2)
    paths = []
    for name, drafter in (("a", a), ("b", b)):
        torch.save(fake_checkpoint(drafter, fingerprint), tmp_path / f"{name}.ckpt")
        paths.append(tmp_path / f"{name}.ckpt")
    same = drafter_from_checkpoint(average_checkpoints(paths, [1.0, 0.0]), verifier, "avg")
    for (name, x), y in zip(a.state_dict().items(), same.state_dict().values()):
        assert torch.equal(x, y), name
    half = average_checkpoints(paths, [0.5, 0.5])["state_dict"]["drafter.fc.weight"]
    torch.testing.assert_close(half, (a.fc.weight + b.fc.weight) / 2)
    with pytest.raises(TapsError, match="sum to 1"):
        average_checkpoints(paths, [0.7, 0.7])
    with pytest.raises(TapsError, match="non-negative"):
        average_checkpoints(paths, [1.5, -0.5])
    with pytest.raises(TapsError, match="at least two"):
        average_checkpoints(paths[:1])
    torch.save(fake_checkpoint(b, {**fingerprint, "weights": "other"}), tmp_path / "c.ckpt")
    with pytest.raises(TapsError, match="different verifiers"):
        average_checkpoints([paths[0], tmp_path / "c.ckpt"])
