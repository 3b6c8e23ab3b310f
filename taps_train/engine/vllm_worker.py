"""Serve one verifier (with or without a drafter) in vLLM and report what it did, prompt by prompt.

Run by `taps_train.engine.vllm` as `PYTHON vllm_worker.py REQUEST.json RESULT.json` under a Python that has vLLM
(usually a venv of its own: vLLM pins its own torch), so this file imports only the standard library, torch and
vllm, never taps_train. The request holds token ids, not text, so both sides decode exactly the same inputs.

Per prompt it records the generated ids, the wall time of the `generate` call, vLLM's speculative-decoding counter
deltas (drafts, draft tokens, accepted tokens, accepted tokens per position) and, when `record_drafts` is set, the
chain vLLM drafted at every step with the probability the draft gave each token. The drafts are read by wrapping
the proposer's greedy sampling, which needs the engine in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).
Progress goes to stdout as one JSON object per line; warnings and errors vLLM logs are returned, so the caller can
fail on a weight the loader skipped.
"""

import json
import logging
import os
import sys
import time
import warnings

PROTOCOL = 1


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def _configure_environment(request: dict) -> None:
    threads = int(request["threads"])
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the drafts are read in this process
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"  # no separate scheduler process to keep a core for
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_gib", 2)))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _record_drafts(trace: list[list[tuple[int, float]]]) -> None:
    """Wrap the proposer's greedy draft sampling: every call appends (token, draft probability) of request 0."""
    import torch
    from vllm.v1.spec_decode import llm_base_proposer

    proposer = llm_base_proposer.SpecDecodeBaseProposer
    greedy = proposer._greedy_sample

    def recorded(self, hidden_states: torch.Tensor) -> torch.Tensor:
        ids = greedy(self, hidden_states)
        logits = self.model.compute_logits(hidden_states[:1]).float()
        if self.use_heterogeneous_vocab:
            logits = self.vocab_mapping.constrain_draft_logits(logits)
        probs = torch.softmax(logits, dim=-1)[0]
        if trace:
            trace[-1].append((int(ids[0]), float(probs.max())))
        return ids

    proposer._greedy_sample = recorded


def _counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters."""
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    }
    values = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in names:
            values[names[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values["accepted_per_position"] = [int(v) for v in metric.values]
    return values


def _delta(after: dict, before: dict) -> dict:
    positions = max(len(after["accepted_per_position"]), len(before["accepted_per_position"]))
    padded = [c["accepted_per_position"] + [0] * (positions - len(c["accepted_per_position"])) for c in (after, before)]
    return {
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
        "accepted_per_position": [a - b for a, b in zip(*padded)],
    }


def _progress(**fields) -> None:
    print(json.dumps(fields), flush=True)


def serve(request: dict) -> dict:
    _configure_environment(request)
    collect = _Collect()
    logging.captureWarnings(True)
    for name in ("vllm", "py.warnings", "transformers"):
        logging.getLogger(name).addHandler(collect)
    warnings.simplefilter("always")

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    draft = request.get("draft")
    trace: list[list[tuple[int, float]]] = []
    if draft and request.get("record_drafts"):
        _record_drafts(trace)
    options = dict(model=request["verifier"], dtype=request["dtype"], max_model_len=request["max_model_len"],
                   enforce_eager=True, seed=request["seed"], disable_log_stats=False)
    if draft:
        options["speculative_config"] = {"method": draft["method"], "model": draft["model"],
                                         "num_speculative_tokens": draft["num_speculative_tokens"]}
    _progress(stage="loading")
    started = time.perf_counter()
    llm = LLM(**options)
    load_seconds = time.perf_counter() - started
    sampling = SamplingParams(temperature=request["temperature"], top_p=request["top_p"], seed=request["seed"],
                              max_tokens=request["max_new_tokens"], stop_token_ids=request["stop_token_ids"],
                              ignore_eos=True, detokenize=False)
    warm_up = request.get("warm_up_prompt")
    if warm_up:
        llm.generate([TokensPrompt(prompt_token_ids=warm_up)], SamplingParams(max_tokens=8, detokenize=False), use_tqdm=False)
    prompts = []
    for index, ids in enumerate(request["prompts"]):
        before = _counters(llm) if draft else None
        trace.append([])
        started = time.perf_counter()
        output = llm.generate([TokensPrompt(prompt_token_ids=ids)], sampling, use_tqdm=False)[0]
        seconds = time.perf_counter() - started
        tokens = list(output.outputs[0].token_ids)
        record = {"tokens": tokens, "seconds": seconds}
        if draft:
            record["spec"] = _delta(_counters(llm), before)
            if request.get("record_drafts"):
                record["drafts"] = trace[-1]
        prompts.append(record)
        _progress(stage="prompt", done=index + 1, total=len(request["prompts"]), tokens=len(tokens), seconds=seconds)
    return {
        "protocol": PROTOCOL,
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]},
        "threads": int(request["threads"]),
        "load_seconds": load_seconds,
        "prompts": prompts,
        "warnings": collect.messages,
    }


def main() -> None:
    request_path, result_path = sys.argv[1:3]
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    if request.get("protocol") != PROTOCOL:
        sys.exit(f"vllm_worker: request protocol {request.get('protocol')!r}, this worker speaks {PROTOCOL}")
    result = serve(request)
    partial = result_path + ".partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(partial, result_path)


if __name__ == "__main__":  # vLLM may spawn processes that import this module
    main()
