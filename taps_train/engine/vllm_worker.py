"""Serve one verifier with one drafter in vLLM and report what it did, prompt by prompt.

Run by `taps_train.engine.serve` as `PYTHON vllm_worker.py REQUEST.json RESULT.json` under a Python that has vLLM
(usually a venv of its own: vLLM pins its own torch), so this file imports only the standard library, torch and
vllm, never taps_train. The request holds token ids, not text, so both sides decode exactly the same inputs.

Per prompt: the generated ids and the wall time of the `generate` call, vLLM's
speculative-decoding counter deltas (drafts, draft tokens, accepted tokens, accepted tokens per position) and, with
a baseline, the same prompt decoded by the verifier alone (a second engine kept alive next to the first, the order
alternating per prompt so that drift of the machine's speed cancels). With `record_drafts`, the chain vLLM drafted
at every step and the probability the draft gave each drafted token (read by wrapping the proposer's greedy sampling: an
extra LM-head call, so not for timing). Loading is audited: draft weights vLLM drops (its loader ignores unexpected
`.bias` keys and names its mappers send nowhere) and draft parameters no weight reached. All of this needs the engine
in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). Progress lines start with `PROGRESS` on stdout, where vLLM
also logs. One drafter per process: deleting a vLLM engine tears down state the other engine of the process needs.
"""

import json
import logging
import os
import sys
import time
import warnings

PROTOCOL = 1
PROGRESS = "PROGRESS "
SHARED_FROM_TARGET = ("embed_tokens",)  # vLLM shares these with the target when the draft has none (it says so)


class _Collect(logging.Handler):
    """Warnings and errors logged while one engine is built."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class _LoadAudit:
    """What vLLM's loaders did with the draft's weights while the proposer loaded it."""

    def __init__(self):
        self.active = False
        self.dropped: list[str] = []
        self.unloaded: list[str] = []

    def reset(self) -> None:
        self.dropped, self.unloaded = [], []


def configure_environment(request: dict) -> None:
    """vLLM in this process, on the cores this process may use, offline (also the generation worker's)."""
    cpus = sorted(os.sched_getaffinity(0))
    threads = request["threads"] = min(int(request["threads"] or len(cpus)), len(cpus))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus[:threads]))  # vLLM's default binds all but one core
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"  # no separate scheduler process to keep a core for
    os.environ["OMP_NUM_THREADS"] = str(threads)  # else vLLM drops torch to one thread "for serving"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(request.get("kv_cache_gib", 1)))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _install_audit(audit: _LoadAudit) -> None:
    from vllm.model_executor.models import utils
    from vllm.v1.spec_decode import llm_base_proposer

    proposer = llm_base_proposer.SpecDecodeBaseProposer
    load_model, ignore, map_name, load_weights = (proposer.load_model, utils.AutoWeightsLoader._can_ignore_unexpected,
                                                  utils.WeightsMapper._map_name_with_shard, utils.AutoWeightsLoader.load_weights)

    def audited_load_model(self, target_model):
        audit.active = True
        try:
            return load_model(self, target_model)
        finally:
            audit.active = False

    def audited_ignore(self, qualname: str) -> bool:
        ignored = ignore(self, qualname)
        if ignored and audit.active:
            audit.dropped.append(qualname)
        return ignored

    def audited_map(self, key: str):
        mapped = map_name(self, key)
        if mapped is None and audit.active:
            audit.dropped.append(key)
        return mapped

    def audited_load_weights(self, weights, *args, **kwargs):
        loaded = load_weights(self, weights, *args, **kwargs)
        if audit.active and type(self.module).__name__.endswith("ForCausalLM") and loaded is not None:
            audit.unloaded += [name for name, _ in self.module.named_parameters()
                               if name not in loaded and not any(part in name for part in SHARED_FROM_TARGET)]
        return loaded

    proposer.load_model = audited_load_model
    utils.AutoWeightsLoader._can_ignore_unexpected = audited_ignore
    utils.WeightsMapper._map_name_with_shard = audited_map
    utils.AutoWeightsLoader.load_weights = audited_load_weights


def _record_drafts(trace: list[list[tuple[int, float]]]) -> None:
    """Wrap the proposer's greedy draft sampling: every call appends (token, the probability the draft gave that token)
    of request 0. The probability is read at the token vLLM returned, not the distribution's maximum, so a token that
    is not the draft's argmax (a mapping error after the argmax) shows as a probability below the top one."""
    import torch
    from vllm.v1.spec_decode import llm_base_proposer

    proposer = llm_base_proposer.SpecDecodeBaseProposer
    greedy = proposer._greedy_sample

    def recorded(self, hidden_states: torch.Tensor) -> torch.Tensor:
        ids = greedy(self, hidden_states)
        if self.use_heterogeneous_vocab:  # the draft's logits would be over another tokenizer's ids
            raise RuntimeError("recording drafts needs a draft that shares the verifier's vocabulary (taps-train's exports do)")
        logits = self.model.compute_logits(hidden_states[:1]).float()  # over the verifier's vocabulary (EAGLE-3 maps d2t here)
        if trace:
            trace[-1].append((int(ids[0]), float(torch.softmax(logits[0], dim=-1)[ids[0]])))
        return ids

    proposer._greedy_sample = recorded


def _counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
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
    return {"drafts": after["drafts"] - before["drafts"], "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
            "accepted_per_position": [a - b for a, b in zip(*padded)]}


def _progress(**fields) -> None:
    print(PROGRESS + json.dumps(fields), flush=True)


def serve(request: dict) -> dict:
    configure_environment(request)
    collect = _Collect()
    logging.captureWarnings(True)
    for name in ("vllm", "py.warnings"):
        logging.getLogger(name).addHandler(collect)
    warnings.simplefilter("default")

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    audit, trace = _LoadAudit(), []
    _install_audit(audit)
    if request["record_drafts"]:
        _record_drafts(trace)
    engine = dict(model=request["verifier"], dtype=request["dtype"], max_model_len=request["max_model_len"],
                  enforce_eager=True, seed=request["seed"], disable_log_stats=False)
    sampling = SamplingParams(temperature=request["temperature"], top_p=request["top_p"], seed=request["seed"],
                              max_tokens=request["max_new_tokens"], stop_token_ids=request["stop_token_ids"],
                              ignore_eos=True, detokenize=False)
    warm_up = SamplingParams(max_tokens=4, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]

    def decode(llm, prompt) -> tuple[list[int], float]:
        started = time.perf_counter()
        output = llm.generate([prompt], sampling, use_tqdm=False)[0]
        return list(output.outputs[0].token_ids), time.perf_counter() - started

    draft = request["draft"]
    _progress(stage="loading")
    plain = LLM(**engine) if request["baseline"] else None
    started = time.perf_counter()
    if draft["alone"]:  # a speculators export names its verifier; vLLM serves the pair from the export alone
        llm = LLM(**{**engine, "model": draft["model"]})
    else:
        llm = LLM(**engine, speculative_config={"method": draft["method"], "model": draft["model"],
                                                 "num_speculative_tokens": draft["num_speculative_tokens"]})
    run = {"load_seconds": time.perf_counter() - started, "warnings": collect.messages,
           "dropped_weights": audit.dropped, "unloaded_parameters": audit.unloaded, "prompts": []}
    for warm in (llm, plain):
        if warm is not None:
            warm.generate(prompts[:1], warm_up, use_tqdm=False)
    for index, prompt in enumerate(prompts):
        record = {}
        engines = [("draft", llm)] + ([("plain", plain)] if plain is not None else [])
        for side, which in engines if index % 2 == 0 else reversed(engines):
            before = _counters(llm) if side == "draft" else None
            trace.append([])
            tokens, seconds = decode(which, prompt)
            if side == "plain":
                record.update(baseline_tokens=tokens, baseline_seconds=seconds)
                continue
            record.update(tokens=tokens, seconds=seconds, spec=_delta(_counters(llm), before))
            if request["record_drafts"]:
                record["drafts"] = trace[-1]
        run["prompts"].append(record)
        _progress(stage="prompt", done=index + 1, total=len(prompts), tokens=len(record["tokens"]))
    return {"protocol": PROTOCOL, "versions": {"vllm": vllm.__version__, "torch": torch.__version__, "python": sys.version.split()[0]},
            "threads": int(request["threads"]), **run}


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
