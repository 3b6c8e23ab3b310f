"""Chat formatting with assistant-only loss masks, for any tokenizer's chat template.

The mask is derived, not hand-tuned: we render the conversation prefix by prefix with the
tokenizer's own template. An assistant turn starts where a sentinel reply would start in the same
prefix (so the header is excluded) and ends where the prefix ending with that turn ends (so the
end-of-turn token is included).
Token offsets then map spans to tokens. This works unchanged for the tiny verifier and real Llama-3.
"""

import weakref
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from taps_train.data.conversation import Conversation
from taps_train.errors import TapsError

_SENTINEL = "\u2063taps-sentinel\u2063"


@dataclass(frozen=True)
class TokenizedSample:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 on assistant tokens (end-of-turn included), 0 elsewhere


def assistant_spans(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character span of every assistant turn."""
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        probe = _render(tokenizer, [*messages[:index], {"role": "assistant", "content": _SENTINEL}], generation_prompt=False)
        start = probe.find(_SENTINEL)
        after = _render(tokenizer, messages[: index + 1], generation_prompt=False)
        if start < 0 or after[:start] != probe[:start] or not full.startswith(after):
            raise TapsError(
                f"the chat template of {tokenizer.name_or_path} renders conversation prefixes inconsistently "
                "(a prefix is not a prefix of the full render), so assistant masks cannot be derived; "
                "use a template whose turns are rendered independently (as Llama-3's are)"
            )
        spans.append((start, len(after)))
    return full, spans


def tokenize_conversation(tokenizer: PreTrainedTokenizerBase, conversation: Conversation, max_length: int) -> TokenizedSample:
    """Token ids and assistant loss mask of one conversation, truncated to `max_length` tokens.

    Messages are first cut to a character budget that `max_length` tokens cannot exceed (twice the
    longest vocabulary entry per token), so a 50 MB record costs what a long one does; conversations
    within the budget, i.e. all ordinary ones, are tokenized exactly as before."""
    budget = 2 * max_length * _longest_token_chars(tokenizer)
    text, spans = assistant_spans(tokenizer, _clipped(conversation.messages, budget))
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start <= begin < end for start, end in spans)) for begin, _ in encoding["offset_mapping"]]
    return TokenizedSample(conversation.id, encoding["input_ids"][:max_length], mask[:max_length])


def _clipped(messages: list[dict[str, str]], budget: int) -> list[dict[str, str]]:
    """The messages up to `budget` characters of content in all; the one crossing it is cut, later ones dropped."""
    clipped = []
    for message in messages:
        if budget <= 0:
            break
        clipped.append(message if len(message["content"]) <= budget else {**message, "content": message["content"][:budget]})
        budget -= len(message["content"])
    return clipped


_LONGEST_TOKEN: "weakref.WeakKeyDictionary[PreTrainedTokenizerBase, int]" = weakref.WeakKeyDictionary()


def _longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """Characters of the longest vocabulary entry as stored (byte-level entries hold one char per byte, so
    never fewer than the text they decode to)."""
    if tokenizer not in _LONGEST_TOKEN:
        _LONGEST_TOKEN[tokenizer] = max(len(token) for token in tokenizer.get_vocab())
    return _LONGEST_TOKEN[tokenizer]


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
