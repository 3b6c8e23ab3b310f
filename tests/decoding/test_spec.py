"""Lossless speculative decoding: T=0 equals greedy token for token, T>0 matches the verifier's
distribution, tree attention equals path-by-path attention."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from taps_train.drafter import Drafter
from taps_train.errors import TapsError
from taps_train.decoding.accept import accept_sampling, verifier_distribution
from taps_train.decoding.decoder import SpeculativeDecoder, single
from taps_train.decoding.tree import DraftTree, TreeConfig, best_nodes, pack
from taps_train.decoding.verify import VerifierSession

PROMPTS = [[0, 5, 17, 33, 2, 9], [0, 44, 12], [0, 7, 7, 7, 7, 101, 250, 3, 19, 80, 2]]


def random_drafter(verifier, seed: int, proposal: list[int] | None = None) -> Drafter:
    """A random EAGLE-2 drafter; `proposal`: the only tokens it may propose (a proposal vocabulary)."""
    torch.manual_seed(seed)
    config = Drafter.config_for(verifier.config, proposal_vocab_size=len(proposal) if proposal else None)
    drafter = Drafter(config)
    drafter.load_verifier_parts(verifier)
    if proposal:
        drafter.set_vocabulary(torch.tensor(proposal))
    return drafter.eval()


def even_tokens(verifier) -> list[int]:
    """A proposal vocabulary of half the verifier's tokens: the odd ones can only come from the verifier itself."""
    return list(range(0, verifier.config.vocab_size, 2))


def greedy_reference(verifier, prompt: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    out = verifier.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos or None,
                            pad_token_id=0, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


@pytest.mark.parametrize("tree", [TreeConfig(), TreeConfig(total_tokens=8, depth=2, top_k=3), TreeConfig(total_tokens=2, depth=1, top_k=1)])  # the last: a chain of one token
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("proposal", [False, True], ids=["whole-vocabulary", "proposal-vocabulary"])
def test_greedy_speculative_equals_plain_greedy(verifier, tree, prompt, proposal):
    drafter = random_drafter(verifier, seed=len(prompt), proposal=even_tokens(verifier) if proposal else None)
    decoder = SpeculativeDecoder(verifier, [drafter], tree, eos_token_ids=[])
    result = decoder.generate(prompt, max_new_tokens=40)
    assert result.tokens == greedy_reference(verifier, prompt, 40, [])
    assert sum(r.new_tokens for r in result.rounds) + 1 == len(result.tokens)  # +1: the prefill token
    assert all(r.tree_tokens <= tree.total_tokens for r in result.rounds)


def test_greedy_with_a_good_drafter_accepts_long_paths_and_stays_exact(verifier):
    """A drafter trained to imitate the verifier on its own greedy text (a few hundred steps)."""
    drafter = random_drafter(verifier, seed=3)
    prompt = PROMPTS[0]
    text = torch.tensor([prompt + greedy_reference(verifier, prompt, 120, [])])
    with torch.no_grad():
        features = verifier.model(input_ids=text).last_hidden_state
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    drafter.train()
    n = text.shape[1] - 1
    for _ in range(150):
        predicted = drafter(text[:, 1:], features[:, :-1], torch.arange(n)[None], torch.ones(n, n, dtype=torch.bool).tril())
        loss = torch.nn.functional.smooth_l1_loss(predicted, features[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval()
    result = SpeculativeDecoder(verifier, [drafter], TreeConfig(), eos_token_ids=[]).generate(prompt, max_new_tokens=100)
    assert result.tokens == greedy_reference(verifier, prompt, 100, [])
    assert result.acceptance_length > 2.0  # paths of several tokens were accepted and committed


def test_generation_stops_at_eos_and_max_new_tokens(verifier):
    drafter = random_drafter(verifier, seed=0)
    reference = greedy_reference(verifier, PROMPTS[0], 30, [])
    eos = reference[7]
    result = SpeculativeDecoder(verifier, [drafter], TreeConfig(), eos_token_ids=[eos]).generate(PROMPTS[0], max_new_tokens=30)
    assert result.tokens == reference[: reference.index(eos) + 1]
    assert len(SpeculativeDecoder(verifier, [drafter], TreeConfig(), eos_token_ids=[]).generate(PROMPTS[0], 5).tokens) == 5


def test_tree_node_logits_equal_their_paths_run_as_plain_sequences(verifier):
    drafter = random_drafter(verifier, seed=1)
    from taps_train.decoding.draft import DrafterState

    prompt = torch.tensor(PROMPTS[2])
    session = VerifierSession(verifier)
    logits, hidden = session.prefill(prompt[:-1])
    state = DrafterState(drafter)
    state.extend(hidden, prompt[1:])
    tree = state.draft(int(prompt[-1]), TreeConfig(total_tokens=30, depth=3, top_k=4))
    tree_logits, tree_hidden = session.tree_forward(pack(tree, session.length))
    for node in range(len(tree)):
        path, cursor = [], node
        while cursor >= 0:
            path.append(int(tree.tokens[cursor]))
            cursor = int(tree.parents[cursor])
        sequence = torch.cat([prompt[:-1], torch.tensor(path[::-1])])
        with torch.no_grad():
            plain = verifier(input_ids=sequence[None], output_hidden_states=True)
        torch.testing.assert_close(tree_logits[node], plain.logits[0, -1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(tree_hidden[-1][node], plain.hidden_states[-1][0, -1], atol=1e-5, rtol=1e-5)


def test_best_nodes_keeps_the_most_confident_ancestor_closed_set():
    # root -> a (0.6) -> c (0.6*0.9) ; root -> b (0.3) -> d (0.3*0.1)
    tree = DraftTree(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([-1, 0, 0, 1, 2]), torch.tensor([0, 1, 1, 2, 2]),
                     torch.tensor([1, 0.6, 0.3, 0.9, 0.1]), torch.tensor([1, 0.6, 0.3, 0.54, 0.03]), torch.zeros(5))
    kept = best_nodes(tree, 2)
    assert kept.tokens.tolist() == [1, 2, 4] and kept.parents.tolist() == [-1, 0, 1]


# --- T > 0 ---------------------------------------------------------------------------------------


def tiny_vocab_verifier(seed: int = 0, vocab: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked but not degenerate distributions
    return model.eval()


def chi_square_critical(dof: int, alpha_z: float = 3.29) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at z (3.29: p = 0.0005)."""
    return dof * (1 - 2 / (9 * dof) + alpha_z * math.sqrt(2 / (9 * dof))) ** 3


def assert_same_distribution(counts: torch.Tensor, probs: torch.Tensor) -> None:
    n = counts.sum()
    expected = probs * n
    keep = expected > 5  # pool rare cells so the test stays valid
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = torch.cat([expected[keep], expected[~keep].sum()[None]])
    nonzero = expected > 0
    statistic = float(((observed[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]).sum())
    assert statistic < chi_square_critical(int(nonzero.sum()) - 1), (statistic, counts.tolist(), (probs * n).tolist())


def test_sampling_acceptance_with_duplicate_siblings_emits_the_verifier_distribution():
    """Root with children [2, 2, 0, 4] (a duplicate): the first emitted token ~ p exactly."""
    tree = DraftTree(torch.tensor([9, 2, 2, 0, 4]), torch.tensor([-1, 0, 0, 0, 0]), torch.tensor([0, 1, 1, 1, 1]),
                     torch.tensor([1, 0.5, 0.4, 0.06, 0.04]), torch.tensor([1, 0.5, 0.4, 0.06, 0.04]), torch.zeros(5))
    logits = torch.tensor([[0.3, -1.0, 1.2, 0.1, 0.8, -0.5]] * 5)
    p = verifier_distribution(logits[0], temperature=0.7)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(20000):
        acceptance = accept_sampling(tree, logits, 0.7, generator)
        first = int(tree.tokens[acceptance.path[1]]) if len(acceptance.path) > 1 else acceptance.bonus
        counts[first] += 1
    assert_same_distribution(counts, p.float())


def duplicate_siblings(trees: list[DraftTree], config: TreeConfig):
    """Verify the tree merged with a copy of itself under one root (every candidate appears twice)."""
    tree = trees[0]
    n = len(tree) - 1
    parents = tree.parents[1:].clone()
    offset_parents = torch.where(parents > 0, parents + n, parents)
    merged = DraftTree(torch.cat([tree.tokens, tree.tokens[1:]]), torch.cat([tree.parents, offset_parents]),
                       torch.cat([tree.depths, tree.depths[1:]]), torch.cat([tree.probs, tree.probs[1:]]),
                       torch.cat([tree.confidence, tree.confidence[1:]]), torch.cat([tree.entropy, tree.entropy[1:]]))
    return merged, 0


@pytest.mark.parametrize("strategy, proposal", [(single, False), (duplicate_siblings, False), (single, True)],
                         ids=["single", "duplicate-siblings", "proposal-vocabulary"])
def test_sampled_speculative_output_matches_the_verifier_distribution(strategy, proposal):
    """First two generated tokens over many seeds vs the exact autoregressive distribution (with a proposal
    vocabulary, half the tokens are never drafted and still come out as often as the verifier says)."""
    verifier = tiny_vocab_verifier()
    drafter = random_drafter(verifier, seed=5, proposal=even_tokens(verifier) if proposal else None)
    prompt, temperature, vocab = [1, 3, 0], 1.0, verifier.config.vocab_size
    with torch.no_grad():
        first = verifier_distribution(verifier(torch.tensor([prompt])).logits[0, -1], temperature)
        joint = torch.zeros(vocab, vocab)
        for a in range(vocab):
            second = verifier_distribution(verifier(torch.tensor([prompt + [a]])).logits[0, -1], temperature)
            joint[a] = first[a] * second
    decoder = SpeculativeDecoder(verifier, [drafter], TreeConfig(total_tokens=10, depth=2, top_k=3), strategy=strategy,
                                 temperature=temperature, eos_token_ids=[])
    counts = torch.zeros(vocab * vocab)
    for seed in range(2500):
        tokens = decoder.generate(prompt, max_new_tokens=3, seed=seed).tokens
        counts[tokens[0] * vocab + tokens[1]] += 1
    assert_same_distribution(counts, joint.flatten())


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"depth": -1}, {"total_tokens": 1}, {"top_k": 0}])
def test_tree_parameters_that_make_no_tree_are_refused(kwargs):
    with pytest.raises(TapsError, match="make no tree"):
        TreeConfig(**kwargs)


def test_prompt_longer_than_the_context_is_refused(verifier):
    decoder = SpeculativeDecoder(verifier, [random_drafter(verifier, 0)], TreeConfig())
    with pytest.raises(TapsError, match="exceeds the verifier's context"):
        decoder.generate([1] * 500, max_new_tokens=20)
    with pytest.raises(TapsError, match="empty prompt"):
        decoder.generate([], max_new_tokens=5)
