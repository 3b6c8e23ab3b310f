"""Fault injection: the machine failing under taps-train's long jobs, and what the rerun finds (issue 36).

For every job (a `taps-train` command writing files later runs trust) it runs the job once undisturbed, then:

- kill: SIGKILL at seeded random moments of the job (as long as the undisturbed run took); after each kill every
  output present must already be what the undisturbed run writes (nothing partial under its final name), and a rerun
  must finish with exactly that;
- disk: the job's outputs on a tmpfs that something else has filled but for a given fraction of what the job writes
  (needs root): one line naming the file and the space, exit 1, no output present; then the filler removed and a
  rerun: exactly the undisturbed outputs;
- two: two processes on the same job and outputs at once: both end well (or one waits and says so), one result, the
  undisturbed one;
- memory: address-space limits below what PyTorch itself needs and just above it: the job finishes with the
  undisturbed result, or fails in one line (out of memory, or the limit refused up front), exit 1, no output present.

"Exactly" is per job: the bytes of every file (export, average, cache), the drafter weights of a fit's last
checkpoint (a resumed run's loop counters are its own), the acceptance lengths of an eval report (its timings are
the machine's). Results: a table of jobs x faults (tried / survived), printed and written with --out.

    python bench/faults.py [--jobs export,average,cache,fit,eval] [--kills 20] [--disk 0.1,0.5,0.95] [--out docs/results/faults.md]
"""

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = ("name: faults\nseed: 0\nmax_length: 128\nsources:\n  - source: gsm_symbolic\n    args: {size: 60, seed: 5}\n"
          "    heldout: 4\n    count: 48\n")


@dataclass
class Job:
    """One command: `argv(work)` writes `outputs(work)`; `digest(work)` is what must come out the same."""

    name: str
    argv: Callable[[Path], list[str]]
    outputs: Callable[[Path], list[Path]]
    digest: Callable[[Path], str]
    seconds: float = 0.0


@dataclass
class Tally:
    tried: int = 0
    survived: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, ok: bool, why: str) -> None:
        self.tried += 1
        self.survived += ok
        if not ok:
            self.failures.append(why)


# --- digests ---------------------------------------------------------------------------------------------------------


def files_digest(paths: list[Path]) -> str:
    """SHA-256 over every file under `paths` (relative names and bytes), temporaries of dead writers excluded."""
    digest = hashlib.sha256()
    for root in paths:
        found = sorted(root.rglob("*")) if root.is_dir() else [root] if root.exists() else []
        for path in found:
            if path.is_file() and not path.name.startswith("."):
                digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def weights_digest(checkpoint: Path) -> str:
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(key.encode() + state[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def tau_digest(report: Path) -> str:
    data = json.loads(report.read_text())
    return json.dumps({name: result["acceptance_length"] for name, result in data["benchmarks"].items()}, sort_keys=True)


# --- jobs ------------------------------------------------------------------------------------------------------------


def jobs(fixtures: Path, verifier: str) -> dict[str, Job]:
    recipe, checkpoints = fixtures / "recipe.yaml", [fixtures / "a.ckpt", fixtures / "b.ckpt"]

    def fit_config(work: Path) -> Path:
        config = fit_yaml(verifier, recipe, work / "run", steps=12, every=4)
        path = work / "fit.yaml"
        path.write_text(json.dumps(config))
        return path

    return {
        "export": Job("export", lambda w: ["export", str(checkpoints[0]), "--out", str(w / "out" / "export"), "--verifier", verifier,
                                            "--overwrite"],
                      lambda w: [w / "out" / "export"], lambda w: files_digest([w / "out" / "export"])),
        "average": Job("average", lambda w: ["average", "--drafters", *map(str, checkpoints), "--output", str(w / "out" / "avg.ckpt")],
                       lambda w: [w / "out" / "avg.ckpt"], lambda w: files_digest([w / "out" / "avg.ckpt"])),
        "cache": Job("cache", lambda w: ["cache", "--recipe", str(recipe), "--verifier", verifier, "--cache-dir", str(w / "out" / "cache")],
                     lambda w: [w / "out" / "cache"], lambda w: files_digest([w / "out" / "cache"])),
        "fit": Job("fit", lambda w: ["fit", "--config", str(fit_config(w))] + (["--ckpt_path", str(w / "run" / "last.ckpt")]
                                                                                  if (w / "run" / "last.ckpt").exists() else []),
                   lambda w: [w / "run" / "last.ckpt"], lambda w: weights_digest(w / "run" / "last.ckpt")),
        "eval": Job("eval", lambda w: ["eval", "--drafters", str(checkpoints[0]), "--verifier", verifier, "--benchmarks", "math_heldout",
                                        "--prompts", "3", "--max-new-tokens", "24", "--total-tokens", "8", "--depth", "2", "--top-k", "3",
                                        "--temperatures", "0", "--no-baseline", "--output", str(w / "out" / "report.json")],
                    lambda w: [w / "out" / "report.json"], lambda w: tau_digest(w / "out" / "report.json")),
    }


def fit_yaml(verifier: str, recipe: Path, run: Path, steps: int, every: int) -> dict:
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": steps, "limit_val_batches": 0, "logger": False,
                    "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": str(run),
                    "callbacks": [{"class_path": "taps_train.training.checkpointing.LastCheckpoint",
                                   "init_args": {"dirpath": str(run), "every_n_train_steps": every, "save_last": True}}]},
        "model": {"class_path": "taps_train.training.Eagle2Module", "init_args": {"verifier": verifier, "lr": 1e-3}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule",
                 "init_args": {"recipe": str(recipe), "batch_size": 8, "cache_dir": str(run.parent / "features")}},
    }


def make_fixtures(fixtures: Path, verifier: str, env: dict) -> None:
    """The recipe, and two drafters to export, average and evaluate (short fits)."""
    fixtures.mkdir(parents=True, exist_ok=True)
    (fixtures / "recipe.yaml").write_text(RECIPE)
    for name, seed in (("a", 0), ("b", 1)):
        if (fixtures / f"{name}.ckpt").exists():
            continue
        config = fit_yaml(verifier, fixtures / "recipe.yaml", fixtures / f"run_{name}", steps=4, every=4)
        config["seed_everything"] = seed
        (fixtures / f"fit_{name}.yaml").write_text(json.dumps(config))
        taps(["fit", "--config", str(fixtures / f"fit_{name}.yaml")], env, check=True)
        shutil.copy(fixtures / f"run_{name}" / "last.ckpt", fixtures / f"{name}.ckpt")


# --- running ---------------------------------------------------------------------------------------------------------


def taps(argv: list[str], env: dict, check: bool = False, memory: int | None = None, **popen) -> subprocess.CompletedProcess:
    def limit() -> None:
        os.setsid()
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    done = subprocess.run([sys.executable, "-m", "taps_train", *argv], env=env, capture_output=True, text=True, preexec_fn=limit,
                          timeout=1800, **popen)
    if check and done.returncode != 0:
        raise SystemExit(f"taps-train {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return done


def killed_at(job: Job, work: Path, env: dict, after: float) -> int:
    """Start the job, SIGKILL its process group `after` seconds in; its exit code (negative when killed)."""
    process = subprocess.Popen([sys.executable, "-m", "taps_train", *job.argv(work)], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return process.wait(timeout=after)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def left_partial(job: Job, work: Path, reference: str, files_ref: dict[str, str]) -> list[str]:
    """What a killed run left under final names that a later run would take and is not the undisturbed result: files
    that differ byte for byte; for an eval, a report whose τ differs (its timings are the machine's); for a fit, a
    `last.ckpt` that does not load (its intermediate checkpoints differ from the final one by design)."""
    if job.name == "eval":
        return [] if not job.outputs(work)[0].exists() or job.digest(work) == reference else ["report.json"]
    if job.name == "fit":
        try:
            if job.outputs(work)[0].exists():
                job.digest(work)
        except Exception:  # noqa: BLE001  (any failure to read it back)
            return ["last.ckpt"]
        return []
    return partial_outputs(job, work, files_ref)


def partial_outputs(job: Job, work: Path, reference: dict[str, str]) -> list[str]:
    """Outputs present under their final names that differ from the undisturbed run's (per file)."""
    found = []
    for root in job.outputs(work):
        paths = sorted(root.rglob("*")) if root.is_dir() else [root] if root.exists() else []
        for path in paths:
            if path.is_file() and not path.name.startswith(".") and path.suffix != ".lock":
                key = str(path.relative_to(work))
                if key in reference and reference[key] != hashlib.sha256(path.read_bytes()).hexdigest():
                    found.append(key)
    return found


def file_hashes(job: Job, work: Path) -> dict[str, str]:
    out = {}
    for root in job.outputs(work):
        paths = sorted(root.rglob("*")) if root.is_dir() else [root] if root.exists() else []
        out |= {str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}
    return out


def written_bytes(job: Job, work: Path) -> int:
    """Everything the job writes into its output folder (a fit's every checkpoint, not only the last)."""
    return sum(p.stat().st_size for p in (work / output_folder(job)).rglob("*") if p.is_file())


def output_folder(job: Job) -> str:
    return "run" if job.name == "fit" else "out"


# --- faults ----------------------------------------------------------------------------------------------------------


def fault_kill(job: Job, base: Path, env: dict, reference: str, files_ref: dict[str, str], kills: int, seed: int) -> Tally:
    tally, rng = Tally(), random.Random(seed)
    work = base / "kill"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for attempt in range(kills):
        killed_at(job, work, env, rng.uniform(0.2, 1.0) * job.seconds)
        partial = left_partial(job, work, reference, files_ref)
        rerun = taps(job.argv(work), env)
        same = rerun.returncode == 0 and job.digest(work) == reference
        tally.add(not partial and same, f"kill {attempt}: partial {partial}" if partial else f"kill {attempt}: rerun exit {rerun.returncode}, "
                  f"same={rerun.returncode == 0 and job.digest(work) == reference}: {rerun.stderr.strip()[-300:]}")
        shutil.rmtree(work / "out", ignore_errors=True)
        shutil.rmtree(work / "run", ignore_errors=True)
    return tally


def mount(folder: Path, size: int) -> bool:
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True).returncode == 0


def fill(path: Path, count: int) -> None:
    """A file of `count` bytes (written, so the filesystem counts it), leaving the rest of the disk to the job."""
    with path.open("wb") as handle:
        for start in range(0, max(count, 0), 1 << 20):
            handle.write(b"\0" * min(1 << 20, count - start))


def fault_disk(job: Job, base: Path, env: dict, reference: str, files_ref: dict[str, str], fractions: list[float], total: int) -> Tally:
    tally = Tally()
    for fraction in fractions:
        work = base / f"disk{fraction}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "out").mkdir(parents=True)
        if job.name == "fit":
            (work / "run").mkdir()
        target = work / output_folder(job)
        if not mount(target, 2 * total + (1 << 20)):
            print("[faults] cannot mount a tmpfs here (needs root): the disk fault is skipped", flush=True)
            break
        fill(target / ".filler", shutil.disk_usage(target).free - int(fraction * total))  # something else filled the disk
        try:
            done = taps(job.argv(work), env)
            lines = done.stderr.strip().splitlines()
            # mid-write ("no space left for <file>: it needs ...") or refused up front from an estimate (the feature cache)
            one_line = (done.returncode == 1 and lines and "Traceback" not in done.stderr and lines[-1].startswith("taps-train: error: ")
                        and ("no space left for" in lines[-1] or (" needs ~" in lines[-1] and " free" in lines[-1])))
            leftovers = left_partial(job, work, reference, files_ref)
            (target / ".filler").unlink()
            rerun = taps(job.argv(work), env)
            same = rerun.returncode == 0 and job.digest(work) == reference
            tally.add(bool(one_line) and not leftovers and same, f"{fraction:.0%}: exit {done.returncode}, last line {lines[-1][:200] if lines else ''!r}, "
                      f"left {leftovers[:3]}, rerun same={same}")
        finally:
            subprocess.run(["umount", "-l", str(target)], capture_output=True)
    return tally


def fault_two(job: Job, base: Path, env: dict, reference: str) -> Tally:
    tally = Tally()
    work = base / "two"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    processes = [subprocess.Popen([sys.executable, "-m", "taps_train", *job.argv(work)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True) for _ in range(2)]
    results = []
    for process in processes:
        try:
            results.append((process.returncode, process.communicate(timeout=1800)[1]))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            results.append((None, "timed out"))
    results = [(process.returncode, err) for process, (_, err) in zip(processes, results)]
    both = all(code == 0 for code, _ in results)
    tally.add(both and job.digest(work) == reference, f"exits {[code for code, _ in results]}: {[err.strip()[-200:] for _, err in results]}")
    return tally


MEMORY_LIMITS = (900_000_000, 1_150_000_000, 1_300_000_000)  # below PyTorch's own need, and just above it


def fault_memory(job: Job, base: Path, env: dict, reference: str) -> Tally:
    """Each limit: the job either finishes with the undisturbed result, or fails in one line (out of memory, or the
    limit refused up front) leaving no output."""
    tally = Tally()
    for limit in MEMORY_LIMITS:
        work = base / f"memory{limit}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        done = taps(job.argv(work), env, memory=limit)
        lines = done.stderr.strip().splitlines()
        one_line = (done.returncode == 1 and lines and "Traceback" not in done.stderr
                    and lines[-1].startswith(("taps-train: error: out of memory", "taps-train: error: this process may use")))
        leftovers = [p.name for root in job.outputs(work) for p in ([root] if root.is_file() else root.rglob("*") if root.exists() else [])
                     if not p.name.startswith(".")]
        finished = done.returncode == 0 and job.digest(work) == reference
        tally.add(finished or (bool(one_line) and not leftovers),
                  f"limit {limit / 1e9:.2f} GB: exit {done.returncode}, last line {lines[-1][:200] if lines else ''!r}, left {leftovers[:3]}")
    return tally


# --- main ------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="export,average,cache,fit,eval")
    parser.add_argument("--faults", default="kill,disk,two,memory")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--disk", default="0.1,0.5,0.95", help="fractions of the job's writes at which the disk fills")
    parser.add_argument("--verifier", default="taps-tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--out", default=None, help="write the table (markdown) here too")
    args = parser.parse_args()
    base = Path(args.work or tempfile.mkdtemp(prefix="taps-faults-"))
    env = {**os.environ, "TAPS_HOME": os.environ.get("TAPS_HOME", str(Path.home() / ".cache" / "taps-train")), "PYTHONUNBUFFERED": "1"}
    verifier = args.verifier
    if verifier == "taps-tiny":
        done = taps(["verifier", "info", "--verifier", verifier], env, check=True)
        verifier = done.stdout.split(":")[0].strip()
    make_fixtures(base / "fixtures", verifier, env)
    chosen = {name: job for name, job in jobs(base / "fixtures", verifier).items() if name in args.jobs.split(",")}
    faults, rows = args.faults.split(","), []
    for name, job in chosen.items():
        work = base / name / "undisturbed"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        began = time.monotonic()
        taps(job.argv(work), env, check=True)
        job.seconds = time.monotonic() - began
        reference, files_ref, total = job.digest(work), file_hashes(job, work), written_bytes(job, work)
        print(f"[faults] {name}: undisturbed in {job.seconds:.1f} s, {total:,} bytes written", flush=True)
        tallies = {}
        if "kill" in faults:
            tallies["kill"] = fault_kill(job, base / name, env, reference, files_ref, args.kills, args.seed)
        if "disk" in faults:
            tallies["disk"] = fault_disk(job, base / name, env, reference, files_ref, [float(f) for f in args.disk.split(",")], total)
        if "two" in faults:
            tallies["two"] = fault_two(job, base / name, env, reference)
        if "memory" in faults:
            tallies["memory"] = fault_memory(job, base / name, env, reference)
        rows.append((name, job.seconds, tallies))
        for fault, tally in tallies.items():
            print(f"[faults] {name} {fault}: {tally.survived}/{tally.tried} survived" + "".join(f"\n    {f}" for f in tally.failures[:5]), flush=True)
    table = ["| job (undisturbed time) | " + " | ".join(faults) + " |", "| --- | " + " | ".join("---" for _ in faults) + " |"]
    for name, seconds, tallies in rows:
        table.append(f"| {name} ({seconds:.0f} s) | " + " | ".join(f"{t.survived}/{t.tried}" if (t := tallies.get(f)) and t.tried else "-"
                                                                  for f in faults) + " |")
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text("\n".join(table) + "\n")
    if any(t.survived < t.tried for _, _, tallies in rows for t in tallies.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
