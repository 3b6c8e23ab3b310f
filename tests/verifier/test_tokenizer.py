from transformers import AutoTokenizer

from taps_train.verifier.offline.tokenizer import BOS, EOT, SPECIAL_TOKENS

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "12 + 30 = 42\n#### 42"},
    {"role": "user", "content": "Thanks!"},
]


def test_chat_template_has_the_llama3_layout(random_verifier_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 12 + 30?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n12 + 30 = 42\n#### 42<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThanks!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_chat_template_round_trips_through_tokens(random_verifier_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    # Every special token is one id, never split into bytes.
    for token in SPECIAL_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    assert ids[0] == tokenizer.convert_tokens_to_ids(BOS)
    assert ids.count(tokenizer.convert_tokens_to_ids(EOT)) == len(MESSAGES)


def test_plain_encoding_adds_bos_and_eos_is_end_of_turn(random_verifier_dir):
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    assert tokenizer("hello")["input_ids"][0] == tokenizer.bos_token_id
    assert tokenizer.eos_token == EOT
