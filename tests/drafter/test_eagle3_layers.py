"""EAGLE-3's fused verifier layers and draft vocabulary size for verifiers of any size: default layers distinct and
capturable by serving engines, bad `feature_layers` and `draft_vocab_size` refused in one line, a fractional draft
vocabulary resolved against the verifier's, and both forms read from YAML as LightningCLI reads them."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from jsonargparse import ArgumentParser
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from taps_train.drafter import Eagle3Drafter, build_drafter
from taps_train.drafter.config import vocab_tokens
from taps_train.drafter.eagle3 import check_feature_layers, default_feature_layers
from taps_train.errors import TapsError
from taps_train.export import export_drafter
from taps_train.training import Eagle3Module
from taps_train.verifier.fingerprint import verifier_fingerprint
from tests.shipped.test_configs import print_config
from tests.export.test_export import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TINY_EAGLE3 = ROOT / "configs" / "tiny" / "eagle3_math.yaml"


def one_line(pattern: str) -> str:
    """A `pytest.raises(match=...)` pattern that also refuses a multi-line message."""
    return rf"^{pattern}[^\n]*$"


@pytest.fixture(scope="module")
def verifier4_dir(random_verifier_dir, tmp_path_factory) -> Path:
    """The random verifier's tokenizer and sizes with 4 decoder layers: the fewest with three distinct capturable states."""
    path = tmp_path_factory.mktemp("verifier4")
    config = AutoConfig.from_pretrained(random_verifier_dir)
    config.num_hidden_layers = 4
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(random_verifier_dir).save_pretrained(path)
    return path


# --- default layers -----------------------------------------------------------------------------


@pytest.mark.parametrize("layers", range(4, 81))
def test_default_layers_are_three_distinct_capturable_states(layers):
    chosen = default_feature_layers(layers)
    assert len(chosen) == 3 and chosen[0] < chosen[1] < chosen[2] and 1 <= chosen[0] and chosen[2] <= layers - 1
    assert check_feature_layers(chosen, layers) == chosen  # what the default picks, a user may write
    if layers >= 7:
        assert chosen == (2, layers // 2, layers - 3)  # EAGLE-3's (and speculators') low, mid, high


def test_default_layers_of_known_verifiers():
    assert default_feature_layers(30) == (2, 15, 27)  # SmolLM2-135M
    assert default_feature_layers(32) == (2, 16, 29)  # Llama-3-8B, as configs/eagle3_mixed_35k.yaml names them
    assert [default_feature_layers(n) for n in (4, 5, 6)] == [(1, 2, 3), (1, 2, 4), (1, 3, 5)]  # 6: not (2, 3, 3)


def test_toy_verifiers_repeat_their_few_capturable_states():
    """2 and 3 layers (the tiny verifier has 2) have fewer than three engine-capturable states: each is used."""
    assert default_feature_layers(2) == (1, 1, 1)
    assert default_feature_layers(3) == (1, 1, 2)
    assert check_feature_layers((1, 2, 2), 3) == (1, 2, 2)


@pytest.mark.parametrize("layers", [0, 1])
def test_a_verifier_without_capturable_states_is_refused(layers):
    with pytest.raises(TapsError, match=one_line(f"the verifier has {layers} decoder layer.*at least 4 layers")):
        default_feature_layers(layers)


def test_hidden_states_indices_are_decoder_layer_inputs_then_the_post_norm_output(verifier4_dir):
    """Why 1..L-1: `hidden_states[i]` is decoder layer i's input (0: the embeddings) and `hidden_states[L]` the
    final-norm output, which engines never capture."""
    verifier = AutoModelForCausalLM.from_pretrained(verifier4_dir).eval()
    inputs, outputs = [], []
    for layer in verifier.model.layers:
        layer.register_forward_pre_hook(lambda module, args, kwargs: inputs.append(kwargs.get("hidden_states", args[0] if args else None)),
                                        with_kwargs=True)
        layer.register_forward_hook(lambda module, args, out: outputs.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        states = verifier(input_ids=torch.tensor([[3, 9, 27, 81]]), output_hidden_states=True).hidden_states
    assert len(states) == 5 and torch.equal(states[0], verifier.model.embed_tokens(torch.tensor([[3, 9, 27, 81]])))
    for i in range(4):
        torch.testing.assert_close(states[i], inputs[i])
    torch.testing.assert_close(states[4], verifier.model.norm(outputs[-1]))
    assert not torch.allclose(states[4], outputs[-1])


# --- user-given layers --------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [
    (15, 2, 27),  # engines concatenate in layer order: fc would read them permuted
    (2, 15, 15),  # speculators refuses repeated ids
    (0, 15, 27),  # the embeddings
    (2, 15, 30),  # the post-norm output
    (-2, 15, 27),
    (2, 15),
    (2, 15, 27, 28),
    (2.0, 15, 27),
])
def test_bad_feature_layers_are_refused_in_one_line(layers):
    expected = rf"feature_layers must be 3 distinct .* within 1\.\.29 .*got {re.escape(str(list(layers)))}; use e\.g\. \[2, 15, 27\]"
    with pytest.raises(TapsError, match=one_line(expected)):
        check_feature_layers(layers, 30)


@pytest.mark.parametrize("layers, count", [((1, 1, 2), 2), ((1, 1, 1), 3), ((2, 2, 2), 3)])
def test_toy_verifier_layers_that_skip_a_capturable_state_are_refused(layers, count):
    with pytest.raises(TapsError, match=one_line(rf"feature_layers must be 3 verifier hidden_states .* each of those {count - 1} at least once")):
        check_feature_layers(layers, count)


def test_module_refuses_bad_feature_layers_and_keeps_good_ones(random_verifier_dir, verifier4_dir):
    with pytest.raises(TapsError, match=one_line(r"feature_layers must be .*got \[1, 1, 2\]")):
        Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, feature_layers=[1, 1, 2])
    with pytest.raises(TapsError, match=one_line(r"feature_layers must be 3 distinct .*got \[3, 1, 2\]")):
        Eagle3Module(verifier=str(verifier4_dir), draft_vocab_size=64, feature_layers=[3, 1, 2])
    assert Eagle3Module(verifier=str(verifier4_dir), draft_vocab_size=64, feature_layers=[1, 2, 3]).drafter.feature_layers == (1, 2, 3)
    assert Eagle3Module(verifier=str(verifier4_dir), draft_vocab_size=64).drafter.feature_layers == (1, 2, 3)


def test_a_resumed_run_fusing_other_layers_is_refused(verifier4_dir):
    """Same shapes, other features: a checkpoint of another (or an older default's) layers cannot resume silently."""
    module = Eagle3Module(verifier=str(verifier4_dir), draft_vocab_size=64)
    checkpoint = {"state_dict": {}}
    module.on_save_checkpoint(checkpoint)
    module.on_load_checkpoint(checkpoint)  # its own layers resume
    checkpoint["taps"]["drafter_config"]["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 3]}
    with pytest.raises(TapsError, match=one_line(r"checkpoint was trained on verifier hidden states \[1, 3, 3\], but this run fuses "
                                                 r"\[1, 2, 3\]; resume with the feature_layers it was trained on")):
        module.on_load_checkpoint(checkpoint)


# --- exports ------------------------------------------------------------------------------------


def eagle3_checkpoint(verifier_dir: Path, layers: tuple[int, ...] | None, path: Path) -> str:
    verifier = AutoModelForCausalLM.from_pretrained(verifier_dir).eval()
    torch.manual_seed(0)
    drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, 50, layers))
    drafter.load_verifier_parts(verifier)
    drafter.set_vocabulary(torch.arange(50))
    return save_checkpoint(drafter, verifier_fingerprint(str(verifier_dir), AutoTokenizer.from_pretrained(verifier_dir)), path)


def test_default_layers_export_as_distinct_speculators_ids(verifier4_dir, tmp_path):
    out = export_drafter(eagle3_checkpoint(verifier4_dir, None, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(verifier4_dir),
                       layout="speculators", dtype="float32")
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


def test_exports_engines_would_misread_are_refused_or_flagged(verifier4_dir, random_verifier_dir, tmp_path):
    with pytest.raises(TapsError, match=one_line(r".*fuses verifier hidden states \[3, 1, 2\]; serving engines concatenate them in layer order")):
        export_drafter(eagle3_checkpoint(verifier4_dir, (3, 1, 2), tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(verifier4_dir))
    with pytest.warns(UserWarning, match=r"fuses verifier hidden states \[1, 1, 1\], one of them twice.*speculators refuses"):
        export_drafter(eagle3_checkpoint(random_verifier_dir, None, tmp_path / "toy.ckpt"), tmp_path / "toy", verifier=str(random_verifier_dir),
                     layout="speculators")


# --- draft vocabulary size ----------------------------------------------------------------------


@pytest.mark.parametrize("size, vocab, tokens", [
    (2048, 8192, 2048), (400, 400, 400), (1, 400, 1),  # a count, at most the verifier's vocabulary
    (0.25, 8192, 2048), (0.25, 128256, 32064), (0.1, 405, 40), (1.0, 400, 400), (1e-9, 400, 1),  # a fraction, rounded, >= 1
])
def test_draft_vocab_size_is_a_count_or_a_fraction(size, vocab, tokens):
    resolved = vocab_tokens(size, vocab, "draft_vocab_size")
    assert resolved == tokens and type(resolved) is int


def test_a_count_beyond_the_verifiers_vocabulary_is_refused():
    with pytest.raises(TapsError, match="draft_vocab_size 1000000 exceeds the verifier's vocabulary of 400 tokens"):
        vocab_tokens(10**6, 400, "draft_vocab_size")


@pytest.mark.parametrize("size", [0, -3, True, False, 0.0, -0.5, 1.5, 2048.0, math.nan, math.inf, "0.25", None])
def test_bad_draft_vocab_size_is_refused_before_the_verifier_is_read(size):
    with pytest.raises(TapsError, match=one_line(r"draft_vocab_size must be an int >= 1 \(tokens\) or a float in \(0, 1\]")):
        Eagle3Module(verifier="/nonexistent/verifier", draft_vocab_size=size)


def test_fractional_draft_vocabulary_is_stored_as_a_count(random_verifier_dir):
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=0.25)
    vocab = module.drafter.config.vocab_size
    assert module.drafter.config.draft_vocab_size == round(vocab / 4) and module.drafter.lm_head.out_features == round(vocab / 4)
    checkpoint = {"state_dict": {}}
    module.on_save_checkpoint(checkpoint)
    assert checkpoint["taps"]["drafter_config"]["draft_vocab_size"] == round(vocab / 4)  # what exports and loaders read


@pytest.mark.parametrize("value, parsed", [("0.25", 0.25), ("256", 256), ("1", 1), ("1.0", 1.0)])
def test_yaml_draft_vocab_size_keeps_its_type(value, parsed, random_verifier_dir, tmp_path):
    """As LightningCLI's parser reads a model config: 256 stays an int (tokens), 0.25 and 1.0 stay floats (fractions)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Eagle3Module, "model")
    config = parser.parse_string(f"model:\n  class_path: taps_train.training.Eagle3Module\n  init_args:\n"
                                 f"    verifier: {random_verifier_dir}\n    draft_vocab_size: {value}\n")
    module = parser.instantiate(config).model
    assert module.hparams.draft_vocab_size == parsed and type(module.hparams.draft_vocab_size) is type(parsed)
    assert module.drafter.config.draft_vocab_size == vocab_tokens(parsed, module.drafter.config.vocab_size, "draft_vocab_size")


@pytest.mark.parametrize("override, parsed", [(None, 0.25), ("model: {init_args: {draft_vocab_size: 2048}}", 2048)])
def test_taps_train_fit_reads_both_forms(override, parsed, capsys, tmp_path):
    """The shipped tiny config's fraction, and a count layered over it, as `taps-train fit` resolves them."""
    configs = [TINY_EAGLE3]
    if override:
        configs.append(tmp_path / "override.yaml")
        configs[-1].write_text(override)
    size = print_config(capsys, *configs)["model"]["init_args"]["draft_vocab_size"]
    assert size == parsed and type(size) is type(parsed)
