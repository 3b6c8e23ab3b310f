"""`taps-train export`: drafters as the directories serving engines load; several as a composition bundle."""

from taps_train.errors import TapsError


def run(args: list[str]) -> None:
    import argparse

    from taps_train.eval.report import tau_table
    from taps_train.export import BUNDLE_STRATEGIES, LAYOUTS, export_bundle, export_drafter
    from dataclasses import asdict

    from taps_train.decoding.tree import TreeConfig, tree_problems
    from taps_train.eval.settings import calibrated_tree
    from taps_train.verifier.loading import DTYPES

    parser = argparse.ArgumentParser(
        prog="taps-train export",
        description="Write config.json + model.safetensors + taps_export.json per drafter in the layout a serving engine loads; "
        "two or more checkpoints make a composition bundle (drafter_<i>/ + bundle.json).",
    )
    parser.add_argument("checkpoints", nargs="+", help="drafter checkpoints from `taps-train fit` or `average`")
    parser.add_argument("--out", required=True, help="export directory (must be empty or absent unless --overwrite)")
    parser.add_argument("--format", choices=sorted(LAYOUTS), default="eagle",
                        help="; ".join(f"{name}: {LAYOUTS[name].engine}" for name in sorted(LAYOUTS)))
    parser.add_argument("--verifier", default=None, help="taps-tiny, smollm2-135m, a .gguf file, a model directory or a hub id (default: the one the checkpoint records)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="dtype of the exported weights")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export in --out")
    parser.add_argument("--no-embeddings", action="store_true", help="leave embed_tokens.weight out (engines that share the target's)")
    parser.add_argument("--eval-report", nargs="+", default=None, help="`taps-train eval` reports whose τ to record")
    bundle = parser.add_argument_group("bundle (two or more checkpoints)")
    bundle.add_argument("--bundle-strategy", choices=BUNDLE_STRATEGIES, default=None, help="how to combine the drafters (default merge)")
    bundle.add_argument("--domains", nargs="+", default=None, help="one domain name per checkpoint, in order (e.g. math chat)")
    bundle.add_argument("--tree", choices=["auto"], default=None,
                        help="auto: the tree `taps-train eval --tree auto` chose, read from --eval-report (instead of --total-tokens/--depth/--top-k)")
    bundle.add_argument("--total-tokens", type=int, default=None, help=f"tree size with the root (default {TreeConfig.total_tokens})")
    bundle.add_argument("--depth", type=int, default=None, help=f"tree depth as in EAGLE-2's code (default {TreeConfig.depth})")
    bundle.add_argument("--top-k", type=int, default=None, help=f"children per expanded node (default {TreeConfig.top_k})")
    options = parser.parse_args(args)
    tree_options = {"total_tokens": options.total_tokens, "depth": options.depth, "top_k": options.top_k}
    bundle_options = {"--bundle-strategy": options.bundle_strategy, "--domains": options.domains, "--tree": options.tree,
                      **{f"--{name.replace('_', '-')}": value for name, value in tree_options.items()}}
    common = {"verifier": options.verifier, "overwrite": options.overwrite, "include_embeddings": not options.no_embeddings,
              "tau_table": tau_table(options.eval_report) if options.eval_report else None,
              "layout": options.format, "dtype": options.dtype}
    if len(options.checkpoints) == 1:
        given = [name for name, value in bundle_options.items() if value is not None]
        if given:
            raise TapsError(f"bundle options ({', '.join(given)}) need two or more checkpoints; got one")
        print(export_drafter(options.checkpoints[0], options.out, **common))
        return
    if options.tree == "auto":
        explicit = [f"--{name.replace('_', '-')}" for name, value in tree_options.items() if value is not None]
        tree = calibrated_tree(options.eval_report, "--tree auto (with --eval-report)", explicit)
        if tree.plain:
            raise TapsError("--tree auto: the calibrated report chose plain decoding (no tree was expected to beat it on its machine), "
                            "so it has no tree for a bundle; pass --total-tokens/--depth/--top-k")
    else:
        given = {name: value for name, value in tree_options.items() if value is not None}
        for name, problem in tree_problems(**{**asdict(TreeConfig()), **given}, plain=False).items():
            raise TapsError(f"--{name.replace('_', '-')} {problem}")
        tree = TreeConfig(**given)
    print(export_bundle(options.checkpoints, options.out, strategy=options.bundle_strategy or "merge", tree=tree,
                        domains=options.domains, **common))
