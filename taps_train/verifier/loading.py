"""Load a frozen verifier (any Hugging Face causal LM) with its tokenizer.

Accepts a hub id, a local model directory, or `taps-tiny` for the offline tiny verifier (built on
first use). Every failure a user can cause becomes one `TapsError` line naming the path and the fix.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from taps_train.errors import TapsError

TINY_VERIFIER = "taps-tiny"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedVerifier:
    name: str  # as the user wrote it
    path: str  # local directory or hub id actually loaded
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def resolve_verifier_path(name_or_path: str) -> str:
    """Map `taps-tiny` to its built directory; check local paths; pass hub ids through."""
    if name_or_path == TINY_VERIFIER:
        from taps_train.verifier.tiny import ensure_tiny_verifier

        return str(ensure_tiny_verifier())
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not path.is_dir():
            raise TapsError(f"verifier path {path} is a file; pass the model directory that holds config.json")
        if not (path / "config.json").is_file():
            raise TapsError(f"verifier directory {path} has no config.json; pass a Hugging Face model directory (save_pretrained layout)")
        return str(path)
    if not _HUB_ID.match(name_or_path) or name_or_path.startswith((".", "~")):
        raise TapsError(f"verifier path {name_or_path} does not exist; pass an existing model directory, a hub id, or {TINY_VERIFIER}")
    return name_or_path


def load_verifier(
    name_or_path: str,
    dtype: str = "float32",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedVerifier:
    """Load model and tokenizer in eval mode with every parameter frozen."""
    if dtype not in DTYPES:
        raise TapsError(f"unknown verifier dtype {dtype!r}; use one of {sorted(DTYPES)}")
    path = resolve_verifier_path(name_or_path)
    hub = {"revision": revision, "trust_remote_code": trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(path, **hub)
    except (OSError, ValueError) as err:
        raise TapsError(f"cannot read the config of verifier {path}: {_first_line(err)}; check the id/path (hub access needs network and HF_TOKEN for gated models)") from err
    is_causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
        trust_remote_code and "AutoModelForCausalLM" in getattr(config, "auto_map", {})
    )
    if not is_causal:
        raise TapsError(f"verifier {path} is a '{config.model_type}' model without a causal-LM head; pass a decoder-only LM (e.g. meta-llama/Meta-Llama-3-8B-Instruct)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], **hub)
        tokenizer = AutoTokenizer.from_pretrained(path, **hub)
    except (OSError, ValueError, RuntimeError) as err:
        raise TapsError(f"cannot load verifier weights/tokenizer from {path}: {_first_line(err)}; re-download or rebuild the model directory") from err
    model.eval().requires_grad_(False)
    return LoadedVerifier(name=name_or_path, path=path, model=model, tokenizer=tokenizer)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
