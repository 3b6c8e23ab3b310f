"""Deliberately broken copies of a correct `--format vllm` export, each a layout or semantics bug an exporter could make:
the agreement check (taps_train/engine/agreement.py) must tell every one of them apart from the drafter, or it proves
nothing. Each control edits an export directory in place."""

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _edit_config(directory: Path, change) -> None:
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


def _edit_tensors(directory: Path, change) -> None:
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def _layer_ids_off_by_one(directory: Path) -> None:
    _edit_config(directory, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[i + 1 for i in c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]))


def _rope_base_of_llama2(directory: Path) -> None:
    def change(config):
        config["rope_theta"] = 10000.0
        config.setdefault("rope_parameters", {})["rope_theta"] = 10000.0
    _edit_config(directory, change)


def _fc_bias_dropped(directory: Path) -> None:
    """What vLLM served before the fold: the attention biases gone (and the config without them)."""
    _edit_tensors(directory, lambda t: [t.pop(f"layers.0.self_attn.{p}_proj.bias") for p in "qkvo"])
    _edit_config(directory, lambda c: c.update(attention_bias=False))


def _d2t_shifted(directory: Path) -> None:
    _edit_tensors(directory, lambda t: t.update(d2t=torch.roll(t["d2t"], 1)))


def _norms_swapped(directory: Path) -> None:
    def change(tensors):
        a, b = (next(key for key in tensors if key.endswith(name)) for name in ("input_layernorm.weight", "hidden_norm.weight"))
        tensors[a], tensors[b] = tensors[b], tensors[a]
    _edit_tensors(directory, change)


# (name, backbone it applies to, how it breaks a vllm-format export)
CONTROLS: list[tuple[str, str, Callable[[Path], None]]] = [
    ("layer ids off by one", "eagle3", _layer_ids_off_by_one),
    ("RoPE base 10,000 instead of the verifier's", "eagle2", _rope_base_of_llama2),
    ("fc bias dropped", "hass", _fc_bias_dropped),
    ("d2t shifted by one", "eagle3", _d2t_shifted),
    ("input and hidden norms swapped", "eagle3", _norms_swapped),
]
