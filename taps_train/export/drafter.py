"""Export one drafter checkpoint as the draft-model directory a serving engine loads.

An export directory holds `config.json` (the one-layer drafter's Llama config with the verifier's sizes, context
length and RoPE, plus what its backbone adds), `model.safetensors` (the trained tensors and, unless
`include_embeddings=False`, the verifier's embedding; no LM head where drafts use the verifier's) and
`taps_export.json` (the layout and backbone it was written in, provenance, τ table). What each layout changes is in
its own module (`sglang.py`, `vllm.py`, `speculators.py`).

The layouts were checked offline against an independent reader written from each key layout (tests/export/test_export.py,
tests/export/test_export_eagle3.py); vLLM (CPU build) serves the `vllm` and `speculators` layouts with the drafts and
acceptance taps-train computes (tests/engine/test_engine_vllm.py, bench/engine.py); SGLang was not available here.
"""

import json
from pathlib import Path

from safetensors.torch import save_file

import taps_train
from taps_train.drafter import BACKBONES, backbone_class
from taps_train.drafter.backbone import check_tensors
from taps_train.errors import TapsError
from taps_train.export.directory import export_directory
from taps_train.export.layout import LAYOUTS, Layout, layout_named, serving_config
from taps_train.export.source import Source, read_source, resolve_verifier
from taps_train.verifier.loading import DTYPES, VerifierFiles

EXPORT_FORMAT_VERSION = 1


def export_drafter(
    checkpoint_path: str | Path,
    out_dir: str | Path,
    verifier: str | None = None,
    overwrite: bool = False,
    include_embeddings: bool = True,
    tau_table: list[dict] | None = None,
    layout: str = "eagle",
    dtype: str = "bfloat16",
) -> Path:
    """Write one drafter checkpoint (from `fit` or `average`) as `layout`'s draft-model directory.

    `verifier` (name or path) defaults to the one recorded in the checkpoint; it is read when the embedding is
    exported or when given explicitly, and must be the verifier the drafter was trained for.
    """
    chosen = checked_options(layout, dtype)
    out_dir = Path(out_dir)
    with export_directory(out_dir, overwrite) as staging:
        source = read_source(checkpoint_path)
        loaded = resolve_verifier([source], verifier, include_embeddings)
        write_drafter(source, staging, loaded, chosen, dtype, include_embeddings, tau_table)
    return out_dir


def checked_options(layout: str, dtype: str) -> Layout:
    if dtype not in DTYPES:
        raise TapsError(f"unknown export dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return layout_named(layout)


def write_drafter(source: Source, directory: Path, verifier: VerifierFiles | None, layout: Layout, dtype: str,
                  include_embeddings: bool, tau_table: list[dict] | None) -> None:
    """The drafter of `source` in `directory`, as `layout` writes it."""
    backbone = backbone_class(source.config)
    architecture = layout.architecture(backbone)
    if architecture is None:
        held = sorted(other.label for other in BACKBONES.values() if layout.architecture(other))
        served = sorted(name for name, other in LAYOUTS.items() if other.architecture(backbone))
        raise TapsError(f"{source.where} is an {backbone.label} drafter; the {layout.name} layout holds {' and '.join(held)} drafts only. "
                        f"Use --format {' or '.join(served)}")
    if ignored := [flag for flag, on in backbone.variant_flags(source.config).items() if on and flag in layout.unread_flags]:
        raise TapsError(f"{source.where} was trained with {ignored}, which {layout.engine} does not read (it would draft without "
                        f"them); use --format {' or '.join(name for name, other in LAYOUTS.items() if not set(ignored) & set(other.unread_flags))}")
    verifier_layers = verifier.config.get_text_config(decoder=True).num_hidden_layers if verifier is not None else None
    backbone.check_servable(source.config, verifier_layers, source.where)
    torch_dtype, index_tensors = DTYPES[dtype], backbone.index_tensors()  # token maps keep their dtype
    tensors = {key: value.detach().to(value.dtype if key in index_tensors else torch_dtype).contiguous() for key, value in source.weights.items()}
    if include_embeddings:
        embedding, _ = verifier.read_parts()  # the head stays unread on disk
        tensors["embed_tokens.weight"] = embedding.to(torch_dtype).contiguous()
    check_tensors(tensors, backbone.tensor_shapes(source.config, bias="fc.bias" in tensors, embeddings=include_embeddings), source.where,
                  index_tensors)
    tensors = {key: value for key, value in tensors.items() if key not in backbone.decoder_only}
    tensors = layout.engine_tensors(tensors, architecture)
    config = serving_config(source.config, layout, dtype, bias="fc.bias" in tensors)
    architectures = list(verifier.config.architectures or []) if verifier is not None else []
    config, tensors = layout.files(config, tensors, source.config, source.checkpoint["taps"]["verifier"]["path"], architectures, dtype)
    write_json(directory / "config.json", config)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    write_json(directory / "taps_export.json", _provenance(source, layout, architecture, dtype, include_embeddings, verifier, tau_table))


def header(layout: Layout) -> dict:
    return {"format": layout.name, "format_version": EXPORT_FORMAT_VERSION, "taps_train_version": taps_train.__version__}


def _provenance(source: Source, layout: Layout, architecture: str, dtype: str, include_embeddings: bool,
                verifier: VerifierFiles | None, tau_table: list[dict] | None) -> dict:
    taps = source.checkpoint["taps"]
    datamodule = source.checkpoint.get("datamodule_hyper_parameters") or {}
    return {
        **header(layout),
        "architecture": architecture,
        "drafter_architecture": source.config.architectures[0],
        "source_checkpoint": str(source.path.resolve()),
        "verifier": taps["verifier"],
        "verifier_checked": verifier is not None,
        "backbone": training_method(source),
        "recipe": datamodule.get("recipe"),
        "fc_bias": getattr(source.config, "fc_bias", False),
        "dtype": dtype,
        "includes_embeddings": include_embeddings,
        "averaged_from": taps.get("averaged_from"),
        "averaging_weights": taps.get("averaging_weights"),
        "tau": tau_table,
    }


def training_method(source: Source) -> dict:
    """How the drafter was trained (EAGLE-2, HASS, EAGLE-3, ...): from its training hyper-parameters, or where they
    name no objective (an average has none), the backbone's reading of its config."""
    from taps_train.training.base import method_of

    name = method_of(source.checkpoint.get("hyper_parameters") or {})
    if name:
        return {"name": name, "inferred_from": "hyper_parameters"}
    return {"name": backbone_class(source.config).trained_as(source.config), "inferred_from": "drafter config"}


def write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
