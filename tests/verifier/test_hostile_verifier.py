"""Hostile verifiers and prompts: a non-causal architecture, a sharded index leaving its directory, chat templates that
fail, prompts with lone surrogates, a stand-in too large for this machine."""

import json

import pytest
from transformers import AutoTokenizer, BertConfig, BertModel

from taps_train.data.chat_format import render_chat
from taps_train.errors import TapsError
from taps_train.verifier.loading import read_config, resolve_verifier_path
from taps_train.verifier.offline.standin import build_standin
from tests.conftest import one_line_error


def test_a_non_causal_architecture_is_refused(tmp_path):
    BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).save_pretrained(tmp_path / "bert")
    with pytest.raises(TapsError, match="is a BertModel, not a causal LM"):
        read_config(str(tmp_path / "bert"))


def test_a_sharded_index_leaving_the_directory_is_refused(random_verifier_dir, tmp_path):
    import shutil

    copy = tmp_path / "v"
    shutil.copytree(random_verifier_dir, copy)
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "../../etc/passwd"}}))
    with pytest.raises(TapsError, match="points at '../../etc/passwd', outside the model directory"):
        resolve_verifier_path(str(copy))


@pytest.mark.parametrize("template, problem", [
    (None, "has no chat template"),
    ("{% for m in messages %}{{ m.content ", r"failed \(TemplateSyntaxError"),
    ("{{ raise_exception('no system role') }}", r"failed \(TemplateError"),
    ("{{ messages.__class__.__mro__ }}", r"failed \(SecurityError"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", r"failed \(TemplateTimeout: it ran for more than"),
])
def test_chat_templates_that_fail_are_one_line(random_verifier_dir, monkeypatch, template, problem):
    monkeypatch.setattr("taps_train.data.chat_format.TEMPLATE_SECONDS", 1)
    tokenizer = AutoTokenizer.from_pretrained(random_verifier_dir)
    tokenizer.chat_template = template
    with pytest.raises(TapsError, match=problem):
        render_chat(tokenizer, [{"role": "user", "content": "hi"}])


def test_a_prompt_with_a_lone_surrogate_is_one_line(random_verifier_dir, capsys, taps_home):
    err = one_line_error(capsys, ["verifier", "generate", "bad \udcff text", "--verifier", str(random_verifier_dir)])
    assert "the prompt is not valid Unicode text" in err


def test_a_standin_too_large_for_this_machine_is_refused_before_allocating(tmp_path):
    with pytest.raises(TapsError, match="over half of this machine's"):
        build_standin(tmp_path / "big", hidden=1_000_000, heads=1000, kv_heads=1000)

