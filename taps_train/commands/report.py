"""`taps-train report`: the paper's tables and figures from eval reports."""


def run(args: list[str]) -> None:
    import argparse

    from taps_train.eval.plots import write_report

    parser = argparse.ArgumentParser(prog="taps-train report", description="Table 1/2 and Figures 6-8 of the TAPS paper from `taps-train eval` reports.")
    parser.add_argument("reports", nargs="+", help="eval report JSON files, or folders of them")
    parser.add_argument("--out", default="checkpoints/report", help="folder for report.md and the PNGs")
    options = parser.parse_args(args)
    for path in write_report(options.reports, options.out):
        print(f"wrote {path}")
