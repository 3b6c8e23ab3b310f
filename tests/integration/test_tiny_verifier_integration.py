"""The real offline tiny verifier: a standard HF directory holding a language model that has learned
both corpora. Builds on first use (~8-10 min on 2 cores), then reuses the cache."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.verifier import TINY_VERIFIER, load_verifier
from taps_train.verifier.generation import greedy_reply
from taps_train.verifier.offline.tiny import TinyVerifierSpec, check_build

pytestmark = pytest.mark.integration


def test_loads_with_plain_transformers(tiny_verifier_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_verifier_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_verifier_dir)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tokenizer)
    assert tokenizer.chat_template and "<|start_header_id|>" in tokenizer.chat_template


def test_is_a_real_language_model(tiny_verifier_dir):
    manifest = check_build(tiny_verifier_dir)
    # A uniform guess over 8k tokens costs ~9 nats/token; the build must have learned both domains.
    assert manifest["heldout_loss"]["gsm_symbolic"] < 1.5
    assert manifest["heldout_loss"]["sharegpt"] < 6.5
    assert manifest["data"]["sharegpt"]["file_records"] == 17_671


def test_greedy_math_continuation_follows_the_chain_of_thought_format(tiny_verifier_dir):
    loaded = load_verifier(TINY_VERIFIER)
    assert loaded.path == str(tiny_verifier_dir)
    # A held-out problem: the build trained on other gsm_symbolic seeds.
    problem = gsm_symbolic_conversations(3, seed=TinyVerifierSpec().math_heldout_seed + 1)[2]
    reply = greedy_reply(loaded.model, loaded.tokenizer, problem.messages[0]["content"], max_new_tokens=120)
    assert "=" in reply and any(ch.isdigit() for ch in reply), reply


def test_held_out_math_is_far_likelier_than_chat(tiny_verifier_dir):
    loaded = load_verifier(str(tiny_verifier_dir))
    problem = gsm_symbolic_conversations(1, seed=99_999)[0]
    ids = loaded.tokenizer.apply_chat_template(problem.messages, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        loss = loaded.model(input_ids=ids, labels=ids).loss.item()
    assert loss < 2.0
