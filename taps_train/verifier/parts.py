"""The verifier's input embedding and LM head (and, for a drafter that starts from it, its last decoder layer), read
straight from its safetensors files.

A drafter needs only these two frozen tensors from the verifier (2 x 128,256 x 4,096 for Llama-3-8B,
~2 GB in bfloat16 against the model's 16 GB), so training from a feature cache must not load, or even
download, the rest. Here the model is never instantiated with weights: the architecture is built on
the meta device (no memory) only to learn which parameters are the embedding and the head, whether
they are tied, their shapes, and the scale the embedding module applies; then only the shards that
hold those two tensors are opened and only those tensors are read.

Names come from the meta model rather than from a list of known keys because that covers every
architecture transformers knows (`model.embed_tokens`, `transformer.wte`, `gpt_neox.embed_in`, ...)
and asks transformers itself which head is tied to which embedding. Checkpoint keys can still differ
from module paths in two ways seen in practice: a base-model prefix that the checkpoint lacks
(`embed_tokens.weight` saved from `LlamaModel`), and composite models whose older checkpoints nest the
text model differently (`language_model.model.embed_tokens.weight`); a unique key ending in the same
`<module>.weight` is accepted for both.
"""

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RemoteEntryNotFoundError
from safetensors import safe_open
from transformers import AutoModelForCausalLM, PretrainedConfig

from taps_train.errors import TapsError, first_line
from taps_train.verifier.loading import check_safetensors_weights, open_safetensors, read_config, resolve_verifier_path

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_FLOAT_DTYPES = {"BF16", "F16", "F32", "F64"}


@dataclass(frozen=True)
class TensorRead:
    """One tensor read from disk: which file, which key, how many bytes."""

    file: str
    name: str
    nbytes: int


@dataclass
class VerifierParts:
    """The verifier's frozen input embedding and LM head, as its own modules would use them.

    `embedding` rows are looked up and then multiplied by `embed_scale` inside the verifier (Gemma:
    sqrt(hidden), applied in the weight dtype; Granite: `embedding_multiplier`), so a drafter must do
    the same to see what the verifier's embedding outputs. When `tied`, `lm_head` is the same tensor
    object as `embedding`.
    """

    embedding: torch.Tensor  # [vocab_size, hidden]
    lm_head: torch.Tensor  # [vocab_size, hidden]
    embed_scale: float
    tied: bool
    source: str  # local directory or hub id
    tensors_read: list[TensorRead] = field(default_factory=list)

    @property
    def bytes_read(self) -> int:
        return sum(read.nbytes for read in self.tensors_read)


@dataclass(frozen=True)
class _Wanted:
    """What the meta model says about one tensor to read."""

    param: str  # parameter name in the model
    shape: tuple[int, ...]


def read_verifier_parts(
    name_or_path: str,
    config: PretrainedConfig | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> VerifierParts:
    """Read only the embedding and LM head of a verifier (local directory, hub id, or `taps-tiny`).

    `config` saves reading config.json again when the caller has it. Tensors keep their stored dtype
    unless `dtype` is given; on CPU without a cast they stay backed by a private, copy-on-write mapping
    of the file, so pages are read when first touched. Every check (files present, keys present, float
    dtype, shapes matching the config) runs before any tensor is read; a hub id downloads config.json,
    the index and only the shards holding the two tensors.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise TapsError(f"verifier parts dtype {dtype} is not a floating-point dtype; pass e.g. torch.bfloat16 or torch.float32")
    files = _WeightFiles.open(name_or_path, config, revision, trust_remote_code)
    embedding, head, tied, embed_scale = _inspect_architecture(files.config, files.path, trust_remote_code)
    wanted = {"embedding": embedding} if tied else {"embedding": embedding, "lm_head": head}
    tensors, reads = files.read(wanted, tied, dtype, device)
    return VerifierParts(
        embedding=tensors["embedding"],
        lm_head=tensors["embedding"] if tied else tensors["lm_head"],
        embed_scale=embed_scale,
        tied=tied,
        source=files.path,
        tensors_read=reads,
    )


def read_verifier_layer(
    name_or_path: str,
    config: PretrainedConfig | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict[str, torch.Tensor]:
    """The tensors of the verifier's last decoder layer, named as inside the layer (`self_attn.q_proj.weight`, ...),
    in their stored dtype: a drafter's decoder layer may start from them (`layer_init: verifier`). Read like the
    embedding and head: the meta model names them, only the shards holding them are opened, every header is checked
    before a tensor is read."""
    files = _WeightFiles.open(name_or_path, config, revision, trust_remote_code)
    prefix, layer = _last_decoder_layer(_meta_model(files.config, files.path, trust_remote_code), files.config, files.path)
    wanted = {name: _Wanted(f"{prefix}.{name}", tuple(p.shape)) for name, p in layer.named_parameters()}
    return files.read(wanted, tied=True, dtype=None, device="cpu")[0]


def _last_decoder_layer(model: torch.nn.Module, config: PretrainedConfig, path: str) -> tuple[str, torch.nn.Module]:
    """(parameter-name prefix, module) of the last decoder layer: the last entry of the module list that holds one
    entry per hidden layer (`model.layers` in Llama, `transformer.h` in GPT-2, ...)."""
    count = config.get_text_config(decoder=True).num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return f"{name}.{count - 1}", module[count - 1]
    raise TapsError(f"verifier {path} ('{config.model_type}') has no list of its {count} decoder layers; "
                    "layer_init: verifier needs a decoder-only LM with one, use layer_init: random")


@dataclass
class _WeightFiles:
    """A verifier's safetensors files: where each tensor key lives, read on demand (a hub id downloads only the index
    and the shards asked for)."""

    path: str  # local directory or hub id
    config: PretrainedConfig
    fetch: Callable[[str], Path | None]  # file name -> local file (downloaded if needed), None when absent
    key_files: dict[str, str]  # tensor key -> file name
    listing: str  # what named the keys (the index or the single file), for messages
    config_where: str

    @classmethod
    def open(cls, name_or_path: str, config: PretrainedConfig | None, revision: str | None, trust_remote_code: bool) -> "_WeightFiles":
        path = resolve_verifier_path(name_or_path, trust_remote_code)
        local = Path(path).is_dir()
        if local:
            check_safetensors_weights(Path(path))  # refuses pickles, naming the file and the conversion
        if config is None:
            config = read_config(path, revision, trust_remote_code)
        fetch = (lambda name: _local_file(Path(path), name)) if local else (lambda name: _hub_file(path, name, revision))
        key_files, listing = _key_files(fetch, path)
        return cls(path, config, fetch, key_files, listing, f"{path}/config.json" if local else f"config.json of {path}")

    def read(self, wanted: dict[str, _Wanted], tied: bool, dtype: torch.dtype | None,
             device: str | torch.device) -> tuple[dict[str, torch.Tensor], list[TensorRead]]:
        """The wanted tensors (role -> tensor), each file opened once, every key and header checked before any read."""
        located = {role: _locate(w, self.key_files, self.listing, self.path, tied) for role, w in wanted.items()}
        with ExitStack() as stack:
            handles: dict[str, safe_open] = {}
            for role, (key, filename) in located.items():
                file = self.fetch(filename)
                if file is None:
                    raise TapsError(f"{self.listing} names shard {filename} for {key}, but that file is missing; re-download the model")
                if filename not in handles:
                    handles[filename] = stack.enter_context(open_safetensors(file))
                _check_header(handles[filename], key, file, wanted[role].shape, self.config_where)
            tensors, reads = {}, []
            for role, (key, filename) in located.items():
                tensor = handles[filename].get_tensor(key)
                reads.append(TensorRead(filename, key, tensor.nbytes))
                tensors[role] = tensor.to(device=device, dtype=dtype or tensor.dtype)
        return tensors, reads


def _inspect_architecture(config: PretrainedConfig, path: str, trust_remote_code: bool) -> tuple[_Wanted, _Wanted, bool, float]:
    """Embedding and head parameter names/shapes, tying and embedding scale, from a weightless model."""
    model = _meta_model(config, path, trust_remote_code)
    embed_module, head_module = model.get_input_embeddings(), model.get_output_embeddings()
    if head_module is None:
        raise TapsError(f"verifier {path} ('{config.model_type}') has no output embedding (LM head); pass a causal LM with one")
    if getattr(head_module, "bias", None) is not None:
        raise TapsError(f"verifier {path} ('{config.model_type}') has an LM head with a bias, which the drafter's head cannot reproduce; use a verifier without one")
    names = {id(p): n for n, p in model.named_parameters()}
    embedding = _Wanted(names[id(embed_module.weight)], tuple(embed_module.weight.shape))
    head = _Wanted(names[id(head_module.weight)], tuple(head_module.weight.shape))
    tied = head_module.weight is embed_module.weight
    return embedding, head, tied, _embed_scale(model, embed_module)


def _meta_model(config: PretrainedConfig, path: str, trust_remote_code: bool) -> torch.nn.Module:
    """The verifier's architecture without weights (meta device): it names the parameters and their shapes."""
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, ImportError) as err:
        raise TapsError(f"verifier {path} ('{config.model_type}') is not a causal LM transformers can build: {first_line(err)}; pass a decoder-only LM") from err


def _embed_scale(model: torch.nn.Module, embed_module: torch.nn.Module) -> float:
    """The factor the verifier applies to looked-up rows: Gemma's scaled embedding module keeps it as
    `scalar_embed_scale` (its `embed_scale` buffer is empty on the meta device); Granite's base model
    multiplies by `embedding_multiplier` after the lookup."""
    scale = float(getattr(embed_module, "scalar_embed_scale", 1.0))
    for module in model.modules():
        if any(child is embed_module for child in module.children()):
            scale *= float(getattr(module, "embedding_multiplier", 1.0))
    return scale


def _local_file(directory: Path, name: str) -> Path | None:
    file = directory / name
    return file if file.is_file() else None


def _hub_file(repo: str, name: str, revision: str | None) -> Path | None:
    """A file of a hub repo (cached or downloaded); None when the repo has no such file."""
    try:
        return Path(hf_hub_download(repo, name, revision=revision))
    except RemoteEntryNotFoundError:
        return None
    except EntryNotFoundError as err:  # offline, and not in the local cache
        if name == INDEX:
            return None  # may be a single-file model; model.safetensors is tried next
        raise TapsError(f"cannot fetch {name} of {repo}@{revision or 'main'}: not in the local Hugging Face cache and the hub is unreachable; download it once with network") from err
    except OSError as err:
        raise TapsError(f"cannot fetch {name} of {repo}@{revision or 'main'}: {first_line(err)}; check the id, revision, network and HF_TOKEN") from err


def _key_files(fetch: Callable[[str], Path | None], path: str) -> tuple[dict[str, str], str]:
    """Map every tensor key to the file holding it (sharded index, or one file's header); also name the listing."""
    index = fetch(INDEX)
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise TapsError(f"{index} is not a readable safetensors index (no weight_map: {first_line(err)}); re-download the model") from err
        return weight_map, str(index)
    single = fetch(SINGLE)
    if single is None:
        raise TapsError(f"verifier {path} has neither {INDEX} nor {SINGLE}; save it with `save_pretrained` (safetensors)")
    with open_safetensors(single) as handle:
        return {key: SINGLE for key in handle.keys()}, str(single)


def _locate(wanted: _Wanted, key_files: dict[str, str], listing: str, path: str, tied: bool) -> tuple[str, str]:
    """(checkpoint key, file name) of a wanted parameter: its own name, else the unique key ending in its name less
    leading parts (`layers.3.mlp.up_proj.weight` for `model.layers.3.mlp.up_proj.weight`), longest first, down to
    `<module>.weight`."""
    if wanted.param in key_files:
        return wanted.param, key_files[wanted.param]
    parts = wanted.param.split(".")
    for start in range(len(parts) - 1):
        leaf = ".".join(parts[start:])
        matches = sorted(key for key in key_files if key == leaf or key.endswith("." + leaf))
        if len(matches) == 1:
            return matches[0], key_files[matches[0]]
        if matches:
            raise TapsError(f"{listing} has several candidates for {wanted.param} ({', '.join(matches)}); the checkpoint layout is ambiguous")
    why = "" if tied else " and config.json does not tie it to the embedding (transformers would give this verifier a random head)"
    raise TapsError(f"{listing} has no tensor {wanted.param}{why}; the checkpoint of {path} is incomplete, re-download or re-save it")


def _check_header(handle: safe_open, key: str, file: Path, shape: tuple[int, ...], config_where: str) -> None:
    """Key present, float dtype, shape as config.json implies: all from the header, nothing read yet."""
    if key not in handle.keys():
        raise TapsError(f"{file} does not hold {key} although the index says so; re-download the model")
    piece = handle.get_slice(key)
    stored = piece.get_dtype()
    if stored not in _FLOAT_DTYPES:
        raise TapsError(f"{file}: {key} is stored as {stored}; the verifier tensors a drafter reads must be float (BF16, F16, F32 or F64), not quantized or integer")
    got = tuple(piece.get_shape())
    if got != shape:
        raise TapsError(f"{file}: {key} has shape {list(got)} but {config_where} implies {list(shape)}; the weights do not match the config")
