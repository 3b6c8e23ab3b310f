"""`taps-train configs ls | cp`: the configs taps-train ships, listed or copied into a working directory."""

import argparse
from pathlib import Path

from taps_train.shipped import copy_config, shipped_configs


def run(args: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="taps-train configs", description="list the configs taps-train ships, or copy one (with "
                                     "the recipes and configs it names) into a directory to edit and run")
    commands = parser.add_subparsers(dest="action", required=True)
    commands.add_parser("ls", help="list the shipped configs")
    copy = commands.add_parser("cp", help="copy a shipped config and the files it names")
    copy.add_argument("name", help="a config as `ls` lists it, e.g. smol/eagle2_math.yaml")
    copy.add_argument("directory", nargs="?", default=".", help="where to copy (default: the current directory)")
    options = parser.parse_args(args)
    if options.action == "ls":
        print("\n".join(shipped_configs()))
        return
    for path in copy_config(options.name, Path(options.directory)):
        print(f"wrote {path}")
