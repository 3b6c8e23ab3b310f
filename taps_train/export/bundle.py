"""A composition for serving: one export directory per drafter plus `bundle.json`, which says how to combine them
(strategy, tree) and which drafter serves which domain."""

from pathlib import Path

from taps_train.decoding.strategies import STRATEGIES
from taps_train.decoding.tree import TreeConfig
from taps_train.errors import TapsError
from taps_train.export.directory import export_directory
from taps_train.export.drafter import checked_options, header, write_drafter, write_json
from taps_train.export.source import read_source, resolve_verifier

BUNDLE_STRATEGIES = sorted(name for name in STRATEGIES if name != "single")


def export_bundle(
    checkpoints: list[str | Path],
    out_dir: str | Path,
    strategy: str = "merge",
    tree: TreeConfig = TreeConfig(),
    domains: list[str] | None = None,
    verifier: str | None = None,
    overwrite: bool = False,
    include_embeddings: bool = True,
    tau_table: list[dict] | None = None,
    layout: str = "eagle",
    dtype: str = "bfloat16",
) -> Path:
    """`drafter_<i>/` export directories of `checkpoints` and their `bundle.json` (the tree defaults to the paper's)."""
    chosen = checked_options(layout, dtype)
    if len(checkpoints) < 2:
        raise TapsError(f"a bundle combines two or more drafters, got {len(checkpoints)}; export a single drafter without bundle options")
    if strategy not in BUNDLE_STRATEGIES:
        raise TapsError(f"unknown bundle strategy {strategy!r}; use one of {BUNDLE_STRATEGIES}")
    if domains is not None and (len(domains) != len(checkpoints) or len(set(domains)) != len(domains)):
        raise TapsError(f"--domains needs one distinct name per drafter: got {domains} for {len(checkpoints)} checkpoints")
    out_dir = Path(out_dir)
    with export_directory(out_dir, overwrite) as staging:
        sources = [read_source(path) for path in checkpoints]
        loaded = resolve_verifier(sources, verifier, include_embeddings)
        names = [f"drafter_{i}" for i in range(len(sources))]
        for name, source in zip(names, sources):
            (staging / name).mkdir()
            write_drafter(source, staging / name, loaded, chosen, dtype, include_embeddings, None)
        manifest = {
            **header(chosen),
            "strategy": strategy,
            "tree": {"total_tokens": tree.total_tokens, "depth": tree.depth, "top_k": tree.top_k},
            "drafters": [{"directory": name, "source_checkpoint": str(source.path.resolve()), "domain": domain}
                         for name, source, domain in zip(names, sources, domains or [None] * len(names))],
            "domains": dict(zip(domains, names)) if domains else {},
            "verifier": sources[0].checkpoint["taps"]["verifier"],
            "tau": tau_table,
        }
        write_json(staging / "bundle.json", manifest)
    return out_dir
