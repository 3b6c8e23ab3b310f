"""EAGLE-3 export: SGLang's, vLLM's and the speculators layouts, checked by a reader written from the published layout
alone, round trips with identical logits, and drafters the engines could not serve refused."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from taps_train.drafter import Eagle3Drafter, build_drafter
from taps_train.errors import TapsError
from taps_train.export import export_bundle, export_drafter, load_exported
from taps_train.export.speculators import from_speculators
from tests.export.test_export import causal_rope_attention, fingerprint, save_checkpoint  # noqa: F401 - fixture

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def make_eagle3(verifier, seed: int, layers: tuple[int, ...] | None = None) -> Eagle3Drafter:
    """A random EAGLE-3 drafter with a shuffled draft vocabulary and norm weights that are not all ones."""
    torch.manual_seed(seed)
    drafter = build_drafter(Eagle3Drafter.config_for(verifier.config, 150, layers))
    drafter.load_verifier_parts(verifier)
    drafter.set_vocabulary(torch.randperm(verifier.config.vocab_size)[:150])
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


def reference_eagle3_logits(directory, verifier, ids: torch.Tensor, layout: str) -> torch.Tensor:
    """One EAGLE-3 draft step over a sequence, from config.json + model.safetensors and the verifier alone:
    fc over the captured layers, [input_layernorm(embed), hidden_norm(h)] into attention, residual h, MLP, final
    norm, draft head, draft ids mapped to verifier ids by d2t. SGLang names layers by decoder-layer output; the
    speculators format nests the Llama config and names the decoder layer `layers.0`."""
    config = json.loads((directory / "config.json").read_text())
    w = load_file(directory / "model.safetensors")
    if layout == "speculators":
        layer_ids, draft_vocab, config, layer = (config["eagle_aux_hidden_state_layer_ids"], config["draft_vocab_size"],
                                                 config["transformer_layer_config"], "layers.0")
    else:
        layer_ids, draft_vocab, layer = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"], config["draft_vocab_size"], "midlayer"
    captured = [i + 1 for i in layer_ids] if layout == "eagle" else layer_ids  # index into hidden_states (inputs of decoder layers)
    with torch.no_grad():
        states = verifier(input_ids=ids[None], output_hidden_states=True).hidden_states
    eps = config["rms_norm_eps"]
    length = len(ids) - 1
    h = torch.cat([states[i][0, :length] for i in captured], -1) @ w["fc.weight"].T
    embed = verifier.get_input_embeddings().weight[ids[1:]]
    x = torch.cat([rms(embed, w[f"{layer}.input_layernorm.weight"], eps), rms(h, w[f"{layer}.hidden_norm.weight"], eps)], -1)
    h = h + causal_rope_attention(x, w, f"{layer}.self_attn", config) @ w[f"{layer}.self_attn.o_proj.weight"].T
    n = rms(h, w[f"{layer}.post_attention_layernorm.weight"], eps)
    mlp = {name: w[f"{layer}.mlp.{name}_proj.weight"] for name in ("gate", "up", "down")}
    h = h + (torch.nn.functional.silu(n @ mlp["gate"].T) * (n @ mlp["up"].T)) @ mlp["down"].T
    draft = rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T
    full = torch.full((length, config["vocab_size"]), -math.inf)
    full[:, torch.arange(draft_vocab) + w["d2t"]] = draft
    return full


def drafter_logits(drafter: Eagle3Drafter, verifier, ids: torch.Tensor) -> torch.Tensor:
    length = len(ids) - 1
    features = verifier_features(verifier, ids, drafter)[:length]
    with torch.no_grad():
        hidden = drafter(ids[1:][None], features[None], torch.arange(length)[None], torch.ones(length, length, dtype=torch.bool).tril())
        return drafter.logits(hidden)[0]


@pytest.mark.parametrize("layout", ["eagle", "vllm", "speculators"])
def test_independent_reader_and_round_trip(verifier, fingerprint, random_verifier_dir, tmp_path, layout):  # noqa: F811
    drafter = make_eagle3(verifier, seed=1)
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir),
                       layout=layout, dtype="float32")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(out / "model.safetensors")
    layer = "layers.0." if layout == "speculators" else "midlayer."
    if layout == "speculators":
        assert config["architectures"] == ["Eagle3Speculator"] and config["speculators_model_type"] == "eagle3"
        assert config["eagle_aux_hidden_state_layer_ids"] == list(drafter.feature_layers) and config["norm_before_residual"] is False
        assert config["speculators_config"]["verifier"]["name_or_path"] == fingerprint["path"]
        assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
        assert config["transformer_layer_config"]["vocab_size"] == verifier.config.vocab_size
    else:
        assert config["architectures"] == [SGLANG_ARCHITECTURE if layout == "eagle" else "LlamaForCausalLM"]
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - (layout == "eagle") for i in drafter.feature_layers]
    assert config["draft_vocab_size"] == 150 and config["target_hidden_size"] == verifier.config.hidden_size
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool and "lm_head.weight" in tensors
    assert all(k.startswith((layer, "fc.", "norm.", "lm_head.", "embed_tokens.", "d2t", "t2d")) for k in tensors)
    ids = torch.tensor([0, 5, 17, 33, 2, 9, 41, 7])
    expected = drafter_logits(drafter, verifier, ids)
    torch.testing.assert_close(reference_eagle3_logits(out, verifier, ids, layout), expected, atol=2e-5, rtol=1e-5)
    loaded = load_exported(out, verifier)
    assert isinstance(loaded, Eagle3Drafter) and loaded.feature_layers == drafter.feature_layers
    assert torch.equal(drafter_logits(loaded, verifier, ids), expected)


def test_speculators_layout_holds_eagle3_drafts_only(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    from tests.export.test_export import make_drafter

    checkpoint = save_checkpoint(make_drafter(verifier, 4, True), fingerprint, tmp_path / "hass.ckpt")
    with pytest.raises(TapsError, match="holds EAGLE-3 drafts only"):
        export_drafter(checkpoint, tmp_path / "out", verifier=str(random_verifier_dir), layout="speculators")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    ({"norm_before_residual": True}, "has no such norms"),
    ({"fc_norm": True}, "has no such norms"),
    ({"speculators_model_type": "eagle"}, "of type 'eagle3' only"),
    ({"transformer_layer_config": None}, "no transformer_layer_config"),
    ({"draft_vocab_size": "150"}, "no integer draft_vocab_size"),
])
def test_speculators_drafts_taps_train_cannot_reproduce_are_refused(verifier, fingerprint, random_verifier_dir, tmp_path, change, message):  # noqa: F811
    out = export_drafter(save_checkpoint(make_eagle3(verifier, seed=9), fingerprint, tmp_path / "d.ckpt"), tmp_path / "out",
                       verifier=str(random_verifier_dir), layout="speculators", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(TapsError, match=message):
        load_exported(out, verifier)


def test_speculators_draft_without_layer_ids_reads_the_speculators_default():
    """speculators fills in layers 2, L/2 and L-3 of the verifier when the config names none."""
    config = {"speculators_model_type": "eagle3", "transformer_layer_config": {"hidden_size": 64}, "draft_vocab_size": 10}
    flat, tensors = from_speculators(config, {"layers.0.mlp.up_proj.weight": torch.ones(1), "fc.weight": torch.ones(1)}, 32, "draft")
    assert flat["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29] and flat["hidden_size"] == 64
    assert set(tensors) == {"midlayer.mlp.up_proj.weight", "fc.weight"}


def test_speculators_draft_reading_layers_the_verifier_lacks_is_refused(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    out = export_drafter(save_checkpoint(make_eagle3(verifier, seed=10), fingerprint, tmp_path / "d.ckpt"), tmp_path / "out",
                       verifier=str(random_verifier_dir), layout="speculators", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": None}))  # default 2, 1, -1 for 2 layers
    with pytest.raises(TapsError, match=r"speculators default \[2, 1, -1\] \(2, L/2, L-3\) does not exist in a 2-layer verifier"):
        load_exported(out, verifier)
    (out / "config.json").write_text(json.dumps({**config, "eagle_aux_hidden_state_layer_ids": [1, 5, 1]}))
    with pytest.raises(TapsError, match=r"reads verifier hidden states \[1, 5, 1\].*has 3"):
        load_exported(out, verifier)


def test_sglang_export_without_t2d_reads_back(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    """SGLang never reads t2d; a draft exported elsewhere without it still loads."""
    drafter = make_eagle3(verifier, seed=2)
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", verifier=str(random_verifier_dir), dtype="float32")
    from safetensors.torch import save_file

    tensors = load_file(out / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "t2d"}, out / "model.safetensors")
    assert torch.equal(load_exported(out, verifier).t2d, drafter.t2d)


def test_drafters_fusing_states_engines_cannot_capture_are_refused(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    for layers in [(0, 1, 1), (1, 1, 2)]:  # the embeddings; the post-norm output of a 2-layer verifier
        checkpoint = save_checkpoint(make_eagle3(verifier, seed=3, layers=layers), fingerprint, tmp_path / "d.ckpt")
        with pytest.raises(TapsError, match="serving engines capture only the inputs of decoder layers 1..1"):
            export_drafter(checkpoint, tmp_path / "out", verifier=str(random_verifier_dir))


def test_bundle_of_an_eagle3_and_an_eagle2_drafter(verifier, fingerprint, random_verifier_dir, tmp_path):  # noqa: F811
    from tests.export.test_export import make_drafter

    checkpoints = [save_checkpoint(make_drafter(verifier, 5, True), fingerprint, tmp_path / "hass.ckpt"),
                   save_checkpoint(make_eagle3(verifier, seed=6), fingerprint, tmp_path / "eagle3.ckpt")]
    out = export_bundle(checkpoints, tmp_path / "bundle", strategy="merge", domains=["math", "chat"], verifier=str(random_verifier_dir))
    architectures = [json.loads((out / f"drafter_{i}" / "config.json").read_text())["architectures"] for i in range(2)]
    assert architectures == [["LlamaForCausalLMEagle"], [SGLANG_ARCHITECTURE]]
    assert json.loads((out / "drafter_1" / "taps_export.json").read_text())["backbone"]["name"] == "eagle3"


def test_averaging_across_backbones_is_refused(verifier, fingerprint, tmp_path):  # noqa: F811
    from taps_train.drafter.average import average_checkpoints
    from tests.export.test_export import make_drafter

    checkpoints = [save_checkpoint(make_drafter(verifier, 7, True), fingerprint, tmp_path / "hass.ckpt"),
                   save_checkpoint(make_eagle3(verifier, seed=8), fingerprint, tmp_path / "eagle3.ckpt")]
    with pytest.raises(TapsError, match="different drafter backbones"):
        average_checkpoints(checkpoints)


def test_averaging_eagle3_drafters_puts_both_heads_on_the_union_vocabulary(verifier, fingerprint, tmp_path):  # noqa: F811
    """Specialists choose different draft vocabularies: an averaged head row is the λ-weighted sum of the drafters'
    rows for the same verifier token (zero where a drafter lacks it), never rows of different tokens added."""
    from taps_train.drafter.average import average_checkpoints
    from taps_train.drafter.checkpoint import drafter_from_checkpoint

    a, b = make_eagle3(verifier, seed=1), make_eagle3(verifier, seed=2)
    paths = [save_checkpoint(a, fingerprint, tmp_path / "a.ckpt"), save_checkpoint(b, fingerprint, tmp_path / "b.ckpt")]
    union = torch.cat([a.draft_token_ids, b.draft_token_ids]).unique()
    assert 150 < len(union) < 300

    def rows_for(drafter, ids):
        rows = torch.zeros(len(ids), drafter.config.hidden_size)
        has = drafter.t2d[ids]
        rows[has] = drafter.lm_head.weight[torch.searchsorted(drafter.draft_token_ids, ids[has])]
        return rows

    averaged = drafter_from_checkpoint(average_checkpoints(paths, [0.25, 0.75]), verifier, "averaged drafter")
    assert torch.equal(averaged.draft_token_ids, union) and torch.equal(averaged.t2d.nonzero().flatten(), union)
    with torch.no_grad():
        torch.testing.assert_close(averaged.lm_head.weight, 0.25 * rows_for(a, union) + 0.75 * rows_for(b, union))
    same = drafter_from_checkpoint(average_checkpoints(paths, [1.0, 0.0]), verifier, "averaged drafter")
    for (name, x), y in zip(a.state_dict().items(), same.state_dict().values()):
        assert torch.equal(x, y), name
