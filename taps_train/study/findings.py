"""Which of the paper's orderings a study's reports support, by paired bootstrap intervals.

Every claim "A beats B" is checked on the same prompts: the prompts of each benchmark are resampled once
for both (per benchmark for an ordering on one benchmark, independently per benchmark and averaged for
an ordering on the average), and the claim is *supported* when the 95% interval of τ_A - τ_B lies above
0, *contradicted* when it lies below, and *not resolved* otherwise.
"""

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from taps_train import files
from taps_train.errors import TapsError
from taps_train.eval.intervals import RESAMPLES, paired_difference_interval
from taps_train.eval.report import EvalReport, read_report
from taps_train.study.compare import generic_claim, read_claims
from taps_train.study.config import Study
from taps_train.eval.plots import load_reports, tau_table, tau_table_caption, write_report
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


def markdown(study: Study, reports: dict[tuple[str, str, float], EvalReport], tree: str = "fixed") -> str:
    """The study's section of report.md: the claims table and the interval half-widths reached."""
    rows = [f"| {c.question} | {c.backbone} | {c.temperature:g} | {c.better} > {c.worse} | {c.where} | "
            f"{c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] | {c.verdict} |" for c in claims(study, reports)]
    widths = {}
    for (_, _, temperature), report in reports.items():
        for result in report.benchmarks.values():
            if result.tau_ci95 is not None:
                widths.setdefault(temperature, []).append((result.tau_ci95[1] - result.tau_ci95[0]) / 2)
    spread = "; ".join(f"T={t:g}: median {np.median(w):.3f}, max {max(w):.3f}" for t, w in sorted(widths.items()))
    return "\n".join([
        f"## Study {study.name}: the paper's orderings" + ("" if tree == "fixed" else f" ({tree} tree)"),
        "",
        f"Each claim's Δτ with its 95% paired bootstrap interval ({RESAMPLES} resamples of the prompts, {study.prompts} "
        f"per benchmark). Half-widths of the single-report τ intervals: {spread or 'none (reports without intervals)'}.",
        "",
        "| RQ | backbone | T | claim | on | Δτ [95% interval] | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Backbones drafter for drafter: the same training set and prompts, each backbone at its fit config's budget "
        "(the later method claimed better, as its paper reports against the earlier).",
        "",
        "| T | trained on | on | claim | Δτ [95% interval] | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {c.temperature:g} | {c.backbone} | {c.where} | {c.better} > {c.worse} | {c.difference:+.3f} [{c.low:+.3f}, {c.high:+.3f}] | "
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
    with one backbone's variants) and report.md on top: every variant's τ, links to those pages, and the claims.
    With `pending` cells still to run, the backbones evaluated so far, and report.md says it is partial."""
    root = report_dir(study, tree)
    backbones = evaluated_backbones(study, tree)
    if not backbones:
        raise TapsError(f"study {study.name}: no evaluation at the {tree} tree has finished yet ({eval_dir(study, tree)} holds no "
                        "reports); run the study first")
    written = [path for backbone in backbones for path in write_report([eval_dir(study, tree) / backbone], root / backbone)]
    by_backbone = {backbone: load_reports([eval_dir(study, tree) / backbone]) for backbone in backbones}
    reports = [report for loaded in by_backbone.values() for report in loaded]
    pages = []
    for backbone, loaded in by_backbone.items():
        shapes = sorted({(r["tree"]["total_tokens"], r["tree"]["depth"], r["tree"]["top_k"]) for r in loaded})
        pages.append(f"[{backbone}]({backbone}/report.md) (tree {', '.join('/'.join(map(str, shape)) for shape in shapes)})")
    page = [
        f"# Study {study.name}" + ("" if tree == "fixed" else f" at the {tree} tree"),
        f"Verifier {study.verifier}; {study.prompts} prompts x {study.max_new_tokens} new tokens per benchmark. Per backbone, its "
        f"tables and figures (trees as total tokens/depth/top-k): {' · '.join(pages)}.",
        *([f"**Partial report**: {pending} cells of the study are still to run (`taps-train study --dry-run` lists them); "
           f"backbones without finished evaluations here: {', '.join(b for b in study.backbones if b not in backbones) or 'none'}."]
          if pending else []),
        "## Acceptance length τ of every variant",
        tau_table_caption(reports),
        tau_table(reports),
        markdown(study, study_reports(study, tree), tree),
        *([comparison(study, study_reports(study, tree))] if study.compare_with else []),
    ]
    written.append(root / "report.md")
    files.write_text(written[-1], "\n\n".join(page))
    return written


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
    low, high = paired_difference_interval(pairs)
    difference = float(np.mean([a.benchmarks[n].acceptance_length - b.benchmarks[n].acceptance_length for n in benchmarks]))
    return Claim(question, backbone, temperature, better, worse, benchmarks[0] if len(benchmarks) == 1 else "average", low, high, difference)
