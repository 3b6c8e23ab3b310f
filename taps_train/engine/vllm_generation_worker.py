"""A vLLM engine kept alive for batched generation (reply regeneration), driven line by line over stdin / stdout.

Run by `taps_train.data.vllm_generation` as `PYTHON vllm_generation_worker.py SETTINGS_JSON` under a Python that has vLLM
(like vllm_worker.py it imports only the standard library and vllm, never taps_train). It loads the verifier once,
prints `READY {...}`, then answers each request line `{"prompts": [[ids]], "max_new_tokens": n, "stop_token_ids": [...],
"temperature": t, "seeds": [...]}` with one line `RESULT {"outputs": [[ids]]}`; every other line it prints is vLLM's log.
It ends when stdin closes.
"""

import json
import sys

from vllm_worker import configure_environment  # the same folder: this file runs as a script

READY, RESULT = "READY ", "RESULT "


def _say(prefix: str, payload: dict) -> None:
    print(prefix + json.dumps(payload), flush=True)


def main() -> None:
    settings = json.loads(sys.argv[1])
    configure_environment(settings)

    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=settings["verifier"], dtype=settings["dtype"], max_model_len=settings["max_model_len"], enforce_eager=True,
              seed=0)
    _say(READY, {"vllm": vllm.__version__, "threads": int(settings["threads"])})
    for line in sys.stdin:
        request = json.loads(line)
        params = [SamplingParams(temperature=request["temperature"], max_tokens=request["max_new_tokens"], seed=seed,
                                 stop_token_ids=request["stop_token_ids"], detokenize=False) for seed in request["seeds"]]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False)
        _say(RESULT, {"outputs": [list(output.outputs[0].token_ids) for output in outputs]})


if __name__ == "__main__":  # vLLM may spawn processes that import this module
    main()
