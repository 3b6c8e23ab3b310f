"""Assistant masks, end-of-turn tokens and stop ids across chat-template families, on tokenizers built here.

Families: ChatML with a default system prompt (SmolLM2's template), Llama-3 (the tiny tokenizer's own),
Gemma (no system role: a system message is folded into the first user turn, as Gemma 3 does) and a
plain-text layout whose turns end with no special token at all. Each tokenizer is the project's byte-level
BPE on a few sentences with the family's special tokens added, so the module builds in about a second.
"""

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from taps_train.data.chat_format import assistant_spans, end_of_turn_suffix, end_of_turn_token, tokenize_conversation
from taps_train.data.conversation import Conversation
from taps_train.errors import TapsError
from taps_train.verifier.generation import greedy_reply, stop_token_ids
from taps_train.verifier.offline.tokenizer import EOS, EOT, train_chat_tokenizer
from tests.data.test_chat_format import masked_runs

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHATML_TEMPLATE = (  # SmolLM2-Instruct's, verbatim
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SMOLLM_SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (  # Gemma 3's layout: no system turn, a system message opens the first user turn
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ '### ' + (message['role'] | capitalize) + ': ' + message['content'] + '\\n\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant: ' }}{% endif %}"
)
# ChatML whose earlier assistant turns lose their reasoning (as Qwen3's do): prefixes are not prefixes of the whole.
UNSTABLE_CHATML_TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    template: str | None  # None: the tiny tokenizer's own (Llama-3 layout)
    end_of_turn: str | None  # the special token that closes an assistant turn; None: the turn ends with its text
    special_tokens: tuple[str, ...] = ()
    eos: str | None = None  # the tokenizer's eos when it is not the tiny tokenizer's <|eot_id|>


FAMILIES = {
    # eos <|endoftext|> as in SmolLM2's and Qwen2.5's base tokenizers: the turn's end is not the tokenizer's eos
    "chatml": Family(CHATML_TEMPLATE, "<|im_end|>", ("<|im_start|>", "<|im_end|>", "<|endoftext|>"), "<|endoftext|>"),
    "llama3": Family(None, EOT),
    "gemma": Family(GEMMA_TEMPLATE, "<end_of_turn>", ("<start_of_turn>", "<end_of_turn>", "<eos>"), "<eos>"),
    "plain": Family(PLAIN_TEMPLATE, None),
}
TEMPLATED = ["chatml", "llama3", "gemma"]

TEXTS = [
    "the quick brown fox jumps over the lazy dog, and the answer is 42.",
    "What is 12 + 30? Twice that is 84, so the answer is the sum.",
    "You are a careful math tutor who answers every question briefly.",
] * 4
WITH_SYSTEM = [
    {"role": "system", "content": "You are a careful math tutor."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42, so the answer is 42"},
    {"role": "user", "content": "And twice that?"},
    {"role": "assistant", "content": "Twice 42 is 84.\n#### 84"},
]
WITHOUT_SYSTEM = WITH_SYSTEM[1:]
CONVERSATIONS = {"with_system": WITH_SYSTEM, "without_system": WITHOUT_SYSTEM}


def make_tokenizer(family: Family, unk_token: str | None = None) -> PreTrainedTokenizerBase:
    """The project's BPE on TEXTS (~300 entries) with the family's special tokens, eos and template."""
    tokenizer = train_chat_tokenizer(TEXTS, vocab_size=300)
    if family.special_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(family.special_tokens)})
    if unk_token:
        tokenizer.add_special_tokens({"unk_token": unk_token})
    if family.eos:
        tokenizer.eos_token = family.eos
    if family.template:
        tokenizer.chat_template = family.template
    return tokenizer


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, PreTrainedTokenizerBase]:
    return {name: make_tokenizer(family) for name, family in FAMILIES.items()}


def tiny_model(tokenizer: PreTrainedTokenizerBase, eos_token_id: int | list[int]) -> LlamaForCausalLM:
    """A random one-layer Llama over the tokenizer's vocabulary whose configs name `eos_token_id` as eos."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos_token_id
    return model


def replies(messages: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", TEMPLATED)
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_each_reply_is_masked_as_its_content_then_its_end_of_turn_token(tokenizers, name, conversation):
    tokenizer, messages = tokenizers[name], CONVERSATIONS[conversation]
    eot = tokenizer.convert_tokens_to_ids(FAMILIES[name].end_of_turn)
    sample = tokenize_conversation(tokenizer, Conversation("c", messages), max_length=10_000)
    assert sample.input_ids == encode(tokenizer, tokenizer.apply_chat_template(messages, tokenize=False))
    # Exactly the reply's own tokens then the end-of-turn id, per turn: no header, no system, no user text.
    assert masked_runs(sample.input_ids, sample.loss_mask) == [encode(tokenizer, reply) + [eot] for reply in replies(messages)]
    closing = [i for i, (token, on) in enumerate(zip(sample.input_ids, sample.loss_mask)) if on and token == eot]
    assert len(closing) == len(replies(messages)) < sample.input_ids.count(eot)  # user and system turns close unmasked
    for index in closing:  # what the template renders after the end-of-turn token is never trained on
        assert index + 1 == len(sample.input_ids) or not sample.loss_mask[index + 1]
    if name != "llama3":
        assert all(tokenizer.decode(sample.input_ids[i + 1]) == "\n" for i in closing)


def test_default_system_prompt_and_headers_stay_out_of_the_loss(tokenizers):
    tokenizer = tokenizers["chatml"]
    sample = tokenize_conversation(tokenizer, Conversation("c", WITHOUT_SYSTEM), max_length=10_000)
    rendered = tokenizer.decode(sample.input_ids)
    in_loss = tokenizer.decode([t for t, on in zip(sample.input_ids, sample.loss_mask) if on])
    assert SMOLLM_SYSTEM in rendered and SMOLLM_SYSTEM not in in_loss
    for absent in ("<|im_start|>", "assistant", "user", "12 + 30?", "twice that"):
        assert absent in rendered and absent not in in_loss


def test_gemma_folds_the_system_message_into_the_unmasked_user_turn(tokenizers):
    tokenizer = tokenizers["gemma"]
    text, spans = assistant_spans(tokenizer, WITH_SYSTEM)
    assert "<start_of_turn>system" not in text and "<start_of_turn>user\nYou are a careful math tutor.\n\nWhat is 12 + 30?" in text
    assert [text[a:b] for a, b in spans] == [reply + "<end_of_turn>" for reply in replies(WITH_SYSTEM)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_end_of_turn_token_and_what_follows_it(tokenizers, name):
    tokenizer, family = tokenizers[name], FAMILIES[name]
    expected_id = tokenizer.convert_tokens_to_ids(family.end_of_turn) if family.end_of_turn else None
    assert end_of_turn_token(tokenizer) == expected_id
    assert end_of_turn_suffix(tokenizer) == {"chatml": ("<|im_end|>", "\n"), "llama3": (EOT, ""), "gemma": ("<end_of_turn>", "\n"),
                                             "plain": ("", "\n\n")}[name]


def test_plain_template_masks_each_reply_and_not_the_separator(tokenizers):
    """With no special end-of-turn token a turn ends with its text: the reply's tokens are masked (the first
    one too, though its BPE token starts with the header's space) and the "\\n\\n" after it is not, so the
    drafter trains on no turn end; decoding such a verifier stops only at its eos."""
    tokenizer = tokenizers["plain"]
    messages = [*WITHOUT_SYSTEM[:3], {"role": "assistant", "content": "the answer is 84"}]
    sample = tokenize_conversation(tokenizer, Conversation("c", messages), max_length=10_000)
    runs = masked_runs(sample.input_ids, sample.loss_mask)
    assert [tokenizer.decode(run) for run in runs] == ["12 + 30 = 42, so the answer is 42", " the answer is 84"]
    assert runs[1][0] == tokenizer.convert_tokens_to_ids("Ġthe")  # one token spans the header's space and the reply's first word
    assert tokenizer.decode(sample.input_ids[-2:]) == "\n\n" and sample.loss_mask[-2:] == [0, 0]
    assert end_of_turn_token(tokenizer) is None


def test_template_that_is_not_prefix_stable_is_still_refused():
    tokenizer = make_tokenizer(Family(UNSTABLE_CHATML_TEMPLATE, "<|im_end|>", FAMILIES["chatml"].special_tokens))
    reasoning = [WITHOUT_SYSTEM[0], {"role": "assistant", "content": "<think>add them</think>42"}, *WITHOUT_SYSTEM[2:]]
    with pytest.raises(TapsError, match="renders conversation prefixes inconsistently"):
        tokenize_conversation(tokenizer, Conversation("c", reasoning), max_length=10_000)
    sample = tokenize_conversation(tokenizer, Conversation("c", WITHOUT_SYSTEM), max_length=10_000)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert masked_runs(sample.input_ids, sample.loss_mask) == [encode(tokenizer, reply) + [eot] for reply in replies(WITHOUT_SYSTEM)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_stop_ids_hold_the_end_of_turn_token_beside_the_configs_eos(tokenizers, name):
    tokenizer, family = tokenizers[name], FAMILIES[name]
    end_of_text = tokenizer.convert_tokens_to_ids(EOS)
    stop = stop_token_ids(tiny_model(tokenizer, end_of_text), tokenizer)
    expected = {end_of_text, tokenizer.eos_token_id} | ({tokenizer.convert_tokens_to_ids(family.end_of_turn)} if family.end_of_turn else set())
    assert stop == sorted(expected)


def test_stop_ids_skip_token_names_missing_from_the_vocabulary():
    """A tokenizer whose eos name is no token (its id reads as the unknown token's) and whose template renders
    that name after each reply: neither the eos nor the end of turn is a stop id, the configs' eos is."""
    family = Family("{% for message in messages %}{{ message['content'] + eos_token }}{% endfor %}", None, eos="</s>")
    tokenizer = make_tokenizer(family, unk_token="<unk>")
    assert tokenizer.eos_token_id == tokenizer.unk_token_id  # the trap: a missing name reads as <unk>
    end_of_text = tokenizer.convert_tokens_to_ids(EOS)
    assert end_of_turn_token(tokenizer) is None
    assert stop_token_ids(tiny_model(tokenizer, [end_of_text]), tokenizer) == [end_of_text]


@pytest.mark.parametrize("name", TEMPLATED)
def test_greedy_reply_stops_at_the_templates_end_of_turn_token(tokenizers, name, monkeypatch):
    """A model that emits the end-of-turn token at every step, while both configs name another eos: the reply
    ends after one token, not at max_new_tokens."""
    tokenizer = tokenizers[name]
    model = tiny_model(tokenizer, tokenizer.convert_tokens_to_ids(EOS))
    head = nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[tokenizer.convert_tokens_to_ids(FAMILIES[name].end_of_turn)] = 10.0
    model.lm_head = head
    generated = []
    generate = model.generate

    def counting_generate(ids, **kwargs):
        out = generate(ids, **kwargs)
        generated.append(out.shape[1] - ids.shape[1])
        return out

    monkeypatch.setattr(model, "generate", counting_generate)
    assert greedy_reply(model, tokenizer, "What is 12 + 30?", max_new_tokens=8) == ""
    assert generated == [1]
