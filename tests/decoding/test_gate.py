"""The speculation gate and plain rounds: speculation turned off while it does not pay, probes that double their wait,
and outputs that stay the verifier's (T=0 token for token, T>0 in distribution) whichever rounds speculate."""

import pytest
import torch

from taps_train.errors import TapsError
from taps_train.decoding.accept import verifier_distribution
from taps_train.decoding.decoder import NO_DRAFTER, SpeculativeDecoder
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.gate import Gate, GateConfig
from taps_train.decoding.tree import PLAIN, TreeConfig
from taps_train.decoding.verify import VerifierSession
from tests.decoding.test_spec import PROMPTS, assert_same_distribution, greedy_reference, random_drafter, tiny_vocab_verifier


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def test_the_gate_stops_below_break_even_probes_with_doubling_waits_and_resumes_when_rounds_pay():
    gate = Gate(GateConfig(break_even=1.5, expected=2.0, smoothing=0.5, first_wait=2, longest_wait=4))
    pattern = []

    def round_(emitted):
        speculating = gate.speculate()
        pattern.append("S" if speculating else "p")
        if speculating:
            gate.observe(emitted)

    round_(1)  # estimate 1.5: still at break-even
    round_(1)  # 1.25: off for 2 rounds
    for _ in range(3):
        round_(1)  # p p, then a failed probe (1.125): off for 4
    for _ in range(5):
        round_(1)  # p p p p, failed probe: the wait stays at the longest, 4
    assert "".join(pattern) == "SS" + "ppS" + "ppppS"
    for _ in range(4):
        round_(4)  # p p p p, then a probe that pays: 2.56 >= 1.5, speculating again
    round_(4)
    assert "".join(pattern[-5:]) == "ppppS" and gate.speculate()
    with pytest.raises(TapsError, match="out of range"):
        GateConfig(break_even=1.2, expected=1.0, first_wait=8, longest_wait=4)


def counting(drafter):
    """The drafter with a count of its forward calls."""
    calls = []
    original = drafter.forward

    def forward(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    drafter.forward = forward
    return drafter, calls


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_plain_tree_is_plain_greedy_decoding_and_never_runs_a_drafter(verifier, prompt):
    drafter, calls = counting(random_drafter(verifier, seed=1))
    result = SpeculativeDecoder(verifier, [drafter], PLAIN, eos_token_ids=[]).generate(prompt, max_new_tokens=30)
    assert result.tokens == greedy_reference(verifier, prompt, 30, [])
    assert calls == [] and all(r.tree_tokens == 1 and r.chosen == NO_DRAFTER for r in result.rounds) and result.acceptance_length == 1.0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_gated_decoding_mixes_plain_and_speculative_rounds_and_stays_greedy(verifier, prompt):
    """A random drafter over a large vocabulary accepts almost nothing: with a break-even of 1.2 the gate turns drafting
    off after the first rounds and probes now and then; the output is plain greedy decoding's all the same."""
    drafter, calls = counting(random_drafter(verifier, seed=2))
    gate = GateConfig(break_even=1.2, expected=1.5, first_wait=2, longest_wait=8)
    result = SpeculativeDecoder(verifier, [drafter], TreeConfig(8, 2, 3), eos_token_ids=[], gate=gate).generate(prompt, max_new_tokens=40)
    assert result.tokens == greedy_reference(verifier, prompt, 40, [])
    plain = [r for r in result.rounds if r.chosen == NO_DRAFTER]
    speculative = [r for r in result.rounds if r.chosen != NO_DRAFTER]
    assert len(plain) > len(speculative) >= 3 and all(r.tree_tokens == 1 for r in plain)
    ungated_calls = len(calls)
    calls.clear()
    SpeculativeDecoder(verifier, [drafter], TreeConfig(8, 2, 3), eos_token_ids=[]).generate(prompt, max_new_tokens=40)
    assert ungated_calls < len(calls) / 2  # the drafter ran only for the speculative rounds (and caught up in one pass)


def test_a_drafter_that_catches_up_in_one_pass_drafts_what_one_extended_every_round_drafts(verifier):
    prompt = PROMPTS[0] + PROMPTS[1]
    _, hidden = VerifierSession(verifier).prefill(torch.tensor(prompt))
    drafter = random_drafter(verifier, seed=3)
    stepwise, batched = DrafterState(drafter), DrafterState(drafter)
    for state in (stepwise, batched):
        state.extend({-1: hidden[-1][:4]}, torch.tensor(prompt[1:5]))
    stepwise.catch_up()
    for position in range(4, len(prompt) - 1):
        for state in (stepwise, batched):
            state.extend({-1: hidden[-1][position : position + 1]}, torch.tensor(prompt[position + 1 : position + 2]))
        stepwise.catch_up()  # one drafter pass a position, as before the gate; `batched` runs them all at its draft
    a, b = stepwise.draft(prompt[-1], TreeConfig(10, 2, 3)), batched.draft(prompt[-1], TreeConfig(10, 2, 3))
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()
    torch.testing.assert_close(a.confidence, b.confidence, rtol=1e-4, atol=1e-6)
    assert stepwise.committed == batched.committed == len(prompt) - 1


def test_plain_rounds_sample_the_verifier_distribution():
    """T=1 with the plain tree: the first two tokens over many seeds follow the verifier's exact joint distribution."""
    verifier = tiny_vocab_verifier()
    prompt, vocab = [1, 3, 0], verifier.config.vocab_size
    with torch.no_grad():
        first = verifier_distribution(verifier(torch.tensor([prompt])).logits[0, -1], 1.0)
        joint = torch.stack([first[a] * verifier_distribution(verifier(torch.tensor([prompt + [a]])).logits[0, -1], 1.0) for a in range(vocab)])
    decoder = SpeculativeDecoder(verifier, [random_drafter(verifier, seed=5)], PLAIN, temperature=1.0, eos_token_ids=[])
    counts = torch.zeros(vocab * vocab)
    for seed in range(2500):
        tokens = decoder.generate(prompt, max_new_tokens=2, seed=seed).tokens
        counts[tokens[0] * vocab + tokens[1]] += 1
    assert_same_distribution(counts, joint.flatten())
