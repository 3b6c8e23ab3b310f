"""`taps-train cache`: build (resume, or extend) the verifier feature caches of a data recipe's sources."""

from taps_train.errors import TapsError
from taps_train.units import duration
from taps_train.verifier.loading import DEFAULT_VERIFIER


def run(args: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="taps-train cache",
        description="Build (resume, or extend) the verifier feature caches of a data recipe's sources; a second call is a no-op. "
        "Under `torchrun --nproc_per_node N -m taps_train cache ...` the N processes split the shards (each on its own GPU); "
        "across nodes the cache dir must be on a filesystem all nodes share.",
    )
    parser.add_argument("--recipe", required=True, help="a data recipe YAML (see data_recipes/)")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER, help="taps-tiny, smollm2-135m, a .gguf file, a local model directory, or a hub id")
    parser.add_argument("--cache-dir", default=None, help="cache root (default $TAPS_HOME/features)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "fp8_e4m3"], help="stored feature dtype (fp8 keeps a per-token scale)")
    from taps_train.verifier.placement import add_placement_arguments

    add_placement_arguments(parser)
    parser.add_argument("--generation-engine", default="auto", choices=["auto", "transformers", "vllm"],
                        help="what generates the replies of `regenerate:` sources: vLLM (about 3x faster on a CPU) or transformers' "
                        "generate; auto: vLLM where --engine-python, $TAPS_ENGINE_PYTHON or this python has it, else transformers")
    parser.add_argument("--engine-python", default=None, help="a python that imports vllm (a venv from scripts/vllm-venv.sh)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print token counts, disk size and build time, and write nothing; the time is measured: the verifier is "
                        "loaded and timed on one batch of each source still to build (seconds on a small model, plus its load time)")
    parser.add_argument("--no-time", dest="estimate_time", action="store_false",
                        help="with --dry-run: no build time, so no verifier is loaded (tokens and disk size only)")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip the SHA-256 check of every shard (by default a cache that is ready has been checked byte for byte, as fit checks it)")
    cache(**vars(parser.parse_args(args)))


def cache(recipe: str, verifier: str, cache_dir: str | None, dtype: str, device: str, verifier_dtype: str, generation_engine: str,
          engine_python: str | None, dry_run: bool, estimate_time: bool, verify: bool) -> None:
    """Under torchrun (WORLD_SIZE > 1) every rank builds its share of the shards, each on its own device; rank 0 alone prints
    (and alone times the verifier for a dry run's estimate, which assumes every rank's device is as fast)."""
    from taps_train.data.distributed import launched_ranks, pinned_device
    from taps_train.data.feature_cache import CacheSettings
    from taps_train.data.prepare import RecipePreparer
    from taps_train.data.recipe import load_recipe
    from taps_train.paths import writable_directory

    with launched_ranks() as ranks:
        if ranks.world > 1 and pinned_device(device):
            raise TapsError(f"--device {device} puts every rank's verifier on the same GPU(s); under torchrun use --device auto "
                            "(each rank on cuda:LOCAL_RANK) or cpu, or run one process without torchrun")
        say = print if ranks.rank == 0 else lambda *args: None
        if cache_dir is not None:
            writable_directory(cache_dir, "--cache-dir", "pass a writable folder for the feature cache")
        preparer = RecipePreparer(load_recipe(recipe), verifier, cache_dir, CacheSettings(dtype=dtype), device, verifier_dtype,
                                  generation_engine=generation_engine, engine_python=engine_python)
        say(f"verifier computes on {preparer.placement.device} in {preparer.placement.dtype_name}; features stored as {dtype}")
        if ranks.world > 1:
            say(f"{ranks.world} ranks share the build: shard i of the recipe is built by rank i % {ranks.world}, on that rank's device")
        for selected in preparer.selected:
            say(f"{selected.selection.source}: {selected.report.summary()}; {selected.duplicates} duplicates dropped")
        sources = ranks.rank_zero_first(lambda: preparer.sources(regenerate=not dry_run))
        rows = preparer.estimate(sources)
        for row in rows:
            say(f"{row['source']}: {row['samples']} samples, {row['tokens']:,} tokens ({row['assistant_tokens']:,} in the loss), "
                f"{row['new_bytes'] / 1e6:,.1f} MB to write -> {row['cache']}")
        say(f"total: {sum(r['tokens'] for r in rows):,} tokens, {sum(r['new_bytes'] for r in rows) / 1e6:,.1f} MB to write ({dtype})")
        if dry_run:
            if not estimate_time or ranks.rank != 0:
                return
            pending = sum(row["pending_tokens"] for row in rows)
            if not pending:
                say("estimated build time: 0 s (every shard is on disk)")
                return
            say(f"timing the verifier on {preparer.placement.device} in {preparer.placement.dtype_name}: one batch per source to build")
            seconds = 0.0
            for source, row in zip(sources, rows):
                if row["pending_tokens"]:
                    measured = preparer.measure(source)
                    seconds += row["pending_tokens"] / measured.tokens_per_s
                    say(f"{row['source']}: {measured.tokens_per_s:,.0f} tokens/s, measured on {measured.tokens:,} tokens "
                        f"({measured.samples} of a batch of {measured.batch_samples} samples) in {measured.seconds:.2f} s after a warm-up")
            seconds /= ranks.world
            split = f", split over {ranks.world} ranks as fast as rank 0" if ranks.world > 1 else ""
            say(f"estimated build time: {f'{seconds:.2g} s' if seconds < 60 else duration(seconds)} for {pending:,} tokens still to compute{split} "
                "(verifier loading not included)")
            return
        for built in preparer.build(sources, ranks):
            if verify and ranks.rank == 0:
                built.verify()
            say(f"ready: {built.directory} ({len(built)} samples)")
