"""Batched generation by vLLM for taps-train's data work (reply regeneration), as other drafter trainers generate their
training text with a serving engine.

vLLM lives in a venv of its own, so one worker process (`engine/vllm_generation_worker.py`, beside the serving worker whose
environment set-up it shares; run as a script, never imported here) holds the engine for a whole
regeneration and answers one request line per batch. On SmolLM2-135M, 2 CPU cores, fp32 greedy, 64 math prompts x
200 tokens: 235 tokens/s against 74 for batched transformers `generate`, with identical replies (README, "A real
verifier").
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from taps_train.errors import TapsError

WORKER = Path(__file__).parents[1] / "engine" / "vllm_generation_worker.py"
READY, RESULT = "READY ", "RESULT "  # vllm_generation_worker's line prefixes (it is not imported here: it imports vllm)
ENGINE_PYTHON_VARIABLE = "TAPS_ENGINE_PYTHON"


class EngineUnavailable(TapsError):
    """vLLM could not be started for this verifier (not installed, or it cannot serve the model)."""


def find_engine_python(explicit: str | None = None) -> str | None:
    """The python that runs vLLM: `explicit`, else $TAPS_ENGINE_PYTHON, else this python when it imports vllm; None when
    there is none."""
    if explicit:
        return explicit
    if os.environ.get(ENGINE_PYTHON_VARIABLE):
        return os.environ[ENGINE_PYTHON_VARIABLE]
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


class VllmGenerator:
    """A vLLM engine serving `verifier_dir` in `dtype` for batched generation; a context manager that stops it."""

    name = "vllm"
    chunk = 64  # conversations per batch: vLLM gains from wide batches (64: ~35 s of fp32 SmolLM2 on 2 cores, what a kill can lose)

    def __init__(self, python: str, verifier_dir: str | Path, dtype: str, max_model_len: int, threads: int | None = None):
        self.log_path = Path(tempfile.mkdtemp(prefix="taps-vllm-generate-")) / "worker.log"
        self._log = self.log_path.open("w")
        settings = {"verifier": str(verifier_dir), "dtype": dtype, "max_model_len": max_model_len, "threads": threads}
        try:
            self._process = subprocess.Popen([python, str(WORKER), json.dumps(settings)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError as err:
            self._log.close()
            raise EngineUnavailable(f"engine python {python} cannot be run ({err})") from err
        try:
            self.info = self._read(READY)
        except TapsError as err:
            self.close()
            raise EngineUnavailable(f"vLLM ({python}) cannot serve {verifier_dir} in {dtype}: {err}") from err

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_token_ids: list[int], temperature: float,
                 seeds: list[int]) -> list[list[int]]:
        """Each prompt's generated ids (up to and including a stop id), greedy at temperature 0, else sampled with its seed."""
        request = {"prompts": prompts, "max_new_tokens": max_new_tokens, "stop_token_ids": stop_token_ids, "temperature": temperature,
                   "seeds": seeds}
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except OSError as err:
            raise TapsError(f"the vLLM generation worker has stopped ({err}); its log is {self.log_path}") from err
        return self._read(RESULT)["outputs"]

    def _read(self, prefix: str) -> dict:
        """The worker's next `prefix` line; its other lines go to the log."""
        for line in self._process.stdout:
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
            self._log.write(line)
            self._log.flush()
        code = self._process.wait()
        tail = "".join(self.log_path.read_text().splitlines(keepends=True)[-8:])
        raise TapsError(f"the vLLM generation worker ended (exit {code}); its log is {self.log_path}. Last lines:\n{tail}")

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __enter__(self) -> "VllmGenerator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
