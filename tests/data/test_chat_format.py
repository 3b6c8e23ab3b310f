"""Assistant-only loss masks, checked against an independent segment-by-segment tokenization on the
tiny verifier's template and on Llama-3-Instruct / Llama-3.1-style templates written here."""

import pytest
from transformers import AutoTokenizer

from taps_train.data.chat_format import assistant_spans, tokenize_conversation
from taps_train.data.conversation import Conversation
from taps_train.errors import TapsError

BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"

# Llama-3-Instruct layout: bos once, then per message a role header, the trimmed content and <|eot_id|>.
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first %}{{ bos_token }}{% endif %}"
    "{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

DATE_PREAMBLE = "Cutting Knowledge Date: December 2023\nToday Date: 1 Jan 2025\n\n"
# Llama-3.1 layout: a system turn is always rendered, opening with a knowledge/date preamble, and any
# system message of the conversation is folded into it.
LLAMA31_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set system_text = messages[0]['content'] | trim %}{% set turns = messages[1:] %}"
    "{% else %}{% set system_text = '' %}{% set turns = messages %}{% endif %}"
    "{{ '<|start_header_id|>system<|end_header_id|>\\n\\n' ~ 'Cutting Knowledge Date: December 2023\\n'"
    " ~ 'Today Date: ' ~ (date_string | default('1 Jan 2025')) ~ '\\n\\n' ~ system_text ~ '<|eot_id|>' }}"
    "{% for message in turns %}"
    "{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# Not prefix-stable (like Qwen3's): earlier assistant turns lose their reasoning, the last one keeps it.
UNSTABLE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ (content | trim) ~ '<|eot_id|>' }}"
    "{% endfor %}"
)

MULTI_TURN = [
    {"role": "system", "content": "You are a careful math tutor."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "  12 + 30 = 42.\n#### 42\n"},
    {"role": "user", "content": "And twice that?"},
    {"role": "assistant", "content": "Twice 42 is 2 * 42 = 84.\n#### 84"},
]
STARTS_WITH_ASSISTANT = [
    {"role": "assistant", "content": "Hello! Ask me a math question."},
    {"role": "user", "content": "How much is 7 * 6?"},
    {"role": "assistant", "content": "7 * 6 = 42"},
]


@pytest.fixture(scope="module")
def tokenizers(random_verifier_dir) -> dict:
    """The random verifier's own tokenizer, and copies of it carrying the hand-written templates."""
    result = {"tiny": AutoTokenizer.from_pretrained(random_verifier_dir)}
    for name, template in (("llama3", LLAMA3_TEMPLATE), ("llama31", LLAMA31_TEMPLATE)):
        copy = AutoTokenizer.from_pretrained(random_verifier_dir)
        copy.chat_template = template
        result[name] = copy
    return result


def segments(template: str, messages: list[dict]) -> list[tuple[str, bool]]:
    """The rendered text as (piece, in_loss) pieces, written out by hand from the template's layout."""
    pieces = [(BOS, False)]
    if template == "llama31":
        system = messages[0]["content"].strip() if messages[0]["role"] == "system" else ""
        pieces += [("<|start_header_id|>system<|end_header_id|>\n\n", False), (DATE_PREAMBLE + system, False), (EOT, False)]
        messages = messages[1:] if messages[0]["role"] == "system" else messages
    for message in messages:
        assistant = message["role"] == "assistant"
        pieces += [(f"<|start_header_id|>{message['role']}<|end_header_id|>\n\n", False), (message["content"].strip(), assistant), (EOT, assistant)]
    return pieces


def expected(tokenizer, template: str, messages: list[dict]) -> tuple[list[int], list[int]]:
    ids, mask = [], []
    for text, in_loss in segments(template, messages):
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        mask += [int(in_loss)] * len(piece)
    return ids, mask


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, current = [], []
    for token, on in zip(ids, mask):
        if on:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


@pytest.mark.parametrize("template", ["tiny", "llama3", "llama31"])
@pytest.mark.parametrize("messages", [MULTI_TURN, STARTS_WITH_ASSISTANT], ids=["multi_turn", "starts_with_assistant"])
def test_mask_is_exactly_assistant_content_and_end_of_turn(tokenizers, template, messages):
    tokenizer = tokenizers[template]
    sample = tokenize_conversation(tokenizer, Conversation("c", messages), max_length=10_000)
    ids, mask = expected(tokenizer, "llama3" if template == "tiny" else template, messages)
    assert sample.input_ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert sample.input_ids == ids  # the hand-written segmentation matches the template's render
    assert sample.loss_mask == mask
    replies = [m["content"].strip() for m in messages if m["role"] == "assistant"]
    decoded = [tokenizer.decode(run) for run in masked_runs(sample.input_ids, sample.loss_mask)]
    assert decoded == [reply + EOT for reply in replies]
    eot = tokenizer.convert_tokens_to_ids(EOT)
    masked_eots = sum(1 for t, m in zip(sample.input_ids, sample.loss_mask) if t == eot and m)
    assert masked_eots == len(replies) < sample.input_ids.count(eot)


def test_headers_user_and_system_turns_are_never_in_the_loss(tokenizers):
    tokenizer = tokenizers["llama31"]
    sample = tokenize_conversation(tokenizer, Conversation("c", MULTI_TURN), max_length=10_000)
    in_loss = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])
    for absent in ("<|start_header_id|>", "<|end_header_id|>", "assistant", "tutor", "twice that", "Cutting Knowledge", BOS):
        assert absent not in in_loss


def test_spans_point_at_the_assistant_text_in_the_render(tokenizers):
    text, spans = assistant_spans(tokenizers["llama3"], MULTI_TURN)
    assert [text[a:b] for a, b in spans] == ["12 + 30 = 42.\n#### 42" + EOT, "Twice 42 is 2 * 42 = 84.\n#### 84" + EOT]


@pytest.mark.parametrize("max_length", [1, 20, 37, 58, 200])
def test_truncation_keeps_ids_and_mask_aligned(tokenizers, max_length):
    tokenizer = tokenizers["llama3"]
    ids, mask = expected(tokenizer, "llama3", MULTI_TURN)
    cut = tokenize_conversation(tokenizer, Conversation("c", MULTI_TURN), max_length=max_length)
    assert len(ids) > 58 and 0 < sum(mask[:58]) < sum(mask)  # the cuts fall inside the conversation and its replies
    assert len(cut.input_ids) == len(cut.loss_mask) == min(max_length, len(ids))
    assert cut.input_ids == ids[:max_length]
    assert cut.loss_mask == mask[:max_length]


def test_template_that_is_not_prefix_stable_is_refused(tokenizers, random_verifier_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    tokenizer.chat_template = UNSTABLE_TEMPLATE
    messages = [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "<think>add them</think>4"},
        {"role": "user", "content": "3 + 3?"},
        {"role": "assistant", "content": "6"},
    ]
    with pytest.raises(TapsError, match="renders conversation prefixes inconsistently"):
        tokenize_conversation(tokenizer, Conversation("c", messages), max_length=10_000)
    # The same template is fine when no turn triggers the rewrite.
    plain = [messages[0], {"role": "assistant", "content": "4"}, *messages[2:]]
    assert sum(tokenize_conversation(tokenizer, Conversation("c", plain), max_length=10_000).loss_mask) > 0
