"""Export directories read back as taps-train drafters, for evaluation: taps-train's own through the layout their
`taps_export.json` records, drafts exported elsewhere through the layout that recognizes their config."""

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from taps_train.drafter import BACKBONES, DrafterBackbone, backbone_class, build_drafter
from taps_train.errors import TapsError
from taps_train.export.layout import LAYOUTS, Layout, layout_named
from taps_train.export.source import check_fits_verifier


def load_exported(directory: str | Path, verifier_model: nn.Module) -> DrafterBackbone:
    """A taps-train drafter (float32, eval mode) from an export directory; the LM head (where drafts use the
    verifier's) and the embedding (when the directory has none) come from `verifier_model`."""
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
        tensors = load_file(directory / "model.safetensors")
    except (OSError, ValueError, SafetensorError) as err:
        raise TapsError(f"{directory} is not a readable EAGLE export (config.json + model.safetensors): {err}") from err
    where = f"export {directory}"
    layout, backbone = _recorded(directory, config, where)
    verifier_config = verifier_model.config.get_text_config(decoder=True)
    config, tensors = layout.read(config, tensors, verifier_config.num_hidden_layers, where)
    backbone = backbone or backbone_reading(config, where)
    drafter_config, tensors = backbone.from_serving(config, tensors, verifier_model.config, where, layout.layer_offset)
    return _with_verifier_parts(drafter_config, tensors, verifier_model, where).eval()


def exported_backbone(directory: Path) -> tuple[Layout, type[DrafterBackbone]]:
    """The layout and backbone of an export directory, without reading its weights."""
    where = f"export {directory}"
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise TapsError(f"{where} has no readable config.json: {err}") from err
    layout, backbone = _recorded(directory, config, where)
    return layout, backbone or backbone_reading(config, where)  # exports written before they recorded their backbone


def backbone_reading(config: dict, where: str) -> type[DrafterBackbone]:
    """The backbone whose serving config this is (drafts without taps_export.json, or exports that predate its `drafter_architecture`)."""
    backbone = next((cls for cls in BACKBONES.values() if cls.reads(config)), None)
    if backbone is None:
        raise TapsError(f"{where}: config.json is no drafter taps-train reads (known backbones: {', '.join(sorted(BACKBONES))})")
    return backbone


def _recorded(directory: Path, config: dict, where: str) -> tuple[Layout, type[DrafterBackbone] | None]:
    """The layout and backbone taps_export.json records; for other drafts, the layout that recognizes the config
    (the backbone is then read from the config)."""
    provenance_file = directory / "taps_export.json"
    if provenance_file.is_file():
        try:
            provenance = json.loads(provenance_file.read_text())
            layout = layout_named(provenance["format"])
            architecture = provenance.get("drafter_architecture")
            backbone = backbone_class({"architectures": [architecture]}) if architecture else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, TapsError) as err:
            raise TapsError(f"{where}: taps_export.json does not name a known layout and backbone ({err}); re-export the drafter") from err
        return layout, backbone
    recognized = [layout for layout in LAYOUTS.values() if layout.recognizes(config)] or [layout for layout in LAYOUTS.values() if layout.fallback]
    return recognized[0], None


def _with_verifier_parts(config, tensors: dict[str, torch.Tensor], verifier_model: nn.Module, where: str) -> DrafterBackbone:
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
