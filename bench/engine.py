"""Exports served by vLLM against taps-train's own decoding: agreement per backbone and format, broken-export
controls, and vLLM's serving speed with and without the draft (T=0, greedy chains of k tokens).

For each drafter checkpoint, every export format vLLM serves is written (float32) and decoded by vLLM on the same
prompts as taps-train's own chain decoding of the checkpoint (taps_train/engine/agreement.py says what is compared).
Then deliberately broken copies of the exports (taps_train/engine/controls.py: a layer id off by one, another RoPE
base, the fc bias dropped, d2t shifted, two norms swapped, a weight dropped or misnamed, biases switched off) go
through the same comparison, each of which must be caught by the check it names. Last, each drafter's vllm export is
timed without draft recording, vLLM decoding every prompt with and without it, alternately. The script exits non-zero
when a genuine export does not agree or a control is not caught (after writing its report).

    python bench/engine.py --engine-python ~/vllm-venv/bin/python \\
        --drafter eagle2=checkpoints/smol_eagle2_math/best-step=400.ckpt --drafter hass=checkpoints/smol_hass_math/last.ckpt \\
        --drafter eagle3=checkpoints/smol_eagle3_math/best-step=300.ckpt --out docs/results/engine
"""

import argparse
import json
import math
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from taps_train.drafter.checkpoint import load_drafter
from taps_train.engine.agreement import Agreement, compare, taps_chains, vllm_chains
from taps_train.engine.controls import CONTROLS, caught
from taps_train.engine.serve import VllmRequest, load_problems, run_worker, served_draft, vllm_version
from taps_train.eval.benchmarks import load_benchmark
from taps_train.commands.eval_vllm import worker_speeds
from taps_train.eval.evaluate import first_turn_ids
from taps_train.export import export_drafter
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.loading import load_verifier


def formats(backbone: str) -> list[tuple[str, bool]]:
    """(export layout, served alone) pairs vLLM serves for a backbone."""
    return [("vllm", False), ("speculators", False), ("speculators", True)] if backbone == "eagle3" else [("vllm", False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-python", required=True, help="a python with vLLM (its own venv)")
    parser.add_argument("--verifier", default="smollm2-135m")
    parser.add_argument("--drafter", action="append", required=True, help="backbone=checkpoint (backbone: eagle2, hass or eagle3)")
    parser.add_argument("--benchmark", default="math_heldout")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("-k", "--speculative-tokens", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="vLLM's CPU threads (default: all this process may use)")
    parser.add_argument("--no-agreement", dest="agreement", action="store_false",
                        help="only time the exports, keeping the agreement and controls already in --out's vllm_cpu.json")
    parser.add_argument("--no-controls", dest="controls", action="store_false")
    parser.add_argument("--no-timing", dest="timing", action="store_false")
    parser.add_argument("--out", default="docs/results/engine")
    options = parser.parse_args()
    drafters = dict(spec.split("=", 1) for spec in options.drafter)
    version = vllm_version(options.engine_python)
    k = options.speculative_tokens
    verifier = load_verifier(options.verifier, "cpu", "float32")
    fingerprint = verifier_fingerprint(verifier.path, verifier.tokenizer)
    eos = stop_token_ids(verifier.model, verifier.tokenizer)
    prompts = [first_turn_ids(verifier.tokenizer, p) for p in load_benchmark(options.benchmark, options.prompts)[0]]
    common = dict(verifier=str(verifier.path), dtype="float32", prompts=prompts, max_new_tokens=options.max_new_tokens, stop_token_ids=eos)
    if options.threads:
        common["threads"] = options.threads
    work = Path(tempfile.mkdtemp(prefix="taps-engine-bench-"))
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, controls, timings, traces, exports, versions = [], [], [], {}, {}, {}

    def agreement(backbone: str, directory: Path, label: str, alone: bool = False) -> tuple[Agreement, dict]:
        served = served_draft(directory, k, alone)
        result = run_worker(options.engine_python, VllmRequest(**common, draft=served, record_drafts=True), label, work / "logs")
        versions.update(result["versions"])
        return compare(vllm_chains(result["prompts"], k), traces[backbone], result, k, load_problems(result)), result

    def exported(backbone: str, layout: str) -> Path:
        directory = exports.setdefault((backbone, layout), work / f"{backbone}_{layout}")
        if not directory.exists():
            export_drafter(drafters[backbone], directory, layout=layout, dtype="float32")
        return directory

    for backbone, checkpoint in drafters.items() if options.agreement else ():
        started = time.perf_counter()
        drafter = load_drafter(checkpoint, verifier.model, fingerprint)
        traces[backbone] = taps_chains(verifier.model, drafter, prompts, k, options.max_new_tokens, eos)
        print(f"{backbone}: taps-train chains in {time.perf_counter() - started:.0f} s")
        for layout, alone in formats(backbone):
            directory = exported(backbone, layout)
            label = f"{backbone}_{layout}{'_alone' if alone else ''}"
            result_agreement, _ = agreement(backbone, directory, label, alone)
            rows.append({"backbone": backbone, "format": layout, "served": "alone" if alone else "speculative_config",
                         "checkpoint": checkpoint, **asdict(result_agreement), "verdict": result_agreement.verdict()})
            print(f"{label}: {result_agreement.verdict()}")
    if options.controls and options.agreement:
        for name, backbone, breaks, checks in CONTROLS:
            if backbone not in drafters:
                continue
            directory = work / f"broken_{len(controls)}"
            shutil.copytree(exports[backbone, "vllm"], directory)
            breaks(directory)
            result_agreement, _ = agreement(backbone, directory, f"control_{len(controls)}")
            controls.append({"control": name, "backbone": backbone, **asdict(result_agreement), "verdict": result_agreement.verdict(),
                             "must_fire": list(checks), "caught": caught(result_agreement.problems(), checks)})
            print(f"control {name!r} ({backbone}): {result_agreement.verdict()}")
    if options.timing:
        for backbone in drafters:
            served = served_draft(exported(backbone, "vllm"), k)
            result = run_worker(options.engine_python, VllmRequest(**common, draft=served), f"{backbone}_timing", work / "logs")
            timings.append({"backbone": backbone, "threads": result["threads"], **worker_speeds(result["prompts"]).report_fields(baseline=True)})
            print(f"{backbone} timing: {timings[-1]}")
    if not options.agreement and (out / "vllm_cpu.json").exists():
        kept = json.loads((out / "vllm_cpu.json").read_text())
        rows, controls, versions = kept["agreement"], kept["controls"], kept["versions"]
    report = {"vllm": version, "versions": versions, "verifier": options.verifier, "benchmark": options.benchmark,
              "prompts": len(prompts), "max_new_tokens": options.max_new_tokens, "speculative_tokens": k,
              "agreement": rows, "controls": controls, "timing": timings}
    (out / "vllm_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "vllm_cpu.md").write_text(markdown(report))
    print(markdown(report))
    failures = [f"{row['backbone']} {row['format']} ({row['served']}): {row['verdict']}" for row in rows if row["verdict"] != "agrees"]
    failures += [f"control {row['control']!r} not caught by {' or '.join(row.get('must_fire', ['its check']))}: {row['verdict']}" for row in controls if not row["caught"]]
    if failures:
        raise SystemExit("bench/engine.py: " + "\n  ".join(["the engine check failed:"] + failures))


def markdown(report: dict) -> str:
    k = report["speculative_tokens"]
    lines = [f"# vLLM {report['vllm']} (CPU) serving taps-train exports of {report['verifier']} drafters",
             "", f"{report['prompts']} {report['benchmark']} prompts, {report['max_new_tokens']} new tokens, T=0, greedy chains of {k} "
             "draft tokens; float32 exports and verifier on both sides. τ = emitted tokens per verifier step (accepted + bonus).", "",
             "| backbone | format | served | loaded cleanly | T=0 identical | τ vLLM | τ taps-train | Δτ 95% | accepted by position vLLM | taps-train | chains identical | max Δlog p | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["agreement"]:
        lines.append(_row(row, [row["backbone"], row["format"], row["served"]]))
    if report["controls"]:
        lines += ["", "Broken exports (each must be told apart):", "",
                  "| control | backbone | loaded cleanly | T=0 identical | τ vLLM | τ taps-train | Δτ 95% | accepted by position vLLM | taps-train | chains identical | max Δlog p | verdict |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in report["controls"]:
            lines.append(_row(row, [row["control"], row["backbone"]]))
    if report["timing"]:
        lines += ["", "vLLM tokens/s, each prompt decoded with and without the draft (alternating order, no draft recording):", "",
                  "| backbone (vllm format) | threads | plain tokens/s | with the draft | speedup |", "| --- | --- | --- | --- | --- |"]
        for row in report["timing"]:
            lines.append(f"| {row['backbone']} | {row['threads']} | {row['baseline_tokens_per_s']:.1f} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f} |")
    return "\n".join(lines) + "\n"


def _row(row: dict, first: list[str]) -> str:
    low, high = row["tau_difference_ci95"] or (math.nan, math.nan)  # None: one prompt, no interval
    return "| " + " | ".join(first + [
        "yes" if not row["load_problems"] else "no: " + "; ".join(row["load_problems"]),
        f"{row['outputs_equal_greedy']}/{row['prompts']}",
        f"{row['vllm_tau']:.3f}", f"{row['taps_tau']:.3f}", f"[{low:+.3f}, {high:+.3f}]",
        " / ".join(map(str, row["vllm_accepted_by_position"])), " / ".join(map(str, row["taps_accepted_by_position"])),
        f"{row['chains_identical']:.1%} of {row['steps_compared']}", f"{row['max_log_probability_difference']:.2g}", row["verdict"]]) + " |"


if __name__ == "__main__":
    main()
