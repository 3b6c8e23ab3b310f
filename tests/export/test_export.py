"""Export for serving engines: round trips, an independent EAGLE reader, validation, atomicity, bundles, CLI."""

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

from taps_train.export import drafter as export
from taps_train.cli import main
from taps_train.drafter import Drafter, drafter_config
from taps_train.errors import TapsError
from taps_train.export import export_bundle, export_drafter, load_exported, serving_config
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.fingerprint import verifier_fingerprint
from tests.eval.test_report import report as eval_report

LAYER_KEYS = [f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"] + [
    "layers.0.post_attention_layernorm.weight", *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down"))]


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


@pytest.fixture(scope="module")
def fingerprint(random_verifier_dir):
    return verifier_fingerprint(str(random_verifier_dir), AutoTokenizer.from_pretrained(random_verifier_dir))


def make_drafter(verifier, seed: int, fc_bias: bool) -> Drafter:
    """A random drafter whose norm weights are not all ones, so a misplaced key would show."""
    torch.manual_seed(seed)
    drafter = Drafter(drafter_config(verifier.config, fc_bias))
    drafter.load_verifier_parts(verifier)
    with torch.no_grad():
        drafter.layers[0].post_attention_layernorm.weight.uniform_(0.5, 1.5)
    return drafter.eval()


def save_checkpoint(drafter: Drafter, fingerprint: dict, path, **extra) -> str:
    """What `fit` saves: trainable `drafter.*` weights and the `taps` section (plus Lightning's extras)."""
    trainable = {f"drafter.{k}": v.clone() for k, v in drafter.state_dict().items() if k not in drafter.frozen_parameter_names()}
    torch.save({"state_dict": trainable, "taps": {"drafter_config": drafter.config.to_dict(), "verifier": fingerprint}, **extra}, path)
    return str(path)


def random_inputs(drafter: Drafter, length: int = 7, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, drafter.config.vocab_size, (1, length), generator=generator)
    features = torch.randn(1, length, drafter.config.hidden_size, generator=generator)
    return ids, features


def drafter_logits(drafter: Drafter, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    length = ids.shape[1]
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    with torch.no_grad():
        return drafter.logits(drafter(ids, features, torch.arange(length)[None], mask))


@pytest.mark.parametrize("fc_bias", [False, True], ids=["eagle2", "hass"])
def test_round_trip_gives_identical_logits(verifier, fingerprint, random_verifier_dir, tmp_path, fc_bias):
    drafter = make_drafter(verifier, 3, fc_bias)
    ckpt = save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt")
    out = export_drafter(ckpt, tmp_path / "out", verifier=str(random_verifier_dir), dtype="float32")
    loaded = load_exported(out, verifier)
    ids, features = random_inputs(drafter)
    assert torch.equal(drafter_logits(loaded, ids, features), drafter_logits(drafter, ids, features))
    assert loaded.fc.bias is None if not fc_bias else torch.equal(loaded.fc.bias, drafter.fc.bias)


def causal_rope_attention(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str, config: dict) -> torch.Tensor:
    """Causal GQA self-attention with RoPE (base `rope_theta`) at positions 0..n-1, before `o_proj`: [n, heads * head_dim]."""
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    length = x.shape[0]
    def project(name: str) -> torch.Tensor:  # attention biases only where the file has them (a vllm export's folded fc bias)
        return x @ w[f"{prefix}.{name}_proj.weight"].T + w.get(f"{prefix}.{name}_proj.bias", 0)

    q = project("q").view(length, heads, head_dim).transpose(0, 1)
    k = project("k").view(length, kv_heads, head_dim).transpose(0, 1)
    v = project("v").view(length, kv_heads, head_dim).transpose(0, 1)
    inv_freq = config["rope_theta"] ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotate = lambda t: torch.cat([-t[..., head_dim // 2:], t[..., :head_dim // 2]], -1)  # noqa: E731
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(head_dim) + torch.full((length, length), -math.inf).triu(1)
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, heads * head_dim)


def reference_eagle_logits(directory, lm_head: torch.Tensor, ids: torch.Tensor, features: torch.Tensor, engine: str = "sglang") -> torch.Tensor:
    """EAGLE-1/2 draft step written from the key layout alone (config.json + model.safetensors), as the engine reads it:
    SGLang's draft adds `fc.bias`; vLLM's has no fc bias (its loader drops the key) and builds q/k/v/o biases when the
    config says `attention_bias` or `bias`."""
    config = json.loads((directory / "config.json").read_text())
    w = load_file(directory / "model.safetensors")
    if engine == "vllm":
        w.pop("fc.bias", None)
        assert bool(config.get("attention_bias") or config.get("bias")) == ("layers.0.self_attn.o_proj.bias" in w), "vLLM would build biases the file lacks"
    x = torch.cat([w["embed_tokens.weight"][ids], features], dim=-1) @ w["fc.weight"].T + w.get("fc.bias", 0)
    h = x + causal_rope_attention(x, w, "layers.0.self_attn", config) @ w["layers.0.self_attn.o_proj.weight"].T + w.get("layers.0.self_attn.o_proj.bias", 0)
    n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]) * w["layers.0.post_attention_layernorm.weight"]
    gate, up = n @ w["layers.0.mlp.gate_proj.weight"].T, n @ w["layers.0.mlp.up_proj.weight"].T
    h = h + (torch.nn.functional.silu(gate) * up) @ w["layers.0.mlp.down_proj.weight"].T
    return h @ lm_head.T


@pytest.mark.parametrize("layout", ["eagle", "vllm"])
@pytest.mark.parametrize("fc_bias", [False, True], ids=["eagle2", "hass"])
def test_independent_eagle_reader_matches_the_drafter(verifier, fingerprint, random_verifier_dir, tmp_path, fc_bias, layout):
    """What each engine computes from the files equals the drafter; for a HASS drafter under vLLM this holds only
    because the fc bias is folded into attention biases (vLLM drops `fc.bias`)."""
    drafter = make_drafter(verifier, 4, fc_bias)
    if fc_bias:
        with torch.no_grad():
            drafter.fc.bias.uniform_(-1, 1)  # large enough that dropping it would show
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out",
                       verifier=str(random_verifier_dir), dtype="float32", layout=layout)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] is None and config["architectures"] == [{"eagle": "LlamaForCausalLMEagle", "vllm": "LlamaForCausalLM"}[layout]]
    ids, features = random_inputs(drafter, length=9, seed=1)
    expected = drafter_logits(drafter, ids, features)[0]
    engine = {"eagle": "sglang", "vllm": "vllm"}[layout]
    torch.testing.assert_close(reference_eagle_logits(out, verifier.lm_head.weight, ids[0], features[0], engine), expected, atol=2e-5, rtol=1e-5)
    loaded = load_exported(out, verifier)  # and taps-train reads it back (unfolding the bias)
    torch.testing.assert_close(drafter_logits(loaded, ids, features), drafter_logits(drafter, ids, features), atol=2e-5, rtol=1e-5)


def test_vllm_export_refuses_attention_biases_that_are_no_folded_fc_bias(verifier, fingerprint, tmp_path):
    drafter = make_drafter(verifier, 5, fc_bias=True)
    out = export_drafter(save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt"), tmp_path / "out", layout="vllm", dtype="float32")
    tensors = load_file(out / "model.safetensors")
    tensors["layers.0.self_attn.k_proj.bias"] += 1.0
    save_file(tensors, out / "model.safetensors")
    with pytest.raises(TapsError, match="k_proj.bias is not the fc bias folded"):
        load_exported(out, verifier)


def test_config_and_bf16_tensors(verifier, fingerprint, random_verifier_dir, tmp_path):
    drafter = make_drafter(verifier, 5, fc_bias=True)
    ckpt = save_checkpoint(drafter, fingerprint, tmp_path / "d.ckpt", hyper_parameters={"align_steps": 3, "topk_weight": 1.0},
                           datamodule_hyper_parameters={"recipe": "data_recipes/tiny_math.yaml"})
    out = export_drafter(ckpt, tmp_path / "out", tau_table=[{"acceptance_length": {"gsm8k": 3.2}}])  # verifier from the checkpoint
    config = json.loads((out / "config.json").read_text())
    source = json.loads((random_verifier_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"] and config["num_hidden_layers"] == 1
    assert config["max_position_embeddings"] == source["max_position_embeddings"] == 512
    assert config["rope_theta"] == source["rope_parameters"]["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert config["bias"] is True and config["fc_bias"] is True
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size", "rms_norm_eps"):
        assert config[key] == source[key], key
    with safe_open(out / "model.safetensors", "pt") as f:
        keys = f.keys()
        assert sorted(keys) == sorted(["embed_tokens.weight", "fc.weight", "fc.bias", *LAYER_KEYS])
        assert {f.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
        assert torch.equal(f.get_tensor("layers.0.mlp.up_proj.weight"), drafter.layers[0].mlp.up_proj.weight.to(torch.bfloat16))
        assert torch.equal(f.get_tensor("embed_tokens.weight"), verifier.model.embed_tokens.weight.to(torch.bfloat16))
    provenance = json.loads((out / "taps_export.json").read_text())
    assert provenance["verifier"] == fingerprint and provenance["verifier_checked"]
    assert provenance["backbone"]["name"] == "hass" and provenance["recipe"] == "data_recipes/tiny_math.yaml"
    assert provenance["source_checkpoint"].endswith("d.ckpt") and provenance["tau"][0]["acceptance_length"]["gsm8k"] == 3.2
    assert provenance["format"] == "eagle" and provenance["averaged_from"] is None
    ids, features = random_inputs(drafter)
    torch.testing.assert_close(drafter_logits(load_exported(out, verifier), ids, features), drafter_logits(drafter, ids, features), atol=0.1, rtol=0.05)


def test_rope_scaling_and_context_length_follow_the_verifier():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    verifier_config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                  vocab_size=100, max_position_embeddings=131072, rope_parameters=rope)
    config = serving_config(drafter_config(verifier_config), "vllm", "bfloat16", bias=False)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["max_position_embeddings"] == 131072
    assert config["rope_theta"] == 500000.0 and config["rope_parameters"] == rope
    assert config["rope_scaling"] == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert LlamaConfig.from_dict(config).rope_parameters == rope  # transformers reads it back the same


def test_vllm_layout_and_no_embeddings(verifier, fingerprint, tmp_path):
    plain = save_checkpoint(make_drafter(verifier, 6, fc_bias=False), fingerprint, tmp_path / "plain.ckpt")
    out = export_drafter(plain, tmp_path / "vllm", layout="vllm", include_embeddings=False)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert sorted(load_file(out / "model.safetensors")) == sorted(["fc.weight", *LAYER_KEYS])
    assert not json.loads((out / "taps_export.json").read_text())["verifier_checked"]
    eagle = export_drafter(plain, tmp_path / "eagle", include_embeddings=False)
    assert not load_file(eagle / "model.safetensors")["fc.bias"].any()  # SGLang's draft fc always has a bias
    hass = save_checkpoint(make_drafter(verifier, 7, fc_bias=True), fingerprint, tmp_path / "hass.ckpt")
    out = export_drafter(hass, tmp_path / "vllm_hass", layout="vllm", include_embeddings=False)
    folded = [f"layers.0.self_attn.{p}_proj.bias" for p in "qkvo"]
    assert sorted(load_file(out / "model.safetensors")) == sorted(["fc.weight", *LAYER_KEYS, *folded])  # no fc.bias: vLLM drops it
    config = json.loads((out / "config.json").read_text())
    assert config["attention_bias"] is True and config["bias"] is False and config["fc_bias"] is True


def test_refuses_bad_inputs(verifier, fingerprint, random_verifier_dir, tmp_path):
    drafter = make_drafter(verifier, 8, fc_bias=False)
    good = save_checkpoint(drafter, fingerprint, tmp_path / "good.ckpt")
    state = {f"drafter.{k}": v for k, v in drafter.state_dict().items() if k not in drafter.frozen_parameter_names()}
    taps = {"drafter_config": drafter.config.to_dict(), "verifier": fingerprint}

    torch.save({"state_dict": {k: v for k, v in state.items() if "up_proj" not in k}, "taps": taps}, tmp_path / "missing.ckpt")
    with pytest.raises(TapsError, match=r"lacks layers\.0\.mlp\.up_proj\.weight \(expected shape \[64, 32\]\)"):
        export_drafter(tmp_path / "missing.ckpt", tmp_path / "a", include_embeddings=False)
    torch.save({"state_dict": {**state, "drafter.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)}, "taps": taps}, tmp_path / "shape.ckpt")
    with pytest.raises(TapsError, match=r"k_proj\.weight has shape \[32, 32\], expected \[16, 32\]"):
        export_drafter(tmp_path / "shape.ckpt", tmp_path / "a", include_embeddings=False)
    torch.save({"state_dict": {**state, "drafter.fc.weight": state["drafter.fc.weight"] * math.nan}, "taps": taps}, tmp_path / "nan.ckpt")
    with pytest.raises(TapsError, match=r"fc\.weight has non-finite values"):
        export_drafter(tmp_path / "nan.ckpt", tmp_path / "a", include_embeddings=False)
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    with pytest.raises(TapsError, match="not a taps-train drafter checkpoint"):
        export_drafter(tmp_path / "foreign.pt", tmp_path / "a")
    with pytest.raises(TapsError, match="unknown export dtype"):
        export_drafter(good, tmp_path / "a", dtype="int8")

    wider = tmp_path / "wider_verifier"
    LlamaForCausalLM(LlamaConfig(vocab_size=verifier.config.vocab_size, hidden_size=48, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(wider)
    AutoTokenizer.from_pretrained(random_verifier_dir).save_pretrained(wider)
    with pytest.raises(TapsError, match=r"hidden_size is 32 but verifier .* has 48"):
        export_drafter(good, tmp_path / "a", verifier=str(wider))
    assert not (tmp_path / "a").exists()

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(TapsError, match="not empty; pass --overwrite"):
        export_drafter(good, tmp_path / "busy", include_embeddings=False)
    with pytest.raises(TapsError, match="not a taps-train export"):
        export_drafter(good, tmp_path / "busy", include_embeddings=False, overwrite=True)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_load_exported_refuses_another_verifier(verifier, fingerprint, other_verifier_dir, tmp_path):
    out = export_drafter(save_checkpoint(make_drafter(verifier, 16, fc_bias=False), fingerprint, tmp_path / "d.ckpt"), tmp_path / "out")
    with pytest.raises(TapsError, match="exported for another verifier"):
        load_exported(out, AutoModelForCausalLM.from_pretrained(other_verifier_dir))
    with pytest.raises(TapsError, match="not a readable EAGLE export"):
        load_exported(tmp_path, verifier)


def test_failed_overwrite_leaves_the_old_export(verifier, fingerprint, tmp_path, monkeypatch):
    first = save_checkpoint(make_drafter(verifier, 9, fc_bias=False), fingerprint, tmp_path / "first.ckpt")
    second = save_checkpoint(make_drafter(verifier, 10, fc_bias=False), fingerprint, tmp_path / "second.ckpt")
    out = export_drafter(first, tmp_path / "exports" / "d", include_embeddings=False, dtype="float32")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken_save(tensors, path, metadata=None):
        path.write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(export, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_drafter(second, out, include_embeddings=False, dtype="float32", overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in out.parent.iterdir()] == ["d"]  # no staging directory left behind
    monkeypatch.undo()
    export_drafter(second, out, include_embeddings=False, dtype="float32", overwrite=True)
    assert json.loads((out / "taps_export.json").read_text())["source_checkpoint"].endswith("second.ckpt")


def test_bundle_of_specialists_and_an_average(verifier, fingerprint, random_verifier_dir, tmp_path):
    from taps_train.drafter.average import write_average

    paths = [save_checkpoint(make_drafter(verifier, s, fc_bias=True), fingerprint, tmp_path / f"{s}.ckpt") for s in (11, 12)]
    averaged = write_average(paths, [0.5, 0.5], tmp_path / "avg.ckpt")
    out = export_bundle([*paths, averaged], tmp_path / "bundle", strategy="route-confidence", tree=TreeConfig(40, 4, 8),
                        domains=["math", "chat", "mixed"], verifier=str(random_verifier_dir), dtype="float32")
    manifest = json.loads((out / "bundle.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["bundle.json", "drafter_0", "drafter_1", "drafter_2"]
    assert manifest["strategy"] == "route-confidence" and manifest["tree"] == {"total_tokens": 40, "depth": 4, "top_k": 8}
    assert manifest["domains"] == {"math": "drafter_0", "chat": "drafter_1", "mixed": "drafter_2"}
    assert manifest["verifier"] == fingerprint
    assert [d["source_checkpoint"].rsplit("/", 1)[1] for d in manifest["drafters"]] == ["11.ckpt", "12.ckpt", "avg.ckpt"]
    assert json.loads((out / "drafter_2" / "taps_export.json").read_text())["averaged_from"] == paths
    halves = [load_file(out / f"drafter_{i}" / "model.safetensors")["fc.weight"] for i in range(3)]
    torch.testing.assert_close(halves[2], (halves[0] + halves[1]) / 2)
    with pytest.raises(TapsError, match="one distinct name per drafter"):
        export_bundle(paths, tmp_path / "b2", domains=["math"], include_embeddings=False)
    with pytest.raises(TapsError, match="unknown bundle strategy"):
        export_bundle(paths, tmp_path / "b2", strategy="single", include_embeddings=False)
    stranger = save_checkpoint(make_drafter(verifier, 13, fc_bias=True), {**fingerprint, "weights": "other"}, tmp_path / "x.ckpt")
    with pytest.raises(TapsError, match="a bundle serves one verifier"):
        export_bundle([paths[0], stranger], tmp_path / "b2", include_embeddings=False)


def test_cli(verifier, fingerprint, random_verifier_dir, tmp_path, capsys):
    main(["--help"])
    assert "export" in capsys.readouterr().out
    a, b = (save_checkpoint(make_drafter(verifier, s, fc_bias=False), fingerprint, tmp_path / f"{s}.ckpt") for s in (14, 15))
    main(["export", a, "--out", str(tmp_path / "one"), "--verifier", str(random_verifier_dir), "--dtype", "float32"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "one")
    assert "embed_tokens.weight" in load_file(tmp_path / "one" / "model.safetensors")
    (tmp_path / "report.json").write_text(json.dumps(eval_report([a, b], "merge", 0.0, 3.5, 2.5)))
    main(["export", a, b, "--out", str(tmp_path / "two"), "--no-embeddings", "--domains", "math", "chat", "--format", "vllm", "--depth", "3",
          "--eval-report", str(tmp_path / "report.json")])
    manifest = json.loads((tmp_path / "two" / "bundle.json").read_text())
    assert manifest["strategy"] == "merge" and manifest["tree"]["depth"] == 3 and manifest["format"] == "vllm"
    assert manifest["tau"][0]["acceptance_length"] == {"gsm8k": 3.5, "mt_bench": 2.5}
    for argv, message in ((["export", a, "--out", str(tmp_path / "one")], "not empty; pass --overwrite"),
                          (["export", a, "--out", str(tmp_path / "x"), "--domains", "math"], "bundle options (--domains) need two or more checkpoints"),
                          (["export", a, "--out", str(tmp_path / "x"), "--eval-report", a], "is not a `taps-train eval` report")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 1 and message in capsys.readouterr().err


def test_bundle_tree_auto_takes_the_tree_eval_chose(verifier, fingerprint, tmp_path, capsys):
    a, b = (save_checkpoint(make_drafter(verifier, s, fc_bias=False), fingerprint, tmp_path / f"{s}.ckpt") for s in (16, 17))

    def report(name: str, tree: dict, calibrated: bool) -> str:
        data = eval_report([a], "single", 0.0, 3.5, 2.5)
        data["tree"] = tree
        if calibrated:
            data["tree_calibration"] = {"choice": {**tree, "expected_tau": 2.0}, "call_ms_by_tokens": {"1": 50.0}}
        (tmp_path / name).write_text(json.dumps(data))
        return str(tmp_path / name)

    auto = report("auto.json", {"total_tokens": 6, "depth": 2, "top_k": 2}, True)
    fixed = report("fixed.json", {"total_tokens": 60, "depth": 5, "top_k": 10}, False)
    main(["export", a, b, "--out", str(tmp_path / "bundle"), "--no-embeddings", "--tree", "auto", "--eval-report", fixed, auto])
    assert json.loads((tmp_path / "bundle" / "bundle.json").read_text())["tree"] == {"total_tokens": 6, "depth": 2, "top_k": 2}
    other = report("other.json", {"total_tokens": 8, "depth": 3, "top_k": 1}, True)
    for extra, message in (([], "needs a report of `taps-train eval --tree auto`"),
                           (["--eval-report", fixed], "needs a report of `taps-train eval --tree auto`"),
                           (["--eval-report", auto, "--depth", "3"], "drop --depth"),
                           (["--eval-report", auto, other], "chose different trees")):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", a, b, "--out", str(tmp_path / "x"), "--no-embeddings", "--tree", "auto", *extra])
        assert exit_info.value.code == 1 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", a, "--out", str(tmp_path / "y"), "--no-embeddings", "--tree", "auto", "--eval-report", auto])
    assert "bundle options (--tree) need two or more checkpoints" in capsys.readouterr().err
