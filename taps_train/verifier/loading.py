"""Load a frozen verifier (any Hugging Face causal LM) with its tokenizer.

Accepts a hub id, a local model directory, `taps-tiny` for the offline tiny verifier (built on first use),
or a GGUF model (`smollm2-135m`, or a .gguf file path; converted on first use). Every failure a user can cause becomes one `TapsError` line naming the path and the fix.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from taps_train.errors import TapsError, first_line
from taps_train.verifier.gguf import PACKAGED, ensure_gguf_verifier, gguf_file, is_gguf_source
from taps_train.verifier.placement import COMPUTE_DTYPES, Placement, resolve_placement

TINY_VERIFIER = "taps-tiny"  # built on first use (verifier/offline/tiny.py)
DEFAULT_VERIFIER = TINY_VERIFIER  # what every command, module and config takes when no verifier is named: the offline one
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DTYPES = COMPUTE_DTYPES
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
DRAFTER_SIZES = ("hidden_size", "vocab_size", "num_attention_heads")  # what drafter_config reads without a fallback


@dataclass
class LoadedVerifier:
    name: str  # as the user wrote it
    path: str  # local directory or hub id actually loaded
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    placement: Placement


def resolve_verifier_path(name_or_path: str, trust_remote_code: bool = False) -> str:
    """Map `taps-tiny` and GGUF sources (`smollm2-135m`, a .gguf file) to the directories built from them; check
    local paths; pass hub ids through.

    A local directory that ships its own Python (`auto_map` in its config or tokenizer config) is refused
    unless `trust_remote_code`: transformers would import that code, or ask on the terminal whether to.
    Hub ids are covered by passing `trust_remote_code` explicitly to every `from_pretrained`."""
    check_verifier_reference(name_or_path, trust_remote_code)
    if name_or_path == TINY_VERIFIER:
        from taps_train.verifier.offline.tiny import ensure_tiny_verifier

        return str(ensure_tiny_verifier())
    if is_gguf_source(name_or_path):
        return str(ensure_gguf_verifier(name_or_path))
    path = Path(name_or_path).expanduser()
    return str(path) if path.exists() else name_or_path


def check_verifier_reference(name_or_path: str, trust_remote_code: bool = False) -> None:
    """What `resolve_verifier_path` checks before it builds or converts anything (a plan's dry run checks this)."""
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise TapsError(f"verifier {name_or_path!r} names nothing; pass a model directory, a .gguf file, a hub id, {TINY_VERIFIER} "
                        f"or one of {', '.join(PACKAGED)}")
    if name_or_path == TINY_VERIFIER:
        return
    if is_gguf_source(name_or_path):
        gguf_file(name_or_path)
        return
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise TapsError(f"verifier path {path} is a file; pass the model directory that holds config.json")
        if not (path / "config.json").is_file():
            raise TapsError(f"verifier directory {path} has no config.json; pass a Hugging Face model directory (save_pretrained layout)")
        if not trust_remote_code:
            _refuse_custom_code(path)
        _refuse_escaping_index(path)
        return
    if not _HUB_ID.match(name_or_path) or name_or_path.startswith((".", "~")):
        raise TapsError(f"verifier path {name_or_path} does not exist; pass an existing model directory, a .gguf file, a hub id, "
                        f"{TINY_VERIFIER} or one of {', '.join(PACKAGED)}")


def _refuse_escaping_index(path: Path) -> None:
    """A sharded checkpoint's index names the files to open: each must lie inside the model directory (an entry such as
    `../../etc/passwd` would have a loader open a file the directory does not hold)."""
    for index in sorted(path.glob("*.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, UnicodeDecodeError, RecursionError, AttributeError) as err:
            raise TapsError(f"verifier index {index} is not a JSON object with a weight_map ({first_line(err)}); re-download or re-save the model") from err
        if not isinstance(weight_map, dict):
            raise TapsError(f"verifier index {index}: weight_map is not an object; re-download or re-save the model")
        for tensor, file in weight_map.items():  # by name: shards may be symlinks (the hub cache's point into blobs/)
            if not isinstance(file, str) or Path(file).is_absolute() or ".." in Path(file).parts or not file.strip():
                raise TapsError(f"verifier index {index}: tensor {tensor!r} points at {file!r}, outside the model directory; "
                                "a sharded checkpoint's files lie in its own directory: re-download or re-save the model")


def _refuse_custom_code(path: Path) -> None:
    for name in ("config.json", "tokenizer_config.json"):
        file = path / name
        if not file.is_file():
            continue
        try:
            content = json.loads(file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise TapsError(f"verifier file {file} is not valid JSON ({first_line(err)}); re-download or re-save the model directory") from err
        if isinstance(content, dict) and content.get("auto_map"):
            raise TapsError(
                f"verifier directory {path} ships its own Python code ({name} has 'auto_map'); taps-train does not run code "
                "from model directories. Use a model whose architecture transformers implements, or re-save it with that "
                "architecture (no auto_map)"
            )


@dataclass
class VerifierFiles:
    """What a drafter needs of a verifier without building it: config, tokenizer, and (on demand)
    the embedding and LM head tensors, or its last layer's, read straight from the safetensors files."""

    path: str
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    revision: str | None = None

    def read_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input embedding [V, H], LM head [V, H]) in the file's dtype, memory-mapped: pages are read
        only when a tensor is used."""
        from taps_train.verifier.parts import read_verifier_parts

        parts = read_verifier_parts(self.path, config=self.config, revision=self.revision)
        return parts.embedding, parts.lm_head

    def read_last_layer(self) -> dict[str, torch.Tensor]:
        """The last decoder layer's tensors, named as inside the layer, in the file's dtype."""
        from taps_train.verifier.parts import read_verifier_layer

        return read_verifier_layer(self.path, config=self.config, revision=self.revision)


def read_verifier_files(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False) -> VerifierFiles:
    """Config and tokenizer of a verifier (a few MB), checked to be a causal LM."""
    path = resolve_verifier_path(name_or_path, trust_remote_code)
    hub = {"revision": revision, "trust_remote_code": trust_remote_code}
    config = read_config(path, revision, trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **hub)
    except (OSError, ValueError) as err:
        raise TapsError(f"cannot load the tokenizer of verifier {path}: {first_line(err)}; re-download or rebuild the model directory") from err
    return VerifierFiles(path=path, config=config, tokenizer=tokenizer, revision=revision)


def check_safetensors_weights(directory: Path) -> None:
    """Weights are untrusted files: only safetensors are read, pickles never (they can run code)."""
    if any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").is_file():
        return
    pickles = sorted(f.name for f in directory.iterdir() if f.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise TapsError(f"verifier directory {directory} holds only pickled weights ({pickles[0]}); taps-train loads safetensors only. "
                        "Convert once with transformers: AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir) (writes safetensors)")
    raise TapsError(f"verifier directory {directory} has no model.safetensors or model.safetensors.index.json; pass a complete model directory")


def open_safetensors(file: Path) -> safe_open:
    """Open a safetensors file, parsing its header only (memory-mapped, no tensor read): safetensors refuses
    an empty or garbage header and a file shorter than the data its header describes (a truncated download)."""
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as err:
        raise TapsError(f"{file} is not a valid safetensors file ({first_line(err)}); it is corrupt or truncated, re-download it") from err


def load_verifier(
    name_or_path: str,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedVerifier:
    """Load model and tokenizer in eval mode with every parameter frozen, weights straight onto
    `device` in the compute `dtype` (see `placement`): an 8B verifier never passes through host
    RAM in float32."""
    placement = resolve_placement(device, dtype)
    path = resolve_verifier_path(name_or_path, trust_remote_code)
    hub = {"revision": revision, "trust_remote_code": trust_remote_code}
    read_config(path, revision, trust_remote_code)
    if Path(path).is_dir():
        check_safetensors_weights(Path(path))
        for shard in sorted(Path(path).glob("*.safetensors")):  # a damaged file is named here, not a SafetensorError in transformers
            with open_safetensors(shard):
                pass
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **placement.from_pretrained_kwargs(), use_safetensors=True, **hub)
        tokenizer = AutoTokenizer.from_pretrained(path, **hub)
    except (OSError, ValueError, RuntimeError) as err:
        raise TapsError(f"cannot load verifier weights/tokenizer from {path}: {first_line(err)}; re-download or rebuild the model directory") from err
    model.eval().requires_grad_(False)
    return LoadedVerifier(name=name_or_path, path=path, model=model, tokenizer=tokenizer, placement=placement)


def read_config(path: str, revision: str | None = None, trust_remote_code: bool = False) -> PretrainedConfig:
    """A verifier's config, checked to be a causal LM's and to state the sizes a drafter copies."""
    hub = {"revision": revision, "trust_remote_code": trust_remote_code}
    try:
        raw, _ = PretrainedConfig.get_config_dict(path, **hub)
        if not isinstance(raw, dict):
            raise ValueError(f"config.json holds a JSON {type(raw).__name__}, not an object")
        config = AutoConfig.from_pretrained(path, **hub)
    except (OSError, ValueError) as err:
        raise TapsError(f"cannot read the config of verifier {path}: {first_line(err)}; check the id/path (hub access needs network and HF_TOKEN for gated models)") from err
    is_causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
        trust_remote_code and "AutoModelForCausalLM" in getattr(config, "auto_map", {})
    )
    # a model type with a causal-LM class (BERT has BertLMHeadModel) saved as another head (BertModel) is not one
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(_is_causal_lm_class(name) for name in architectures):
        raise TapsError(f"verifier {path} is a {', '.join(map(str, architectures))}, not a causal LM (its config's architectures); "
                        "pass a decoder-only LM with its LM head (e.g. meta-llama/Meta-Llama-3-8B-Instruct)")
    if not is_causal:
        raise TapsError(f"verifier {path} is a '{config.model_type}' model without a causal-LM head; pass a decoder-only LM (e.g. meta-llama/Meta-Llama-3-8B-Instruct)")
    _require_drafter_sizes(path, config, raw)
    return config


def _is_causal_lm_class(name: object) -> bool:
    return isinstance(name, str) and (name.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
                                      or name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def _require_drafter_sizes(path: str, config: PretrainedConfig, raw: dict) -> None:
    """A config missing a size would silently get transformers' class default (hidden_size 4096 for Llama),
    and the drafter and cache estimate would be built for a model that does not exist. Only a top-level
    LM config is checked: `save_pretrained` always writes these fields there, while nested text configs of
    multimodal models legitimately omit fields equal to their defaults."""
    if config.get_text_config(decoder=True) is not config:
        return
    for name in DRAFTER_SIZES:
        stored = config.attribute_map.get(name, name)  # e.g. GPT-2 stores hidden_size as n_embd
        if stored not in raw:
            raise TapsError(f"verifier config {Path(path) / 'config.json'} has no '{stored}'; a drafter copies the verifier's "
                            f"{', '.join(DRAFTER_SIZES)}: restore the field (re-download or re-save the model directory)")
