"""Deliberately broken copies of a correct `--format vllm` export, each a layout or semantics bug an exporter could make:
the agreement check (taps_train/engine/agreement.py) must tell every one of them apart from the drafter, or it proves
nothing. Each control edits an export directory in place and names the checks (`Agreement.problems`) of which at least
one must fire: a control caught only by another check shows that its own check has no power."""

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


def _weight_dropped(directory: Path) -> None:
    """vLLM's EAGLE loader does not require every parameter: a missing one keeps its uninitialised values."""
    _edit_tensors(directory, lambda t: t.pop("layers.0.mlp.down_proj.weight"))


def _weight_misnamed(directory: Path) -> None:
    """vLLM ignores any unexpected name ending in `.bias` (for GPTQ checkpoints): this weight is dropped silently."""
    _edit_tensors(directory, lambda t: t.update({"layers.0.mlp.down_proj.bias": t.pop("layers.0.mlp.down_proj.weight")}))


def _biases_switched_off(directory: Path) -> None:
    """The attention biases saved but the config without them: vLLM builds no bias and ignores the tensors."""
    _edit_config(directory, lambda c: c.update(attention_bias=False))


DRAFTS = ("chains", "log_probabilities")  # the checks that compare what was drafted
# (name, backbone it applies to, how it breaks a vllm-format export, checks of which one must fire)
CONTROLS: list[tuple[str, str, Callable[[Path], None], tuple[str, ...]]] = [
    ("layer ids off by one", "eagle3", _layer_ids_off_by_one, DRAFTS),
    ("RoPE base 10,000 instead of the verifier's", "eagle2", _rope_base_of_llama2, DRAFTS),
    ("fc bias dropped", "hass", _fc_bias_dropped, DRAFTS),
    ("d2t shifted by one", "eagle3", _d2t_shifted, ("chains",)),
    ("input and hidden norms swapped", "eagle3", _norms_swapped, DRAFTS),
    ("a weight dropped (MLP down projection)", "eagle2", _weight_dropped, ("load",)),
    ("a weight misnamed (down projection saved as a bias)", "eagle2", _weight_misnamed, ("load",)),
    ("attention biases switched off in the config", "hass", _biases_switched_off, ("load",)),
]


def caught(problems: list[tuple[str, str]], checks: tuple[str, ...]) -> bool:
    """Whether one of a control's own checks found it."""
    return any(check in checks for check, _ in problems)
