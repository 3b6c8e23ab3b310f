"""Export drafters as the draft-model directories serving engines load (EAGLE-1/2 below; EAGLE-3 at the end).

An export directory holds:

- `config.json`: the one-layer drafter's Llama config (hidden size, heads, head_dim, vocabulary,
  RMSNorm eps, `max_position_embeddings` and RoPE of the verifier), written both the transformers-5
  way (`rope_parameters`, `dtype`) and the way engines pinned to transformers 4 read it
  (`rope_theta`, `rope_scaling`, `torch_dtype`). `bias` says whether `fc.bias` is in the weights
  (the EAGLE configs' key); `fc_bias` whether the drafter was trained with one.
- `model.safetensors`: `fc.weight` [H, 2H], `fc.bias` [H], `layers.0.self_attn.{q,k,v,o}_proj.weight`,
  `layers.0.post_attention_layernorm.weight` [H], `layers.0.mlp.{gate,up,down}_proj.weight` and
  (unless `include_embeddings=False`) `embed_tokens.weight` [V, H] copied from the verifier. There is
  no `layers.0.input_layernorm` (EAGLE has none before the first attention), no final norm and no
  `lm_head`: EAGLE-1/2 drafts use the verifier's LM head.
- `taps_export.json`: provenance (verifier fingerprint, source checkpoint, backbone, recipe,
  averaging, τ table).

Two layouts differ only where the engines do:

- `eagle` (SGLang `--speculative-algorithm EAGLE --speculative-draft-model-path DIR`): architecture
  `LlamaForCausalLMEagle`. SGLang's EAGLE draft always has an fc bias, so a drafter trained without
  one gets an explicit zero `fc.bias` (same function, nothing left uninitialized). SGLang takes the
  embedding and LM head from the target model; the embedding in the file is for engines and
  reference code that read it from the draft checkpoint.
- `vllm` (`speculative_config={"method": "eagle", "model": DIR, "num_speculative_tokens": N}`):
  architecture `LlamaForCausalLM`, because vLLM's EAGLE config prefixes the draft's architecture
  with `Eagle` (-> its `EagleLlamaForCausalLM`); `LlamaForCausalLMEagle` would become an unregistered
  name. vLLM's EAGLE-1 Llama draft builds `fc` without a bias and its loader drops `fc.bias` silently,
  so an fc-bias (HASS-style) drafter is exported with the bias folded into attention biases
  (`fold_fc_bias`, `attention_bias: true`): the same function. `bias` is false there, since vLLM reads
  `bias: true` as attention biases. vLLM shares the embedding with the target when the draft runs
  without pipeline parallelism.

EAGLE-3 drafters (`Eagle3Drafter`) keep their checkpoint's keys (`fc` [H, 3H], `midlayer.*` with
`hidden_norm` and 2H-wide q/k/v, `norm`, a draft-vocabulary `lm_head`, `d2t`/`t2d`) and add
`draft_vocab_size`, `target_hidden_size` and `eagle_config.eagle_aux_hidden_state_layer_ids` to the config:
`eagle` is SGLang's `LlamaForCausalLMEagle3` (layer ids by decoder-layer output, one less than taps-train's),
`vllm` vLLM's method `eagle3`, and `speculators` the speculators library's format (taps_train/speculators.py),
which `vllm serve DIR` reads on its own.

The layouts were checked offline against an independent reader written from this key layout (see
tests/test_export.py, tests/test_export_eagle3.py). vLLM (CPU build) serves the `vllm` and `speculators` layouts with the
drafts and acceptance taps-train computes (tests/test_engine_vllm.py, bench/engine.py); SGLang was not available here.
"""

import json
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PretrainedConfig

import taps_train
from taps_train import speculators
from taps_train.backbones import backbone_name
from taps_train.drafter.checkpoint import check_tensors, check_verifier, read_checkpoint, trained_drafter
from taps_train.drafter import Drafter, DrafterBackbone, Eagle3Drafter, backbone_class, build_drafter, drafter_config
from taps_train.drafter.eagle3 import draft_token_ids, token_maps
from taps_train.drafter.features import FeatureContract, check_layers
from taps_train.errors import TapsError
from taps_train.eval.report import read_report
from taps_train.decoding.strategies import STRATEGIES
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import DTYPES, VerifierFiles, read_verifier_files
from taps_train.verifier.portable import portable_config

LAYOUTS = ("eagle", "vllm", "speculators")
FOLDED_BIAS = "layers.0.self_attn.o_proj.bias"  # where a vllm export keeps a folded fc bias (`fold_fc_bias`)
# The architecture name each engine loads a backbone's draft under, per layout.
SERVING_ARCHITECTURES = {
    (Drafter.architecture, "eagle"): "LlamaForCausalLMEagle",
    (Drafter.architecture, "vllm"): "LlamaForCausalLM",  # vLLM prefixes it: EagleLlamaForCausalLM
    (Eagle3Drafter.architecture, "eagle"): "LlamaForCausalLMEagle3",
    (Eagle3Drafter.architecture, "vllm"): "LlamaForCausalLM",  # vLLM's method "eagle3" makes it Eagle3LlamaForCausalLM
    (Eagle3Drafter.architecture, "speculators"): speculators.ARCHITECTURE,
}
# EAGLE-3 fused-layer ids as engines read them: SGLang takes decoder-layer *outputs* (and adds one), vLLM the
# inputs of decoder layers, which are taps-train's `hidden_states` indices.
LAYER_ID_OFFSET = {"eagle": -1, "vllm": 0, "speculators": 0}
EXPORT_FORMAT_VERSION = 1
DEFAULT_TREE = TreeConfig()  # the paper's: 60 tokens, depth 5, top-k 10
BUNDLE_STRATEGIES = sorted(name for name in STRATEGIES if name != "single")
MARKERS = ("taps_export.json", "bundle.json")  # what makes a directory safe to replace with --overwrite
VERIFIER_FIELDS = ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def export_eagle(
    checkpoint_path: str | Path,
    out_dir: str | Path,
    verifier: str | None = None,
    overwrite: bool = False,
    include_embeddings: bool = True,
    tau_table: list[dict] | None = None,
    layout: str = "eagle",
    dtype: str = "bfloat16",
) -> Path:
    """Write one drafter checkpoint (from `fit` or `average`) as an EAGLE draft-model directory.

    `verifier` (name or path) defaults to the one recorded in the checkpoint; it is loaded when the
    embedding is exported or when given explicitly, and must be the verifier the drafter was trained for.
    """
    _check_options(layout, dtype)
    out_dir = Path(out_dir)
    with _atomic_directory(out_dir, overwrite) as staging:
        source = _read_source(checkpoint_path)
        loaded = _resolve_verifier([source], verifier, include_embeddings)
        _write_drafter(source, staging, loaded, layout, dtype, include_embeddings, tau_table)
    return out_dir


def export_bundle(
    checkpoints: list[str | Path],
    out_dir: str | Path,
    strategy: str = "merge",
    tree: TreeConfig = DEFAULT_TREE,
    domains: list[str] | None = None,
    verifier: str | None = None,
    overwrite: bool = False,
    include_embeddings: bool = True,
    tau_table: list[dict] | None = None,
    layout: str = "eagle",
    dtype: str = "bfloat16",
) -> Path:
    """A composition for serving: `drafter_<i>/` export directories plus `bundle.json` saying how to
    combine them (strategy, tree parameters) and which drafter serves which domain."""
    _check_options(layout, dtype)
    if len(checkpoints) < 2:
        raise TapsError(f"a bundle combines two or more drafters, got {len(checkpoints)}; export a single drafter without bundle options")
    if strategy not in BUNDLE_STRATEGIES:
        raise TapsError(f"unknown bundle strategy {strategy!r}; use one of {BUNDLE_STRATEGIES}")
    if domains is not None and (len(domains) != len(checkpoints) or len(set(domains)) != len(domains)):
        raise TapsError(f"--domains needs one distinct name per drafter: got {domains} for {len(checkpoints)} checkpoints")
    out_dir = Path(out_dir)
    with _atomic_directory(out_dir, overwrite) as staging:
        sources = [_read_source(path) for path in checkpoints]
        loaded = _resolve_verifier(sources, verifier, include_embeddings)
        names = [f"drafter_{i}" for i in range(len(sources))]
        for name, source in zip(names, sources):
            (staging / name).mkdir()
            _write_drafter(source, staging / name, loaded, layout, dtype, include_embeddings, None)
        manifest = {
            **_header(layout),
            "strategy": strategy,
            "tree": {"total_tokens": tree.total_tokens, "depth": tree.depth, "top_k": tree.top_k},
            "drafters": [{"directory": name, "source_checkpoint": str(source.path.resolve()), "domain": domain}
                         for name, source, domain in zip(names, sources, domains or [None] * len(names))],
            "domains": dict(zip(domains, names)) if domains else {},
            "verifier": sources[0].checkpoint["taps"]["verifier"],
            "tau": tau_table,
        }
        _write_json(staging / "bundle.json", manifest)
    return out_dir


def load_exported(directory: str | Path, verifier_model: nn.Module) -> DrafterBackbone:
    """A taps-train drafter (float32, eval mode) from an export directory, for evaluation.

    Reads taps-train exports and EAGLE-1/2/3 Llama drafts from elsewhere in either layout; the LM head
    (EAGLE-1/2) and the embedding (when the directory has none) come from `verifier_model`.
    """
    directory = Path(directory)
    try:
        config_dict = json.loads((directory / "config.json").read_text())
        tensors = load_file(directory / "model.safetensors")
    except (OSError, ValueError, SafetensorError) as err:
        raise TapsError(f"{directory} is not a readable EAGLE export (config.json + model.safetensors): {err}") from err
    where = f"export {directory}"
    if speculators.is_speculators(config_dict):
        layers = verifier_model.config.get_text_config(decoder=True).num_hidden_layers
        config_dict, tensors = speculators.from_speculators(config_dict, tensors, layers, where)
        drafter = _eagle3_from_export(config_dict, tensors, verifier_model, where, LAYER_ID_OFFSET["speculators"])
    elif "draft_vocab_size" in config_dict:
        sglang = config_dict.get("architectures") == [SERVING_ARCHITECTURES[Eagle3Drafter.architecture, "eagle"]]
        drafter = _eagle3_from_export(config_dict, tensors, verifier_model, where, LAYER_ID_OFFSET["eagle" if sglang else "vllm"])
    else:
        drafter = _eagle_from_export(config_dict, tensors, verifier_model, where)
    return drafter.eval()


def _eagle_from_export(config_dict: dict, tensors: dict[str, torch.Tensor], verifier_model: nn.Module, where: str) -> Drafter:
    if config_dict.get("attention_bias") and FOLDED_BIAS in tensors:
        tensors = unfold_fc_bias(tensors, where)
    has_bias = "fc.bias" in tensors
    config = LlamaConfig.from_dict({**config_dict, "architectures": [Drafter.architecture]})  # the eagle or the vllm name
    config.fc_bias = bool(config_dict.get("fc_bias", has_bias))
    check_tensors(tensors, Drafter.tensor_shapes(config, bias=has_bias or config.fc_bias, embeddings="embed_tokens.weight" in tensors), where)
    if has_bias and not config.fc_bias:
        if tensors["fc.bias"].any():
            raise TapsError(f"{where}: config.json says fc_bias false but fc.bias is not zero; fix config.json")
        del tensors["fc.bias"]
    return _with_verifier_parts(config, tensors, verifier_model, where)


def _eagle3_from_export(config_dict: dict, tensors: dict[str, torch.Tensor], verifier_model: nn.Module, where: str,
                        layer_offset: int) -> Eagle3Drafter:
    """Fused layers are named `layer_offset` away from taps-train's `hidden_states` indices (SGLang: by decoder-layer
    output). `t2d`, which SGLang never reads, is rebuilt from `d2t` when absent."""
    try:
        layers = [int(i) - layer_offset for i in config_dict["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    except (KeyError, TypeError, ValueError) as err:
        raise TapsError(f"{where}: config.json lacks eagle_config.eagle_aux_hidden_state_layer_ids; it is not an EAGLE-3 draft") from err
    check_layers(FeatureContract(tuple(layers)), verifier_model.config, "given to read " + where)
    config = LlamaConfig.from_dict({**config_dict, "architectures": [Eagle3Drafter.architecture], "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}})
    config.target_hidden_size = getattr(config, "target_hidden_size", None) or config.hidden_size
    if "t2d" not in tensors and "d2t" in tensors:
        tensors["t2d"] = token_maps(draft_token_ids(tensors["d2t"]), config.vocab_size)[1]
    check_tensors(tensors, Eagle3Drafter.tensor_shapes(config, bias=False, embeddings="embed_tokens.weight" in tensors), where,
                  Eagle3Drafter.index_tensors())
    return _with_verifier_parts(config, tensors, verifier_model, where)


def _with_verifier_parts(config: LlamaConfig, tensors: dict[str, torch.Tensor], verifier_model: nn.Module, where: str) -> DrafterBackbone:
    """The drafter of `config` with the verifier's parts and the export's tensors (an exported embedding must be the verifier's)."""
    check_fits_verifier(config, verifier_model.config, where, "the given verifier")
    drafter = build_drafter(config)
    drafter.load_verifier_parts(verifier_model)
    embed = tensors.pop("embed_tokens.weight", None)
    # Loose: the file may hold the embedding in another dtype than the verifier was loaded in.
    if embed is not None and not torch.allclose(embed.float(), drafter.embed_tokens.weight.float(), rtol=1e-2, atol=1e-3):
        raise TapsError(f"{where}: embed_tokens.weight differs from this verifier's embedding; it was exported for another verifier")
    drafter.load_state_dict(tensors, strict=False)
    return drafter


def tau_table_from_reports(paths: list[str | Path]) -> list[dict]:
    """The acceptance lengths of `taps-train eval` reports, to record with an export."""
    table = []
    for path in paths:
        report = read_report(path).as_dict()
        table.append({
            "report": str(path),
            **{key: report[key] for key in ("strategy", "temperature", "drafters", "tree")},
            "acceptance_length": {name: result["acceptance_length"] for name, result in report["benchmarks"].items()},
        })
    return table


@dataclass
class _Source:
    """A checkpoint with its drafter config and trainable weights (keys without `drafter.`)."""

    path: Path
    where: str
    checkpoint: dict
    config: LlamaConfig
    weights: dict[str, torch.Tensor]


def _read_source(path: str | Path) -> _Source:
    """A `fit` or `average` checkpoint; `read_checkpoint` has checked its config and weights."""
    checkpoint = read_checkpoint(path)
    _, config, weights = trained_drafter(checkpoint)
    return _Source(Path(path), f"checkpoint {path}", checkpoint, config, weights)


def _check_options(layout: str, dtype: str) -> None:
    if layout not in LAYOUTS:
        raise TapsError(f"unknown export format {layout!r}; use one of {sorted(LAYOUTS)}")
    if dtype not in DTYPES:
        raise TapsError(f"unknown export dtype {dtype!r}; use one of {sorted(DTYPES)}")


def _resolve_verifier(sources: list[_Source], verifier: str | None, include_embeddings: bool) -> VerifierFiles | None:
    """Read the verifier's config and tokenizer when needed (never its layers) and refuse drafters that do not fit it."""
    trained = sources[0].checkpoint["taps"]["verifier"]
    for source in sources[1:]:
        if source.checkpoint["taps"]["verifier"] != trained:
            raise TapsError(f"{source.where} was trained against verifier {source.checkpoint['taps']['verifier']['path']}, "
                            f"{sources[0].where} against {trained['path']}; a bundle serves one verifier")
    if verifier is None and not include_embeddings:
        return None
    try:
        loaded = read_verifier_files(verifier or trained["path"])
    except TapsError as err:
        if verifier:
            raise
        raise TapsError(f"{err} (the verifier recorded in {sources[0].where}); pass --verifier, or --no-embeddings to export without it") from err
    fingerprint = verifier_fingerprint(loaded.path, loaded.tokenizer)
    for source in sources:
        check_fits_verifier(source.config, loaded.config, source.where, f"verifier {loaded.path}")
        check_verifier(source.checkpoint, fingerprint, source.where)
    return loaded


def check_fits_verifier(config: LlamaConfig, verifier_config: PretrainedConfig, where: str, verifier: str) -> None:
    """The sizes the verifier's features, embedding and LM head impose on the drafter."""
    expected = drafter_config(verifier_config)
    for field in VERIFIER_FIELDS:
        if getattr(config, field) != getattr(expected, field):
            raise TapsError(f"{where}: drafter {field} is {getattr(config, field)} but {verifier} has {getattr(expected, field)}; "
                            "it was trained for another verifier")


def _write_drafter(source: _Source, directory: Path, verifier: VerifierFiles | None, layout: str, dtype: str,
                   include_embeddings: bool, tau_table: list[dict] | None) -> None:
    torch_dtype = DTYPES[dtype]
    index_tensors = backbone_class(source.config).index_tensors()  # token maps keep their dtype
    tensors = {key: value.detach().to(value.dtype if key in index_tensors else torch_dtype).contiguous() for key, value in source.weights.items()}
    if (source.config.architectures[0], layout) not in SERVING_ARCHITECTURES:
        raise TapsError(f"{source.where} is an EAGLE-1/2 drafter; the {layout} layout holds EAGLE-3 drafts only. "
                        "Use --format eagle (SGLang) or vllm")
    if _is_eagle3(source.config):
        _check_exportable_layers(source, verifier)
    elif layout == "eagle" and "fc.bias" not in tensors:
        tensors["fc.bias"] = torch.zeros(source.config.hidden_size, dtype=torch_dtype)
    if include_embeddings:
        embedding, _ = verifier.read_parts()  # the head stays unread on disk
        tensors["embed_tokens.weight"] = embedding.to(torch_dtype).contiguous()
    check_tensors(tensors, backbone_class(source.config).tensor_shapes(source.config, bias="fc.bias" in tensors, embeddings=include_embeddings),
                  source.where, index_tensors)
    if layout == "vllm" and "fc.bias" in tensors and not _is_eagle3(source.config):
        tensors = fold_fc_bias(tensors)
    config = serving_config(source.config, layout, dtype, bias="fc.bias" in tensors)
    config["attention_bias"] = FOLDED_BIAS in tensors
    if layout == "speculators":
        architectures = list(verifier.config.architectures or []) if verifier is not None else []
        config = speculators.speculators_config(config, source.config, source.checkpoint["taps"]["verifier"]["path"], architectures, dtype)
        tensors = speculators.to_speculators_names(tensors)
    _write_json(directory / "config.json", config)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    _write_json(directory / "taps_export.json", _provenance(source, layout, dtype, include_embeddings, verifier, tau_table))


def fold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same drafter without `fc.bias`, for vLLM's EAGLE-1 Llama draft, which has no fc bias (its loader drops
    `fc.bias` without a word) but builds q/k/v/o biases when the config says `attention_bias`. The layer has no input
    norm, so fc's bias b reaches attention only through q, k and v (biases W_q b, W_k b, W_v b) and the output only
    through the residual (o_proj's bias b): the function is unchanged up to rounding (computed in float64)."""
    tensors = dict(tensors)
    bias = tensors.pop("fc.bias").double()
    dtype = tensors["fc.weight"].dtype
    for name in ("q", "k", "v"):
        weight = tensors[f"layers.0.self_attn.{name}_proj.weight"]
        tensors[f"layers.0.self_attn.{name}_proj.bias"] = (weight.double() @ bias).to(dtype)
    tensors[FOLDED_BIAS] = bias.to(dtype)
    return tensors


def unfold_fc_bias(tensors: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """`fold_fc_bias` undone: attention biases that are not a folded fc bias are refused (taps-train's drafter has none)."""
    tensors = dict(tensors)
    bias = tensors.pop(FOLDED_BIAS).double()
    for name in ("q", "k", "v"):
        key = f"layers.0.self_attn.{name}_proj.bias"
        if key not in tensors:
            raise TapsError(f"{where}: config.json says attention_bias but {key} is missing; re-export the drafter")
        folded = tensors[f"layers.0.self_attn.{name}_proj.weight"].double() @ bias
        if not torch.allclose(tensors.pop(key).double(), folded, rtol=2e-2, atol=1e-3 * (float(folded.abs().max()) + 1e-6)):
            raise TapsError(f"{where}: {key} is not the fc bias folded through {name}_proj (W b); taps-train's drafter has no "
                            "attention biases of its own, so this is not one of its exports")
    tensors["fc.bias"] = bias.to(tensors["fc.weight"].dtype)
    return tensors


def serving_config(config: LlamaConfig, layout: str, dtype: str, bias: bool) -> dict:
    """The drafter's Llama config as engines read it, with the legacy RoPE keys next to `rope_parameters`."""
    result = config.to_dict()
    result.update(
        architectures=[SERVING_ARCHITECTURES[config.architectures[0], layout]],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        bias=bias,
        fc_bias=config.fc_bias,
        dtype=dtype,
    )
    result = portable_config(result)
    if _is_eagle3(config):
        layers = [i + LAYER_ID_OFFSET[layout] for i in config.eagle_config["eagle_aux_hidden_state_layer_ids"]]
        result["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True}
    return result


def _is_eagle3(config: PretrainedConfig) -> bool:
    return config.architectures[0] == Eagle3Drafter.architecture


def _check_exportable_layers(source: _Source, verifier: VerifierFiles | None) -> None:
    """Engines capture the inputs of decoder layers 1..L-1 (SGLang cannot name the embeddings, and neither engine
    the post-norm output), each once, and concatenate them in layer order: an EAGLE-3 drafter fusing other states, or
    the same ones in another order, would read different features there, and one fusing a state twice (the default on
    a verifier of under 4 layers) cannot be served."""
    layers = source.config.eagle_config["eagle_aux_hidden_state_layer_ids"]
    count = verifier.config.get_text_config(decoder=True).num_hidden_layers if verifier is not None else None
    outside = [i for i in layers if i < 1 or (count is not None and i >= count)]
    if outside:
        raise TapsError(f"{source.where} fuses verifier hidden states {layers}; serving engines capture only the inputs of decoder "
                        f"layers 1..{count - 1 if count else 'L-1'}, so {outside} cannot be served. Train with feature_layers inside that range")
    if layers != sorted(layers):
        raise TapsError(f"{source.where} fuses verifier hidden states {layers}; serving engines concatenate them in layer order, "
                        f"so its fc would read them permuted. Train with feature_layers in ascending order")
    if len(set(layers)) < len(layers):
        warnings.warn(f"{source.where} fuses verifier hidden states {layers}, one of them twice (its verifier has fewer than three "
                      "that engines capture); taps-train reads this export back, but speculators refuses repeated layer ids and "
                      "vLLM/SGLang capture each layer once, so no engine serves it", stacklevel=4)


def _provenance(source: _Source, layout: str, dtype: str, include_embeddings: bool,
                verifier: VerifierFiles | None, tau_table: list[dict] | None) -> dict:
    taps = source.checkpoint["taps"]
    datamodule = source.checkpoint.get("datamodule_hyper_parameters") or {}
    return {
        **_header(layout),
        "architecture": SERVING_ARCHITECTURES[source.config.architectures[0], layout],
        "source_checkpoint": str(source.path.resolve()),
        "verifier": taps["verifier"],
        "verifier_checked": verifier is not None,
        "backbone": _backbone(source),
        "recipe": datamodule.get("recipe"),
        "fc_bias": source.config.fc_bias,
        "dtype": dtype,
        "includes_embeddings": include_embeddings,
        "averaged_from": taps.get("averaged_from"),
        "averaging_weights": taps.get("averaging_weights"),
        "tau": tau_table,
    }


def _header(layout: str) -> dict:
    return {"format": layout, "format_version": EXPORT_FORMAT_VERSION, "taps_train_version": taps_train.__version__}


def _backbone(source: _Source) -> dict:
    """EAGLE-3 by its architecture; EAGLE-2 or HASS from the training hyper-parameters when they set the
    objective, else from the fc bias (HassModule's default is true, Eagle2Module's false)."""
    if _is_eagle3(source.config):
        return {"name": "eagle3", "inferred_from": "drafter architecture"}
    name = backbone_name(source.checkpoint.get("hyper_parameters") or {})
    if name:
        return {"name": name, "inferred_from": "hyper_parameters (align_steps, topk_weight)"}
    return {"name": "hass" if source.config.fc_bias else "eagle2", "inferred_from": "fc_bias"}


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


@contextmanager
def _atomic_directory(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty sibling directory to fill; on success it replaces `out_dir`, on failure it is
    removed and `out_dir` stays as it was. An earlier export killed between its two renames left the
    old export aside (`.<name>.*.old`); it is put back first. Staging directories of killed exports
    are removed (see `_remove_stale_staging`)."""
    if out_dir.is_symlink():
        raise TapsError(f"export target {out_dir} is a symbolic link; pass the real directory ({out_dir.resolve()}) as --out")
    if out_dir.exists() and not out_dir.is_dir():
        raise TapsError(f"export target {out_dir} is a file; pass a directory for --out")
    _recover_retired(out_dir)
    _remove_stale_staging(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise TapsError(f"export directory {out_dir} is not empty; pass --overwrite to replace it or choose another --out")
        if not any((out_dir / marker).is_file() for marker in MARKERS):
            raise TapsError(f"refusing to replace {out_dir}: it is not a taps-train export (no {' or '.join(MARKERS)}); "
                            "remove it yourself or choose another --out")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.{socket.gethostname()}.{os.getpid()}.", suffix=".partial", dir=out_dir.parent))
    except OSError as err:
        raise TapsError(f"cannot write next to {out_dir}: {err.strerror or err}; choose an --out in a writable directory") from err
    try:
        yield staging
        _refuse_foreign_files(out_dir, staging)
        staging.chmod(0o755)
        _replace_directory(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _recover_retired(out_dir: Path) -> None:
    if out_dir.exists():
        return
    retired = sorted(out_dir.parent.glob(f".{out_dir.name}.*.old"), key=lambda p: p.stat().st_mtime) if out_dir.parent.is_dir() else []
    if retired:
        retired[-1].rename(out_dir)
        print(f"restored the previous export at {out_dir} (an earlier export was interrupted while replacing it)")


def _remove_stale_staging(out_dir: Path) -> None:
    """Remove the staging directories (`.<name>.<host>.<pid>.<random>.partial`) that exports to `out_dir`
    killed mid-write left behind: only this host's, and only when their process is gone. A directory on
    shared storage may be another machine's export in progress, whose process this host cannot see."""
    if not out_dir.parent.is_dir():
        return
    prefix = f".{out_dir.name}."
    stale = [path for path in out_dir.parent.glob(f"{prefix}*.partial") if path.is_dir() and _orphaned(path.name.removeprefix(prefix))]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    if stale:
        print(f"removed {len(stale)} staging director{'y' if len(stale) == 1 else 'ies'} of interrupted exports to {out_dir}")


def _orphaned(owner: str) -> bool:
    """Whether `<host>.<pid>.<random>.partial` names a process of this host that no longer runs.

    Names without an owner (staging of older versions) and other hosts' are never orphaned."""
    parts = owner.removesuffix(".partial").rsplit(".", 2)  # host names may hold dots, the pid and mkdtemp's part do not
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)  # signal 0 only asks whether the process exists
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive but another user's, or no possible pid
        pass
    return False


def _refuse_foreign_files(out_dir: Path, staging: Path) -> None:
    """--overwrite replaces an export, never files a user put inside it: everything in the old directory
    must be something this export writes too."""
    if not out_dir.is_dir():
        return
    ours = {p.relative_to(staging) for p in staging.rglob("*")} | {Path(m) for m in MARKERS}
    foreign = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.relative_to(out_dir) not in ours)
    if foreign:
        raise TapsError(f"refusing to replace {out_dir}: it holds files an export does not write ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}); move them out or choose another --out")


def _replace_directory(new: Path, target: Path) -> None:
    """Rename `new` onto `target`; an existing `target` is moved aside first and deleted only after."""
    if not target.exists():
        new.rename(target)
        return
    retired = new.with_suffix(".old")
    target.rename(retired)
    try:
        new.rename(target)
    except OSError:
        retired.rename(target)
        raise
    shutil.rmtree(retired)
