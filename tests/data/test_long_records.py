"""A huge record costs what a long one does: messages are cut to a character budget before tokenizing,
and the first `max_length` tokens are exactly those of the uncut conversation."""

import time

import pytest
from transformers import AutoTokenizer

from taps_train.data.chat_format import assistant_spans, tokenize_conversation
from taps_train.data.conversation import Conversation


@pytest.fixture(scope="module")
def tokenizer(random_verifier_dir):
    return AutoTokenizer.from_pretrained(random_verifier_dir)


def _uncut(tokenizer, conversation, max_length):
    text, spans = assistant_spans(tokenizer, conversation.messages)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= begin < b for a, b in spans)) for begin, _ in encoding["offset_mapping"]]
    return encoding["input_ids"][:max_length], mask[:max_length]


@pytest.mark.parametrize("max_length", [8, 64, 512])
def test_long_conversations_tokenize_as_if_uncut(tokenizer, max_length):
    messages = [{"role": "user", "content": "How many apples? " * 300}, {"role": "assistant", "content": "There are 12 apples. " * 400},
                {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because 3 x 4 = 12. " * 50}]
    conversation = Conversation(id="long", messages=messages)
    sample = tokenize_conversation(tokenizer, conversation, max_length)
    assert (sample.input_ids, sample.loss_mask) == _uncut(tokenizer, conversation, max_length)


def test_a_50_mb_record_takes_well_under_a_second(tokenizer):
    conversation = Conversation(id="huge", messages=[{"role": "user", "content": "x" * 50_000_000}, {"role": "assistant", "content": "ok"}])
    began = time.perf_counter()
    sample = tokenize_conversation(tokenizer, conversation, 128)
    assert time.perf_counter() - began < 2.0 and len(sample.input_ids) == 128
