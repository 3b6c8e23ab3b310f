"""The complete T=0 lossless check (taps_train/decoding/greedy_check.py) against deliberately broken decoders: the
runner-up at a non-tie and a non-top-2 token at a tie both fail; a tie followed by the verifier's own continuation
is counted; a tie followed by the old continuation, an early end and too many ties all fail."""

import dataclasses

import pytest
import torch

import taps_train.eval.evaluate as evaluate
import taps_train.decoding.greedy_check as greedy_check
from taps_train.errors import TapsError
from taps_train.decoding.baseline import plain_generate
from taps_train.decoding.greedy_check import check_greedy_reply, rounding_tolerance, too_many_ties
from tests.decoding.test_speedup import MAX_NEW_TOKENS, PROMPTS, decoder, tokenizer, verifier  # noqa: F401  (fixtures)

AT = 3  # the reply position the broken decoders change


def ranked(model, ids: list[int]) -> tuple[list[int], list[float]]:
    """The verifier's three best next tokens after `ids` and their logits."""
    with torch.no_grad():
        top = model(torch.tensor([ids])).logits[0, -1].float().topk(3)
    return top.indices.tolist(), top.values.tolist()


def broken(spec, change):
    """`spec` whose first-turn replies of the first prompt are `change(prompt_ids, reply)`."""
    generate, calls = spec.generate, []

    def generate_broken(ids, max_new_tokens, **kwargs):
        generation = generate(ids, max_new_tokens, **kwargs)
        calls.append(ids)
        if len(calls) == 2:  # after the warm-up: prompt p0, turn 1
            generation = dataclasses.replace(generation, tokens=change(ids, generation.tokens))
        return generation

    spec.generate = generate_broken
    return spec


def run(spec, tok):
    tally = evaluate.run_benchmark(spec, tok, PROMPTS, MAX_NEW_TOKENS, label="math", progress=False, baseline=True)
    result = tally.report()
    assert result.greedy_checked_tokens == sum(tally.speed.tokens) > 0  # every token of every turn
    return result


def tie_tolerance(monkeypatch, value: float) -> None:
    monkeypatch.setattr(greedy_check, "rounding_tolerance", lambda top, dtype: torch.full_like(top, value))


def test_the_runner_up_at_a_non_tie_fails(verifier, tokenizer):  # noqa: F811
    def runner_up(ids, reply):
        return reply[:AT] + [ranked(verifier, ids + reply[:AT])[0][1]] + plain_generate(verifier, ids + reply[:AT], MAX_NEW_TOKENS, set())[1:]
    with pytest.raises(TapsError, match=rf"prompt 'p0', turn 1: speculative decoding at T=0 gave token \d+ at new token {AT + 1} .*not lossless"):
        run(broken(decoder(verifier), runner_up), tokenizer)


def test_a_token_outside_the_tie_fails(verifier, tokenizer, monkeypatch):  # noqa: F811
    spec = decoder(verifier)
    reference = plain_generate(verifier, evaluate.first_turn_ids(tokenizer, PROMPTS[0]), MAX_NEW_TOKENS, spec.eos)
    (first, second, third), (l1, l2, l3) = ranked(verifier, evaluate.first_turn_ids(tokenizer, PROMPTS[0]) + reference[:AT])
    assert l1 - l2 < l1 - l3
    tie_tolerance(monkeypatch, (l1 - l2) + 0.5 * (l2 - l3))  # the runner-up is tied with the top, the third is not

    def third_ranked(ids, reply):
        return reply[:AT] + [third] + plain_generate(verifier, ids + reply[:AT] + [third], MAX_NEW_TOKENS - AT - 1, set())
    with pytest.raises(TapsError, match=rf"gave token {third} at new token {AT + 1} where the verifier's argmax is token {first}"):
        run(broken(spec, third_ranked), tokenizer)


def test_a_tie_then_the_verifiers_own_continuation_is_counted_and_the_old_continuation_fails(verifier, tokenizer, monkeypatch):  # noqa: F811
    monkeypatch.setattr(greedy_check, "TIE_SHARE", 1.0)
    spec = decoder(verifier)
    prompt = evaluate.first_turn_ids(tokenizer, PROMPTS[0])
    reference = plain_generate(verifier, prompt, MAX_NEW_TOKENS, spec.eos)
    (first, second, _), (l1, l2, l3) = ranked(verifier, prompt + reference[:AT])
    tie_tolerance(monkeypatch, (l1 - l2) + 0.5 * (l2 - l3))

    def tied_then_own(ids, reply):
        return reply[:AT] + [second] + plain_generate(verifier, ids + reply[:AT] + [second], MAX_NEW_TOKENS - AT - 1, spec.eos)
    result = run(broken(spec, tied_then_own), tokenizer)
    assert result.greedy_ties == 1 and result.identical_to_greedy is False

    def tied_then_old(ids, reply):  # the hole of a check that stops at the first tie: what follows is not the verifier's
        return reply[:AT] + [second] + reply[AT + 1:]
    if check_greedy_reply(verifier, prompt, tied_then_old(prompt, reference), spec.eos, MAX_NEW_TOKENS).divergence is None:
        pytest.skip("this random verifier continues the same way after either token")
    with pytest.raises(TapsError, match=r"speculative decoding at T=0 gave token .* at new token (?!4 )\d+ .*not lossless"):
        run(broken(decoder(verifier), tied_then_old), tokenizer)


def test_more_ties_than_one_in_200_fail_where_plain_decoding_ties_less(verifier, tokenizer, monkeypatch):  # noqa: F811
    monkeypatch.setattr(greedy_check, "TIE_P", 0.9)  # one tie against plain decoding's none is "beyond chance" here
    prompt = evaluate.first_turn_ids(tokenizer, PROMPTS[0])
    spec = decoder(verifier)
    reference = plain_generate(verifier, prompt, MAX_NEW_TOKENS, spec.eos)
    (first, second, _), (l1, l2, l3) = ranked(verifier, prompt + reference[:AT])
    tie_tolerance(monkeypatch, (l1 - l2) + 0.5 * (l2 - l3))

    def tied_then_own(ids, reply):
        return reply[:AT] + [second] + plain_generate(verifier, ids + reply[:AT] + [second], MAX_NEW_TOKENS - AT - 1, spec.eos)
    with pytest.raises(TapsError, match=r"benchmark math: 1 of \d+ tokens at T=0 were not the verifier's argmax .* where the verifier's own "
                                        r"plain decoding tied 0 of \d+: more than rounding explains"):
        run(broken(spec, tied_then_own), tokenizer)


def test_an_end_before_the_budget_without_a_stop_token_fails(verifier, tokenizer):  # noqa: F811
    with pytest.raises(TapsError, match=rf"gave an end before its budget at new token {AT + 1}"):
        run(broken(decoder(verifier), lambda ids, reply: reply[:AT]), tokenizer)


def test_genuine_decoding_passes_with_every_token_checked(verifier, tokenizer):  # noqa: F811
    result = run(decoder(verifier), tokenizer)
    assert result.identical_to_greedy is True and result.greedy_ties == 0


def test_tolerance_follows_the_dtype():
    assert float(rounding_tolerance(torch.tensor(20.0), torch.float32)) == pytest.approx(1e-3)  # the floor
    assert float(rounding_tolerance(torch.tensor(-20.0), torch.bfloat16)) == pytest.approx(8 * 2**-7 * 20)


def test_ties_beyond_the_share_need_plain_decoding_to_tie_as_often():
    """bfloat16 SmolLM2, measured: plain decoding itself ties 4 of 589 math tokens, so 6 speculative ties of 589 are
    rounding; 30 are not, nor are 6 when plain decoding was not checked."""
    assert too_many_ties("b", 2, 589) is None
    assert too_many_ties("b", 6, 589, (4, 589)) is None
    assert "where the verifier's own plain decoding tied 4 of 589" in str(too_many_ties("b", 30, 589, (4, 589)))
    assert "6 of 589 tokens" in str(too_many_ties("b", 6, 589))
    assert too_many_ties("b", 6, 589, (0, 589)) is None  # 6 against none: p = 1/64, still chance at TIE_P
    assert too_many_ties("b", 12, 589, (0, 589)) is not None  # p = 1/4096
