"""The speedup in every eval report: plain decoding of the same verifier next to speculative decoding, alternated
per prompt, identical at T=0 (a mismatch stops the eval naming the prompt), an interval over prompts, and
report fields that the reader checks."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import taps_train.eval.evaluate as evaluate
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import Prompt
from taps_train.eval.intervals import PromptSpeeds, speedup_interval
from taps_train.eval.report import read_report, tau_cell
from taps_train.decoding.baseline import plain_generate
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from tests.eval.test_report_reading import valid
from tests.decoding.test_spec import greedy_reference, random_drafter

MAX_NEW_TOKENS = 10
PROMPTS = [Prompt("p0", ["What is 3 + 4?"]), Prompt("p1", ["Name a prime.", "And another?"]), Prompt("p2", ["Count to five."])]


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


@pytest.fixture(scope="module")
def tokenizer(random_verifier_dir):
    return AutoTokenizer.from_pretrained(random_verifier_dir)


def decoder(verifier, temperature: float = 0.0) -> SpeculativeDecoder:
    return SpeculativeDecoder(verifier, [random_drafter(verifier, seed=0)], TreeConfig(total_tokens=8, depth=2, top_k=3), temperature=temperature,
                              eos_token_ids=[0])


def test_plain_decoding_at_t0_is_transformers_greedy_generate(verifier):
    for prompt in ([5, 9, 14, 2], [7] * 30):
        assert plain_generate(verifier, prompt, 12, set()) == greedy_reference(verifier, prompt, 12, [])


def test_plain_decoding_stops_after_an_eos_token_and_at_the_budget(verifier):
    free = plain_generate(verifier, [5, 9, 14, 2], 12, set())
    stop = free[3]
    cut = plain_generate(verifier, [5, 9, 14, 2], 12, {stop})
    assert cut == free[: free.index(stop) + 1]
    assert len(plain_generate(verifier, [5, 9, 14, 2], 3, set())) == 3


def test_plain_sampling_is_seeded(verifier):
    draws = [plain_generate(verifier, [5, 9, 14, 2], 12, set(), temperature=1.0, seed=seed) for seed in (1, 1, 2)]
    assert draws[0] == draws[1] != draws[2]


def test_eval_with_a_baseline_reports_speeds_speedup_and_identity_at_t0(verifier, tokenizer):
    result = evaluate.run_benchmark(decoder(verifier), tokenizer, PROMPTS, MAX_NEW_TOKENS, label="math", progress=False,
                                    baseline=True).report()
    assert result.tokens_per_s > 0 and result.baseline_tokens_per_s > 0
    assert result.speedup == pytest.approx(result.tokens_per_s / result.baseline_tokens_per_s)
    low, high = result.speedup_ci95
    assert 0 < low <= high
    assert result.identical_to_greedy is True and result.greedy_ties == 0


def test_eval_at_t_above_0_has_a_speedup_but_no_identity_claim(verifier, tokenizer):
    result = evaluate.run_benchmark(decoder(verifier, temperature=0.8), tokenizer, PROMPTS, MAX_NEW_TOKENS, progress=False,
                                    baseline=True).report()
    assert result.speedup is not None and result.identical_to_greedy is result.greedy_ties is None


def test_without_a_baseline_only_the_speculative_speed_is_reported(verifier, tokenizer, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("plain decoding ran without a baseline")

    monkeypatch.setattr(evaluate, "plain_generate", refuse)
    result = evaluate.run_benchmark(decoder(verifier), tokenizer, PROMPTS, MAX_NEW_TOKENS, progress=False).report()
    assert result.tokens_per_s > 0
    assert result.baseline_tokens_per_s is result.speedup is result.speedup_ci95 is result.identical_to_greedy is None
    assert "speedup" not in result.as_dict()


def test_decoding_order_alternates_per_prompt(verifier, tokenizer, monkeypatch):
    calls = []
    spec = decoder(verifier)
    generate, plain = spec.generate, evaluate.plain_generate

    def speculative(*args, **kwargs):
        calls.append("speculative")
        return generate(*args, **kwargs)

    def baseline(*args, **kwargs):
        calls.append("plain")
        return plain(*args, **kwargs)

    monkeypatch.setattr(spec, "generate", speculative)
    monkeypatch.setattr(evaluate, "plain_generate", baseline)
    evaluate.run_benchmark(spec, tokenizer, PROMPTS, MAX_NEW_TOKENS, progress=False, baseline=True)
    timed = calls[2:]  # after the warm-up of both
    assert timed == ["speculative", "plain", "plain", "plain", "speculative", "speculative", "speculative", "plain"]


def test_a_t0_mismatch_stops_the_eval_naming_benchmark_prompt_turn_and_token(verifier, tokenizer, monkeypatch):
    plain = evaluate.plain_generate

    calls = {"n": 0}

    def corrupt_second_turn(model, ids, *args, **kwargs):
        tokens = plain(model, ids, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 4:  # warm-up, p0, p1 turn 1, p1 turn 2
            tokens[2] = (tokens[2] + 1) % model.config.vocab_size
        return tokens

    monkeypatch.setattr(evaluate, "plain_generate", corrupt_second_turn)
    with pytest.raises(TapsError, match=r"benchmark math, prompt 'p1', turn 2: .* at new token 3 .*not lossless"):
        evaluate.run_benchmark(decoder(verifier), tokenizer, PROMPTS, MAX_NEW_TOKENS, label="math", progress=False, baseline=True)


def test_speedup_interval_pairs_each_prompts_two_decodings():
    same = PromptSpeeds(tokens=[10, 20, 30], seconds=[1.0, 2.0, 3.0], baseline_tokens=[10, 20, 30], baseline_seconds=[2.0, 4.0, 6.0])
    assert speedup_interval(same) == pytest.approx((2.0, 2.0))  # every prompt 2x: no spread
    mixed = PromptSpeeds(tokens=[10] * 6, seconds=[1.0, 1.0, 1.0, 2.0, 2.0, 2.0], baseline_tokens=[10] * 6, baseline_seconds=[2.0] * 6)
    low, high = speedup_interval(mixed)
    assert 0.8 < low < 4 / 3 < high < 2.2  # six prompts, half of them 2x and half 1x: wide, and honest about it
    with pytest.raises(ValueError, match="both decodings"):
        speedup_interval(PromptSpeeds([1], [1.0], [], []))


def test_report_cells_show_the_speedup_with_its_interval():
    result = {"acceptance_length": 2.5, "mean_tree_tokens": 12, "tau_ci95": [2.4, 2.6], "speedup": 1.62, "speedup_ci95": [1.5, 1.7]}
    assert tau_cell(result) == "2.50 [2.40, 2.60] (12) 1.62× [1.50, 1.70]"
    assert tau_cell({"acceptance_length": 2.5, "mean_tree_tokens": 12}) == "2.50 (12)"


def write(tmp_path, change: dict):
    data = valid()
    data["benchmarks"]["gsm8k"].update(change)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    return path


def test_reports_with_speeds_read_back(tmp_path):
    fields = {"tokens_per_s": 12.5, "baseline_tokens_per_s": 8.0, "speedup": 1.5625, "speedup_ci95": [1.4, 1.7], "identical_to_greedy": True,
              "greedy_ties": 0}
    result = read_report(write(tmp_path, fields)).benchmarks["gsm8k"]
    assert (result.tokens_per_s, result.speedup, result.speedup_ci95, result.identical_to_greedy) == (12.5, 1.5625, (1.4, 1.7), True)
    assert {k: v for k, v in result.as_dict().items() if k in fields} == fields


@pytest.mark.parametrize("change, message", [
    ({"speedup": -1}, "speedup` must be a finite number"),
    ({"speedup": "fast"}, "speedup` must be a finite number"),
    ({"tokens_per_s": float("inf")}, "tokens_per_s` must be a finite number"),
    ({"speedup_ci95": [2.0, 1.0]}, "speedup_ci95` must be .low, high."),
    ({"speedup_ci95": [1.0]}, "speedup_ci95` must be .low, high."),
    ({"identical_to_greedy": "yes"}, "identical_to_greedy` must be true or false"),
    ({"identical_to_greedy": 1}, "identical_to_greedy` must be true or false"),
    ({"greedy_ties": -1}, "greedy_ties` must be an integer"),
])
def test_bad_speed_fields_are_refused_naming_the_field(tmp_path, change, message):
    with pytest.raises(TapsError, match=message):
        read_report(write(tmp_path, change))


def test_speedup_interval_is_reproducible():
    rng = np.random.default_rng(3)
    speeds = PromptSpeeds(list(rng.integers(5, 50, 8)), list(rng.uniform(1, 3, 8)), list(rng.integers(5, 50, 8)), list(rng.uniform(1, 3, 8)))
    assert speedup_interval(speeds) == speedup_interval(speeds)
    assert torch.isfinite(torch.tensor(speedup_interval(speeds))).all()
