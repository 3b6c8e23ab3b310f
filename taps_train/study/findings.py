"""Which of the paper's orderings a study's reports support, by paired intervals over prompts.

Every claim "A beats B" is checked on the same prompts: a paired jackknife t-interval, each prompt left out of both
reports at once (per benchmark for an ordering on one benchmark; the benchmarks' variances added for an ordering on
the average), and the claim is *supported* when the 95% interval of τ_A - τ_B lies above
0, *contradicted* when it lies below, and *not resolved* otherwise.
"""

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taps_train import files
from taps_train.errors import TapsError
from taps_train.eval.intervals import METHOD, paired_difference_interval
from taps_train.eval.report import EvalReport, read_report
from taps_train.study.compare import generic_claim, read_claims
from taps_train.study.config import Study
from taps_train.eval.plots import FIGURES, load_reports, machine_label, tau_table, tau_table_caption, write_report
from taps_train.study.plan import eval_dir, report_dir
from taps_train.fit_config import FIX
from taps_train.user_yaml import read_yaml


@dataclass(frozen=True)
class Claim:
    question: str  # RQ1..RQ4
    backbone: str
    temperature: float
    better: str
    worse: str
    where: str  # a benchmark, or "average"
    low: float
    high: float
    difference: float
    prompts: str  # prompts per benchmark behind the interval ("8", or "8/7" when the benchmarks differ)

    @property
    def verdict(self) -> str:
        return "supported" if self.low > 0 else "contradicted" if self.high < 0 else "not resolved"


def study_reports(study: Study, tree: str = "fixed") -> dict[tuple[str, str, float], EvalReport]:
    """(backbone, variant label, temperature) -> report, for every report the study's evals at `tree` wrote."""
    reports = {}
    for backbone in study.backbones:
        for path in sorted((eval_dir(study, tree) / backbone).glob("*.json")):
            report = read_report(path)
            label = path.stem.rsplit("_T", 1)[0] if len(study.temperatures) > 1 else path.stem
            reports[backbone, label, report.temperature] = report
    return reports


def claims(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[Claim]:
    """Every ordering of `orderings` that both reports behind it can check, per backbone and temperature."""
    found = []
    for backbone in study.backbones:
        for temperature in study.temperatures:
            best = _best_single(backbone, temperature, list(study.domains), reports)
            for question, better, worse, benchmarks in orderings(study, best):
                a, b = reports.get((backbone, better, temperature)), reports.get((backbone, worse, temperature))
                claim = _claim(question, backbone, temperature, better, a, worse, b, benchmarks)
                if claim is not None:
                    found.append(claim)
    return found


def backbone_claims(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[Claim]:
    """The later method beats the earlier one, drafter for drafter (each training set, on each of its benchmarks; a
    mixture on every benchmark), on the same prompts. `Claim.backbone` holds the training set here."""
    ranked = sorted((rank, name) for name, rank in backbone_ranks(study).items() if rank is not None)
    pairs = [(later, earlier) for i, (_, earlier) in enumerate(ranked) for _, later in ranked[i + 1:]]
    sets = {**{name: [benchmark_name(b) for b in domain.benchmarks] for name, domain in study.domains.items()},
            **{name: [benchmark_name(b) for b in study.benchmarks] for name in study.mixtures}}
    found = []
    for temperature in study.temperatures:
        for name, benchmarks in sets.items():
            for benchmark in benchmarks:
                for later, earlier in pairs:
                    claim = _claim("backbone", name, temperature, later, reports.get((later, name, temperature)), earlier,
                                   reports.get((earlier, name, temperature)), [benchmark])
                    found += [claim] if claim else []
    return found


def backbone_ranks(study: Study) -> dict[str, int | None]:
    """Backbone name -> the `study_rank` of the module class its fit config trains (the methods' own papers: HASS and
    EAGLE-3 each report a longer τ than EAGLE-2; EAGLE-3, the later one, is claimed over HASS). Study.check has read
    every config."""
    import taps_train.training

    ranks = {}
    for name, path in study.backbones.items():
        class_path = str((read_yaml(path, "fit config", FIX).get("model") or {}).get("class_path", ""))
        module_name, _, class_name = class_path.rpartition(".")
        try:
            module = importlib.import_module(module_name) if module_name else taps_train.training
        except ImportError:
            module = None
        ranks[name] = getattr(getattr(module, class_name, None), "study_rank", None)
    return ranks


def orderings(study: Study, best_single: str | None) -> list[tuple[str, str, str, list[str]]]:
    """(question, better, worse, benchmarks) the paper claims. RQ1: the matched specialist beats each other one on
    its domain's benchmarks. RQ2: the matched specialist beats a mixture (not uniformly better) and the mixture
    beats the unmatched specialists (robust). RQ3: best single > uniform average, route-confidence > best single,
    merge > route-confidence, on the average over benchmarks. RQ4: route-confidence > route-entropy."""
    claimed = []
    for domain, spec in study.domains.items():
        others = [other for other in study.domains if other != domain]
        for benchmark in map(benchmark_name, spec.benchmarks):
            claimed += [("RQ1", domain, other, [benchmark]) for other in others]
            for mixture in study.mixtures:
                claimed.append(("RQ2", domain, mixture, [benchmark]))
                claimed += [("RQ2", mixture, other, [benchmark]) for other in others]
    everything = [benchmark_name(spec) for spec in study.benchmarks]
    if best_single is not None:
        claimed += [("RQ3", best_single, "average", everything), ("RQ3", "route-confidence", best_single, everything)]
    return claimed + [("RQ3", "merge", "route-confidence", everything), ("RQ4", "route-confidence", "route-entropy", everything)]


# Budget-matched controls: merge verifies its drafters' trees together, twice the tokens of every other variant's tree;
# merge-budget cuts the merged tree to one tree's budget. (better, worse, what the comparison tells)
CONTROLS = (
    ("merge-budget", "route-confidence", "merging at the same tree budget: the part of merge > route-confidence that is not its larger tree"),
    ("merge", "merge-budget", "what the doubled tree adds to merging (the part of merge > route-confidence that is its larger tree)"),
)
QUESTIONS = {
    "RQ1": "the matched specialist beats every other specialist on its domain",
    "RQ2": "the matched specialist beats the mixture on its domain; the mixture beats the unmatched specialists",
    "RQ3": "best single > uniform average; route-confidence > best single; merge > route-confidence (average of the benchmarks)",
    "RQ4": "route-confidence > route-entropy (average of the benchmarks)",
}


def controls(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[tuple[Claim, str]]:
    """The budget-matched comparisons each backbone's reports can make, with what each tells."""
    everything = [benchmark_name(spec) for spec in study.benchmarks]
    found = []
    for backbone in study.backbones:
        for temperature in study.temperatures:
            for better, worse, tells in CONTROLS:
                claim = _claim("control", backbone, temperature, better, reports.get((backbone, better, temperature)), worse,
                               reports.get((backbone, worse, temperature)), everything)
                found += [(claim, tells)] if claim else []
    return found


def markdown(study: Study, reports: dict[tuple[str, str, float], EvalReport], tree: str = "fixed") -> str:
    """The study's claim sections of report.md: the claims, the budget-matched controls, backbone against backbone, and
    the signals without intervals. Every interval's n (prompts per benchmark) stands beside it."""
    found = claims(study, reports)
    return "\n".join([
        f"## Study {study.name}: the paper's orderings" + ("" if tree == "fixed" else f" ({tree} tree)"),
        "",
        f"Each claim's Δτ with its 95% paired interval ({METHOD}; n = prompts per benchmark, beside each).",
        "",
        "| RQ | backbone | T | claim | on | Δτ [95% interval] | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {c.question} | {c.backbone} | {c.temperature:g} | {c.better} > {c.worse} | {c.where}, n={c.prompts} | "
          f"{c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] | {c.verdict} |" for c in found],
        "",
        *_controls_section(study, reports),
        "Backbones drafter for drafter: the same training set and prompts, each backbone at its fit config's budget "
        "(the later method claimed better, as its paper reports against the earlier).",
        "",
        "| T | trained on | on | claim | Δτ [95% interval] | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {c.temperature:g} | {c.backbone} | {c.where}, n={c.prompts} | {c.better} > {c.worse} | {c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] | "
          f"{c.verdict} |" for c in backbone_claims(study, reports)],
        "",
        "Point estimates without intervals (the reports pool these over rounds, not per prompt): RQ4, draft entropy of "
        "accepted vs rejected tokens; RQ5, acceptance rate by depth of each specialist on its own domain and of the "
        "other specialists there.",
        "",
        "| backbone | T | drafter | on | entropy accepted / rejected | acceptance rate by depth |",
        "| --- | --- | --- | --- | --- | --- |",
        *_signal_rows(study, reports),
        "",
    ])


def _controls_section(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[str]:
    found = controls(study, reports)
    if not found:
        return []
    return [
        "### Budget-matched controls",
        "",
        "merge verifies a tree of twice the tokens of every other variant's; merge-budget is the same merge cut to one tree's "
        "budget. Each row says which part of merge > route-confidence it measures.",
        "",
        "| backbone | T | comparison | on | Δτ [95% interval] | verdict | what it tells |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {c.backbone} | {c.temperature:g} | {c.better} > {c.worse} | {c.where}, n={c.prompts} | {c.difference:+.3f} "
          f"[{c.low:+.3f}, {c.high:+.3f}] | {c.verdict} | {tells} |" for c, tells in found],
        "",
    ]


def comparison(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> str:
    """The claims of this study beside those of `study.compare_with`, row for row where both checked one."""
    other = read_claims(study.compare_with)
    rows = []
    for c in claims(study, reports):
        key = (c.question, c.backbone, f"{c.temperature:g}", generic_claim(c.question, c.better, c.worse), c.where)
        if key in other:
            interval, verdict = other[key]
            rows.append(f"| {c.question} | {c.backbone} | {c.temperature:g} | {key[3]} | {c.where} | {c.difference:+.3f} [{c.low:+.3f}, "
                        f"{c.high:+.3f}] ({c.better} > {c.worse}) {c.verdict} | {interval} {verdict} | "
                        f"{'same' if verdict == c.verdict else 'differs'} |")
    return "\n".join([
        f"## The same claims in {study.compare_with}",
        "",
        "Each claim is the paper's direction; Δτ [95% paired interval] and verdict in this study and in the other, where both "
        f"checked it ({len(rows)} of this study's claims).",
        "",
        "| RQ | backbone | T | claim | on | this study | other study | verdicts |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ])


def _signal_rows(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[str]:
    rows = []
    for (backbone, label, temperature), report in sorted(reports.items(), key=lambda item: (item[0][0], item[0][2], item[0][1])):
        if label not in study.domains:
            continue
        for name, result in report.benchmarks.items():
            entropy = result.draft_entropy
            shown = "–" if entropy is None else " / ".join("–" if v is None else f"{v:.2f}" for v in (entropy.accepted, entropy.rejected))
            depths = " ".join(f"{rate:.2f}" for rate in result.accept_rate_by_depth)
            rows.append(f"| {backbone} | {temperature:g} | {label} | {name} | {shown} | {depths} |")
    return rows


def write_study_report(study: Study, tree: str = "fixed", pending: int = 0) -> list[Path]:
    """The study's report at `tree`: `taps-train report` per backbone (`<backbone>/`: its tables and figures, legible
    with one backbone's variants) and report.md on top, which opens with what was found (verdicts per question and
    backbone, the tally, the caveats, where to read on) before every variant's τ, the claims and the timings.
    With `pending` cells still to run, the backbones evaluated so far, and report.md says it is partial."""
    root = report_dir(study, tree)
    backbones = evaluated_backbones(study, tree)
    if not backbones:
        raise TapsError(f"study {study.name}: no evaluation at the {tree} tree has finished yet ({eval_dir(study, tree)} holds no "
                        "reports); run the study first")
    names = {backbone: drafter_names(study, backbone) for backbone in backbones}
    written = [path for backbone in backbones for path in write_report([eval_dir(study, tree) / backbone], root / backbone, names[backbone])]
    by_backbone = {backbone: load_reports([eval_dir(study, tree) / backbone]) for backbone in backbones}
    reports = study_reports(study, tree)
    page = [
        f"# Study {study.name}" + ("" if tree == "fixed" else f" at the {tree} tree"),
        f"Verifier {study.verifier}; {study.prompts} prompts x {study.max_new_tokens} new tokens per benchmark; trees as total "
        f"tokens/depth/top-k: " + ", ".join(f"{b} {_trees(loaded)}" for b, loaded in by_backbone.items()) + ".",
        *([f"**Partial report**: {pending} cells of the study are still to run (`taps-train study --dry-run` lists them); "
           f"backbones without finished evaluations here: {', '.join(b for b in study.backbones if b not in backbones) or 'none'}."]
          if pending else []),
        "## What was found",
        summary(study, reports),
        "### Caveats",
        "\n".join(f"- {caveat}" for caveat in caveats(study, reports)),
        "### Read on",
        "\n".join(read_on(root, backbones)),
        "## Acceptance length τ of every variant",
        tau_table_caption([r for loaded in by_backbone.values() for r in loaded]),
        *[f"### {backbone}\n\n{tau_table(loaded, names[backbone])}\n\n![τ of every {backbone} variant, with intervals]({backbone}/tau.png)"
          for backbone, loaded in by_backbone.items()],
        markdown(study, reports, tree),
        *([timing_section(study, reports)] if any(_timed(r) for r in reports.values()) else []),
        *([comparison(study, reports)] if study.compare_with else []),
    ]
    written.append(root / "report.md")
    files.write_text(written[-1], "\n\n".join(page))
    return written


def drafter_names(study: Study, backbone: str) -> dict[str, str]:
    """A backbone's fitted drafters by what they are (their `run/checkpoint` is the fit's folder and `last`)."""
    names = {f"{backbone}_{domain}/last": f"{domain} specialist" for domain in study.domains}
    return names | {f"{backbone}_{mixture}/last": f"{mixture} (mixture of {' + '.join(study.domains)})" for mixture in study.mixtures}


def summary(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> str:
    """Verdicts per research question and backbone at each temperature, the tally, the contradicted claims by name, the
    best single specialist RQ3 used, and the budget-matched controls."""
    found = claims(study, reports)
    backbones = [backbone for backbone in study.backbones if any(key[0] == backbone for key in reports)]
    rows = []
    for question, meaning in QUESTIONS.items():
        cells = []
        for backbone in backbones:
            per_t = []
            for t in study.temperatures:
                verdicts = [c.verdict for c in found if c.question == question and c.backbone == backbone and c.temperature == t]
                if verdicts:
                    per_t.append(f"T={t:g}: " + ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if verdicts.count(v)))
            cells.append("; ".join(per_t) or "–")
        rows.append(f"| {question} | {meaning} | " + " | ".join(cells) + " |")
    tally = {v: sum(c.verdict == v for c in found) for v in VERDICTS}
    lines = [f"| RQ | the paper's claim | {' | '.join(backbones)} |", "| --- | --- | " + " | ".join("---" for _ in backbones) + " |", *rows, "",
             f"**Tally**: {len(found)} claims, " + ", ".join(f"{count} {v}" for v, count in tally.items()) + " (a claim is supported when "
             "its 95% interval lies above 0, contradicted when below)."]
    contradicted = [c for c in found if c.verdict == "contradicted"]
    if contradicted:
        lines.append("**Contradicted**: " + "; ".join(f"{c.backbone} T={c.temperature:g} {c.better} > {c.worse} on {c.where} "
                                                       f"({c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}])" for c in contradicted) + ".")
    best = {(b, t): _best_single(b, t, list(study.domains), reports) for b in backbones for t in study.temperatures}
    lines.append("**Best single specialist** (RQ3 compares against it; by average τ): " + "; ".join(
        f"{b} " + ", ".join(f"T={t:g} {best[b, t] or '-'}" for t in study.temperatures) for b in backbones) + "."
        + (" It changes with the temperature for " + ", ".join(b for b in backbones if len({best[b, t] for t in study.temperatures}) > 1)
           + ", so those RQ3 rows compare different specialists." if any(len({best[b, t] for t in study.temperatures}) > 1 for b in backbones) else ""))
    controlled = controls(study, reports)
    if controlled:
        lines.append("**Budget-matched controls** (merge's tree is twice the others'): " + "; ".join(
            f"{c.backbone} T={c.temperature:g} {c.better} > {c.worse} {c.verdict} ({c.difference:+.3f})" for c, _ in controlled) + ".")
    return "\n".join(lines)


VERDICTS = ("supported", "not resolved", "contradicted")


def caveats(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> list[str]:
    """What applies to every number of the report: the sample, the interval, training variance, the benchmarks, the tree
    budgets and, for timed cells, the machines and sittings."""
    found = [
        f"{study.prompts} prompts x {study.max_new_tokens} new tokens per benchmark: each interval is a 95% {METHOD} with n = "
        f"{study.prompts} (n stands beside every interval).",
        "Intervals hold the prompts' variation only: every drafter is one fit (one seed, on one machine); a refit on another "
        "machine or seed moves τ by more than some of these intervals.",
        "The benchmarks are held-out splits of the training sources (in-distribution): a specialist is measured on its own "
        "data's distribution.",
    ]
    if "merge" in study.strategies:
        found.append("merge verifies a tree of twice the tokens of the other variants (see the budget-matched controls).")
    timed = {key: report for key, report in reports.items() if _timed(report)}
    if timed:
        machines = {machine_label(r.machine) for r in timed.values() if r.machine}
        unknown = sum(1 for r in timed.values() if not r.machine)
        flagged = [f"{b} {label} T={t:g}" for (b, label, t), _ in timing_flags(timed).items()]
        found.append(("Speedups were timed on " + (f"{len(machines)} machine(s) ({'; '.join(sorted(machines))})" if machines else "")
                      + (" and " if machines and unknown else "") + (f"{unknown} cells that do not record their machine" if unknown else "")
                      + ": do not rank speedups across backbones or sittings unless their machines and baselines agree (timings below).")
                     + (f" Plain-decoding baselines out of line with their backbone's (beyond the speedup interval): {', '.join(flagged)}."
                        if flagged else ""))
    return found


def read_on(root: Path, backbones: list[str]) -> list[str]:
    """Links: the findings written about this study (findings.md beside the report, when there is one) and each
    backbone's page with its figures."""
    found = next((path for path in (root / "findings.md", root.parent / "findings.md") if path.is_file()), None)
    links = [f"- [findings.md]({'' if found.parent == root else '../'}findings.md): what the study finds, read first"] if found else []
    for backbone in backbones:
        figures = [name for name in FIGURES if (root / backbone / f"{name}.png").is_file()]
        links.append(f"- [{backbone}]({backbone}/report.md): its tables and figures (" + ", ".join(
            f"[{FIGURES[name]}]({backbone}/{name}.png)" for name in figures) + ")")
    return links


def timing_section(study: Study, reports: dict[tuple[str, str, float], EvalReport]) -> str:
    """Every timed cell's plain-decoding baseline (tokens/s) and machine, with the cells whose baseline is out of line."""
    timed = {key: report for key, report in reports.items() if _timed(report)}
    flags = timing_flags(timed)
    benchmarks = list(dict.fromkeys(name for r in timed.values() for name in r.benchmarks))
    rows = []
    for (backbone, label, t), report in sorted(timed.items(), key=lambda item: (list(study.backbones).index(item[0][0]), item[0][2], item[0][1])):
        cells = []
        for name in benchmarks:
            result = report.benchmarks.get(name)
            cells.append(f"{result.baseline_tokens_per_s:.1f} / {result.speedup:.2f}x" if result and result.speedup is not None else "–")
        rows.append(f"| {backbone} | {label} | {t:g} | " + " | ".join(cells) + f" | {machine_label(report.machine) if report.machine else 'not recorded'} | "
                    + (flags.get((backbone, label, t)) or "") + " |")
    return "\n".join([
        "## Timings: each cell's plain-decoding baseline and machine",
        "",
        "A speedup is the cell's speculative tokens/s over plain decoding of the same prompts in the same sitting. A baseline out "
        "of line with the other cells of its backbone (by more than the cell's own speedup interval, relative to the "
        "backbone's median) marks a sitting or a machine state that differs: compare such a cell's speedup with care.",
        "",
        "| backbone | variant | T | " + " | ".join(f"{name} baseline tokens/s / speedup" for name in benchmarks) + " | machine | baseline |",
        "| --- | --- | --- | " + " | ".join("---" for _ in benchmarks) + " | --- | --- |",
        *rows,
        "",
    ])


def timing_flags(timed: dict[tuple[str, str, float], EvalReport]) -> dict[tuple[str, str, float], str]:
    """Cells whose baseline on some benchmark differs from their backbone's median baseline there by more than the
    relative half-width of the cell's speedup interval: -> what differs."""
    flags = {}
    for (backbone, label, t), report in timed.items():
        said = []
        for name, result in report.benchmarks.items():
            others = [r.benchmarks[name].baseline_tokens_per_s for (b, _, _), r in timed.items()
                      if b == backbone and name in r.benchmarks and r.benchmarks[name].baseline_tokens_per_s]
            if not result.baseline_tokens_per_s or not result.speedup_ci95 or len(others) < 3:
                continue
            median = float(np.median(others))
            tolerance = (result.speedup_ci95[1] - result.speedup_ci95[0]) / 2 / result.speedup
            if abs(result.baseline_tokens_per_s / median - 1) > tolerance:
                said.append(f"{name} {result.baseline_tokens_per_s:.1f} vs median {median:.1f}")
        if said:
            flags[backbone, label, t] = "out of line: " + ", ".join(said)
    return flags


def _timed(report: EvalReport) -> bool:
    return any(result.speedup is not None for result in report.benchmarks.values())


def _trees(reports: list[dict]) -> str:
    return ", ".join(sorted({"/".join(str(r["tree"][k]) for k in ("total_tokens", "depth", "top_k")) for r in reports}))


def evaluated_backbones(study: Study, tree: str = "fixed") -> list[str]:
    """The backbones with at least one finished evaluation report at `tree`."""
    return [backbone for backbone in study.backbones if any((eval_dir(study, tree) / backbone).glob("*.json"))]


def benchmark_name(spec: str) -> str:
    """A report names a benchmark given as `name:path` by its name."""
    return spec.split(":", 1)[0]


def _best_single(backbone: str, temperature: float, domains: list[str], reports: dict) -> str | None:
    singles = {d: reports.get((backbone, d, temperature)) for d in domains}
    singles = {d: r for d, r in singles.items() if r is not None}
    return max(singles, key=lambda d: singles[d].average_acceptance_length) if singles else None


def _claim(question: str, backbone: str, temperature: float, better: str, a: EvalReport | None, worse: str,
           b: EvalReport | None, benchmarks: Sequence[str]) -> Claim | None:
    """Δτ = mean over `benchmarks` of τ_A - τ_B, and its paired interval; None when either report lacks them."""
    if a is None or b is None:
        return None
    pairs = []
    for name in benchmarks:
        ra, rb = a.benchmarks.get(name), b.benchmarks.get(name)
        if ra is None or rb is None or ra.prompt_counts is None or rb.prompt_counts is None:
            return None
        if len(ra.prompt_counts.new_tokens) != len(rb.prompt_counts.new_tokens):
            return None  # different prompts were decoded (one skipped a prompt): no pairing
        pairs.append((ra.prompt_counts, rb.prompt_counts))
    interval = paired_difference_interval(pairs)
    if interval is None:
        return None  # fewer than two prompts: no interval
    low, high = interval
    difference = float(np.mean([a.benchmarks[n].acceptance_length - b.benchmarks[n].acceptance_length for n in benchmarks]))
    prompts = "/".join(str(n) for n in dict.fromkeys(len(counts.new_tokens) for counts, _ in pairs))
    return Claim(question, backbone, temperature, better, worse, benchmarks[0] if len(benchmarks) == 1 else "average", low, high, difference,
                 prompts)
