"""The paper's tables and figures from `taps-train eval` reports.

`taps-train report` writes them as PNGs plus a markdown page; notebooks/analysis.ipynb calls the same
functions, so a view looks the same with or without Jupyter. A *variant* is one row of Table 1: the
drafters, the strategy and (for weight averaging) the weights; its reports differ by temperature.

Figures are drawn on `matplotlib.figure.Figure` directly (no pyplot): no global state and no display
backend, so the command runs headless.
"""

from collections.abc import Iterable
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from taps_train import files
from taps_train.errors import TapsError
from taps_train.paths import writable_directory
from taps_train.eval.report import read_report, speedup_cell, tau_only_cell

DPI = 120


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


def variant(report: dict) -> str:
    """Row label: the drafter for `single`, else `strategy: a + b` (with λ for weight averaging)."""
    names = " + ".join(drafter_name(d) for d in report["drafters"])
    if report["strategy"] == "single":
        return names
    if report["strategy"] == "average":
        return f"average λ={'/'.join(f'{w:g}' for w in weights(report))}: {names}"
    return f"{report['strategy']}: {names}"


def by_variant(reports: list[dict]) -> dict[str, dict[float, dict]]:
    """variant -> temperature -> report, variants in the order given; two reports for one cell are an error."""
    table: dict[str, dict[float, dict]] = {}
    for report in reports:
        cells = table.setdefault(variant(report), {})
        if report["temperature"] in cells:
            raise TapsError(f"two reports for {variant(report)} at T={report['temperature']:g}; pass one of them")
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


def tau_table(reports: list[dict]) -> str:
    """Table 1: τ per variant (rows) and benchmark x temperature (columns), with verified tree tokens per call, and
    next to each τ the speedup over plain decoding when any report measured it."""
    temps, names = temperatures(reports), benchmark_names(reports)
    header, with_speedup = ["variant"], timed(reports)
    for t in temps:
        for name in names:
            header += [f"T={t:g} {name}"] + ([f"T={t:g} {name} speedup"] if with_speedup else [])
        header.append(f"T={t:g} average")
    rows = []
    for label, cells in by_variant(reports).items():
        row = [label]
        for t in temps:
            report = cells.get(t)
            results = report["benchmarks"] if report else {}
            for name in names:
                row.append(tau_only_cell(results[name]) if name in results else "–")
                if with_speedup:
                    row.append(speedup_cell(results[name]) if name in results else "–")
            row.append(f"{report['average_acceptance_length']:.2f}" if report else "–")
        rows.append(row)
    return markdown_table(header, rows)


def tau_table_caption(reports: list[dict]) -> str:
    return ("τ = tokens emitted per verifier call (± the half-width of its 95% bootstrap interval over prompts); in parentheses the "
            "mean number of tree tokens the verifier checked per call" + ("; speedup = tokens/s over plain decoding of the same "
                                                                         "verifier on the same prompts, with its 95% interval." if timed(reports) else "."))


def timed(reports: list[dict]) -> bool:
    """Whether any report measured the speedup over plain decoding (decoded with its baseline)."""
    return any(result.get("speedup") is not None for r in reports for result in r["benchmarks"].values())


def routed(reports: list[dict]) -> list[dict]:
    return [r for r in reports if any("routing" in result for result in r["benchmarks"].values())]


def routing_drafters(report: dict) -> list[str]:
    """The routing keys of a report (drafter paths, or `merged`), in first-seen order."""
    return list(dict.fromkeys(d for result in report["benchmarks"].values() for d in result.get("routing", {})))


def routing_table(report: dict) -> str:
    """Table 2 for one routed report: verifier calls (rounds) whose tree came from each drafter, per benchmark."""
    drafters = routing_drafters(report)
    rows = []
    for name, result in report["benchmarks"].items():
        counts = result.get("routing", {})
        total = sum(counts.values())
        rows.append([name, *(f"{counts.get(d, 0)} ({100 * counts.get(d, 0) / max(total, 1):.1f}%)" for d in drafters), str(total)])
    return markdown_table(["benchmark", *map(drafter_name, drafters), "rounds"], rows)


def signal_table(reports: list[dict]) -> str:
    """Figure 7's numbers: mean draft entropy and confidence of accepted vs rejected draft tokens."""
    def number(value: float | None) -> str:
        return "–" if value is None else f"{value:.3f}"

    rows = []
    for report in reports:
        for name, result in report["benchmarks"].items():
            entropy, confidence = result.get("draft_entropy", {}), result.get("draft_confidence", {})
            rows.append([variant(report), f"{report['temperature']:g}", name,
                         *(number(signals.get(kind)) for signals in (entropy, confidence) for kind in ("accepted", "rejected"))])
    header = ["variant", "T", "benchmark", "entropy accepted", "entropy rejected", "confidence accepted", "confidence rejected"]
    return markdown_table(header, rows)


# --- figures ----------------------------------------------------------------------------------------


def _grid(rows: int, cols: int, width: float = 4.0, height: float = 3.2, **kwargs):
    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    return figure, figure.subplots(rows, cols, squeeze=False, **kwargs)


def plot_tau(reports: list[dict]) -> Figure:
    """Table 1 as bars: τ per benchmark (and average) for each variant, one panel per temperature."""
    temps, names = temperatures(reports), benchmark_names(reports)
    table = by_variant(reports)
    figure, axes = _grid(1, len(temps), width=min(9.0, max(4.0, 0.25 * (len(names) + 1) * len(table))), height=3.8, sharey=True)
    width = 0.8 / len(table)
    for ax, t in zip(axes[0], temps):
        for index, (label, cells) in enumerate(table.items()):
            report = cells.get(t)
            if report is None:
                continue
            values = [report["benchmarks"].get(n, {}).get("acceptance_length", float("nan")) for n in names]
            ax.bar([x + (index - (len(table) - 1) / 2) * width for x in range(len(names) + 1)],
                   [*values, report["average_acceptance_length"]], width, label=label, color=f"C{index % 10}")
        ax.set_xticks(range(len(names) + 1), [*names, "average"], rotation=30, ha="right")
        ax.set_title(f"T={t:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("τ (tokens per verifier call)")
    _legend(figure, axes)
    figure.suptitle("Acceptance length by benchmark (Table 1)")
    return figure


def plot_accept_by_depth(reports: list[dict]) -> Figure:
    """Figure 8: acceptance rate of the draft token at each depth, per benchmark (columns) and temperature (rows)."""
    temps, names = temperatures(reports), benchmark_names(reports)
    table = by_variant(reports)
    figure, axes = _grid(len(temps), len(names), sharex=True, sharey=True)
    for row, t in zip(axes, temps):
        for ax, name in zip(row, names):
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


def plot_entropy(reports: list[dict]) -> Figure:
    """Figure 7: mean draft entropy of accepted vs rejected tokens, per benchmark (columns) and temperature (rows)."""
    temps, names = temperatures(reports), benchmark_names(reports)
    labels = list(by_variant(reports))
    figure, axes = _grid(len(temps), len(names), width=3.2, height=0.32 * len(labels) + 1.4, sharex=True, sharey=True)
    figure.set_figwidth(figure.get_figwidth() + 0.07 * max(map(len, labels)))  # room for the variant names
    for row, t in zip(axes, temps):
        for ax, name in zip(row, names):
            for report in (r for r in reports if r["temperature"] == t and name in r["benchmarks"]):
                entropy = report["benchmarks"][name].get("draft_entropy", {})
                y = labels.index(variant(report))
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


def plot_routing(reports: list[dict]) -> Figure | None:
    """Table 2 as bars: share of verifier calls routed to each drafter, per benchmark, one panel per routed report."""
    routed_reports = routed(reports)
    if not routed_reports:
        return None
    figure, axes = _grid(1, len(routed_reports), width=5.0, height=0.5 * len(benchmark_names(routed_reports)) + 1.8, sharey=True)
    for ax, report in zip(axes[0], routed_reports):
        names = list(report["benchmarks"])
        left = [0.0] * len(names)
        for index, drafter in enumerate(routing_drafters(report)):
            shares = [_share(report["benchmarks"][n].get("routing", {}), drafter) for n in names]
            ax.barh(names, shares, left=left, color=f"C{index % 10}", label=drafter_name(drafter))
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


def plot_interpolation(reports: list[dict]) -> Figure | None:
    """Figure 6: τ against the averaging weight λ, with the inference-time compositions of the same pair as reference lines."""
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
        for other in reports:
            if other["strategy"] not in ("single", "average") and sorted(other["drafters"]) == sorted(pair) and other["temperature"] == t:
                ax.axhline(other["average_acceptance_length"], linestyle="--", color="0.4", linewidth=1)
                ax.annotate(other["strategy"], (0.5, other["average_acceptance_length"]), xycoords=("axes fraction", "data"),
                            ha="center", va="bottom", fontsize="small", color="0.3")
        ax.set_xlabel(f"λ (weight of {drafter_name(pair[0])}; 1-λ: {drafter_name(pair[1])})", fontsize="small")
        ax.set_title(f"weight averaging, T={t:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel("acceptance length τ")
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


def figures(reports: list[dict]) -> dict[str, Figure]:
    """Every view these reports support, by file stem (routing and interpolation only when present)."""
    drawn = {"tau": plot_tau(reports), "accept_by_depth": plot_accept_by_depth(reports), "draft_entropy": plot_entropy(reports),
             "routing": plot_routing(reports), "interpolation": plot_interpolation(reports)}
    return {name: figure for name, figure in drawn.items() if figure is not None}


def markdown(reports: list[dict], images: Iterable[str]) -> str:
    images = set(images)
    first = reports[0]
    tree = first.get("tree", {})
    parts = [
        "# taps-train report",
        f"{len(reports)} eval report(s); verifier {', '.join(sorted({str(r.get('verifier')) for r in reports}))}; "
        f"tree {tree.get('total_tokens')} tokens, depth {tree.get('depth')}, top-k {tree.get('top_k')}.",
        "## Acceptance length τ (Table 1)",
        tau_table_caption(reports),
        tau_table(reports),
        "![τ by benchmark](tau.png)",
    ]
    if "routing" in images:
        parts.append("## Routing decisions (Table 2)\nVerifier calls whose tree came from each drafter.")
        parts += [f"### {variant(r)}, T={r['temperature']:g}\n\n{routing_table(r)}" for r in routed(reports)]
        parts.append("![routing](routing.png)")
    parts += ["## Acceptance rate by depth (Figure 8)", "![acceptance by depth](accept_by_depth.png)",
              "## Draft entropy and confidence of accepted vs rejected tokens (Figure 7)", signal_table(reports),
              "![draft entropy](draft_entropy.png)"]
    if "interpolation" in images:
        parts += ["## Weight averaging: λ interpolation (Figure 6)", _interpolation_table(reports), "![interpolation](interpolation.png)"]
    return "\n\n".join(parts) + "\n"


def _interpolation_table(reports: list[dict]) -> str:
    rows = [[f"{lam:g}", variant(r), f"{t:g}", f"{r['average_acceptance_length']:.2f}"]
            for (_, t), points in interpolation_points(reports).items() for lam, r in points]
    return markdown_table(["λ", "variant", "T", "average τ"], rows)


def write_report(paths: Iterable[str | Path], out: str | Path) -> list[Path]:
    """PNGs of every view plus report.md (tables and the images) in `out`; returns the files written."""
    out = writable_directory(out, "--out", "pass a directory (new or existing) for the PNGs and report.md")
    reports = load_reports(paths)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    drawn = figures(reports)
    for name, figure in drawn.items():
        written.append(out / f"{name}.png")
        with files.atomic_file(written[-1]) as tmp:
            figure.savefig(tmp, dpi=DPI, bbox_inches="tight", format="png")
    written.append(out / "report.md")
    files.write_text(written[-1], markdown(reports, drawn))
    return written
