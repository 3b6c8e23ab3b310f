"""The rules for evaluation settings, one place for every command that takes them.

`taps-train eval` checks its options with these before loading anything, and a study checks the settings its
evaluation cells will pass to `eval` with the same functions during `--dry-run`, so a plan it approves does not
fail hours later at its first evaluation. Each rule returns the problem as text (None when the value is fine);
callers name the option (`--top-p`) or the study key (`temperatures`). Tree shapes have theirs with their type
(`decoding/tree.py tree_problems`).
"""

import math

from taps_train.data.recipe import load_recipe
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import parse_benchmark
from taps_train.eval.report import read_report
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.loading import check_verifier_reference


def temperatures_problem(values: object) -> str | None:
    if not isinstance(values, list | tuple) or not values:
        return f"{values!r}: need one temperature or more"
    bad = [t for t in values if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0]
    if bad:
        return f"{' '.join(map(str, bad))} out of range: need finite values >= 0 (0 is greedy)"
    return None


def top_p_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and 0 < value <= 1):
        return f"{value!r} is out of range: need 0 < top-p <= 1 (1 disables nucleus sampling)"
    return None


def benchmark_problem(spec: object) -> str | None:
    """What `eval` would refuse about a benchmark spec (`name` or `name:path`), without reading the benchmark."""
    if not isinstance(spec, str):
        return f"{spec!r} is not a benchmark name"
    try:
        benchmark = parse_benchmark(spec)
        if spec.partition(":")[2] and type(benchmark).path_arg == "recipe":  # a held-out split of another recipe
            load_recipe(benchmark.recipe)
    except TapsError as err:
        return str(err)
    return None


def verifier_problem(verifier: object) -> str | None:
    """What loading the verifier would refuse first, without building or converting it."""
    try:
        check_verifier_reference(verifier)
    except TapsError as err:
        return str(err)
    return None


def calibrated_tree(reports: list[str] | None, option: str, explicit: list[str]) -> TreeConfig:
    """The tree `taps-train eval --tree auto` chose, read back from its reports (those given must agree): a machine's
    shape is calibrated once and reused by later evaluations (`eval --tree-from`) and bundles (`export --tree auto`).
    `explicit` names tree options the user also gave, which would contradict it."""
    if explicit:
        raise TapsError(f"{option} takes the tree from a calibrated report; drop {', '.join(explicit)}")
    calibrated = {path: read_report(path) for path in reports or []}
    calibrated = {path: report for path, report in calibrated.items() if report.tree_calibration is not None}
    if not calibrated:
        raise TapsError(f"{option} needs a report of `taps-train eval --tree auto` (none given has a tree_calibration); "
                        "run eval with --tree auto first")
    trees = {r.tree for r in calibrated.values()}
    if len(trees) > 1:
        raise TapsError(f"{option}: the calibrated reports chose different trees ({', '.join(f'{p}: {r.tree}' for p, r in calibrated.items())}); "
                        "pass one of them, or --total-tokens/--depth/--top-k")
    return trees.pop()
