"""A study's report.md opens with what was found: the verdicts per question and backbone, the tally, the contradicted
claims by name, the best single specialist RQ3 used, the budget-matched controls, the caveats (timed cells' machines
and baselines among them), and it is written again byte for byte from the same records."""

import json
from pathlib import Path

from taps_train.study.findings import controls, study_reports, summary, timing_flags, write_study_report
from tests.study.test_study import fake_report, study  # noqa: F401  (the study fixture)

STRONG = [(30 + i % 7, 10) for i in range(8)]  # τ about 3.3 on every prompt
WEAK = [(n - 5, c) for n, c in STRONG]  # half a token less per call


def edit(path: Path, **fields) -> None:
    data = json.loads(path.read_text())
    data.update({k: v for k, v in fields.items() if k != "benchmarks"})
    for name, change in fields.get("benchmarks", {}).items():
        data["benchmarks"][name].update(change)
    path.write_text(json.dumps(data))


def write_variants(out: Path, temperature: float, a_best: bool, suffix: str = "") -> None:
    """Specialists a and b (a the better on average when `a_best`), route-confidence, merge and its budget control; a
    study of several temperatures names its reports with the temperature as `suffix`."""
    best, other = (STRONG, WEAK) if a_best else (WEAK, STRONG)
    fake_report(out / f"a{suffix}.json", "a", {"gsm8k": best, "mt_bench": WEAK})
    fake_report(out / f"b{suffix}.json", "b", {"gsm8k": other, "mt_bench": STRONG if not a_best else WEAK})
    fake_report(out / f"route-confidence{suffix}.json", "route-confidence", {"gsm8k": STRONG, "mt_bench": WEAK})
    fake_report(out / f"merge-budget{suffix}.json", "merge-budget", {"gsm8k": STRONG, "mt_bench": STRONG})
    fake_report(out / f"merge{suffix}.json", "merge", {"gsm8k": WEAK, "mt_bench": STRONG})  # below its budget control
    for path in out.glob(f"*{suffix}.json"):
        edit(path, temperature=temperature)


def test_the_summary_tallies_verdicts_names_contradictions_the_best_single_and_the_controls(study):
    study.temperatures = [0.0, 1.0]
    out = study.out_dir / "eval" / "eagle2"
    write_variants(out, 0.0, a_best=True, suffix="_T0")
    write_variants(out, 1.0, a_best=False, suffix="_T1")
    reports = study_reports(study)
    text = summary(study, reports)
    assert text.startswith("| RQ | the paper's claim | eagle2 |")
    # T=0: a > b on gsm8k holds, b > a on mt_bench is a tie; T=1: b is the better on gsm8k, against the paper's a > b
    assert ("| RQ1 | the matched specialist beats every other specialist on its domain | T=0: 1 supported, 1 not resolved; "
            "T=1: 1 supported, 1 contradicted |") in text
    assert "| RQ4 | route-confidence > route-entropy (average of the benchmarks) | – |" in text  # no route-entropy reports
    assert "**Tally**: 8 claims, 2 supported, 4 not resolved, 2 contradicted" in text
    assert ("**Contradicted**: eagle2 T=1 a > b on gsm8k (-0.500 [-0.500, -0.500]); eagle2 T=1 route-confidence > b on average "
            "(-0.250 [-0.250, -0.250]).") in text
    assert "**Best single specialist** (RQ3 compares against it; by average τ): eagle2 T=0 a, T=1 b." in text
    assert "It changes with the temperature for eagle2, so those RQ3 rows compare different specialists." in text
    controlled = {(c.temperature, c.better, c.worse): (c.verdict, tells) for c, tells in controls(study, reports)}
    assert controlled[0.0, "merge", "merge-budget"][0] == "contradicted" and "doubled tree" in controlled[0.0, "merge", "merge-budget"][1]
    assert controlled[0.0, "merge-budget", "route-confidence"][0] == "supported"
    assert "**Budget-matched controls** (merge's tree is twice the others'): eagle2 T=0 merge-budget > route-confidence supported" in text


def test_timed_cells_name_their_machine_and_a_baseline_out_of_line_is_flagged(study, tmp_path):
    study.temperatures = [0.0]
    study.report_dir = str(tmp_path / "published")
    out = study.out_dir / "eval" / "eagle2"
    write_variants(out, 0.0, a_best=True)
    machine = {"processor": "AMD EPYC 9R14", "flags": ["avx2"], "threads": 2, "torch": "2.13.0"}
    for path in out.glob("*.json"):
        slow = path.stem == "a"  # another sitting: its plain decoding ran at 11 tokens/s, the others' at 15
        edit(path, machine=machine, benchmarks={name: {"baseline_tokens_per_s": 11.0 if slow else 15.0, "tokens_per_s": 12.0,
                                                       "speedup": 12.0 / (11.0 if slow else 15.0), "speedup_ci95": [0.7, 1.2]}
                                                for name in ("gsm8k", "mt_bench")})
    flags = timing_flags(study_reports(study))
    assert list(flags) == [("eagle2", "a", 0.0)] and "gsm8k 11.0 vs median 15.0" in flags["eagle2", "a", 0.0]
    write_study_report(study)
    page = (tmp_path / "published" / "report.md").read_text()
    assert "Speedups were timed on 1 machine(s) (AMD EPYC 9R14, 2 threads)" in page
    assert "Plain-decoding baselines out of line with their backbone's (beyond the speedup interval): eagle2 a T=0." in page
    assert "## Timings: each cell's plain-decoding baseline and machine" in page
    assert "| eagle2 | a | 0 | 11.0 / 1.09x | 11.0 / 1.09x | AMD EPYC 9R14, 2 threads | out of line: gsm8k 11.0 vs median 15.0" in page


def test_the_report_opens_with_the_findings_and_is_written_again_byte_for_byte(study, tmp_path):
    study.temperatures = [0.0]
    study.report_dir = str(tmp_path / "published")
    write_variants(study.out_dir / "eval" / "eagle2", 0.0, a_best=True)
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "findings.md").write_text("# what we found\n")
    first = {path.name: path.read_bytes() for path in write_study_report(study)}
    page = first["report.md"].decode()
    assert page.index("## What was found") < page.index("### Caveats") < page.index("### Read on") < page.index("## Acceptance length τ")
    assert "- [findings.md](findings.md): what the study finds, read first" in page
    assert "![τ of every eagle2 variant, with intervals](eagle2/tau.png)" in page
    assert "| a specialist | eagle2_a/last |" not in page  # the fake reports name their drafters `a`, not a fit's checkpoint
    assert {path.name: path.read_bytes() for path in write_study_report(study)} == first
