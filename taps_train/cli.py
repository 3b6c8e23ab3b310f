"""The `taps-train` command: one table of commands, each a module of `taps_train.commands` with a `run(args)`.

Config files are read as LightningCLI reads them (jsonargparse: `fit`, `validate` and `test` are Lightning's own CLI,
`study` a config of its own; configs map one-to-one to constructor arguments); every other command takes options
read by argparse. Errors the user can fix (`TapsError`) print as one line, never as a traceback.
"""

import errno
import importlib
import re
import sys
from dataclasses import dataclass

from taps_train.errors import TapsError
from taps_train.memory import address_space_limit, check_loadable
from taps_train.paths import checked_home
from taps_train.units import size


@dataclass(frozen=True)
class Command:
    module: str  # imported when the command runs: `taps-train --help` loads none of them
    summary: str


COMMANDS = {
    "fit": Command("taps_train.commands.lightning", "train a drafter (LightningCLI: --config configs/<name>.yaml)"),
    "validate": Command("taps_train.commands.lightning", "run the validation loop of a drafter config/checkpoint"),
    "test": Command("taps_train.commands.lightning", "run the test loop of a drafter config/checkpoint"),
    "cache": Command("taps_train.commands.cache", "build a recipe's verifier feature cache (--dry-run: estimate tokens, disk and build time first)"),
    "eval": Command("taps_train.commands.eval", "measure acceptance length of drafters on benchmarks; write JSON reports"),
    "consolidate": Command("taps_train.commands.consolidate", "merge a DeepSpeed checkpoint directory into one drafter-only checkpoint file"),
    "average": Command("taps_train.commands.average", "average drafter checkpoints in weight space into a new checkpoint"),
    "export": Command("taps_train.commands.export", "write drafters as EAGLE draft-model directories for SGLang / vLLM (several: a composition bundle)"),
    "verifier": Command("taps_train.commands.verifier", "build the offline tiny verifier, convert GGUF models, inspect and sample any verifier; "
                        "build a Llama-3-shaped stand-in"),
    "report": Command("taps_train.commands.report", "tables (markdown) and plots (PNG) of the paper's views from eval reports"),
    "study": Command("taps_train.commands.study", "the TAPS experiment from one YAML: fit every backbone x domain/mixture, eval every drafter "
                     "and strategy, report (resumable)"),
    "configs": Command("taps_train.commands.configs", "list the configs taps-train ships (ls) or copy one with the recipes it names into a "
                       "directory (cp)"),
}
LIGHTNING = "taps_train.commands.lightning"
USAGE = "\n".join(
    [
        "usage: taps-train <command> [options]   (taps-train <command> --help for its options)",
        "",
        "Train domain-specialized EAGLE-2 / HASS drafters for speculative decoding.",
        "",
        "commands:",
        *(f"  {name:<10} {command.summary}" for name, command in COMMANDS.items()),
    ]
)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"taps-train: unknown command {args[0]!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    try:
        checked_home()
        check_loadable()
        module = importlib.import_module(command.module)
        if command.module == LIGHTNING:
            # LightningCLI reads sys.argv itself; pass args only when called from Python.
            module.run(args if argv is not None else None, args[0])
        else:
            module.run(args[1:])
    except TapsError as err:
        print(f"taps-train: error: {out_of_memory(err.__cause__, args[0]) or err}", file=sys.stderr)
        sys.exit(1)
    except (MemoryError, RuntimeError, OSError, ValueError) as err:  # ValueError: jsonargparse wraps what constructors raise
        short = out_of_memory(err, args[0])
        if short is None:
            raise
        print(f"taps-train: error: {short}", file=sys.stderr)
        sys.exit(1)


def out_of_memory(err: BaseException | None, command: str) -> str | None:
    """A process that ran out of memory (Python's MemoryError, torch's allocator, a library that could not be mapped)
    as one line: how much was asked for where it says, the process's limit where it has one; None for other errors."""
    seen = []
    while err is not None and err not in seen and len(seen) < 20:  # the error itself, then what it wraps
        seen.append(err)
        text = str(err)
        if (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError" or "out of memory" in text.lower()
                or "can't allocate memory" in text or "Cannot allocate memory" in text or getattr(err, "errno", None) == errno.ENOMEM):
            break
        err = err.__cause__ or err.__context__
    else:
        return None
    asked = re.search(r"allocate (\d+) bytes", text) or re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", text)
    limit = address_space_limit()
    wanted = (size(int(asked[1])) if asked[1].isdigit() else asked[1]) if asked else None
    return (f"out of memory in `taps-train {command}`" + (f": it asked for {wanted} more" if wanted else "")
            + (f" within this process's limit of {size(limit)} (ulimit -v)" if limit is not None else "")
            + "; free memory, raise the limit, or lower the batch or model size. Nothing half-written was kept")
