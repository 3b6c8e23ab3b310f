"""Run a study's cells in order, skipping finished ones, with progress and a time estimate.

Each cell runs as its own `taps-train` process (the same command a user would type; its output goes to
`logs/<cell>.log`), so a crash in one cell cannot leave the study's own state half-written, and a cell's
process dies with the study's. A cell is finished when `cells/<cell>.json` records its fingerprint and its outputs still
read back as they were written (size and SHA-256, recorded with it); an interrupted fit resumes from its last checkpoint
when its fingerprint is unchanged.
"""

import ctypes
import functools
import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console

from taps_train import files
from taps_train.units import duration
from taps_train.errors import TapsError
from taps_train.paths import writable_directory
from taps_train.study.config import Study
from taps_train.study.plan import Cell, plan


@dataclass(frozen=True)
class Rates:
    """Seconds a cell takes before this study has measured its own (prior_rates.yaml says how they were measured)."""

    per_step: dict[str, float]
    per_decode: dict[str, float]
    per_process: dict[str, float]


@functools.cache
def prior_rates() -> dict[str, Rates]:
    """The measured rates shipped with taps-train, per verifier."""
    raw = yaml.safe_load(Path(__file__).with_name("prior_rates.yaml").read_text())
    return {verifier: Rates(**rates) for verifier, rates in raw.items()}


def run_study(study: Study, dry_run: bool = False, console: Console | None = None) -> list[Cell]:
    """Run (or, with `dry_run`, print) every unfinished cell; returns the cells that ran."""
    console = console or Console(stderr=True)
    cells, todo = unfinished(study)
    console.print(_plan_text(study, cells, todo, _State(study.out_dir)))
    if dry_run or not todo:
        return []
    try:
        study.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TapsError(f"cannot create the study folder {study.out_dir}: {err.strerror or err}; set out_root to a writable folder") from err
    with files.exclusive(study.out_dir / ".lock", f"another run of study {study.name}"):
        state = _State(study.out_dir)
        todo = _todo(cells, state)  # what another run finished meanwhile
        began = time.monotonic()
        index = 0
        while index < len(todo):
            cell = todo[index]
            console.print(f"[{index + 1}/{len(todo)}] {_describe(cell)} ...")
            earlier = state.hashes(cell.key) if (state.read(cell) or {}).get("fingerprint") == cell.fingerprint else None
            seconds = _run_cell(cell, state)
            state.record(cell, seconds)
            if earlier and earlier != state.hashes(cell.key):  # a finished cell ran again (e.g. a fit whose checkpoint was not kept)
                rest = [c for c in _todo(cells, state) if c not in todo[:index + 1]]
                console.print(f"{_describe(cell)}: its outputs differ from those an earlier run recorded; "
                              f"{len([c for c in rest if c not in todo])} finished evaluations that read them run again")
                todo[index + 1:] = rest
            index += 1
            left = _estimate(todo[index:], cells, state, study)
            console.print(f"[{index}/{len(todo)}] {_describe(cell)} done in {duration(seconds)}; study elapsed "
                          f"{duration(time.monotonic() - began)}, about {duration(left) if left is not None else '?'} left")
    return todo


def unfinished(study: Study) -> tuple[list[Cell], list[Cell]]:
    """The study's cells, and those not finished with their current fingerprint."""
    study.check()
    cells = plan(study)
    return cells, _todo(cells, _State(study.out_dir))


def _todo(cells: list[Cell], state: "_State") -> list[Cell]:
    """The cells not finished, except fits that no unfinished evaluation reads: a study resumed from its records and
    reports alone (committed, or copied to another machine without the checkpoints) does not train again the drafters
    of evaluations that are done. A changed fit changes the fingerprints of the evaluations reading it, so it still runs."""
    left = [cell for cell in cells if not state.finished(cell)]
    read = {key for cell in left if cell.kind == "eval" for key in cell.needs}
    return [cell for cell in left if cell.kind == "eval" or cell.key in read]


class _State:
    """`cells/<key>.json` per finished cell: its fingerprint and how long it took."""

    def __init__(self, out_dir: Path):
        self.directory = out_dir / "cells"

    def path(self, cell: Cell) -> Path:
        return self.directory / f"{cell.key}.json"

    def read(self, cell: Cell | str) -> dict | None:
        """The record of a cell (or of the cell with that key), None when there is none to read."""
        path = self.directory / f"{cell if isinstance(cell, str) else cell.key}.json"
        if path.is_dir():
            raise TapsError(f"study state {path} is a directory, where taps-train keeps a cell's record file; remove it "
                            "(the cell then runs again)")
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            return None
        return record if isinstance(record, dict) else None

    def finished(self, cell: Cell) -> bool:
        """Recorded with the cell's fingerprint, and every output still what the cell wrote (size and SHA-256)."""
        record = self.read(cell)
        if not record or record.get("fingerprint") != cell.fingerprint:
            return False
        outputs = record.get("outputs") if isinstance(record.get("outputs"), list) else []
        if outputs and all(isinstance(entry, str) for entry in outputs):  # recorded before sizes and hashes were: non-empty
            return all(path.exists() and _size_and_time(path)[0] > 0 for path in cell.outputs)
        written = {entry.get("path"): entry for entry in outputs if isinstance(entry, dict)}
        return all(_intact(path, written.get(str(path))) for path in cell.outputs) and record.get("read", self.reads(cell)) == self.reads(cell)

    def reads(self, cell: Cell) -> dict[str, list]:
        """The recorded content hashes of what an evaluation reads (its drafters' checkpoints, its calibration's report):
        a fit trained again to other weights (another sitting, another machine) makes the evaluations of the earlier
        weights stale, even when their fingerprints, which say how the cells ran, still match."""
        return {key: self.hashes(key) for key in cell.needs}

    def hashes(self, key: str) -> list:
        """The SHA-256 of each output the cell `key` recorded ([] without a record)."""
        outputs = (self.read(key) or {}).get("outputs")
        return [entry.get("sha256") for entry in outputs if isinstance(entry, dict)] if isinstance(outputs, list) else []

    def record(self, cell: Cell, seconds: float) -> None:
        files.write_text(self.path(cell), json.dumps({"fingerprint": cell.fingerprint, "seconds": round(seconds, 1), "steps": cell.steps,
                                                      "decodes": cell.decodes, "outputs": [_summary(p) for p in cell.outputs],
                                                      "read": self.reads(cell)}, indent=2))

    def measured(self, cells: list[Cell]) -> float | None:
        """Seconds per step (fits) or per decode (evals) over those of `cells` finished here (seconds include start-up)."""
        seconds = units = 0.0
        for cell in cells:
            record = self.read(cell)
            if record and record.get("fingerprint") == cell.fingerprint:
                seconds += float(record.get("seconds", 0))
                units += float(record.get("steps" if cell.kind == "fit" else "decodes", 0))
        return seconds / units if units else None


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]  # DeepSpeed checkpoints are folders


def _size_and_time(path: Path) -> tuple[int, int]:
    stats = [file.stat() for file in _files(path)]
    return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)


def _summary(path: Path) -> dict:
    """What an output was when its cell finished: size, modification time and content hash."""
    digest = hashlib.sha256()
    for file in _files(path):
        digest.update(f"{file.relative_to(path) if path.is_dir() else ''}\0".encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(2**20), b""):
                digest.update(block)
    size, mtime = _size_and_time(path)
    return {"path": str(path), "size": size, "mtime_ns": mtime, "sha256": digest.hexdigest()}


def _intact(path: Path, written: dict | None) -> bool:
    """The output exists and reads back as recorded (the hash is recomputed only when size or time changed)."""
    if written is None or not path.exists():
        return False
    size, mtime = _size_and_time(path)
    if (size, mtime) == (written.get("size"), written.get("mtime_ns")):
        return True
    return size == written.get("size") and _summary(path)["sha256"] == written.get("sha256")


def _run_cell(cell: Cell, state: _State) -> float:
    log = cell.log
    writable_directory(log.parent, "study log folder", "remove the file in the way or point out_root elsewhere").mkdir(parents=True, exist_ok=True)
    args = list(cell.args)
    if cell.kind == "fit":
        _prepare_fit(cell, state, args)
    began = time.monotonic()
    with log.open("a") as out:
        out.write(f"$ taps-train {' '.join(args)}\n")
        out.flush()
        result = subprocess.run([sys.executable, "-m", "taps_train", *args], stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent, check=False)
    if result.returncode != 0:
        raise TapsError(f"study cell {cell.key} failed (exit {result.returncode}): {_last_line(log)}; see {log}. "
                        "Fix it and run the study again: finished cells are kept")
    missing = [str(p) for p in cell.outputs if not p.exists()]
    if missing:
        raise TapsError(f"study cell {cell.key} finished without writing {missing}; see {log}")
    return time.monotonic() - began


def _prepare_fit(cell: Cell, state: _State, args: list[str]) -> None:
    """Write the cell's fit config; resume from its last checkpoint when an earlier run of the same cell was cut
    short, or start over (removing that run's checkpoints) when the cell's inputs changed since."""
    directory = cell.config_path.parent
    previous = state.read(cell) or _read_started(directory)
    last = directory / "last.ckpt"
    if last.exists() and previous and previous.get("fingerprint") == cell.fingerprint:
        args += ["--ckpt_path", str(last)]
    else:
        for stale in directory.glob("*.ckpt"):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()  # DeepSpeed checkpoints are directories
    directory.mkdir(parents=True, exist_ok=True)
    files.write_text(cell.config_path, yaml.safe_dump(cell.fit_config, sort_keys=False))
    files.write_text(directory / "started.json", json.dumps({"fingerprint": cell.fingerprint}))


def _read_started(directory: Path) -> dict | None:
    try:
        return json.loads((directory / "started.json").read_text())
    except (OSError, ValueError):
        return None


def _die_with_parent() -> None:
    """Linux: the cell's process is interrupted when the study's process dies, even by SIGKILL. SIGINT, not SIGTERM:
    Lightning turns SIGTERM into a flag its loop checks later (an orphaned fit kept building its cache); SIGINT is a
    KeyboardInterrupt at once, which fit, eval and cache builds clean up after. A study started in the background
    (`nohup ... &` from a script) inherits SIGINT ignored, and so would its cells: they get the default back first."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGINT))  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _last_line(log: Path) -> str:
    """The cell's own last words (its one-line error, without the repeated `taps-train: error:`)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].removeprefix("taps-train: error: ")[:600] if lines else "no output"


def _describe(cell: Cell) -> str:
    if cell.kind == "fit":
        return f"fit {cell.backbone} on {cell.label}"
    return f"eval {cell.backbone} {cell.label}" + ("" if cell.tree == "fixed" else f" ({cell.tree} tree)")


def _estimate(todo: list[Cell], cells: list[Cell], state: _State, study: Study) -> float | None:
    """Seconds the `todo` cells will take: the measured rate of the study's finished cells like each (fits of its
    backbone, evals at its tree), else the prior rates of the verifier (None without them)."""
    total = 0.0
    rates = {}  # each rate reads the finished cells' records once per kind of cell, not once per cell
    for cell in todo:
        units = cell.steps if cell.kind == "fit" else cell.decodes
        if _rate_group(cell) not in rates:
            rates[_rate_group(cell)] = state.measured([c for c in cells if _rate_group(c) == _rate_group(cell)])
        measured = rates[_rate_group(cell)]
        if measured is not None and units:
            total += measured * units
            continue
        prior = _prior_rate(study, cell) if units else None
        if prior is None:
            return None
        total += prior * units + prior_rates()[study.verifier].per_process[cell.kind]
    return total


def _rate_group(cell: Cell) -> tuple[str, str]:
    return (cell.kind, cell.backbone if cell.kind == "fit" else cell.tree)


def _prior_rate(study: Study, cell: Cell) -> float | None:
    """Seconds per step or decoded prompt from the shipped prior rates; None for other verifiers."""
    rates = prior_rates().get(study.verifier)
    if rates is None:
        return None
    if cell.kind == "eval":
        return rates.per_decode[cell.tree] * study.max_new_tokens / 64 * (1 if cell.tree in study.baseline else 0.5)
    module = str(cell.fit_config["model"].get("class_path", "")).rsplit(".", 1)[-1]
    return rates.per_step.get(module)


def _plan_text(study: Study, cells: list[Cell], todo: list[Cell], state: _State) -> str:
    fits = [c for c in cells if c.kind == "fit"]
    evals = [c for c in cells if c.kind == "eval"]
    left = _estimate(todo, cells, state, study)
    budget = f"{study.max_steps} steps each" if study.max_steps else "each on its config's own budget"
    lines = [f"study {study.name} -> {study.out_dir}",
             (f"  {len(fits)} fits ({len(study.backbones)} backbones x {len(study.domains)} domains + {len(study.mixtures)} mixtures, "
             f"{budget}), {len(evals)} evals ({study.prompts} prompts x {len(study.benchmarks)} benchmarks "
             f"x {len(study.temperatures)} temperatures each)"),
             (f"  {len(cells) - len(todo)} cells done, {len(todo)} to do; estimated time "
             f"{duration(left) if left is not None else 'unknown (no rate measured yet for this verifier)'}")]
    lines += [f"    {'todo' if c in todo else 'done'}  {_describe(c)}"
              + (" (checkpoint not kept: its evaluations are done)" if c not in todo and c.kind == "fit" and not c.outputs[0].exists() else "")
              for c in cells]
    for cell in damaged_fits(cells, todo, state):
        lines.append(f"  warning: {cell.outputs[0]} is no longer what fit {cell.label} ({cell.backbone}) wrote (size or SHA-256 changed since): "
                     f"the evaluations that read it stand, but the drafter on disk is damaged; to train it again, delete "
                     f"{state.path(cell)} and rerun the study")
    return "\n".join(lines)


def damaged_fits(cells: list[Cell], todo: list[Cell], state: _State) -> list[Cell]:
    """Finished fits whose checkpoint is on disk but not what they wrote (one not kept is no damage: a study resumed
    from its records alone)."""
    return [cell for cell in cells if cell.kind == "fit" and cell not in todo and cell.outputs[0].exists() and not state.finished(cell)]
