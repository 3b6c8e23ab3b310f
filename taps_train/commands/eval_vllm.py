"""`taps-train eval --engine vllm`: the drafter measured where it will be served.

The drafter (a checkpoint, exported on the fly with `--format vllm`, or an export directory) is served by vLLM in a
worker process of `--engine-python` (taps_train/engine/serve.py); every prompt is decoded with the draft and by the
verifier alone, alternately. The report has the schema of taps-train's own eval: τ is vLLM's emitted tokens per
verifier step (accepted draft tokens + the bonus token, from its counters: Σ accepted / Σ drafts + 1), acceptance by
chain position, tokens/s with and without the draft, the speedup with its interval and, at T=0, whether the outputs
equal vLLM's plain greedy ones. vLLM drafts a greedy chain of `--speculative-tokens` tokens (its tree mode is not
used), so the report's tree is that chain. Prompts are decoded on their opening turn only (a later turn would need
the chat template on vLLM's side).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from taps_train import machine
from taps_train.data.vllm_generation import find_engine_python
from taps_train.engine.agreement import chain_config
from taps_train.engine.serve import ServedDraft, VllmRequest, load_problems, run_worker, served_draft, vllm_version
from taps_train.errors import TapsError
from taps_train.eval.benchmarks import Prompt
from taps_train.eval.evaluate import first_turn_ids
from taps_train.eval.intervals import PromptCounts, PromptSpeeds, tau_interval
from taps_train.eval.report import BenchmarkResult, EvalReport
from taps_train.export import export_drafter
from taps_train.decoding.greedy_check import ReplyCheck, check_greedy_reply, not_lossless, too_many_ties
from taps_train.verifier.generation import files_stop_token_ids
from taps_train.verifier.loading import load_verifier, read_verifier_files, resolve_verifier_path

VLLM_DTYPES = {"auto": "float32", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}  # auto: as on a CPU


def check_engine_options(options: argparse.Namespace) -> None:
    """What `--engine vllm` cannot do, refused before anything is loaded."""
    if options.strategy != "single":
        raise TapsError(f"--engine vllm serves one drafter; strategy '{options.strategy}' combines several (vLLM has no such strategy). "
                        "Evaluate compositions with taps-train's own engine (--engine taps)")
    if options.tree == "auto" or options.tree_from is not None:
        raise TapsError("--engine vllm drafts greedy chains of --speculative-tokens tokens; --tree auto and --tree-from choose taps-train's trees")
    if options.speculative_tokens < 1:
        raise TapsError(f"--speculative-tokens {options.speculative_tokens} is out of range: need at least 1")
    cores = len(os.sched_getaffinity(0))
    if options.engine_threads is not None and not 1 <= options.engine_threads <= cores:
        raise TapsError(f"--engine-threads {options.engine_threads} is out of range: need 1 to {cores} (the cores this process may use), "
                        "or leave it out for all of them")
    if options.verifier_dtype not in VLLM_DTYPES:
        raise TapsError(f"--verifier-dtype {options.verifier_dtype}: vLLM takes one of {sorted(VLLM_DTYPES)}")
    if options.device not in ("auto", "cpu", "cuda"):
        raise TapsError(f"--device {options.device}: vLLM places the verifier itself; pass auto")


def run_engine_eval(options: argparse.Namespace, benchmarks: dict[str, list[Prompt]]) -> dict[float, EvalReport]:
    """One report per temperature, each from one vLLM worker decoding every benchmark's prompts."""
    python = find_engine_python(options.engine_python) or sys.executable  # this one's import error names the fix
    version = vllm_version(python)
    verifier_dir = str(resolve_verifier_path(options.verifier))
    files = read_verifier_files(verifier_dir)
    eos = files_stop_token_ids(files)
    served = _served(options)
    k = options.speculative_tokens
    chain = chain_config(k)
    ids = {name: [first_turn_ids(files.tokenizer, prompt) for prompt in prompts] for name, prompts in benchmarks.items()}
    flat = [prompt for prompts in ids.values() for prompt in prompts]
    print(f"vLLM {version}: serving {served.model} (method {served.method}, chains of {k}) on {len(flat)} opening turns")
    reports, verifier = {}, {}  # verifier: the HF model of the T=0 check, loaded on first need
    for temperature in options.temperatures:
        request = VllmRequest(verifier=verifier_dir, dtype=VLLM_DTYPES[options.verifier_dtype], prompts=flat,
                              max_new_tokens=options.max_new_tokens, stop_token_ids=eos, draft=served, temperature=temperature, baseline=options.baseline,
                              top_p=options.top_p, seed=options.seed, threads=options.engine_threads,
                              max_model_len=max(map(len, flat)) + options.max_new_tokens + k + 1)
        began = time.perf_counter()
        result = run_worker(python, request, f"T{temperature:g}")
        seconds = time.perf_counter() - began
        problems = load_problems(result)
        for problem in problems:
            print(f"warning: {problem}")
        results, start = {}, 0
        for name, prompts in ids.items():
            records = result["prompts"][start:start + len(prompts)]
            start += len(prompts)
            check = _greedy_check(options, records, prompts, name, eos, verifier) if temperature == 0 and options.baseline else None
            results[name] = benchmark_result(records, k, seconds * len(prompts) / len(flat), check)
        reports[temperature] = EvalReport(
            verifier=options.verifier, drafters=tuple(options.drafters), strategy="single", temperature=temperature,
            tree=chain, benchmarks=results,
            average_acceptance_length=sum(r.acceptance_length for r in results.values()) / len(results),
            engine={"name": "vllm", **result["versions"], "threads": result["threads"], "method": served.method,
                    "speculative_tokens": k, "export": served.model, "served_alone": served.alone, "turns": "first",
                    "tau": "emitted tokens per verifier step: accepted draft tokens / drafts + 1 (bonus token)",
                    "load_problems": problems, "log": result["log"]},
            machine={**machine.describe(), "threads": result["threads"]},  # the engine's threads timed it
        )
    return reports


def _served(options: argparse.Namespace) -> ServedDraft:
    """The drafter given as an export directory, or its checkpoint exported for vLLM into a temporary directory."""
    source = Path(options.drafters[0])
    if source.is_dir():
        return served_draft(source, options.speculative_tokens)
    directory = Path(tempfile.mkdtemp(prefix="taps-vllm-export-")) / source.stem
    dtype = VLLM_DTYPES[options.verifier_dtype]
    export_drafter(source, directory, verifier=options.verifier, layout="vllm", dtype=dtype)
    return served_draft(directory, options.speculative_tokens)


def benchmark_result(records: list[dict], k: int, wall_time_s: float, greedy_check: tuple[int, int] | None) -> BenchmarkResult:
    """A benchmark's report entry from the worker's per-prompt records (with the plain decoding of each prompt);
    `greedy_check`: (ties, tokens checked) of the complete T=0 check, None where it did not run."""
    steps = [r["spec"]["drafts"] for r in records]
    emitted = [r["spec"]["accepted_tokens"] + r["spec"]["drafts"] for r in records]
    by_position = [sum(r["spec"]["accepted_per_position"][i] for r in records if i < len(r["spec"]["accepted_per_position"])) for i in range(k)]
    reached = [sum(steps)] + by_position[:-1]
    speed = worker_speeds(records)
    return BenchmarkResult(
        acceptance_length=sum(emitted) / sum(steps) if sum(steps) else 0.0,
        verify_calls=sum(steps), new_tokens=sum(emitted), prompts=len(records), prompts_skipped_too_long=0,
        mean_tree_tokens=k + 1.0, accept_rate_by_depth=tuple(a / n if n else 0.0 for a, n in zip(by_position, reached)),
        draft_entropy=None, draft_confidence=None, wall_time_s=round(wall_time_s, 3),
        prompt_new_tokens=tuple(emitted), prompt_verify_calls=tuple(steps),
        tau_ci95=tau_interval(PromptCounts(emitted, steps)) if sum(steps) else None,
        identical_to_greedy=None if greedy_check is None else all(r["tokens"] == r["baseline_tokens"] for r in records),
        greedy_ties=None if greedy_check is None else greedy_check[0], greedy_checked_tokens=None if greedy_check is None else greedy_check[1],
        **speed.report_fields(baseline=bool(speed.baseline_tokens)),
    )


def worker_speeds(records: list[dict]) -> PromptSpeeds:
    """Tokens and seconds per prompt from a worker's records, with the plain decoding's when it ran one."""
    speeds = PromptSpeeds([len(r["tokens"]) for r in records], [r["seconds"] for r in records])
    if all("baseline_tokens" in r for r in records):
        speeds.baseline_tokens, speeds.baseline_seconds = [len(r["baseline_tokens"]) for r in records], [r["baseline_seconds"] for r in records]
    return speeds


def _greedy_check(options: argparse.Namespace, records: list[dict], prompts: list[list[int]], benchmark: str, eos: list[int],
                  verifier: dict) -> tuple[int, int]:
    """(ties, tokens checked): the complete T=0 check (greedy_check) of every output vLLM decoded with the draft, and of
    its plain output (the same check, so that rounding's share of ties is known), by the verifier loaded here once
    (`verifier` holds it across benchmarks). A divergence, or more ties than rounding explains, is an error: vLLM was
    not lossless there."""
    if "model" not in verifier:
        verifier["model"] = load_verifier(options.verifier, options.device, VLLM_DTYPES[options.verifier_dtype]).model
    def checked(prompt: list[int], reply: list[int], where: str, decoding: str) -> ReplyCheck:
        check = check_greedy_reply(verifier["model"], prompt, reply, set(eos), options.max_new_tokens)
        if check.divergence is not None:
            raise not_lossless(where, decoding, check.divergence)
        return check

    ties = tokens = plain_ties = plain_tokens = 0
    for index, (record, prompt) in enumerate(zip(records, prompts)):
        where = f"benchmark {benchmark}, prompt {index + 1}"
        draft = checked(prompt, record["tokens"], where, "vLLM with the draft")
        ties, tokens = ties + draft.ties, tokens + draft.tokens
        plain = draft if record["baseline_tokens"] == record["tokens"] else checked(prompt, record["baseline_tokens"], where, "vLLM's plain decoding")
        plain_ties, plain_tokens = plain_ties + plain.ties, plain_tokens + plain.tokens
    problem = too_many_ties(f"benchmark {benchmark} (vLLM)", ties, tokens, (plain_ties, plain_tokens))
    if problem:
        raise problem
    return ties, tokens
