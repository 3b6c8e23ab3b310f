"""`run_benchmark`'s bar moves with every decoding round, not once per prompt: on a real verifier one
prompt takes minutes, and a bar that only moves between prompts looks hung."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

import taps_train.eval.evaluate as evaluate
from taps_train.eval.benchmarks import Prompt
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from tests.decoding.test_spec import random_drafter

MAX_NEW_TOKENS = 8


class RecordingBar:
    """Stands in for tqdm: what the bar was told."""

    def __init__(self, *, total: int, **_):
        self.total = total
        self.updates: list[int] = []
        self.postfixes: list[str] = []

    def __enter__(self) -> "RecordingBar":
        return self

    def __exit__(self, *_) -> None:
        return None

    def update(self, tokens: int) -> None:
        self.updates.append(tokens)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfixes.append(text)


@pytest.fixture
def bars(monkeypatch) -> list[RecordingBar]:
    made: list[RecordingBar] = []

    def recording_tqdm(**kwargs) -> RecordingBar:
        made.append(RecordingBar(**kwargs))
        return made[-1]

    monkeypatch.setattr(evaluate, "tqdm", recording_tqdm)
    return made


@pytest.fixture(scope="module")
def decoder_and_tokenizer(random_verifier_dir):
    verifier = AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()
    decoder = SpeculativeDecoder(verifier, [random_drafter(verifier, seed=0)], TreeConfig(total_tokens=8, depth=2, top_k=3))
    return decoder, AutoTokenizer.from_pretrained(random_verifier_dir)


def test_bar_counts_tokens_per_round_with_prompts_done_and_running_tau(decoder_and_tokenizer, bars):
    decoder, tokenizer = decoder_and_tokenizer
    prompts = [Prompt("a", ["What is 3 + 4?"]), Prompt("b", ["Name a prime.", "And another?"]), Prompt("c", ["Count to five."])]
    tally = evaluate.run_benchmark(decoder, tokenizer, prompts, MAX_NEW_TOKENS)
    [bar] = bars
    assert bar.total == 4 * MAX_NEW_TOKENS  # four turns, each with its own token budget
    assert sum(bar.updates) == bar.total
    assert len(bar.updates) == tally.verify_calls + len(prompts)  # one step per round, one budget fill per prompt
    assert tally.verify_calls > len(prompts)
    assert bar.postfixes[0].startswith("0/3 prompts")  # moved before the first prompt finished
    assert bar.postfixes[-1] == f"3/3 prompts, τ {tally.acceptance_length:.2f}"


def test_a_prompt_too_long_for_the_context_still_fills_its_budget(decoder_and_tokenizer, bars):
    decoder, tokenizer = decoder_and_tokenizer
    prompts = [Prompt("long", ["seven " * 600]), Prompt("short", ["What is 3 + 4?"])]
    tally = evaluate.run_benchmark(decoder, tokenizer, prompts, MAX_NEW_TOKENS)
    [bar] = bars
    assert tally.skipped_too_long == 1 and tally.prompts == 1
    assert sum(bar.updates) == bar.total == 2 * MAX_NEW_TOKENS
    assert bar.postfixes[-1].startswith("2/2 prompts")
