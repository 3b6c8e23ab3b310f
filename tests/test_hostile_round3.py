"""Hardening, round 3 (issue 24): each class of failure a hostile user found, fixed at its root, one case or two per
class here (bench/hostile.py throws many more): the environment, hand-edited configs and study folders, damaged
artefacts, YAML alias bombs, out-of-range fit options, wrong-backbone checkpoints, verifier directories and prompts,
and where results go."""

import json
import math
import os
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer, BertConfig, BertModel

from taps_train.cli import main
from taps_train.data.chat_format import render_chat
from taps_train.data.datamodule import DrafterDataModule
from taps_train.drafter.eagle3 import draft_vocab_tokens
from taps_train.errors import TapsError
from taps_train.eval.plots import markdown_cell
from taps_train.fit_config import check_trainer_options, fit_config_problems
from taps_train.paths import output_file, writable_directory
from taps_train.study.plan import Cell
from taps_train.study.run import _State
from taps_train.user_yaml import MAX_ALIASES, read_yaml
from taps_train.verifier.loading import read_config, resolve_verifier_path
from taps_train.verifier.offline.standin import build_standin

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------- environment

@pytest.mark.parametrize("home", ["file", "/proc/taps-home", "/dev/null/taps"])
def test_a_bad_taps_home_is_one_line_for_every_command(tmp_path, monkeypatch, capsys, home):
    if home == "file":
        home = tmp_path / "a-file"
        home.write_text("x")
    monkeypatch.setenv("TAPS_HOME", str(home))
    for argv in (["report", str(tmp_path), "--out", str(tmp_path / "r")], ["verifier", "info"], ["eval", "--drafters", "x.ckpt"]):
        assert "TAPS_HOME" in one_line_error(capsys, argv)


def test_output_checks_name_the_option(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(TapsError, match=r"--cache-dir .*file is a file, not a directory"):
        writable_directory(tmp_path / "file" / "cache", "--cache-dir", "fix")
    with pytest.raises(TapsError, match=r"--output /proc/x/r.json: folder /proc/x is not a writable directory"):
        output_file("/proc/x/r.json", "--output")
    with pytest.raises(TapsError, match="is a directory"):
        output_file(tmp_path, "--output")


def test_where_results_go_is_checked_before_work(tmp_path, capsys, taps_home):
    (tmp_path / "file").write_text("x")
    assert "--out" in one_line_error(capsys, ["report", str(tmp_path), "--out", str(tmp_path / "file")])
    assert "--output" in one_line_error(capsys, ["average", "--drafters", "a.ckpt", "b.ckpt", "--output", "/proc/x/avg.ckpt"])
    assert "filesystem root" in one_line_error(capsys, ["consolidate", "/"])


def test_report_cells_are_inert_text():
    assert markdown_cell("a|b\n## c <img src=x> [link](http://x) `code`") == "a\\|b ## c \\<img src=x\\> \\[link\\](http://x) \\`code\\`"


# ------------------------------------------------------------------------------------------- YAML and configs

def test_yaml_alias_bombs_duplicate_keys_and_dates(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(TapsError, match=f"more than {MAX_ALIASES} aliases"):
        read_yaml(tmp_path / "bomb.yaml", "study file", "fix")
    (tmp_path / "twice.yaml").write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(TapsError, match="duplicate key 'a'"):
        read_yaml(tmp_path / "twice.yaml", "study file", "fix")
    (tmp_path / "date.yaml").write_text("when: 2024-01-02\nat: 2024-01-02 10:00:00\n")
    assert read_yaml(tmp_path / "date.yaml", "x", "fix") == {"when": "2024-01-02", "at": "2024-01-02 10:00:00"}
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(TapsError, match="is not UTF-8 text"):
        read_yaml(tmp_path / "latin1.yaml", "recipe", "fix")


@pytest.mark.parametrize("config, problem", [
    ({"trainer": [1, 2], "model": {}, "data": {}}, "trainer must be a mapping, got list"),
    ({"model": {"class_path": "x", "init_args": [1]}}, "model.init_args must be a mapping"),
    ({"trainer": {"callbacks": "foo"}}, "trainer.callbacks[0] must be a mapping"),
    ({"trainer": {"logger": {"class_path": "x", "init_args": "s"}}}, "trainer.logger[0].init_args must be a mapping"),
    ({"data": {"class_path": 3}}, "data.class_path must be a dotted class name"),
    ([1, 2], "the file must be a mapping of sections"),
])
def test_fit_config_shapes(config, problem):
    assert problem in fit_config_problems(config)[0]


def test_fit_refuses_a_config_alias_bomb_and_a_list_trainer(tmp_path, capsys, taps_home):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    assert "more than 64 aliases" in one_line_error(capsys, ["fit", "--config", str(tmp_path / "bomb.yaml")])
    (tmp_path / "list.yaml").write_text("trainer: [1, 2]\nmodel: {}\ndata: {}\n")
    assert "trainer must be a mapping" in one_line_error(capsys, ["fit", "--config", str(tmp_path / "list.yaml")])


def test_a_bad_class_path_is_one_line_naming_the_key_and_nothing_runs(tmp_path, capsys, taps_home):
    marker = tmp_path / "PWNED"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": {"class_path": "os.system", "init_args": {"command": f"touch {marker}"}},
                                                     "data": {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", str(marker)]}}}))
    err = one_line_error(capsys, ["fit", "--config", str(tmp_path / "c.yaml")])
    assert err.startswith(f"taps-train: error: fit config {tmp_path / 'c.yaml'}: Parser key") and not marker.exists()


@pytest.mark.parametrize("trainer, key", [({"max_steps": -5}, "trainer.max_steps"), ({"log_every_n_steps": 0}, "trainer.log_every_n_steps"),
                                          ({"gradient_clip_val": math.nan}, "trainer.gradient_clip_val"),
                                          ({"limit_val_batches": -1}, "trainer.limit_val_batches")])
def test_trainer_bounds(trainer, key):
    with pytest.raises(TapsError, match=key):
        check_trainer_options(trainer)
    check_trainer_options({"max_steps": -1, "max_epochs": None, "log_every_n_steps": 5, "limit_val_batches": 0.5})


# ------------------------------------------------------------------------------------------- fit options and checkpoints

@pytest.mark.parametrize("options, key", [
    ({"batch_size": 0}, "data.batch_size"), ({"batch_size": -1}, "data.batch_size"), ({"max_tokens_per_batch": 0}, "data.max_tokens_per_batch"),
    ({"max_tokens_per_batch": 100}, "smaller than one sample"), ({"val_samples_per_source": -1}, "data.val_samples_per_source"),
    ({"seed": -3}, "data.seed"),
])
def test_datamodule_options_out_of_range(random_verifier_dir, options, key):
    recipe = Path(__file__).parents[1] / "data_recipes" / "tiny_math.yaml"
    with pytest.raises(TapsError, match=key):
        DrafterDataModule(str(recipe), verifier=str(random_verifier_dir), **options)


def test_a_file_as_cache_dir_is_refused(random_verifier_dir, tmp_path):
    (tmp_path / "file").write_text("x")
    recipe = Path(__file__).parents[1] / "data_recipes" / "tiny_math.yaml"
    with pytest.raises(TapsError, match="data.cache_dir"):
        DrafterDataModule(str(recipe), verifier=str(random_verifier_dir), cache_dir=str(tmp_path / "file"))


@pytest.mark.parametrize("options, key", [({"lr": math.nan}, "model.lr"), ({"lr": -1e-3}, "model.lr"), ({"lr": 0.0}, "model.lr"),
                                          ({"warmup_steps": -2}, "model.warmup_steps"), ({"betas": (0.9, 1.5)}, "model.betas"),
                                          ({"topk": 0}, "model.topk"), ({"feature_noise": math.inf}, "model.feature_noise")])
def test_module_options_out_of_range(random_verifier_dir, options, key):
    from taps_train.training import Eagle2Module

    with pytest.raises(TapsError, match=key):
        Eagle2Module(verifier=str(random_verifier_dir), **options)


def test_draft_vocabulary_larger_than_the_verifiers_is_refused():
    with pytest.raises(TapsError, match="exceeds the verifier's vocabulary of 100 tokens"):
        draft_vocab_tokens(101, 100)
    assert draft_vocab_tokens(100, 100) == 100 and draft_vocab_tokens(0.5, 100) == 50


def test_a_checkpoint_of_another_backbone_is_refused_before_loading(random_verifier_dir, tmp_path):
    from taps_train.training import Eagle2Module, Eagle3Module

    eagle3 = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=0.5)
    trained = {f"drafter.{k}": v for k, v in eagle3.drafter.state_dict().items() if k not in eagle3.drafter.frozen_parameter_names()}
    checkpoint = {"taps": {"drafter_config": eagle3.drafter.config.to_dict(), "verifier": eagle3.verifier_fingerprint}, "state_dict": trained}
    torch.save(checkpoint, tmp_path / "e3.ckpt")
    eagle2 = Eagle2Module(verifier=str(random_verifier_dir))
    with pytest.raises(TapsError, match=r"holds a LlamaForCausalLMEagle3 .* this Eagle2Module trains a LlamaForCausalLMEagle"):
        eagle2.on_load_checkpoint(checkpoint)
    with pytest.raises(TapsError, match="warm-start checkpoint .* holds a LlamaForCausalLMEagle3"):
        Eagle2Module(verifier=str(random_verifier_dir), init_from=str(tmp_path / "e3.ckpt"))
    hass = Eagle2Module(verifier=str(random_verifier_dir), fc_bias=True)
    with pytest.raises(TapsError, match="with fc bias"):
        Eagle2Module(verifier=str(random_verifier_dir)).on_load_checkpoint(
            {"taps": {"drafter_config": hass.drafter.config.to_dict(), "verifier": hass.verifier_fingerprint}})


# ------------------------------------------------------------------------------------------- study folders

def _cell(tmp_path: Path) -> Cell:
    output = tmp_path / "fits" / "last.ckpt"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(b"weights" * 100)
    return Cell(key="fit_x_a", kind="fit", backbone="x", label="a", args=[], outputs=[output], fingerprint="f", log=tmp_path / "logs" / "x.log")


def test_a_damaged_output_is_not_a_finished_cell(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.record(cell, 1.0)
    assert state.finished(cell)
    cell.outputs[0].write_bytes(b"")  # truncated to 0 bytes
    assert not state.finished(cell)
    cell.outputs[0].write_bytes(b"weightz" * 100)  # same size, other bytes
    assert not state.finished(cell)
    cell.outputs[0].write_bytes(b"weights" * 100)
    os.utime(cell.outputs[0], ns=(1, 1))  # restored content, other time: the hash decides
    assert state.finished(cell)


def test_a_cell_record_replaced_by_a_directory_is_one_line(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.path(cell).mkdir(parents=True)
    with pytest.raises(TapsError, match="is a directory, where taps-train keeps a cell's record"):
        state.finished(cell)


def test_records_of_older_versions_still_count_when_outputs_are_not_empty(tmp_path):
    cell, state = _cell(tmp_path), _State(tmp_path)
    state.directory.mkdir(parents=True)
    state.path(cell).write_text(json.dumps({"fingerprint": "f", "outputs": [str(cell.outputs[0])]}))
    assert state.finished(cell)
    cell.outputs[0].write_bytes(b"")
    assert not state.finished(cell)


# ------------------------------------------------------------------------------------------- verifiers and prompts

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
