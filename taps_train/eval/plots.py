"""The paper's tables and figures from `taps-train eval` reports.

`taps-train report` writes them as PNGs plus a markdown page that opens with what the reports show; notebooks/
analysis.ipynb calls the same functions, so a view looks the same with or without Jupyter. A *variant* is one row of
Table 1: the drafters, the strategy and (for weight averaging) the weights; its reports differ by temperature. Rows
are named for readers (`names` maps a drafter's `run/checkpoint` to what it is, e.g. "math specialist"; by default
the run/checkpoint itself) and come in a fixed order: single drafters, weight averages, routing, merging.

Figures are drawn on `matplotlib.figure.Figure` directly (no pyplot): no global state and no display
backend, so the command runs headless.
"""

from collections.abc import Iterable, Mapping
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from taps_train import files
from taps_train.errors import TapsError
from taps_train.paths import writable_directory
from taps_train.eval.intervals import LEVEL, METHOD, PromptCounts, paired_difference_interval
from taps_train.eval.report import average_tau_interval, read_report, speedup_cell, tau_interval_of, tau_only_cell

DPI = 120
# Rows of Table 1 by strategy: the drafters alone, then compositions from weight space to the verifier's tree.
VARIANT_ORDER = ("single", "average", "route-entropy", "route-confidence", "merge-budget", "merge-union", "merge")
Names = Mapping[str, str] | None  # drafter `run/checkpoint` -> readable name


# --- reports ------------------------------------------------------------------------------------


def load_reports(paths: Iterable[str | Path]) -> list[dict]:
    """Eval reports from JSON files and from folders of them (sorted), in the order given.

    Each is checked by `read_report`; the views work on its JSON form, as notebooks do.
    """
    paths, files = [Path(p) for p in paths], []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files:
        raise TapsError(f"no eval reports (*.json) in {', '.join(map(str, paths))}")
    return [read_report(file).as_dict() for file in files]


def drafter_name(path: str) -> str:
    """`run/checkpoint` of a checkpoint path: short, and unique for checkpoints of different runs.

    The run is the checkpoint's folder, or the one above Lightning's default `<run>/checkpoints/`.
    """
    checkpoint = Path(path)
    run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return f"{run.name}/{checkpoint.stem}" if run.name else checkpoint.stem


def weights(report: dict) -> list[float]:
    """Averaging weights λ of an `average` report (absent or null: uniform)."""
    return report.get("weights") or [1.0 / len(report["drafters"])] * len(report["drafters"])


def drafter_label(path: str, names: Names = None) -> str:
    """A drafter as readers know it: its readable name when `names` has one, else its `run/checkpoint`."""
    return (names or {}).get(drafter_name(path), drafter_name(path))


def variant(report: dict, names: Names = None) -> str:
    """Row label: the drafter for `single`, else `strategy (a + b)` (with λ for weight averaging)."""
    drafters = " + ".join(drafter_label(d, names) for d in report["drafters"])
    if report["strategy"] == "single":
        return drafters
    if report["strategy"] == "average":
        return f"average λ={'/'.join(f'{w:g}' for w in weights(report))} ({drafters})"
    return f"{report['strategy']} ({drafters})"


def variant_drafters(report: dict) -> str:
    """The drafters of a row by `run/checkpoint` (what the files are called), for the column beside readable names."""
    return " + ".join(drafter_name(d) for d in report["drafters"])


def ordered(reports: list[dict], names: Names = None) -> list[dict]:
    """Reports in the fixed row order: single drafters (in the order of `names`, else as given), weight averages (the
    first drafter's λ descending), then routing and merging (VARIANT_ORDER); the given order breaks ties."""
    singles = list(names or {}) + [drafter_name(r["drafters"][0]) for r in reports if r["strategy"] == "single"]

    def key(item: tuple[int, dict]) -> tuple:
        index, report = item
        strategy = report["strategy"]
        rank = VARIANT_ORDER.index(strategy) if strategy in VARIANT_ORDER else len(VARIANT_ORDER)
        single = singles.index(drafter_name(report["drafters"][0])) if strategy == "single" else 0
        return rank, single, -weights(report)[0] if strategy == "average" else 0.0, index

    return [report for _, report in sorted(enumerate(reports), key=key)]


def by_variant(reports: list[dict], names: Names = None) -> dict[str, dict[float, dict]]:
    """variant -> temperature -> report, variants in the fixed row order; two reports for one cell are an error."""
    table: dict[str, dict[float, dict]] = {}
    for report in ordered(reports, names):
        cells = table.setdefault(variant(report, names), {})
        if report["temperature"] in cells:
            raise TapsError(f"two reports for {variant(report, names)} at T={report['temperature']:g}; pass one of them")
        cells[report["temperature"]] = report
    return table


def temperatures(reports: list[dict]) -> list[float]:
    return sorted({r["temperature"] for r in reports})


def benchmark_names(reports: list[dict]) -> list[str]:
    """Every benchmark of any report, in first-seen order."""
    return list(dict.fromkeys(name for r in reports for name in r["benchmarks"]))


# --- markdown tables ------------------------------------------------------------------------------


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """Cells come from report files (drafter names are paths a user chose), so each is one line of inert text."""
    lines = [[markdown_cell(cell) for cell in header], ["---"] * len(header), *([markdown_cell(cell) for cell in row] for row in rows)]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def markdown_cell(text: object) -> str:
    """One table cell: line breaks and control characters become spaces; pipes, backticks, HTML and link brackets are
    escaped, so a name cannot end the table, start a new block or inject markup or links."""
    flat = "".join(" " if (ord(c) < 32 or ord(c) == 127 or c in "\u2028\u2029\x85") else c for c in str(text))
    return "".join("\\" + c if c in "\\|`<>[]" else c for c in flat)


def prompt_counts(reports: list[dict], temperature: float, benchmark: str) -> list[int]:
    """The distinct numbers of prompts decoded on `benchmark` at `temperature` (one, unless prompts were skipped)."""
    return sorted({r["benchmarks"][benchmark]["prompts"] for r in reports if r["temperature"] == temperature and benchmark in r["benchmarks"]})


def tau_table(reports: list[dict], names: Names = None) -> str:
    """Table 1: τ with its interval per variant (rows) and benchmark x temperature (columns; the number of prompts in the
    header, or in a cell whose count differs), the verified tree tokens per call, and next to each τ the speedup over plain
    decoding when any report measured it."""
    temps, benchmarks = temperatures(reports), benchmark_names(reports)
    header, with_speedup = ["variant"] + (["drafters"] if names else []), timed(reports)
    usual = {}
    for t in temps:
        for name in benchmarks:
            counts = prompt_counts(reports, t, name)
            usual[t, name] = counts[-1] if counts else 0
            header += [f"T={t:g} {name} τ (n={usual[t, name]})"] + ([f"T={t:g} {name} speedup"] if with_speedup else [])
        header.append(f"T={t:g} average τ")
    header.append("tree tokens per call")
    rows = []
    for label, cells in by_variant(reports, names).items():
        row = [label] + ([variant_drafters(next(iter(cells.values())))] if names else [])
        for t in temps:
            report = cells.get(t)
            results = report["benchmarks"] if report else {}
            for name in benchmarks:
                result = results.get(name)
                cell = tau_only_cell(result) if result else "–"
                if result and result["prompts"] != usual[t, name]:
                    cell += f" (n={result['prompts']})"
                row.append(cell)
                if with_speedup:
                    row.append(speedup_cell(result) if result else "–")
            row.append(average_cell(report) if report else "–")
        tokens = sorted({round(result["mean_tree_tokens"]) for report in cells.values() for result in report["benchmarks"].values()})
        row.append("/".join(map(str, tokens)))
        rows.append(row)
    return markdown_table(header, rows)


def average_cell(report: dict) -> str:
    """The report's average τ over its benchmarks, with its interval when every benchmark has per-prompt counts."""
    interval = average_tau_interval(report)
    return f"{report['average_acceptance_length']:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def tau_table_caption(reports: list[dict]) -> str:
    return (f"τ = tokens emitted per verifier call, with its {LEVEL:.0%} interval ({METHOD}; n = prompts per benchmark; a report "
            "without per-prompt counts shows the interval it recorded); the average's interval combines its benchmarks'" + ("; speedup = tokens/s over plain decoding of the same "
                                                                     "verifier on the same prompts, with its 95% interval as the "
                                                                     "report recorded it." if timed(reports) else "."))


def timed(reports: list[dict]) -> bool:
    """Whether any report measured the speedup over plain decoding (decoded with its baseline)."""
    return any(result.get("speedup") is not None for r in reports for result in r["benchmarks"].values())


def routed(reports: list[dict]) -> list[dict]:
    return [r for r in reports if any("routing" in result for result in r["benchmarks"].values())]


def routing_drafters(report: dict) -> list[str]:
    """The routing keys of a report (drafter paths, or `merged`), in first-seen order."""
    return list(dict.fromkeys(d for result in report["benchmarks"].values() for d in result.get("routing", {})))


def routing_table(report: dict, names: Names = None) -> str:
    """Table 2 for one routed report: verifier calls (rounds) whose tree came from each drafter, per benchmark."""
    drafters = routing_drafters(report)
    rows = []
    for name, result in report["benchmarks"].items():
        counts = result.get("routing", {})
        total = sum(counts.values())
        rows.append([name, *(f"{counts.get(d, 0)} ({100 * counts.get(d, 0) / max(total, 1):.1f}%)" for d in drafters), str(total)])
    return markdown_table(["benchmark", *(drafter_label(d, names) for d in drafters), "rounds"], rows)


def signal_table(reports: list[dict], names: Names = None) -> str:
    """Figure 7's numbers: mean draft entropy and confidence of accepted vs rejected draft tokens."""
    def number(value: float | None) -> str:
        return "–" if value is None else f"{value:.3f}"

    rows = []
    for report in ordered(reports, names):
        for name, result in report["benchmarks"].items():
            entropy, confidence = result.get("draft_entropy", {}), result.get("draft_confidence", {})
            rows.append([variant(report, names), f"{report['temperature']:g}", name,
                         *(number(signals.get(kind)) for signals in (entropy, confidence) for kind in ("accepted", "rejected"))])
    header = ["variant", "T", "benchmark", "entropy accepted", "entropy rejected", "confidence accepted", "confidence rejected"]
    return markdown_table(header, rows)


# --- figures ----------------------------------------------------------------------------------------


def _grid(rows: int, cols: int, width: float = 4.0, height: float = 3.2, **kwargs):
    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    return figure, figure.subplots(rows, cols, squeeze=False, **kwargs)


def plot_tau(reports: list[dict], names: Names = None) -> Figure:
    """Table 1 as bars with their intervals: τ per benchmark (and average) for each variant, one panel per temperature."""
    temps, benchmarks = temperatures(reports), benchmark_names(reports)
    table = by_variant(reports, names)
    figure, axes = _grid(1, len(temps), width=min(9.0, max(4.0, 0.25 * (len(benchmarks) + 1) * len(table))), height=3.8, sharey=True)
    width = 0.8 / len(table)
    for ax, t in zip(axes[0], temps):
        for index, (label, cells) in enumerate(table.items()):
            report = cells.get(t)
            if report is None:
                continue
            results = [report["benchmarks"].get(n) for n in benchmarks]
            values = [r["acceptance_length"] if r else float("nan") for r in results] + [report["average_acceptance_length"]]
            intervals = [tau_interval_of(r) if r else None for r in results] + [average_tau_interval(report)]
            # an older report's pooled τ may sit outside the interval of its per-prompt counts (turns it skipped): no negative bar
            errors = [[max(0.0, v - i[0]) if i else 0.0 for v, i in zip(values, intervals)],
                      [max(0.0, i[1] - v) if i else 0.0 for v, i in zip(values, intervals)]]
            ax.bar([x + (index - (len(table) - 1) / 2) * width for x in range(len(benchmarks) + 1)], values, width, yerr=errors,
                   error_kw={"elinewidth": 0.8, "capsize": 1.5, "ecolor": "0.25"}, label=label, color=f"C{index % 10}")
        ax.set_xticks(range(len(benchmarks) + 1), [*benchmarks, "average"], rotation=30, ha="right")
        ax.set_title(f"T={t:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("τ (tokens per verifier call)")
    _legend(figure, axes)
    figure.suptitle(f"Acceptance length by benchmark, {LEVEL:.0%} intervals (Table 1)")
    return figure


def plot_accept_by_depth(reports: list[dict], names: Names = None) -> Figure:
    """Figure 8: acceptance rate of the draft token at each depth, per benchmark (columns) and temperature (rows)."""
    temps, benchmarks = temperatures(reports), benchmark_names(reports)
    table = by_variant(reports, names)
    figure, axes = _grid(len(temps), len(benchmarks), sharex=True, sharey=True)
    for row, t in zip(axes, temps):
        for ax, name in zip(row, benchmarks):
            for index, (label, cells) in enumerate(table.items()):
                rates = cells[t]["benchmarks"].get(name, {}).get("accept_rate_by_depth", []) if t in cells else []
                if rates:
                    ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label, color=f"C{index % 10}")
            ax.set_title(f"{name}, T={t:g}")
            ax.set_ylim(0, 1.02)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("draft depth")
    for row in axes:
        row[0].set_ylabel("acceptance rate")
    _legend(figure, axes)
    figure.suptitle("Acceptance rate by speculative depth (Figure 8)")
    return figure


def plot_entropy(reports: list[dict], names: Names = None) -> Figure:
    """Figure 7: mean draft entropy of accepted vs rejected tokens, per benchmark (columns) and temperature (rows)."""
    temps, benchmarks = temperatures(reports), benchmark_names(reports)
    labels = list(by_variant(reports, names))
    figure, axes = _grid(len(temps), len(benchmarks), width=3.2, height=0.32 * len(labels) + 1.4, sharex=True, sharey=True)
    figure.set_figwidth(figure.get_figwidth() + 0.07 * max(map(len, labels)))  # room for the variant names
    for row, t in zip(axes, temps):
        for ax, name in zip(row, benchmarks):
            for report in (r for r in reports if r["temperature"] == t and name in r["benchmarks"]):
                entropy = report["benchmarks"][name].get("draft_entropy", {})
                y = labels.index(variant(report, names))
                accepted, rejected = entropy.get("accepted"), entropy.get("rejected")
                if accepted is not None and rejected is not None:
                    ax.plot([accepted, rejected], [y, y], color="0.7", zorder=1)
                if accepted is not None:
                    ax.scatter(accepted, y, color="tab:green", marker="o", label="accepted", zorder=2)
                if rejected is not None:
                    ax.scatter(rejected, y, color="tab:red", marker="X", label="rejected", zorder=2)
            ax.set_yticks(range(len(labels)), labels)
            ax.set_ylim(-0.6, len(labels) - 0.4)
            ax.invert_yaxis()
            ax.set_xlim(left=0)
            ax.set_title(f"{name}, T={t:g}")
            ax.grid(axis="x", alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("draft entropy (nats)")
    _legend(figure, axes)
    figure.suptitle("Draft entropy of accepted vs rejected tokens (Figure 7)")
    return figure


def plot_routing(reports: list[dict], names: Names = None) -> Figure | None:
    """Table 2 as bars: share of verifier calls routed to each drafter, per benchmark, one panel per routed report."""
    routed_reports = routed(ordered(reports, names))
    if not routed_reports:
        return None
    figure, axes = _grid(1, len(routed_reports), width=5.0, height=0.5 * len(benchmark_names(routed_reports)) + 1.8, sharey=True)
    for ax, report in zip(axes[0], routed_reports):
        benchmarks = list(report["benchmarks"])
        left = [0.0] * len(benchmarks)
        for index, drafter in enumerate(routing_drafters(report)):
            shares = [_share(report["benchmarks"][n].get("routing", {}), drafter) for n in benchmarks]
            ax.barh(benchmarks, shares, left=left, color=f"C{index % 10}", label=drafter_label(drafter, names))
            left = [a + b for a, b in zip(left, shares)]
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of verifier calls")
        ax.set_title(f"{report['strategy']}, T={report['temperature']:g}")
    axes[0][0].invert_yaxis()  # shared by all panels: first benchmark on top
    _legend(figure, axes)
    figure.suptitle("Routing decisions by benchmark (Table 2)")
    return figure


def _share(counts: dict[str, int], drafter: str) -> float:
    return counts.get(drafter, 0) / max(1, sum(counts.values()))


def interpolation_points(reports: list[dict]) -> dict[tuple[tuple[str, ...], float], list[tuple[float, dict]]]:
    """(drafter pair, temperature) -> [(λ, report)] sorted by λ, λ being the first drafter's weight.

    Only pairs with at least two `average` reports; `single` reports of either drafter are the ends of
    the curve (λ=1: the first drafter alone, λ=0: the second).
    """
    curves: dict[tuple[tuple[str, ...], float], list[tuple[float, dict]]] = {}
    for report in reports:
        if report["strategy"] == "average" and len(report["drafters"]) == 2:
            curves.setdefault((tuple(report["drafters"]), report["temperature"]), []).append((weights(report)[0], report))
    curves = {key: points for key, points in curves.items() if len(points) >= 2}
    for (pair, t), points in curves.items():
        for lam, drafter in ((1.0, pair[0]), (0.0, pair[1])):
            points += [(lam, r) for r in reports if r["strategy"] == "single" and r["drafters"] == [drafter] and r["temperature"] == t]
        points.sort(key=lambda point: point[0])
    return curves


def plot_interpolation(reports: list[dict], names: Names = None) -> Figure | None:
    """Figure 6: τ against the averaging weight λ, with the inference-time compositions of the same pair as reference lines
    (named in the legend, each in its own style, so that close lines keep legible names)."""
    curves = interpolation_points(reports)
    if not curves:
        return None
    figure, axes = _grid(1, len(curves), width=5.0, height=3.6, sharey=True)
    for ax, ((pair, t), points) in zip(axes[0], curves.items()):
        lambdas = [lam for lam, _ in points]
        for index, name in enumerate(benchmark_names([r for _, r in points])):
            ax.plot(lambdas, [r["benchmarks"].get(name, {}).get("acceptance_length", float("nan")) for _, r in points],
                    marker=".", alpha=0.6, color=f"C{index % 10}", label=name)
        ax.plot(lambdas, [r["average_acceptance_length"] for _, r in points], marker="o", color="black", linewidth=2, label="average")
        compositions = [r for r in ordered(reports, names) if r["strategy"] not in ("single", "average")
                        and sorted(r["drafters"]) == sorted(pair) and r["temperature"] == t]
        for index, other in enumerate(compositions):
            ax.axhline(other["average_acceptance_length"], linestyle=("--", ":", "-.", (0, (5, 1, 1, 1)))[index % 4],
                       color=f"{0.15 + 0.15 * (index % 4):.2f}", linewidth=1.2, label=f"{other['strategy']} (average)")
        ax.set_xlabel(f"λ (weight of {drafter_label(pair[0], names)}; 1-λ: {drafter_label(pair[1], names)})", fontsize="small")
        ax.set_title(f"weight averaging, T={t:g}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("acceptance length τ")
    _legend(figure, axes)  # beside the panels: inside them it covered the curves
    figure.suptitle("Checkpoint averaging: interpolation sweep (Figure 6)")
    return figure


def _legend(figure: Figure, axes) -> None:
    """One legend for all panels, right of them: outside the layout, so long variant names never shrink the panels
    (saved with a tight bounding box, as notebooks show figures)."""
    entries: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    figure.legend(entries.values(), entries.keys(), loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize="small", frameon=False)


# --- the report --------------------------------------------------------------------------------------


def figures(reports: list[dict], names: Names = None) -> dict[str, Figure]:
    """Every view these reports support, by file stem (routing and interpolation only when present)."""
    drawn = {"tau": plot_tau(reports, names), "accept_by_depth": plot_accept_by_depth(reports, names),
             "draft_entropy": plot_entropy(reports, names), "routing": plot_routing(reports, names),
             "interpolation": plot_interpolation(reports, names)}
    return {name: figure for name, figure in drawn.items() if figure is not None}


FIGURES = {"tau": "τ by benchmark, with intervals", "routing": "routing decisions", "accept_by_depth": "acceptance by depth",
           "draft_entropy": "draft entropy", "interpolation": "λ interpolation"}


def markdown(reports: list[dict], images: Iterable[str], names: Names = None) -> str:
    """The page: what the reports show first (best variants, whether the lead is resolved, caveats, figures), then the
    paper's tables, each figure beside the table it draws."""
    images = [name for name in FIGURES if name in set(images)]
    trees = sorted({"/".join(str(r["tree"][k]) for k in ("total_tokens", "depth", "top_k")) for r in reports})
    parts = [
        "# taps-train report",
        f"{len(reports)} eval report(s); verifier {', '.join(sorted({str(r.get('verifier')) for r in reports}))}; "
        f"tree{'s' if len(trees) > 1 else ''} {', '.join(trees)} (total tokens/depth/top-k).",
        "## What the reports show",
        summary(reports, names),
        "Figures: " + " · ".join(f"[{FIGURES[name]}]({name}.png)" for name in images) + ".",
        "## Acceptance length τ (Table 1)",
        tau_table_caption(reports),
        tau_table(reports, names),
        "![τ by benchmark, with intervals](tau.png)",
    ]
    if "routing" in images:
        parts.append("## Routing decisions (Table 2)\nVerifier calls whose tree came from each drafter.")
        parts += [f"### {variant(r, names)}, T={r['temperature']:g}\n\n{routing_table(r, names)}" for r in routed(ordered(reports, names))]
        parts.append("![routing](routing.png)")
    parts += ["## Acceptance rate by depth (Figure 8)", "![acceptance by depth](accept_by_depth.png)",
              "## Draft entropy and confidence of accepted vs rejected tokens (Figure 7)", signal_table(reports, names),
              "![draft entropy](draft_entropy.png)"]
    if "interpolation" in images:
        parts += ["## Weight averaging: λ interpolation (Figure 6)", _interpolation_table(reports, names), "![interpolation](interpolation.png)"]
    return "\n\n".join(parts) + "\n"


def summary(reports: list[dict], names: Names = None) -> str:
    """Per temperature and benchmark: the variant with the longest τ, the runner-up, and whether the lead is resolved by
    their paired interval on the same prompts; then the caveats that apply to every number of the page."""
    rows = []
    for t in temperatures(reports):
        for benchmark in benchmark_names(reports):
            ranked = sorted((r for r in ordered(reports, names) if r["temperature"] == t and benchmark in r["benchmarks"]),
                            key=lambda r: -r["benchmarks"][benchmark]["acceptance_length"])
            if not ranked:
                continue
            best = ranked[0]["benchmarks"][benchmark]
            row = [f"{t:g}", benchmark, variant(ranked[0], names), tau_only_cell(best), "–", "–"]
            if len(ranked) > 1:
                second = ranked[1]["benchmarks"][benchmark]
                row[4] = f"{variant(ranked[1], names)}: {second['acceptance_length']:.2f}"
                row[5] = lead_cell(best, second)
            rows.append(row)
    table = markdown_table(["T", "benchmark", "longest τ", "τ [95% interval]", "runner-up", "lead [paired 95% interval]"], rows)
    prompts = sorted({result["prompts"] for r in reports for result in r["benchmarks"].values()})
    caveats = [f"{'/'.join(map(str, prompts))} prompts per benchmark; τ intervals are {LEVEL:.0%} {METHOD}s (from each report's "
               "per-prompt counts; a report without them shows the interval it recorded, as speedups always do): they hold the "
               "prompts' variation, not training's (one fit per drafter: another seed or machine moves τ too)."]
    if timed(reports):
        caveats.append(machine_caveat(reports))
    return table + "\n\n" + "\n".join(f"- {caveat}" for caveat in caveats)


def lead_cell(best: dict, second: dict) -> str:
    """`+0.12 [+0.03, +0.21] resolved` when both results have per-prompt counts for the same prompts, else `+0.12`."""
    lead, interval = tau_difference(best, second)
    if interval is None:
        return f"{lead:+.2f}"
    return f"{lead:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}] " + ("resolved" if interval[0] > 0 else "not resolved")


def tau_difference(a: dict, b: dict) -> tuple[float, tuple[float, float] | None]:
    """τ of benchmark result `a` minus `b`'s, with its paired interval over their prompts (None unless both kept
    per-prompt counts of the same number of prompts)."""
    difference = a["acceptance_length"] - b["acceptance_length"]
    counts = [(r.get("prompt_new_tokens"), r.get("prompt_verify_calls")) for r in (a, b)]
    if any(c is None for pair in counts for c in pair) or len(counts[0][0]) != len(counts[1][0]):
        return difference, None
    return difference, paired_difference_interval([(PromptCounts(*counts[0]), PromptCounts(*counts[1]))])


def machine_caveat(reports: list[dict]) -> str:
    """Which machines timed the speedups: one (comparable), several, or not recorded (then not ranked across reports)."""
    timed_reports = [r for r in reports if any(res.get("speedup") is not None for res in r["benchmarks"].values())]
    machines = {machine_label(r.get("machine")) for r in timed_reports if r.get("machine")}
    unknown = sum(1 for r in timed_reports if not r.get("machine"))
    if len(machines) == 1 and not unknown:
        return f"Speedups timed on one machine: {next(iter(machines))}."
    said = [f"{len(machines)} machines ({'; '.join(sorted(machines))})"] if machines else []
    said += [f"{unknown} report(s) that do not record theirs (written before taps-train recorded it)"] if unknown else []
    return (f"Speedups come from {' and '.join(said)}: a speedup depends on the CPU or GPU and its load, so compare "
            "speedups measured in one sitting on one machine, not across these reports.")


def machine_label(machine: Mapping) -> str:
    return f"{machine.get('processor', '?')}, {machine.get('threads', '?')} threads"


def _interpolation_table(reports: list[dict], names: Names = None) -> str:
    rows = [[f"{lam:g}", variant(r, names), f"{t:g}", average_cell(r)]
            for (_, t), points in interpolation_points(reports).items() for lam, r in points]
    return markdown_table(["λ", "variant", "T", "average τ [95% interval]"], rows)


def write_report(paths: Iterable[str | Path], out: str | Path, names: Names = None) -> list[Path]:
    """PNGs of every view plus report.md (tables and the images) in `out`; returns the files written."""
    out = writable_directory(out, "--out", "pass a directory (new or existing) for the PNGs and report.md")
    reports = load_reports(paths)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    drawn = figures(reports, names)
    for name, figure in drawn.items():
        written.append(out / f"{name}.png")
        with files.atomic_file(written[-1]) as tmp:
            figure.savefig(tmp, dpi=DPI, bbox_inches="tight", format="png")
    written.append(out / "report.md")
    files.write_text(written[-1], markdown(reports, drawn, names))
    return written
