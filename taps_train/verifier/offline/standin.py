"""A random-weight verifier with Llama-3-8B's shapes where they matter for drafter plumbing.

The offline tiny verifier is a real language model but has an 8k vocabulary and a single weight
file, so it never exercises what a Llama-3-8B verifier does to taps-train: a 128,256-row embedding
and LM head (the drafter's frozen parts, ~1 GB each at 8B scale), sharded safetensors with an index,
bfloat16 storage, GQA and RoPE base 500,000. The stand-in has all of that at a size that builds in
seconds. Its weights are random (seeded), so it is for plumbing, memory and speed checks, never for
acceptance-length claims.

Its tokenizer is the project's byte-level BPE with Llama-3's special tokens and chat template,
trained on a few hundred gsm_symbolic problems: a few thousand real entries, so ids above that are
never produced. Token ids in config.json come from that tokenizer, not from Llama-3's numbering.
"""

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from rich.console import Console
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.errors import TapsError
from taps_train.files import atomic_directory, recover_directory
from taps_train.verifier.portable import save_portable
from taps_train.verifier.offline.tokenizer import EOS, EOT, train_chat_tokenizer

STANDIN_FORMAT = 2  # 2: config and tokenizer files readable by transformers 4.x too
MANIFEST = "standin.json"
LLAMA3_VOCAB = 128_256
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
console = Console(stderr=True)


@dataclass(frozen=True)
class StandinSpec:
    """Everything that determines the files; a directory is reused only for an equal spec."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    dtype: str
    seed: int
    vocab_size: int = LLAMA3_VOCAB
    tokenizer_problems: int = 300
    tokenizer_vocab: int = 4096
    format: int = STANDIN_FORMAT


def build_standin(
    out: Path,
    layers: int = 8,
    hidden: int = 1024,
    heads: int = 8,
    kv_heads: int = 2,
    dtype: Literal["bfloat16", "float32"] = "bfloat16",
    seed: int = 0,
) -> Path:
    """Write a random Llama-3-shaped verifier (128,256 vocab, GQA, untied head, sharded safetensors).

    Builds in well under a minute on 2 CPU cores at the defaults (~0.37B parameters, ~0.74 GB in
    bfloat16). Rerunning with the same settings reuses a complete directory.

    Args:
        out: directory to create (must be absent, empty, or a stand-in built with the same settings).
        layers: decoder layers.
        hidden: hidden size (the intermediate size is 3.5 x hidden, as in Llama-3-8B).
        heads: query heads; hidden / heads is the head dimension (128 at the defaults, as in Llama-3).
        kv_heads: key/value heads (GQA); Llama-3-8B has 4 query heads per KV head.
        dtype: storage dtype of the weights; Llama-3 checkpoints ship in bfloat16.
        seed: seed of the random weights.
    """
    out = Path(out).expanduser()
    spec = _spec(layers, hidden, heads, kv_heads, dtype, seed)
    for line in recover_directory(out, "build"):
        console.print(line)
    if _reusable(out, spec):
        console.print(f"reusing stand-in verifier at {out}")
        return out
    began = time.perf_counter()
    with atomic_directory(out) as staging:
        tokenizer = _tokenizer(spec)
        config = _config(spec, tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids(EOT), tokenizer.pad_token_id)
        model = _random_model(config, spec)
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids(EOS)],
            pad_token_id=config.pad_token_id,
        )
        # Half the embedding's size puts the embedding and the LM head in shards of their own (a tensor
        # larger than the limit is never split) and spreads the decoder layers over further shards.
        embedding_bytes = model.get_input_embeddings().weight.nbytes
        save_portable(model, tokenizer, staging, max_shard_size=embedding_bytes // 2)
        parameters = sum(p.numel() for p in model.parameters())
        del model

        shards = sorted(set(json.loads((staging / "model.safetensors.index.json").read_text())["weight_map"].values()))
        manifest = {
            "spec": asdict(spec),
            "parameters": parameters,
            "tokenizer_entries": len(tokenizer),
            "shards": shards,
            "files": {f.name: f.stat().st_size for f in sorted(staging.iterdir()) if f.is_file()},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    size_gb = sum(manifest["files"].values()) / 1e9
    console.print(
        f"stand-in verifier ready at {out}: {parameters / 1e9:.2f}B parameters, {size_gb:.2f} GB in "
        f"{len(shards)} shards, built in {time.perf_counter() - began:.1f} s"
    )
    return out


def _spec(layers: int, hidden: int, heads: int, kv_heads: int, dtype: str, seed: int) -> StandinSpec:
    if dtype not in _DTYPES:
        raise TapsError(f"stand-in dtype {dtype!r} is not supported; use one of {sorted(_DTYPES)}")
    if layers < 1 or hidden < 1 or heads < 1 or kv_heads < 1:
        raise TapsError(f"stand-in sizes must be positive (layers={layers}, hidden={hidden}, heads={heads}, kv_heads={kv_heads})")
    if hidden % heads or (hidden // heads) % 2:
        raise TapsError(f"stand-in hidden {hidden} must split into {heads} heads of an even size (RoPE rotates pairs); change --hidden or --heads")
    if heads % kv_heads:
        raise TapsError(f"stand-in heads {heads} must be a multiple of kv_heads {kv_heads} (GQA); change --heads or --kv_heads")
    spec = StandinSpec(layers, hidden, heads, kv_heads, round(3.5 * hidden), dtype, seed)
    _check_memory(spec)
    return spec


def _check_memory(spec: StandinSpec) -> None:
    """Refuse, before allocating, a model this machine cannot hold: it is built in float32 (4 bytes a parameter)."""
    kv = spec.hidden // spec.heads * spec.kv_heads
    parameters = 2 * spec.vocab_size * spec.hidden + spec.layers * (2 * spec.hidden * (spec.hidden + kv) + 3 * spec.hidden * spec.intermediate)
    needed, available = 4 * parameters, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available // 2:
        raise TapsError(f"a stand-in of {spec.layers} layers x hidden {spec.hidden} has {parameters / 1e9:.1f}B parameters and needs about "
                        f"{needed / 2**30:.0f} GiB to build, over half of this machine's {available / 2**30:.0f} GiB; lower --hidden or --layers")


def _reusable(out: Path, spec: StandinSpec) -> bool:
    """True for a complete stand-in of the same spec, False for an absent or empty directory; else refuse."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise TapsError(f"stand-in output {out} is a file; pass a directory path")
    if not any(out.iterdir()):
        return False
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise TapsError(f"{out} is not empty and holds no readable {MANIFEST}; pass a new --out directory") from err
    if manifest.get("spec") != asdict(spec):
        raise TapsError(f"{out / MANIFEST} records other settings ({manifest.get('spec')}); pass a new --out directory or delete {out}")
    for name, size in manifest.get("files", {}).items():
        file = out / name
        if not file.is_file() or file.stat().st_size != size:
            raise TapsError(f"stand-in at {out} has a missing or truncated {name}; delete {out} and build again")
    return True


def _tokenizer(spec: StandinSpec):
    conversations = gsm_symbolic_conversations(spec.tokenizer_problems, seed=0)
    texts = [message["content"] for conversation in conversations for message in conversation.messages]
    return train_chat_tokenizer(texts, spec.tokenizer_vocab)


def _config(spec: StandinSpec, bos: int, eos: int, pad: int) -> LlamaConfig:
    # Llama-3-8B-Instruct (the paper's verifier): RoPE base 500,000 without 3.1's long-context scaling,
    # 8192 positions, RMSNorm eps 1e-5, untied embedding and LM head.
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500_000.0},
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype=spec.dtype,
    )


def _random_model(config: LlamaConfig, spec: StandinSpec) -> LlamaForCausalLM:
    """Weights drawn directly in the storage dtype from one seeded generator.

    Constructing on the meta device skips transformers' own initialisation (which draws every weight
    in float32 first and takes several times longer at this size); the non-persistent RoPE buffer is
    left uninitialised, which is harmless because the model is only saved, never run.
    """
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(config, dtype=_DTYPES[spec.dtype])
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # RMSNorm gains
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, config.initializer_range, generator=generator)
    return model
