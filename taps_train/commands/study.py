"""`taps-train study`: the TAPS experiment from one YAML (fit, eval, report; resumable)."""

from taps_train.cli import COMMANDS
from taps_train.commands.errors import config_files
from taps_train.errors import TapsError


def run(args: list[str]) -> None:
    from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser

    from taps_train.study import Study, run_study
    from taps_train.study.run import unfinished
    from taps_train.study.config import check_study_file
    from taps_train.study.findings import evaluated_backbones, write_study_report
    from taps_train.study.plan import report_dir

    parser = ArgumentParser(prog="taps-train study", description=COMMANDS["study"].summary + ". Any key of the YAML can be overridden, "
                            "e.g. --max_steps 100.", exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile, help="a study YAML (see configs/study/)")
    parser.add_class_arguments(Study)
    parser.add_argument("--dry-run", action="store_true", help="print the plan (cells done / to do) and its estimated time; run nothing")
    parser.add_argument("--report-only", action="store_true", help="write the report of the evaluations finished so far (a study "
                        "that runs in several sittings); run nothing")
    files = config_files(args)
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
        print(f"wrote {len(written)} files to {report_dir(study, tree)} ({tree} tree; report.md: what was found and its "
              "caveats first, then every variant's τ with intervals, the paper's orderings and the controls)")
