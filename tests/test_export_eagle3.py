"""EAGLE-3 export: SGLang's and vLLM's layouts, checked by a reader written from the published layout
alone, round trips with identical logits, and drafters the engines could not serve refused."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from taps_train.drafter import Eagle3Drafter, build_drafter
from taps_train.errors import TapsError
from taps_train.export import export_bundle, export_eagle, load_exported
from tests.test_export import causal_rope_attention, fingerprint, save_checkpoint  # noqa: F401 - fixture

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def make_eagle3(verifier, seed: int, layers: tuple[int, ...] | None = None) -> Eagle3Drafter:
    """A random EAGLE-3 drafter with a shuffled draft vocabulary and norm weights that are not all ones."""
    torch.manual_seed(seed)
    drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, 150, layers))
    drafter.load_verifier_parts(verifier)
    drafter.set_draft_vocabulary(torch.randperm(verifier.config.vocab_size)[:150])
    with torch.no_grad():
        for norm in (drafter.norm, drafter.midlayer.hidden_norm, drafter.midlayer.input_layernorm, drafter.midlayer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)
    return drafter.eval()


def verifier_features(verifier, ids: torch.Tensor, drafter: Eagle3Drafter) -> torch.Tensor:
    with torch.no_grad():
        states = verifier(input_ids=ids[None], output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in drafter.feature_layers], dim=-1)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def reference_eagle3_logits(directory, verifier, ids: torch.Tensor, sglang: bool) -> torch.Tensor:
    """One EAGLE-3 draft step over a sequence, from config.json + model.safetensors and the verifier alone:
    fc over the captured layers, [input_layernorm(embed), hidden_norm(h)] into attention, residual h, MLP, final
    norm, draft head, draft ids mapped to verifier ids by d2t. SGLang names layers by decoder-layer output."""
    config = json.loads((directory / "config.json").read_text())
    w = load_file(directory / "model.safetensors")
    layer_ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    captured = [i + 1 for i in layer_ids] if sglang else layer_ids  # index into hidden_states (inputs of decoder layers)
    with torch.no_grad():
        states = verifier(input_ids=ids[None], output_hidden_states=True).hidden_states
    eps = config["rms_norm_eps"]
    length = len(ids) - 1
    h = torch.cat([states[i][0, :length] for i in captured], -1) @ w["fc.weight"].T
    embed = verifier.get_input_embeddings().weight[ids[1:]]
    x = torch.cat([rms(embed, w["midlayer.input_layernorm.weight"], eps), rms(h, w["midlayer.hidden_norm.weight"], eps)], -1)
    h = h + causal_rope_attention(x, w, "midlayer.self_attn", config) @ w["midlayer.self_attn.o_proj.weight"].T
    n = rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    h = h + (torch.nn.functional.silu(n @ w["midlayer.mlp.gate_proj.weight"].T) * (n @ w["midlayer.mlp.up_proj.weight"].T)) @ w["midlayer.mlp.down_proj.weight"].T
    draft = rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
    full = torch.full((length, config["vocab_size"]), -math.inf)
    full[:, torch.arange(config["draft_vocab_size"]) + w["d2t"]] = draft
    return full


def drafter_logits(drafter: Eagle3Drafter, verifier, ids: torch.Tensor) -> torch.Tensor:
    length = len(ids) - 1
    features = verifier_features(verifier, ids, drafter)[:length]
    with torch.no_grad():
        hidden = drafter(ids[1:][None], features[None], torch.arange(length)[None], torch.ones(length, length, dtype=torch.bool).tril())
        return drafter.logits(hidden)[0]


@pytest.mark.parametrize("layout", ["eagle", "vllm"])
def test_independent_reader_and_round_trip(verifier, fingerprint, random_verifier_dir, tmp_path, layout):  # noqa: F811
    drafter = make_eagle3(verifier, seed=1)
    out = export_eagle(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir),
                       layout=layout, dtype="float32")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    assert config["architectures"] == [SGLANG_ARCHITECTURE if layout == "eagle" else "LlamaForCausalLM"]
    assert config["draft_vocab_size"] == 150 and config["target_hidden_size"] == verifier.config.hidden_size
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - (layout == "eagle") for i in drafter.feature_layers]
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool and "lm_head.weight" in tensors
    assert all(k.startswith(("midlayer.", "fc.", "norm.", "lm_head.", "embed_tokens.", "d2t", "t2d")) for k in tensors)
    ids = torch.tensor([0, 5, 17, 33, 2, 9, 41, 7])
    expected = drafter_logits(drafter, verifier, ids)
    torch.testing.assert_close(reference_eagle3_logits(out, verifier, ids, sglang=layout == "eagle"), expected, atol=2e-5, rtol=1e-5)
    loaded = load_exported(out, verifier)
    assert isinstance(loaded, Eagle3Drafter) and loaded.feature_layers == drafter.feature_layers
    assert torch.equal(drafter_logits(loaded, verifier, ids), expected)


def test_sglang_export_without_t2d_reads_back(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    """SGLang never reads t2d; a draft exported elsewhere without it still loads."""
    drafter = make_eagle3(verifier, seed=2)
    out = export_eagle(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir), dtype="float32")
    from safetensors.torch import save_file

    tensors = load_file(out / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "t2d"}, out / "model.safetensors")
    assert torch.equal(load_exported(out, verifier).t2d, drafter.t2d)


def test_drafters_fusing_states_engines_cannot_capture_are_refused(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    for layers in [(0, 1, 1), (1, 1, 2)]:  # the embeddings; the post-norm output of a 2-layer verifier
        checkpoint = save_checkpoint(make_eagle3(verifier, seed=3, layers=layers), fingerprint, tmp_path / "d.ckpt")
        with pytest.raises(TapsError, match="serving engines capture only the inputs of decoder layers 1..1"):
            export_eagle(checkpoint, tmp_path / "out", verifier=str(random_verifier_dir))


def test_bundle_of_an_eagle3_and_an_eagle2_drafter(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    from tests.test_export import make_drafter

    checkpoints = [save_checkpoint(make_drafter(verifier, 5, True), fingerprint, tmp_path / "hass.ckpt"),
                   save_checkpoint(make_eagle3(verifier, seed=6), fingerprint, tmp_path / "eagle3.ckpt")]
    out = export_bundle(checkpoints, tmp_path / "bundle", strategy="merge", domains=["math", "chat"], verifier=str(random_verifier_dir))
    architectures = [json.loads((out / f"drafter_{i}" / "config.json").read_text())["architectures"] for i in range(2)]
    assert architectures == [["LlamaForCausalLMEagle"], [SGLANG_ARCHITECTURE]]
    assert json.loads((out / "drafter_1" / "taps_export.json").read_text())["backbone"]["name"] == "eagle3"


def test_averaging_across_backbones_is_refused(verifier, fingerprint, tmp_path):  # noqa: F811
    from taps_train.drafter.average import average_checkpoints
    from tests.test_export import make_drafter

    checkpoints = [save_checkpoint(make_drafter(verifier, 7, True), fingerprint, tmp_path / "hass.ckpt"),
                   save_checkpoint(make_eagle3(verifier, seed=8), fingerprint, tmp_path / "eagle3.ckpt")]
    with pytest.raises(TapsError, match="different drafter backbones"):
        average_checkpoints(checkpoints)
