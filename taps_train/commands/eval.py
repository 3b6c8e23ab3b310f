"""`taps-train eval`: speculative decoding of drafters against their verifier on named benchmarks,
one JSON report per temperature (design.md, "Eval report"), and a τ table on stdout."""

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from taps_train import files, machine
from taps_train.drafter.average import average_checkpoints, check_weights
from taps_train.drafter.checkpoint import (
    check_verifier,
    drafter_from_checkpoint,
    load_drafter,
)
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import BENCHMARKS, load_benchmark
from taps_train.commands.eval_vllm import check_engine_options, run_engine_eval
from taps_train.eval.evaluate import first_turn_ids, run_benchmark
from taps_train.eval.report import BenchmarkResult, EvalReport, read_report, report_path, tau_cell
from taps_train.eval.settings import benchmark_problem, calibrated_tree, temperatures_problem, top_p_problem
from taps_train.ranges import int_problem
from taps_train.paths import output_file
from taps_train.decoding.calibrate import CostModel, TreeCalibration, calibrate_tree
from taps_train.decoding.gate import GateConfig
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.strategies import STRATEGIES
from taps_train.decoding.tree import TreeConfig, tree_problems
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.loading import (
    DEFAULT_VERIFIER,
    load_verifier,
    read_config,
    resolve_verifier_path,
)
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.placement import add_placement_arguments

OFFLINE_BENCHMARKS = ["math_heldout", "arith_offline", "chat_heldout"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="taps-train eval", description="Measure acceptance length (τ) of drafters on benchmarks; write JSON reports.")
    p.add_argument("--drafters", nargs="+", required=True, help="drafter checkpoints written by `taps-train fit`")
    p.add_argument("--verifier", default=DEFAULT_VERIFIER, help="taps-tiny, smollm2-135m, a .gguf file, a local HF model directory, or a hub id")
    add_placement_arguments(p)
    p.add_argument("--strategy", default="single", choices=sorted([*STRATEGIES, "average"]),
                   help="single drafter, or how several are combined (average: in weight space; others: per round)")
    p.add_argument("--weights", nargs="+", type=float, default=None, help="averaging weights λ (strategy average; default uniform)")
    p.add_argument("--benchmarks", nargs="+", default=OFFLINE_BENCHMARKS, help=f"names ({', '.join(BENCHMARKS)}) or name:path/to/local/file")
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0], help="one report per temperature")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=20, help="prompts per benchmark (the first N, fixed order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tree", choices=["fixed", "auto"], default="fixed",
                   help="fixed: the tree --total-tokens/--depth/--top-k; auto: the shape of most tokens/s measured on this machine, "
                        "those three options bounding the search (one drafter only)")
    p.add_argument("--tree-from", default=None, metavar="REPORT",
                   help="the tree an eval report of --tree auto chose (calibrate a machine once, evaluate every variant with its tree; "
                        "any strategy)")
    p.add_argument("--total-tokens", type=int, default=TreeConfig.total_tokens, help="tree size including the root")
    p.add_argument("--depth", type=int, default=TreeConfig.depth, help="EAGLE-2 depth: trees reach depth + 1 levels")
    p.add_argument("--top-k", type=int, default=TreeConfig.top_k)
    p.add_argument("--calibration-prompts", type=int, default=2,
                   help="--tree auto: prompts per benchmark it measures acceptance on (those after the evaluated ones)")
    p.add_argument("--calibrate-on", nargs="+", default=None, metavar="BENCHMARK",
                   help="--tree auto: the benchmarks whose prompts choose the tree (default: every one of --benchmarks). A "
                        "specialist's tree is best chosen on its own domain; the speculation gate guards the others")
    p.add_argument("--gate", choices=["auto", "off"], default="auto",
                   help="auto: with a calibrated tree (--tree auto, --tree-from), rounds fall back to plain decoding while speculation "
                        "does not pay (taps_train/decoding/gate.py); off: every round speculates (τ of the drafter alone)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip plain decoding of every prompt (halves the time; the report then has no speedup)")
    p.add_argument("--engine", choices=["taps", "vllm"], default="taps",
                   help="taps: taps-train's own speculative decoding; vllm: the drafter served by vLLM (README, 'Exporting for SGLang and vLLM')")
    p.add_argument("--engine-python", default=None,
                   help="--engine vllm: a python that imports vllm (default: $TAPS_ENGINE_PYTHON, as regeneration reads it, else this one)")
    p.add_argument("--engine-threads", type=int, default=None, help="--engine vllm: CPU threads (default: every core this process may use)")
    p.add_argument("--speculative-tokens", type=int, default=3, help="--engine vllm: draft tokens per verifier step (a greedy chain)")
    p.add_argument("--output", default="checkpoints/eval/report.json", help="report path (with several --temperatures, one report each, a _T<temp> suffix added to each)")
    p.add_argument("--wandb-project", default=None, help="also log the reports to this W&B project (offline without an API key or network)")
    return p


def run(args: list[str]) -> None:
    options = parser().parse_args(args)
    if (options.strategy == "single") != (len(options.drafters) == 1):
        raise TapsError(f"strategy '{options.strategy}' got {len(options.drafters)} drafters; 'single' takes one, every other strategy two or more")
    if options.engine == "vllm":
        check_engine_options(options)
    calibrated = None
    if options.tree_from is not None:
        if options.tree == "auto":
            raise TapsError("--tree auto calibrates a tree; --tree-from reads one a calibration chose: pass one of them")
        explicit = [flag for flag in ("--total-tokens", "--depth", "--top-k") if any(a == flag or a.startswith(f"{flag}=") for a in args)]
        calibrated = calibrated_tree([options.tree_from], "--tree-from", explicit)
    check_options(options, calibrated)
    if options.engine == "vllm":
        write_reports(run_engine_eval(options, load_benchmarks(options)), options)
        return
    tree = calibrated or TreeConfig(options.total_tokens, options.depth, options.top_k)
    verifier = load_verifier(options.verifier, options.device, options.verifier_dtype)
    fingerprint = verifier_fingerprint(verifier.path, verifier.tokenizer)
    if options.strategy == "average":
        drafters = [averaged_drafter(options.drafters, options.weights, verifier.model, fingerprint)]
    else:
        drafters = [load_drafter(path, verifier.model, fingerprint) for path in options.drafters]
    extra = options.calibration_prompts if options.tree == "auto" else 0
    benchmarks = load_benchmarks(options, extra)
    eos = stop_token_ids(verifier.model, verifier.tokenizer)
    calibration, gate = None, None
    if options.tree == "auto":
        calibration = auto_tree(verifier, drafters[0], benchmarks, options, set(eos), tree)
        tree, gate = calibration.choice.tree, calibration.gate()
    elif calibrated is not None:
        gate = gate_from_report(options, tree, len(drafters))
    gate = gate if options.gate == "auto" else None
    benchmarks = {name: prompts[: options.prompts] for name, prompts in benchmarks.items()}
    reports: dict[float, EvalReport] = {}
    for temperature in options.temperatures:
        strategy = STRATEGIES.get(options.strategy, STRATEGIES["single"])
        decoder = SpeculativeDecoder(verifier.model, drafters, tree, strategy, temperature, options.top_p, eos_token_ids=eos, gate=gate)
        results = {
            name: run_benchmark(decoder, verifier.tokenizer, prompts, options.max_new_tokens, options.seed, f"{name} T={temperature}",
                                baseline=options.baseline).report(
                options.drafters if options.strategy.startswith("route") else None)
            for name, prompts in benchmarks.items()
        }
        for name, result in results.items():
            if result.greedy_ties:
                print(f"{name} T=0: {result.greedy_ties} of {result.greedy_checked_tokens} tokens were near-ties of the verifier's logits "
                      f"({verifier.model.dtype} rounding flips them), every other token its argmax; --verifier-dtype float32 gives "
                      "token-identical outputs")
        reports[temperature] = EvalReport(
            verifier=options.verifier,
            drafters=tuple(options.drafters),
            strategy=options.strategy,
            temperature=temperature,
            tree=tree,
            benchmarks=results,
            average_acceptance_length=sum(r.acceptance_length for r in results.values()) / len(results),
            weights=None if options.weights is None else tuple(options.weights),  # None: uniform
            tree_calibration=None if calibration is None else {**calibration.as_dict(), "calibrated_on": calibrated_on(options),
                                                               "measured": measured(calibration, results)},
            speculation_gate=None if gate is None else gate.as_dict(),
            machine=machine.describe(verifier.model.device),
        )
    write_reports(reports, options)


def load_benchmarks(options: argparse.Namespace, extra: int = 0) -> dict[str, list]:
    """Each benchmark's first --prompts prompts and `extra` more (load_benchmark reports skipped records itself)."""
    return {spec.split(":")[0]: load_benchmark(spec, options.prompts + extra)[0] for spec in options.benchmarks}


def gate_from_report(options: argparse.Namespace, tree: TreeConfig, drafters: int) -> GateConfig | None:
    """The speculation gate of a tree read with --tree-from: its break-even from the calibration's measured costs, for
    this strategy's round (route: every drafter drafts one tree; merge: every tree is verified; average: one drafter)."""
    calibration = read_report(options.tree_from).tree_calibration
    costs = CostModel.from_calibration(calibration, f"--tree-from {options.tree_from}")
    drafting = 1 if options.strategy in ("single", "average") else drafters
    tokens = 1 + drafters * (tree.total_tokens - 1) if options.strategy in ("merge", "merge-union") else tree.total_tokens
    expected = calibration.get("choice", {}).get("expected_tau")
    return costs.gate(tree, float(expected) if isinstance(expected, int | float) and expected > 0 else 1.0, drafting, tokens)


def benchmark_names(options: argparse.Namespace) -> list[str]:
    """--benchmarks' names (a `name:path` spec is named `name`)."""
    return [spec.split(":")[0] for spec in options.benchmarks]


def calibrated_on(options: argparse.Namespace) -> list[str]:
    """The benchmarks whose prompts chose a --tree auto tree."""
    return options.calibrate_on or benchmark_names(options)


def measured(calibration: TreeCalibration, results: dict[str, BenchmarkResult]) -> dict:
    """What decoding with the chosen tree measured beside what the calibration predicted, per benchmark: τ over all
    rounds, τ over the speculative rounds only (the prediction's kind), tokens/s."""
    found = {}
    for name, result in results.items():
        speculative_calls = result.verify_calls - (result.plain_rounds or 0)
        found[name] = {"tau": round(result.acceptance_length, 4), "tokens_per_s": result.tokens_per_s,
                       "speculative_tau": round((result.new_tokens - (result.plain_round_tokens or 0)) / speculative_calls, 4)
                       if speculative_calls else None}
        print(f"--tree auto, {name}: predicted τ {calibration.choice.expected_tau:.2f} at {calibration.choice.tokens_per_s:.1f} tokens/s; "
              f"measured τ {result.acceptance_length:.2f} ({found[name]['speculative_tau'] or 0:.2f} over its "
              f"{speculative_calls} speculative rounds)" + (f" at {result.tokens_per_s:.1f} tokens/s" if result.tokens_per_s else ""))
    return found


def write_reports(reports: dict[float, EvalReport], options: argparse.Namespace) -> None:
    """One report file per temperature, the τ table, and the W&B logging when asked."""
    written: list[Path] = []
    for temperature, report in reports.items():
        path = report_path(Path(options.output).expanduser(), temperature, len(options.temperatures))
        files.write_text(path, report.to_json())
        written.append(path)
        print(f"wrote {path}")
    print_table(reports)
    if options.wandb_project:
        from taps_train.tracking import log_eval_reports

        print(f"W&B run: {log_eval_reports(options.wandb_project, written)}")


def auto_tree(verifier, drafter, benchmarks: dict[str, list], options: argparse.Namespace, eos: set[int], bound: TreeConfig) -> TreeCalibration:
    """`--tree auto`: calibrate on the first turns of the prompts that follow the evaluated ones in every benchmark, or
    in those of --calibrate-on (a benchmark with no more prompts lends its evaluated ones, said in one line), and print
    the choice."""
    chosen = {}
    for name, items in benchmarks.items():
        if options.calibrate_on and name not in options.calibrate_on:
            continue
        chosen[name] = items[options.prompts : options.prompts + options.calibration_prompts]
        if not chosen[name]:
            chosen[name] = items[: options.calibration_prompts]
            print(f"--tree auto: benchmark {name} has no prompts beyond the {options.prompts} evaluated; it calibrates on "
                  f"{len(chosen[name])} of them")
    prompts = [first_turn_ids(verifier.tokenizer, prompt) for items in chosen.values() for prompt in items]
    context = getattr(verifier.model.config.get_text_config(decoder=True), "max_position_embeddings", None) or 2**62
    prompts = [ids for ids in prompts if len(ids) + options.max_new_tokens + bound.levels + 1 <= context]
    print(f"--tree auto: measuring call costs and acceptance on {len(prompts)} prompts of {', '.join(chosen)} (shapes up to {bound.total_tokens} tokens, "
          f"depth {bound.depth}, top-k {bound.top_k})")
    calibration = calibrate_tree(verifier.model, drafter, prompts, eos, bound, continuation_tokens=min(48, options.max_new_tokens))
    choice, plain = calibration.choice, calibration.plain
    if choice.tree.plain:
        best = next(c for c in calibration.ranking if not c.tree.plain)
        print(f"--tree auto: plain decoding ({plain.tokens_per_s:.1f} tokens/s): no tree is expected to beat it on this machine (best: "
              f"{best.tree.total_tokens}/{best.tree.depth}/{best.tree.top_k}, expected τ {best.expected_tau:.2f} at {best.tokens_per_s:.1f} tokens/s)")
    else:
        print(f"--tree auto: total tokens {choice.tree.total_tokens}, depth {choice.tree.depth}, top-k {choice.tree.top_k}: expected τ "
              f"{choice.expected_tau:.2f} at {choice.round_ms:.0f} ms per round = {choice.tokens_per_s:.1f} tokens/s "
              f"(plain decoding {plain.tokens_per_s:.1f} tokens/s; call-cost spread up to {max(calibration.call_ms_spread.values()):.0%})")
    return calibration


def check_options(options: argparse.Namespace, calibrated: TreeConfig | None = None) -> None:
    """Refuse out-of-range options before the verifier or any drafter is loaded (the tree options unless a calibration
    chose the tree: its report was checked when read)."""
    def refuse(option: str, value, need: str) -> TapsError:
        return TapsError(f"{option} {value} is out of range: need {need}")

    problems = {
        "--prompts": int_problem(options.prompts, 1, "at least 1 prompt per benchmark"),
        "--max-new-tokens": int_problem(options.max_new_tokens, 1, "at least 1"),
        "--seed": int_problem(options.seed, 0, "a seed >= 0"),
        **({} if calibrated else {f"--{field.replace('_', '-')}": problem
                                  for field, problem in tree_problems(options.total_tokens, options.depth, options.top_k, plain=False).items()}),
        "--temperatures": temperatures_problem(options.temperatures),
        "--top-p": top_p_problem(options.top_p),
        **{"--benchmarks": problem for problem in map(benchmark_problem, options.benchmarks) if problem},
    }
    for option, problem in problems.items():
        if problem:
            raise TapsError(f"{option} {problem}")
    if options.tree == "auto" and options.strategy not in ("single", "average"):
        raise TapsError(f"--tree auto calibrates one drafter's trees; strategy '{options.strategy}' combines several per round. "
                        "Calibrate one drafter with --tree auto and pass its report to --tree-from, or give --total-tokens/--depth/--top-k")
    if options.calibration_prompts < 1:
        raise refuse("--calibration-prompts", options.calibration_prompts, "at least 1")
    if options.calibrate_on is not None:
        if options.tree != "auto":
            raise TapsError("--calibrate-on names the benchmarks --tree auto calibrates on; add --tree auto, or drop --calibrate-on")
        names = benchmark_names(options)
        unknown = [name for name in options.calibrate_on if name not in names]
        if unknown:
            raise TapsError(f"--calibrate-on {' '.join(unknown)}: not among --benchmarks ({', '.join(names)}); name benchmarks this eval runs")
    if options.weights is not None:
        if options.strategy != "average":
            raise TapsError(f"--weights applies only to --strategy average, not '{options.strategy}'; drop --weights or pass --strategy average")
        check_weights(options.weights, len(options.drafters))
    output = Path(options.output).expanduser()
    for path in {output, *(report_path(output, t, len(options.temperatures)) for t in options.temperatures)}:
        output_file(path, "--output")
    config = read_config(resolve_verifier_path(options.verifier))
    context = getattr(config, "max_position_embeddings", None)
    if context and options.max_new_tokens >= context:
        raise refuse("--max-new-tokens", options.max_new_tokens, f"fewer than the verifier's context of {context} tokens (prompt included)")
    vocab, top_k = getattr(config, "vocab_size", None), (calibrated or options).top_k
    if vocab and top_k > vocab:
        raise refuse("--top-k", top_k, f"at most the verifier's vocabulary size {vocab}")


def averaged_drafter(paths: list[str], weights: list[float] | None, verifier, fingerprint: dict):
    checkpoint = average_checkpoints(paths, weights)
    check_verifier(checkpoint, fingerprint, f"averaged drafter of {', '.join(paths)}")
    return drafter_from_checkpoint(checkpoint, verifier, "averaged drafter")


def print_table(reports: dict[float, EvalReport]) -> None:
    table = Table(title="acceptance length τ ± 95% interval half-width (verified tree tokens per call) "
                        "and speedup over plain decoding [95% interval]")
    table.add_column("benchmark")
    for temperature in reports:
        table.add_column(f"T={temperature:g}", justify="right")
    names = next(iter(reports.values())).benchmarks
    for name in names:
        cells = [tau_cell(r.benchmarks[name].as_dict()) for r in reports.values()]
        table.add_row(name, *cells)
    table.add_row("average", *[f"{r.average_acceptance_length:.2f}" for r in reports.values()])
    Console().print(table)
