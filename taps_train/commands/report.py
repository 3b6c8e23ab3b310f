"""`taps-train report`: the paper's tables and figures from eval reports, led by what they show."""

from taps_train.errors import TapsError


def run(args: list[str]) -> None:
    import argparse

    from taps_train.eval.plots import drafter_name, load_reports, write_report
    from taps_train.paths import writable_directory

    parser = argparse.ArgumentParser(prog="taps-train report", description="Table 1/2 and Figures 6-8 of the TAPS paper from `taps-train eval` reports.")
    parser.add_argument("reports", nargs="+", help="eval report JSON files, or folders of them")
    parser.add_argument("--out", default="checkpoints/report", help="folder for report.md and the PNGs")
    parser.add_argument("--name", action="append", default=[], metavar="RUN/CHECKPOINT=NAME",
                        help="a readable name for a drafter, e.g. smol_eagle2_math/last='math specialist' (repeat for each); rows then "
                        "carry the names, in the order given, with the files in a column of their own")
    options = parser.parse_args(args)
    names = {}
    for item in options.name:
        key, separator, name = item.partition("=")
        if not separator or not key.strip() or not name.strip():
            raise TapsError(f"--name {item!r}: write RUN/CHECKPOINT=NAME, e.g. smol_eagle2_math/last='math specialist'")
        names[key.strip()] = name.strip()
    if len(set(names.values())) < len(names):
        raise TapsError(f"--name: two drafters share a name ({', '.join(sorted(names.values()))}); give each its own")
    writable_directory(options.out, "--out", "pass a directory (new or existing) for the PNGs and report.md")  # before any work
    known = {drafter_name(d) for report in load_reports(options.reports) for d in report["drafters"]} if names else set()
    if unknown := [key for key in names if key not in known]:
        raise TapsError(f"--name: no report has a drafter {', '.join(unknown)}; the drafters are {', '.join(sorted(known))}")
    for path in write_report(options.reports, options.out, names or None):
        print(f"wrote {path}")
