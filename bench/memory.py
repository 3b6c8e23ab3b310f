"""Memory benchmark on random Llama-3-shaped stand-in verifiers (vocabulary 128,256), all figures from one run:

  1. peak host RSS of constructing `HassModule` against the stand-in (default 8 layers x 1024) vs the
     stand-in's full float32 size; target: peak <= embedding + LM head bytes as stored + the drafter's
     weights + a small constant (the verifier's transformer layers are never materialised)
  2. peak RSS of one HASS training step (forward + backward, 3 alignment steps) at 8,192 loss positions
     with the vocabulary-sized loss chunked (1,024 positions) vs unchunked; target >= 4x lower chunked
  3. the feature cache built with the verifier computing in bfloat16 vs float32: tokens/s of each build
     and how far the stored (bfloat16) features of the two differ

    python bench/memory.py [--work checkpoints/bench_memory] [--positions 8192] [--unchunked-max 2048] [--threads N]

Each memory figure comes from a fresh subprocess (so nothing allocated before counts): it imports
everything, resets its peak RSS (`echo 5 > /proc/self/clear_refs`, Linux only; ru_maxrss would carry
the parent's peak across fork/exec), does the work and reports VmHWM minus the RSS at the reset.

(2) uses a small-hidden stand-in (default 2 x 256) so the vocabulary terms dominate, with the frozen
embedding and head cast to float32 as Lightning's 32-true precision (the CPU default) does in `setup`
(bfloat16 matmuls are several times slower on most CPUs). Unchunked steps run at 1/16 and 1/4 of the
positions, then at 1/2 and all of them while that stays within --unchunked-max positions (time: at
V = 128,256 a step costs tens of ms per position on 2 cores) and the growth predicted by a line through
the last two within --max-gb (memory). Where the full count is not run, its unchunked figure is that
line's value, printed as an extrapolation: the unchunked loss's memory is linear in positions.
Stand-ins are built once under --work and reused; (3) rebuilds its caches there from scratch each run.
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from taps_train.data.feature_cache import CacheSettings, FeatureCache, verifier_features
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import load_recipe
from taps_train.training import HassModule
from taps_train.verifier.offline.standin import LLAMA3_VOCAB, MANIFEST, build_standin

PROMPT = 8  # leading tokens of each synthetic row outside the loss, as a prompt would be
MB, GB = 1e6, 1e9


# --- peak RSS, inside a probe process ---------------------------------------------------------

def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) * 1024


def reset_peak() -> int:
    """Set the peak RSS (VmHWM) to the current RSS and return that RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return _status_bytes("VmRSS")


def peak() -> int:
    return _status_bytes("VmHWM")


# --- probes: each runs in its own process --------------------------------------------------------

def construct_probe(verifier: str) -> dict:
    """Peak RSS growth of `HassModule(verifier=...)`, then after every page of the frozen parts is read."""
    start = reset_peak()
    module = HassModule(verifier=verifier)
    built = peak() - start
    parts = [module.drafter.embed_tokens.weight, module.drafter.lm_head.weight]
    with torch.no_grad():
        for weight in parts:  # the parts are mapped from the files; a training step reads all of them
            weight.sum()
    return {
        "built": built,
        "touched": peak() - start,
        "parts_bytes": sum(w.nbytes for w in parts),
        "parts_dtype": str(parts[0].dtype).removeprefix("torch."),
        "drafter_bytes": sum(p.nbytes for p in module.drafter.parameters() if p.requires_grad),
    }


def synthetic_batch(rows: int, positions_per_row: int, hidden: int, vocab: int) -> dict[str, torch.Tensor]:
    """A batch as `pad_collate` makes it, with `rows * positions_per_row` positions in the loss."""
    generator = torch.Generator().manual_seed(0)
    width = positions_per_row + PROMPT
    loss_mask = torch.ones(rows, width, dtype=torch.bool)
    loss_mask[:, :PROMPT] = False
    return {
        "input_ids": torch.randint(0, vocab, (rows, width), generator=generator),
        "loss_mask": loss_mask,
        "attention_mask": torch.ones(rows, width, dtype=torch.bool),
        "features": torch.randn(rows, width, hidden, generator=generator),
    }


def step_probe(verifier: str, positions: int, row_positions: int, chunk_size: int | None) -> dict:
    """Peak RSS growth and seconds of one forward + backward of `step_losses` on a synthetic batch."""
    module = HassModule(verifier=verifier, loss_chunk_size=chunk_size)
    module.drafter.cast_verifier_parts(torch.float32)  # as setup() under 32-true; CPU bfloat16 matmuls are far slower
    config = module.drafter.config
    warmup, _ = module.step_losses(synthetic_batch(1, 64, config.hidden_size, config.vocab_size), train=True)
    warmup.backward()  # first-use buffers (BLAS, allocator) and the gradients stay: not part of the step's peak
    rows = max(1, positions // row_positions)
    batch = synthetic_batch(rows, positions // rows, config.hidden_size, config.vocab_size)
    counted = int(batch["loss_mask"][:, 2:].sum())  # positions t whose x_{t+2} is in the loss
    start = reset_peak()
    began = time.perf_counter()
    loss, _ = module.step_losses(batch, train=True)
    loss.backward()
    return {"growth": peak() - start, "seconds": time.perf_counter() - began, "positions": counted, "rows": rows}


PROBES = {"construct": construct_probe, "step": step_probe}


def run_probe(kind: str, threads: int | None, **options) -> dict:
    request = json.dumps({"kind": kind, "threads": threads, "options": options})
    done = subprocess.run([sys.executable, __file__, "--probe", request], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def probe_main(request: str) -> None:
    spec = json.loads(request)
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    print(json.dumps(PROBES[spec["kind"]](**spec["options"])))


# --- the three measurements ------------------------------------------------------------------------

def standin(work: Path, layers: int, hidden: int) -> tuple[Path, int]:
    """A stand-in under `work` (built once) and its parameter count."""
    path = build_standin(work / f"standin-{layers}x{hidden}", layers=layers, hidden=hidden)
    return path, json.loads((path / MANIFEST).read_text())["parameters"]


def construction_memory(path: Path, parameters: int, label: str, threads: int | None) -> None:
    got = run_probe("construct", threads, verifier=str(path))
    full = 4 * parameters
    needed = got["parts_bytes"] + got["drafter_bytes"]
    print(f"1. HassModule(verifier=stand-in {label}, {parameters / 1e9:.2f}B parameters), fresh process")
    print(f"   embedding + LM head as stored ({got['parts_dtype']}):    {got['parts_bytes'] / MB:8,.1f} MB")
    print(f"   drafter trainable weights (float32):          {got['drafter_bytes'] / MB:8,.1f} MB")
    print(f"   full stand-in in float32 (parameters x 4):    {full / MB:8,.1f} MB")
    print(f"   peak RSS growth, construction alone:          {got['built'] / MB:8,.1f} MB  (parts mapped from the files, read on first touch)")
    print(f"   peak RSS growth, after reading every part page: {got['touched'] / MB:6,.1f} MB")
    print(f"   peak / full float32 size: {got['touched'] / full:.3f};  peak / (embedding + head + drafter): {got['touched'] / needed:.3f}; "
          f"excess over them {(got['touched'] - needed) / MB:,.1f} MB  (target: a small constant)")


def growth_per_position(steps: list[dict]) -> float:
    """Slope of peak growth over positions between the last two steps."""
    small, large = steps[-2:]
    return (large["growth"] - small["growth"]) / (large["positions"] - small["positions"])


def step_memory(path: Path, label: str, positions: int, row_positions: int, chunk_size: int, unchunked_max: int, max_bytes: float,
                threads: int | None) -> None:
    def measure(count: int, chunk: int | None) -> dict:
        got = run_probe("step", threads, verifier=str(path), positions=count, row_positions=row_positions, chunk_size=chunk)
        name = "unchunked" if chunk is None else f"chunked ({chunk:,})"
        print(f"   {name:15s} {got['positions']:6,} positions ({got['rows']:2} rows): peak RSS growth {got['growth'] / MB:8,.0f} MB, "
              f"step {got['seconds']:6.1f} s")
        return got

    def predicted(count: int) -> float:
        """On the line through the two largest unchunked steps measured so far."""
        return unchunked[-1]["growth"] + growth_per_position(unchunked) * (count - unchunked[-1]["positions"])

    print(f"\n2. one HASS step (3 alignment steps, forward + backward), stand-in {label}, parts in float32; "
          f"one [{positions:,}, {LLAMA3_VOCAB:,}] float32 tensor is {positions * LLAMA3_VOCAB * 4 / GB:.1f} GB")
    unchunked = [measure(positions // 16, None), measure(positions // 4, None)]
    for count in (positions // 2, positions):
        if count > unchunked_max or predicted(count) > max_bytes:
            break
        unchunked.append(measure(count, None))
    same = unchunked[-1]
    at_same = measure(same["positions"], chunk_size)
    if same["positions"] == positions:
        at_full, full, how = at_same, same["growth"], "measured"
    else:
        at_full, full = measure(positions, chunk_size), predicted(positions)
        how = (f"EXTRAPOLATED (not run: over --unchunked-max {unchunked_max:,} or --max-gb {max_bytes / GB:g}), "
               f"linear through the unchunked steps at {unchunked[-2]['positions']:,} and {same['positions']:,} positions")
    print(f"   unchunked at {positions:,} positions: {full / MB:,.0f} MB, {how}")
    per_position = growth_per_position(unchunked)
    print(f"   unchunked growth per position: {per_position / MB:.2f} MB, as {per_position / (4 * LLAMA3_VOCAB):.1f} float32 [{LLAMA3_VOCAB:,}] "
          f"rows (the drafter's own activations included)")
    if at_full is not at_same:
        print(f"   chunked {positions:,} / chunked {same['positions']:,} positions: {at_full['growth'] / at_same['growth']:.2f}  "
              f"(the vocabulary terms are bounded by the chunk; the drafter's own activations grow with positions x hidden)")
    print(f"   peak ratio unchunked / chunked at {same['positions']:,} positions (both measured): {same['growth'] / at_same['growth']:.2f}")
    print(f"   peak ratio unchunked / chunked at {positions:,} positions: {full / at_full['growth']:.2f}  (target >= 4)")
    print(f"   step time chunked / unchunked at {same['positions']:,} positions: {at_same['seconds'] / same['seconds']:.2f}  (one run each: noisy)")


def cache_dtypes(path: Path, label: str, work: Path, samples: int) -> None:
    """Builds from scratch with the verifier in each dtype; only the build is timed."""
    recipe_file = work / "bench_recipe.yaml"
    recipe_file.write_text(f"name: bench_memory\nseed: 0\nmax_length: 256\nsources:\n"
                           f"  - source: gsm_symbolic\n    args: {{size: {samples + samples // 4}, seed: 1}}\n    count: {samples}\n")
    recipe = load_recipe(recipe_file)
    print(f"\n3. feature cache of {samples} gsm_symbolic conversations (max_length 256) on stand-in {label}, "
          f"verifier on cpu, features stored as bfloat16, torch threads {torch.get_num_threads()}")
    caches, speeds = {}, {}
    for dtype in ("bfloat16", "float32"):
        root = work / f"cache-{dtype}"
        shutil.rmtree(root, ignore_errors=True)
        preparer = RecipePreparer(recipe, str(path), root, CacheSettings(), device="cpu", verifier_dtype=dtype)
        sources = preparer.sources()
        tokens = sum(len(s.input_ids) for source in sources for s in source.samples)  # tokenizes, outside the timing
        verifier_features(preparer.verifier.model, sources[0].samples[:4], 0)  # loads the verifier and warms up
        began = time.perf_counter()
        (caches[dtype],) = preparer.build(sources)
        seconds = time.perf_counter() - began
        speeds[dtype] = tokens / seconds
        print(f"   verifier in {dtype:8s}: {tokens:,} tokens in {seconds:5.1f} s = {speeds[dtype]:8,.0f} tok/s")
    print(f"   throughput bf16 / fp32: {speeds['bfloat16'] / speeds['float32']:.3f}")
    feature_difference(caches["bfloat16"], caches["float32"])


def feature_difference(tested: FeatureCache, reference: FeatureCache) -> None:
    """Largest and mean absolute difference of the stored features, against the reference's scale."""
    largest = total = squares = scale = 0.0
    count = 0
    for position in range(len(reference)):
        expected = reference[position]["features"]
        difference = (tested[position]["features"] - expected).abs()
        largest = max(largest, difference.max().item())
        total += difference.sum().item()
        squares += expected.square().sum().item()
        scale = max(scale, expected.abs().max().item())
        count += expected.numel()
    rms = (squares / count) ** 0.5
    print(f"   stored features, bf16 run vs fp32 run: max |diff| {largest:.4f}, mean |diff| {total / count:.5f}; "
          f"fp32 features: max |f| {scale:.3f}, RMS {rms:.3f}")
    print(f"   relative: max |diff| / max |f| {largest / scale:.4f}, mean |diff| / RMS {total / count / rms:.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("checkpoints/bench_memory"), help="stand-ins and caches (reused)")
    parser.add_argument("--layers", type=int, default=8, help="layers of the stand-in of (1)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of the stand-in of (1)")
    parser.add_argument("--small-layers", type=int, default=2, help="layers of the stand-in of (2) and (3)")
    parser.add_argument("--small-hidden", type=int, default=256, help="hidden size of the stand-in of (2) and (3)")
    parser.add_argument("--positions", type=int, default=8192, help="loss positions of the training step in (2); a multiple of 16")
    parser.add_argument("--row-positions", type=int, default=512, help="loss positions per row of the synthetic batch")
    parser.add_argument("--chunk", type=int, default=1024, help="loss_chunk_size of the chunked step")
    parser.add_argument("--unchunked-max", type=int, default=2048, help="largest unchunked step run beyond the two fitted ones (time)")
    parser.add_argument("--max-gb", type=float, default=11.0, help="largest predicted peak growth an unchunked step may run at (memory)")
    parser.add_argument("--samples", type=int, default=120, help="conversations cached in (3)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--skip-construct", action="store_true")
    parser.add_argument("--skip-step", action="store_true")
    parser.add_argument("--skip-cache", action="store_true")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # internal: run one measurement in this process
    args = parser.parse_args()
    if args.probe:
        probe_main(args.probe)
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    began = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.skip_construct:
        path, parameters = standin(args.work, args.layers, args.hidden)
        construction_memory(path, parameters, f"{args.layers} x {args.hidden}", args.threads)
    if not (args.skip_step and args.skip_cache):
        small, _ = standin(args.work, args.small_layers, args.small_hidden)
        label = f"{args.small_layers} x {args.small_hidden}"
        if not args.skip_step:
            step_memory(small, label, args.positions, args.row_positions, args.chunk, args.unchunked_max, args.max_gb * GB, args.threads)
        if not args.skip_cache:
            cache_dtypes(small, label, args.work, args.samples)
    print(f"\nbench wall time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
