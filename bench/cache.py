"""Feature-cache benchmark on the offline tiny verifier, all figures measured in one run:

  a. cache build tokens/s / raw verifier forward tokens/s on the same batches (target >= 0.9)
  b. bytes per token on disk: bf16 / (2*H) (target <= 1.05) and fp8_e4m3 / bf16 (target <= 0.55)
  c. bytes a mixture adds when its sources are cached (target 0)

    python bench/cache.py [--recipe data_recipes/tiny_mixed.yaml] [--threads N]
    python bench/cache.py --verifier smollm2-135m --recipe R --speed-only   # (a) on a real 30-layer LLM

Caches go to temporary directories (every build starts from scratch); the tiny verifier itself comes
from $TAPS_HOME as usual. For (a) the raw forward pass and the build alternate for a few rounds and the
fastest round of each counts, so load from other jobs on a shared machine does not bias the ratio; the
forward time measured inside the builds gives the same ratio without a second pass. Progress bars go to
stderr, figures to stdout.
"""

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from taps_train.data import feature_cache
from taps_train.data.feature_cache import CacheSettings, length_batches, shard_ranges
from taps_train.data.prepare import PreparedSource, RecipePreparer
from taps_train.data.recipe import load_recipe

RECIPES = Path(__file__).parents[1] / "data_recipes"


VERIFIER = "taps-tiny"  # --verifier


def preparer(recipe: Path, root: Path, dtype: str = "bfloat16") -> RecipePreparer:
    return RecipePreparer(load_recipe(recipe), VERIFIER, root, CacheSettings(dtype=dtype))


def raw_forward_seconds(p: RecipePreparer, sources: list[PreparedSource]) -> float:
    """The verifier forward alone, over exactly the batches a build runs (per shard, length-grouped)."""
    model, pad_id = p.verifier.model, p.tokenizer.pad_token_id or 0
    start = time.perf_counter()
    for source in sources:
        for a, b in shard_ranges(len(source.samples), p.settings.shard_samples):
            shard = source.samples[a:b]
            for batch in length_batches([len(s.input_ids) for s in shard], p.settings.batch_tokens):
                feature_cache.verifier_features(model, [shard[i] for i in batch], pad_id)
    return time.perf_counter() - start


class ForwardClock:
    """Times and counts the verifier forward calls made inside a build (`with forward_clock() as clock`)."""

    def __init__(self):
        self.seconds, self.calls = 0.0, 0


@contextmanager
def forward_clock() -> Iterator[ForwardClock]:
    clock, real = ForwardClock(), feature_cache.verifier_features

    def timed(model, samples, *args):
        start = time.perf_counter()
        result = real(model, samples, *args)
        clock.seconds += time.perf_counter() - start
        clock.calls += 1
        return result

    feature_cache.verifier_features = timed
    try:
        yield clock
    finally:
        feature_cache.verifier_features = real


def tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def tokens_of(sources: list[PreparedSource]) -> int:
    return sum(len(s.input_ids) for source in sources for s in source.samples)


def build_speed(recipe: Path, root: Path, rounds: int) -> tuple[RecipePreparer, Path, int]:
    """(a): raw forward and a from-scratch build, alternating; returns the first round's cache root."""
    p = preparer(recipe, root / "round-0")
    sources = p.sources()
    start = time.perf_counter()
    tokens = tokens_of(sources)  # tokenizes (chat template + masks); not part of either timing
    print(f"recipe {recipe.name}: {sum(len(s.samples) for s in sources):,} samples, {tokens:,} tokens "
          f"(tokenized in {time.perf_counter() - start:.1f} s); verifier hidden size {p.hidden_size}, torch threads {torch.get_num_threads()}")
    feature_cache.verifier_features(p.verifier.model, sources[0].samples[:8], 0)  # warm-up
    raw, build, inside = [], [], []
    for index in range(rounds):
        raw.append(raw_forward_seconds(p, sources))
        for source in sources:
            source.directory = root / f"round-{index}" / source.directory.name
        with forward_clock() as clock:
            start = time.perf_counter()
            p.build(sources)
            build.append(time.perf_counter() - start)
        inside.append(clock.seconds / build[-1])
        print(f"round {index}: raw forward {tokens / raw[-1]:,.0f} tok/s, build {tokens / build[-1]:,.0f} tok/s "
              f"({build[-1]:.1f} s, of which verifier forward {clock.seconds:.1f} s, storing {build[-1] - clock.seconds:.1f} s)")
    print(f"(a) build tok/s / raw forward tok/s (fastest round of each): {min(raw) / min(build):.3f}  (target >= 0.9)")
    print(f"    forward time / build time inside each build: {', '.join(f'{r:.3f}' for r in inside)}")
    return p, root / "round-0", tokens


def disk_figures(recipe: Path, root: Path, p: RecipePreparer, tokens: int) -> None:
    """(b): bytes on disk per token, every file of the cache directories counted."""
    hidden = p.hidden_size
    bf16 = tree_bytes(root) / tokens
    fp8_root = root.parent.parent / "fp8"
    fp8_preparer = preparer(recipe, fp8_root, "fp8_e4m3")
    fp8_preparer.build(fp8_preparer.sources())
    fp8 = tree_bytes(fp8_root) / tokens
    print(f"bf16 cache: {tree_bytes(root) / 1e6:,.1f} MB, {bf16:.1f} bytes/token "
          f"(formula {feature_cache.bytes_per_token([hidden], 'bfloat16')}: 2*H features + 4 id + 1 mask)")
    print(f"fp8 cache:  {tree_bytes(fp8_root) / 1e6:,.1f} MB, {fp8:.1f} bytes/token "
          f"(formula {feature_cache.bytes_per_token([hidden], 'fp8_e4m3')}: H features + 4 scale + 4 id + 1 mask)")
    print(f"(b) bf16 bytes/token / (2*H): {bf16 / (2 * hidden):.3f}  (target <= 1.05)")
    print(f"    fp8 bytes/token / bf16 bytes/token: {fp8 / bf16:.3f}  (target <= 0.55)")


def mixture_bytes(root: Path) -> None:
    """(c): single-source recipes first, then the mixtures over the same sources."""
    single = set()
    for name in ("tiny_math", "tiny_chat"):
        p = preparer(RECIPES / f"{name}.yaml", root)
        single.update(c.directory for c in p.build(p.sources()))
        print(f"built {name}: cache root now {tree_bytes(root) / 1e6:,.1f} MB")
    for name in ("tiny_mixed", "tiny_mixed_large"):
        before = tree_bytes(root)
        with forward_clock() as clock:
            p = preparer(RECIPES / f"{name}.yaml", root)
            caches = p.build(p.sources())
        shared = {c.directory for c in caches} <= single
        print(f"(c) {name} adds {tree_bytes(root) - before:,} bytes (target 0); verifier forward calls: {clock.calls}; "
              f"reads only the single-source caches: {shared}")


def main() -> None:
    global VERIFIER
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=RECIPES / "tiny_mixed.yaml")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--rounds", type=int, default=3, help="raw-forward / build rounds for (a)")
    parser.add_argument("--verifier", default=VERIFIER, help="taps-tiny, smollm2-135m, a .gguf file or a model directory")
    parser.add_argument("--speed-only", action="store_true", help="(a) only: (b) and (c) build more caches (slow on a real model)")
    args = parser.parse_args()
    VERIFIER = args.verifier
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="taps-bench-cache-") as tmp:
        p, root, tokens = build_speed(args.recipe, Path(tmp) / "bf16", args.rounds)
        if not args.speed_only:
            disk_figures(args.recipe, root, p, tokens)
            mixture_bytes(Path(tmp) / "mixtures")
    print(f"bench wall time: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
