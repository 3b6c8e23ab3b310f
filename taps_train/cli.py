"""The `taps-train` command: one table of commands, each a module of `taps_train.commands` (or its package's own
command module) with a `run(args)`.

Config files are read as LightningCLI reads them (jsonargparse: `fit`, `validate` and `test` are Lightning's own CLI,
`study` a config of its own; configs map one-to-one to constructor arguments); every other command takes options
read by argparse. Errors the user can fix (`TapsError`) print as one line, never as a traceback.
"""

import importlib
import sys
from dataclasses import dataclass

from taps_train.errors import TapsError
from taps_train.paths import checked_home


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
        module = importlib.import_module(command.module)
        if command.module == LIGHTNING:
            # LightningCLI reads sys.argv itself; pass args only when called from Python.
            module.run(args if argv is not None else None, args[0])
        else:
            module.run(args[1:])
    except TapsError as err:
        print(f"taps-train: error: {err}", file=sys.stderr)
        sys.exit(1)
