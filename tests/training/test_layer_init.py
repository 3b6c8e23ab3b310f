"""`model.layer_init: verifier`: the drafter's decoder layer starts as a copy of the verifier's last layer, wherever
a tensor's name and shape agree, and nothing else changes (the other tensors are the random start they would be)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from taps_train.errors import TapsError
from taps_train.training import Eagle2Module, HassModule
from taps_train.training.eagle3 import Eagle3Module

from tests.drafter.test_toy_backbone import ToyModule


def _modules(make) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same module with layer_init verifier and random, each built from the same seed."""
    torch.manual_seed(0)
    started = make("verifier")
    torch.manual_seed(0)
    return started, make("random")


def _last_layer(verifier_dir) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(verifier_dir)
    return dict(model.model.layers[-1].named_parameters())


@pytest.mark.parametrize("module_class", [Eagle2Module, HassModule])
def test_eagle2_layer_is_the_verifiers_last(random_verifier_dir, module_class):
    started, random = _modules(lambda init: module_class(verifier=str(random_verifier_dir), layer_init=init))
    verifier = _last_layer(random_verifier_dir)
    layer = dict(started.drafter.layers[0].named_parameters())
    assert set(layer) < set(verifier)  # the drafter's layer has no input norm
    for name, tensor in layer.items():
        assert torch.equal(tensor, verifier[name]), name
        assert tensor.requires_grad, name  # a start, not a frozen part
    for name, tensor in random.drafter.named_parameters():
        if not name.startswith("layers.0."):
            assert torch.equal(tensor, started.drafter.get_parameter(name)), name  # the rest: the same random start


def test_eagle3_copies_what_has_the_verifier_layers_shape(random_verifier_dir):
    started, random = _modules(lambda init: Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=64, layer_init=init))
    verifier = _last_layer(random_verifier_dir)
    copied = {"self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
              "input_layernorm.weight", "post_attention_layernorm.weight"}
    for name, tensor in started.drafter.midlayer.named_parameters():
        reference = verifier[name] if name in copied else random.drafter.midlayer.get_parameter(name)
        assert torch.equal(tensor, reference), name  # q/k/v read [embedding, hidden]: twice the width, stay random


def test_sharded_bfloat16_verifier(standin):
    """The Llama-3-shaped stand-in keeps its layers in another shard than the embedding, in bfloat16."""
    module = Eagle2Module(verifier=str(standin), layer_init="verifier")
    verifier = _last_layer(standin)
    weight = module.drafter.layers[0].mlp.down_proj.weight
    assert weight.dtype == torch.float32 and torch.equal(weight, verifier["mlp.down_proj.weight"].float())


def test_bad_settings_are_refused(random_verifier_dir, tmp_path):
    with pytest.raises(TapsError, match="unknown model.layer_init 'last'; use one of random, verifier"):
        Eagle2Module(verifier=str(random_verifier_dir), layer_init="last")
    with pytest.raises(TapsError, match="model.layer_init and model.init_from both say where the drafter starts"):
        Eagle2Module(verifier=str(random_verifier_dir), layer_init="verifier", init_from=str(tmp_path / "x.ckpt"))
    with pytest.raises(TapsError, match="the toy drafter has no decoder layer"):
        ToyModule(verifier=str(random_verifier_dir), layer_init="verifier")


def test_verifier_layer_unlike_the_drafters_is_refused(random_verifier_dir, tmp_path):
    """GPT-2's layer (fused c_attn, c_fc/c_proj) shares no tensor name with a Llama layer: nothing to start from."""
    path = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=400, n_embd=32, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=False)).save_pretrained(path)
    for file in random_verifier_dir.glob("tokenizer*"):
        (path / file.name).write_bytes(file.read_bytes())
    with pytest.raises(TapsError, match=r"no tensor of verifier .*gpt2's last layer \(ln_1.weight, .*\) has the name and shape"):
        Eagle2Module(verifier=str(path), layer_init="verifier")
