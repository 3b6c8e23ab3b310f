"""`taps-train study` on a micro study (random verifier, 2 training steps per fit): it runs every cell through the
real `taps-train fit` / `eval` processes, writes a report with intervals and the paper's orderings, resumes after
being killed without redoing finished cells, reruns exactly what a changed input touches, and refuses bad
study files in one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from taps_train.cli import main
from taps_train.errors import TapsError
from taps_train.study import Domain, Study, Tree, run_study
from taps_train.study.plan import plan
from taps_train.study.run import unfinished

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"


def recipe(path: Path, seed: int) -> str:
    path.write_text(f"name: r{seed}\nseed: 0\nmax_length: 256\nsources:\n  - source: gsm_symbolic\n    args: {{size: 40, seed: {seed}}}\n"
                    "    heldout: 4\n    count: 16\n")
    return str(path)


def fit_config(path: Path, verifier: Path) -> str:
    path.write_text(yaml.safe_dump({
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 500, "limit_val_batches": 0, "logger": False,
                    "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "taps_train.training.Eagle2Module", "init_args": {"verifier": str(verifier)}},
        "data": {"class_path": "taps_train.data.datamodule.DrafterDataModule", "init_args": {"recipe": "set by the study", "batch_size": 4}},
    }))
    return str(path)


@pytest.fixture
def study(tmp_path, random_verifier_dir, monkeypatch) -> Study:
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return Study(
        name="micro",
        verifier=str(random_verifier_dir),
        domains={"a": Domain(recipe(tmp_path / "a.yaml", 3), [f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}"]),
                 "b": Domain(recipe(tmp_path / "b.yaml", 4), [f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}"])},
        backbones={"eagle2": fit_config(tmp_path / "eagle2.yaml", random_verifier_dir)},
        max_steps=2,
        strategies=["route-confidence", "merge"],
        temperatures=[0.0],
        tree=Tree(total_tokens=8, depth=2, top_k=2),
        prompts=2,
        max_new_tokens=6,
        lambdas=[0.5],
        out_root=str(tmp_path / "studies"),
    )


def study_yaml(study: Study, path: Path) -> Path:
    data = {key: getattr(study, key) for key in ("name", "verifier", "backbones", "max_steps", "strategies", "temperatures", "prompts",
                                                 "max_new_tokens", "lambdas", "out_root", "trees", "report_dir")}
    data["domains"] = {name: {"recipe": d.recipe, "benchmarks": d.benchmarks} for name, d in study.domains.items()}
    data["tree"] = {"total_tokens": study.tree.total_tokens, "depth": study.tree.depth, "top_k": study.tree.top_k}
    path.write_text(yaml.safe_dump(data))
    return path


def cell_processes(study: Study) -> list[str]:
    """Command lines of live processes working on this study's files."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(study.out_dir) in text and "pytest" not in text:
            found.append(text)
    return found


@pytest.mark.integration  # seven `taps-train` processes: ~1-2 minutes on 2 cores
def test_killed_study_resumes_without_redoing_finished_cells_and_reports(study, tmp_path):
    study.trees = ["fixed", "auto"]
    study.report_dir = str(tmp_path / "published")
    config = study_yaml(study, tmp_path / "study.yaml")
    command = [sys.executable, "-m", "taps_train", "study", "--config", str(config)]
    first_fit = study.out_dir / "cells" / "fit_eagle2_a.json"
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.monotonic() + 300
    while not first_fit.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first_fit.exists(), "the first fit never finished"
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 60
    while cell_processes(study) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not cell_processes(study), "a cell's process outlived the study"
    cells, todo = unfinished(study)
    assert cells[0].key == "fit_eagle2_a" and cells[0] not in todo and len(todo) < len(cells)
    first = json.loads(first_fit.read_text())
    checkpoint_time = cells[0].outputs[0].stat().st_mtime_ns

    ran = run_study(study)
    assert [cell.key for cell in ran] == [cell.key for cell in todo]  # only the unfinished cells ran
    assert cells[0].outputs[0].stat().st_mtime_ns == checkpoint_time and json.loads(first_fit.read_text()) == first
    assert unfinished(study)[1] == []

    main(["study", "--config", str(config)])  # nothing left to run: writes the report
    report = (tmp_path / "published" / "report.md").read_text()
    assert report.index("## What was found") < report.index("### Caveats") < report.index("## Acceptance length τ") < report.index("## Study micro: the paper's orderings")
    assert "**Tally**: " in report and "| RQ3 | best single > uniform average;" in report
    assert "| RQ1 | eagle2 | 0 | a > b | gsm8k, n=2 |" in report and "| RQ3 | eagle2 | 0 | merge > route-confidence | average, n=2 |" in report
    evals = sorted(p.stem for p in (study.out_dir / "eval" / "eagle2").glob("*.json"))
    assert evals == ["a", "average_lambda0.5", "b", "merge", "route-confidence"]
    calibrated = json.loads((study.out_dir / "eval_auto" / "eagle2" / "a.json").read_text())
    assert calibrated["tree_calibration"] is not None
    for name in ("b", "merge", "route-confidence"):  # every variant at the one tree the calibration chose
        assert json.loads((study.out_dir / "eval_auto" / "eagle2" / f"{name}.json").read_text())["tree"] == calibrated["tree"]
    tree = "/".join(str(calibrated["tree"][key]) for key in ("total_tokens", "depth", "top_k"))
    auto_report = (tmp_path / "published" / "auto_tree" / "report.md").read_text()
    assert "## Study micro: the paper's orderings (auto tree)" in auto_report and f"trees as total tokens/depth/top-k: eagle2 {tree}." in auto_report
    assert "- [eagle2](eagle2/report.md): its tables and figures ([τ by benchmark, with intervals](eagle2/tau.png)" in auto_report
    assert (tmp_path / "published" / "auto_tree" / "eagle2" / "tau.png").is_file()  # each backbone's figures on its own page
    assert "| merge (a specialist + b specialist) | eagle2_a/last + eagle2_b/last |" in (tmp_path / "published" / "eagle2" / "report.md").read_text()

    # A changed recipe reruns its fit and every evaluation reading that drafter, nothing else.
    Path(study.domains["b"].recipe).write_text(Path(study.domains["b"].recipe).read_text().replace("count: 16", "count: 12"))
    _, todo = unfinished(study)
    assert [cell.key for cell in todo] == ["fit_eagle2_b", "eval_eagle2_b", "eval_eagle2_route-confidence", "eval_eagle2_merge",
                                           "eval_eagle2_average_lambda0.5", "eval_eagle2_b@auto", "eval_eagle2_route-confidence@auto",
                                           "eval_eagle2_merge@auto"]  # the calibration (a's drafter) stands


def test_the_machine_tree_is_calibrated_once_per_backbone_on_the_mixture_and_read_by_every_other_variant(study, tmp_path):
    study.trees = ["fixed", "auto"]
    study.mixtures = {"m": recipe(tmp_path / "m.yaml", 5)}
    evals = [cell for cell in plan(study) if cell.kind == "eval"]
    fixed, auto = [c for c in evals if c.tree == "fixed"], [c for c in evals if c.tree == "auto"]
    assert [c.label for c in fixed] == ["a", "b", "m", "route-confidence", "merge", "average_lambda0.5"]
    assert [c.label for c in auto] == ["m", "a", "b", "route-confidence", "merge"]  # no λ sweep: τ alone, at the fixed tree
    calibration = auto[0]
    assert calibration.key == "eval_eagle2_m@auto" and "--tree" in calibration.args and "--tree-from" not in calibration.args
    assert calibration.args[calibration.args.index("--tree") + 1] == "auto" and calibration.needs == ["fit_eagle2_m"]
    for cell in auto[1:]:
        assert cell.args[cell.args.index("--tree-from") + 1] == str(calibration.outputs[0]) and "--total-tokens" not in cell.args
        assert calibration.key in cell.needs and cell.outputs[0].parent == study.out_dir / "eval_auto" / "eagle2"
    assert all("--tree" not in c.args and "--tree-from" not in c.args for c in fixed)
    assert not any("--no-baseline" in c.args for c in evals)  # by default every tree measures the speedup
    study.baseline = ["auto"]
    evals = [cell for cell in plan(study) if cell.kind == "eval"]
    assert [("--no-baseline" in c.args) for c in evals] == [c.tree == "fixed" for c in evals]
    assert len({c.key for c in evals}) == len({c.log for c in evals}) == len(evals)


def test_dry_run_estimates_from_the_verifiers_prior_rates_then_from_the_studys_own_cells(study, capsys, monkeypatch):
    from taps_train.study import run

    run_study(study, dry_run=True)
    assert "estimated time unknown" in capsys.readouterr().err
    rates = run.Rates({"Eagle2Module": 10.0}, {"fixed": 64.0, "auto": 1.0}, {"fit": 5.0, "eval": 1.0})
    monkeypatch.setattr(run, "prior_rates", lambda: {study.verifier: rates})
    run_study(study, dry_run=True)  # 2 fits x (2 steps x 10 s + 5 s) + 5 evals x (2 prompts x 2 benchmarks x 6 s + 1 s) = 50 + 125 s
    assert "estimated time 2m55s" in capsys.readouterr().err
    (study.out_dir / "cells").mkdir(parents=True)  # a fit recorded at 50 s per step (its checkpoint gone: to do again)
    (study.out_dir / "cells" / "fit_eagle2_a.json").write_text(json.dumps({"fingerprint": plan(study)[0].fingerprint, "seconds": 100.0, "steps": 2}))
    run_study(study, dry_run=True)
    assert "0 cells done, 7 to do; estimated time 5m25s" in capsys.readouterr().err


def test_backbones_run_one_after_another_and_a_finished_backbone_needs_no_checkpoint(study, tmp_path, capsys):
    from taps_train.study.run import _State

    study.backbones = {"eagle2": study.backbones["eagle2"], "other": study.backbones["eagle2"]}
    cells = plan(study)
    assert [(c.backbone, c.kind) for c in cells] == [(b, k) for b in ("eagle2", "other") for k in ("fit",) * 2 + ("eval",) * 5]
    state = _State(study.out_dir)
    for cell in cells:  # every cell of eagle2 recorded as a sitting that ended would leave it, but no checkpoint kept
        if cell.backbone == "eagle2":
            for path in cell.outputs:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("{}" if cell.kind == "eval" else "")
            state.record(cell, 1.0)
            if cell.kind == "fit":
                cell.outputs[0].unlink()
    _, todo = unfinished(study)
    assert [c.key for c in todo] == [c.key for c in cells if c.backbone == "other"]
    run_study(study, dry_run=True)
    assert "done  fit eagle2 on a (checkpoint not kept: its evaluations are done)" in capsys.readouterr().err
    state.path(next(c for c in cells if c.key == "eval_eagle2_merge")).unlink()  # an evaluation to do again needs both drafters
    _, todo = unfinished(study)
    assert [c.key for c in todo][:3] == ["fit_eagle2_a", "fit_eagle2_b", "eval_eagle2_merge"]


def test_a_fit_trained_again_to_other_weights_makes_the_evaluations_of_the_earlier_ones_run_again(study, monkeypatch, capsys):
    from taps_train.study import run

    weights = {"version": "1"}

    def fake_cell(cell, state):  # the scheduler's part only: a cell writes its outputs, a fit the current weights
        for path in cell.outputs:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(weights["version"] if cell.kind == "fit" else "{}")
        return 1.0

    monkeypatch.setattr(run, "_run_cell", fake_cell)
    run_study(study)
    cells = plan(study)
    fit_a = cells[0]
    readers = [c.key for c in cells if fit_a.key in c.needs]
    assert readers == ["eval_eagle2_a", "eval_eagle2_route-confidence", "eval_eagle2_merge", "eval_eagle2_average_lambda0.5"]
    fit_a.outputs[0].unlink()  # a later sitting: the checkpoint was not kept, one evaluation of it is still to do
    (study.out_dir / "cells" / "eval_eagle2_merge.json").unlink()
    assert [c.key for c in run_study(study)] == ["fit_eagle2_a", "eval_eagle2_merge"]  # the same weights again
    fit_a.outputs[0].unlink()
    (study.out_dir / "cells" / "eval_eagle2_merge.json").unlink()
    weights["version"] = "2"
    capsys.readouterr()
    assert [c.key for c in run_study(study)] == ["fit_eagle2_a", *readers]
    assert "fit eagle2 on a: its outputs differ from those an earlier run recorded; 3 finished evaluations that read them run again" in " ".join(capsys.readouterr().err.split())
    assert unfinished(study)[1] == []
    (study.out_dir / "cells" / "fit_eagle2_a.json").write_text((study.out_dir / "cells" / "fit_eagle2_a.json").read_text().replace(
        json.loads((study.out_dir / "cells" / "fit_eagle2_a.json").read_text())["outputs"][0]["sha256"], "0" * 64))
    assert [c.key for c in unfinished(study)[1]] == readers  # they read weights other than those now recorded


def test_dry_run_prints_the_plan_and_runs_nothing(study, capsys):
    assert run_study(study, dry_run=True) == []
    text = capsys.readouterr().err
    assert "2 fits" in text and "5 evals" in text and "0 cells done, 7 to do" in text and "todo  fit eagle2 on a" in text
    assert not (study.out_dir / "cells").exists()


@pytest.mark.parametrize("change, message", [
    ({"domains": {}}, "compares specialists of two or more domains"),
    ({"backbones": {}}, "name at least one backbone"),
    ({"strategies": ["single"]}, "not composition strategies"),
    ({"strategies": ["merge", "vote"]}, r"\['vote'\] are not composition strategies"),
    ({"lambdas": [1.5]}, r"every λ lies in \[0, 1\]"),
    ({"max_steps": 0}, r"max_steps: 0 is out of range: need at least 1 step"),
    ({"temperatures": []}, r"temperatures: \[\]: need one temperature or more"),
    ({"temperatures": [float("nan")]}, "temperatures: nan out of range"),
    ({"temperatures": [0.0, 0]}, r"temperatures: 0.0 given more than once \(each is run once\)"),  # issue 36: said nothing
    ({"lambdas": [0.5, 0.5]}, r"lambdas: 0.5 given more than once"),
    ({"strategies": ["merge", "route-confidence", "merge"]}, r"strategies: 'merge' given more than once"),
    ({"tree": Tree(total_tokens=0)}, "tree.total_tokens: 0 is out of range"),
    ({"tree": Tree(depth=-1)}, "tree.depth: -1 is out of range"),
    ({"seed": -1}, "seed: -1 is out of range"),
    ({"report_dir": "/proc/report"}, "report_dir /proc/report is not a writable directory"),
    ({"baseline": ["paper"]}, r"baseline: \['paper'\]: name trees of"),
    ({"trees": []}, r"trees: \[\]: name each of \['fixed', 'auto'\] at most once"),
    ({"trees": ["auto", "auto"]}, "trees: .* at most once"),
    ({"trees": ["paper"]}, "trees: .* at most once"),
    ({"verifier": "/nowhere/model"}, "verifier: verifier path /nowhere/model does not exist"),
    ({"domains": {"a": Domain("a.yaml", ["math_heldout:/etc/hosts"]), "b": Domain("b.yaml", ["mt_bench"])}}, "recipe /etc/hosts must be a mapping"),
    ({"mixtures": {"a": "x.yaml"}}, "share a name"),
    ({"mixtures": {"m": "missing.yaml"}}, "mixtures.m: missing.yaml does not exist"),
    ({"backbones": {"../up": "eagle2.yaml"}}, "names become folder names"),
    ({"domains": {"a": Domain("a.yaml", ["gsm9k"]), "b": Domain("b.yaml", ["mt_bench"])}}, "unknown benchmark 'gsm9k'"),
    ({"domains": {"a": Domain("a.yaml", ["gsm8k:nowhere.jsonl"]), "b": Domain("b.yaml", ["mt_bench"])}}, "nowhere.jsonl does not exist"),
    ({"out_root": "/dev/null/studies"}, "cannot create the study folder /dev/null/studies/micro"),
])
def test_bad_studies_are_refused_before_anything_runs(study, change, message):
    for key, value in change.items():
        setattr(study, key, value)
    with pytest.raises(TapsError, match=message):
        run_study(study)
    assert not study.out_dir.is_dir()


def test_three_domains_refuse_a_lambda_sweep_and_a_backbone_file_must_be_a_fit_config(study, tmp_path):
    study.domains["c"] = Domain(study.domains["a"].recipe, ["gsm8k"])
    with pytest.raises(TapsError, match="λ sweep interpolates two specialists; this study has 3 domains"):
        run_study(study)
    study.lambdas = []
    (tmp_path / "bad.yaml").write_text("- just a list\n")
    study.backbones = {"eagle2": str(tmp_path / "bad.yaml")}
    with pytest.raises(TapsError, match="the file must be a mapping of sections"):
        run_study(study)


def test_cli_refuses_a_study_file_in_one_line(study, tmp_path, capsys):
    config = study_yaml(study, tmp_path / "study.yaml")
    data = yaml.safe_load(config.read_text())
    data["strategies"] = ["nope"]
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "--config", str(config)])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("taps-train: error: study micro: strategies: ['nope']") and "\n" not in error


def fake_report(path: Path, label: str, per_prompt: dict[str, list[tuple[int, int]]]) -> None:
    """An eval report whose benchmarks hold these (new tokens, verifier calls) per prompt."""
    from taps_train.eval.intervals import PromptCounts, tau_interval
    from taps_train.eval.report import BenchmarkResult, EvalReport, Signals
    from taps_train.decoding.tree import TreeConfig

    results = {}
    for name, counts in per_prompt.items():
        new, calls = [n for n, _ in counts], [c for _, c in counts]
        results[name] = BenchmarkResult(sum(new) / sum(calls), sum(calls), sum(new), len(counts), 0, 30.0, (0.6, 0.4), Signals(1.0, 2.0),
                                        None, 1.0, None, tuple(new), tuple(calls), tau_interval(PromptCounts(new, calls)))
    average = sum(r.acceptance_length for r in results.values()) / len(results)
    report = EvalReport("v", (label,), "single", 0.0, TreeConfig(60, 5, 10), results, average)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.to_json())


def test_report_only_writes_the_evaluations_finished_so_far_and_says_it_is_partial(study, tmp_path, capsys):
    hass = yaml.safe_load(Path(study.backbones["eagle2"]).read_text())
    hass["model"]["class_path"] = "taps_train.training.HassModule"
    (tmp_path / "hass.yaml").write_text(yaml.safe_dump(hass))
    study.backbones = {"eagle2": study.backbones["eagle2"], "hass": str(tmp_path / "hass.yaml")}
    study.trees, study.report_dir = ["fixed", "auto"], str(tmp_path / "published")
    config = study_yaml(study, tmp_path / "study.yaml")
    with pytest.raises(SystemExit):
        main(["study", "--config", str(config), "--report-only"])
    assert "study micro: no evaluation has finished yet, so there is nothing to report" in capsys.readouterr().err
    counts = [(30 + i % 7, 10) for i in range(20)]
    for label in ("a", "b"):  # the first two of eagle2's evaluations, as a sitting that ended there leaves them
        fake_report(study.out_dir / "eval" / "eagle2" / f"{label}.json", label, {"gsm8k": counts, "mt_bench": counts})
    capsys.readouterr()
    main(["study", "--config", str(config), "--report-only"])
    assert "no evaluation at the auto tree has finished yet" in capsys.readouterr().out
    report = (tmp_path / "published" / "report.md").read_text()
    assert "**Partial report**: 22 cells of the study are still to run" in report and "finished evaluations here: hass." in report
    assert (tmp_path / "published" / "eagle2" / "report.md").is_file() and not (tmp_path / "published" / "hass").exists()
    assert not (study.out_dir / "cells").exists()  # nothing ran
    with pytest.raises(SystemExit):
        main(["study", "--config", str(config), "--report-only", "--dry-run"])
    assert "--dry-run and --report-only: pass one" in capsys.readouterr().err


def test_findings_say_which_orderings_the_intervals_support(study):
    from taps_train.study.findings import markdown, study_reports

    study.temperatures = [0.0]
    out = study.out_dir / "eval" / "eagle2"
    strong = [(30 + i % 7, 10) for i in range(20)]  # τ about 3.3 on every prompt
    weak = [(n - 5, c) for n, c in strong]  # half a token less per call on every prompt
    noisy = [(n + (8 if i % 2 else -8), c) for i, (n, c) in enumerate(strong)]  # same mean, prompt-level noise
    fake_report(out / "a.json", "a", {"gsm8k": strong, "mt_bench": weak})
    fake_report(out / "b.json", "b", {"gsm8k": weak, "mt_bench": strong})
    fake_report(out / "route-confidence.json", "route-confidence", {"gsm8k": strong, "mt_bench": strong})
    fake_report(out / "merge.json", "merge", {"gsm8k": noisy, "mt_bench": noisy})
    fake_report(out / "route-entropy.json", "route-entropy", {"gsm8k": [(n + 3, c) for n, c in strong], "mt_bench": strong})
    text = markdown(study, study_reports(study))
    assert "| RQ1 | eagle2 | 0 | a > b | gsm8k, n=20 | +0.500 [+0.500, +0.500] | supported |" in text
    assert "| RQ1 | eagle2 | 0 | b > a | mt_bench, n=20 | +0.500 [+0.500, +0.500] | supported |" in text
    assert "| RQ3 | eagle2 | 0 | route-confidence > a | average, n=20 | +0.250 [+0.250, +0.250] | supported |" in text
    merge = next(line for line in text.splitlines() if "merge > route-confidence" in line)
    assert merge.endswith("| not resolved |")
    assert "| RQ4 | eagle2 | 0 | route-confidence > route-entropy | average, n=20 | -0.150 [-0.150, -0.150] | contradicted |" in text
    assert "| eagle2 | 0 | a | gsm8k | 1.00 / 2.00 | 0.60 0.40 |" in text
    assert "> average |" not in text  # no uniform-average report: that claim is left out, not guessed


def test_claims_stand_beside_another_studys_read_back_from_its_report(study, tmp_path):
    from taps_train.study.findings import comparison, markdown, study_reports

    study.temperatures = [0.0]
    out = study.out_dir / "eval" / "eagle2"
    strong = [(30 + i % 7, 10) for i in range(20)]
    weak = [(n - 5, c) for n, c in strong]
    fake_report(out / "a.json", "a", {"gsm8k": strong, "mt_bench": weak})
    fake_report(out / "b.json", "b", {"gsm8k": weak, "mt_bench": strong})
    fake_report(out / "average.json", "average", {"gsm8k": weak, "mt_bench": weak})
    fake_report(out / "route-confidence.json", "route-confidence", {"gsm8k": strong, "mt_bench": strong})
    (tmp_path / "other.md").write_text(markdown(study, study_reports(study)))  # the other study: the same claims ...
    fake_report(out / "b.json", "b", {"gsm8k": strong, "mt_bench": strong})  # ... but here b is as good as a on gsm8k, and the best single
    study.compare_with = str(tmp_path / "other.md")
    text = comparison(study, study_reports(study))
    assert ("| RQ1 | eagle2 | 0 | a > b | gsm8k | +0.000 [+0.000, +0.000] (a > b) not resolved | +0.500 [+0.500, +0.500] (a > b) "
            "supported | differs |") in text
    assert "| RQ1 | eagle2 | 0 | b > a | mt_bench | +0.500 [+0.500, +0.500] (b > a) supported | +0.500 [+0.500, +0.500] (b > a) supported | same |" in text
    assert "| RQ3 | eagle2 | 0 | best single > average | average | +0.500 [+0.500, +0.500] (b > average) supported | " in text
    assert "(a > average) supported | same |" in text  # the best single differs, the claim pairs
    for bad, message in ((tmp_path, "is not a report file"), (tmp_path / "none.md", "is not a report file"),
                         (FIXTURES / "gsm8k.jsonl", "holds no claims table")):
        study.compare_with = str(bad)
        with pytest.raises(TapsError, match=message):
            study.check()


def test_backbones_are_compared_drafter_for_drafter_the_later_method_claimed_better(study, tmp_path):
    from taps_train.study.findings import markdown, study_reports

    hass = yaml.safe_load(Path(study.backbones["eagle2"]).read_text())
    hass["model"]["class_path"] = "taps_train.training.HassModule"
    (tmp_path / "hass.yaml").write_text(yaml.safe_dump(hass))
    study.backbones = {"hass": str(tmp_path / "hass.yaml"), "eagle2": study.backbones["eagle2"]}
    study.temperatures = [0.0]
    strong = [(30 + i % 7, 10) for i in range(20)]
    weak = [(n - 5, c) for n, c in strong]
    for backbone, a, b in (("eagle2", weak, strong), ("hass", strong, weak)):
        fake_report(study.out_dir / "eval" / backbone / "a.json", "a", {"gsm8k": a})
        fake_report(study.out_dir / "eval" / backbone / "b.json", "b", {"mt_bench": b})
    text = markdown(study, study_reports(study))
    assert "| 0 | a | gsm8k, n=20 | hass > eagle2 | +0.500 [+0.500, +0.500] | supported |" in text
    assert "| 0 | b | mt_bench, n=20 | hass > eagle2 | -0.500 [-0.500, -0.500] | contradicted |" in text
    assert "eagle2 > hass" not in text


@pytest.mark.parametrize("content, message", [
    (None, "cannot read study file"),
    ("root:x:0:0:root:/root:/bin/bash\n", "is not a YAML mapping of study keys"),
    ("name: [unclosed\n", "is not valid YAML"),
    ("- a\n- b\n", "is not a YAML mapping"),
])
def test_a_study_file_that_is_not_a_study_is_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "s.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "--config", str(path)])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err.strip()
    assert message in error and str(path) in error and "\n" not in error and "root:x" not in error


def test_an_interrupted_fit_resumes_from_its_last_checkpoint_unless_its_inputs_changed(study):
    from taps_train.study.plan import plan
    from taps_train.study.run import _prepare_fit, _State

    cell = plan(study)[0]
    directory = cell.config_path.parent
    directory.mkdir(parents=True)
    (directory / "last.ckpt").write_bytes(b"step 100")
    (directory / "epoch=0-step=100.ckpt").write_bytes(b"step 100")
    (directory / "started.json").write_text(json.dumps({"fingerprint": cell.fingerprint}))
    args = list(cell.args)
    _prepare_fit(cell, _State(study.out_dir), args)
    assert args[-2:] == ["--ckpt_path", str(directory / "last.ckpt")] and (directory / "last.ckpt").exists()
    assert cell.outputs == [directory / "last.ckpt"]
    assert [c["class_path"] for c in cell.fit_config["trainer"]["callbacks"]] == ["taps_train.training.checkpointing.LastCheckpoint"]
    assert yaml.safe_load(cell.config_path.read_text())["data"]["init_args"]["recipe"] == study.domains["a"].recipe

    (directory / "started.json").write_text(json.dumps({"fingerprint": "another recipe"}))
    args = list(cell.args)
    _prepare_fit(cell, _State(study.out_dir), args)
    assert "--ckpt_path" not in args and not list(directory.glob("*.ckpt"))  # a stale run is not resumed with new inputs


def test_last_ckpt_holds_the_final_step_even_when_the_budget_is_not_a_multiple_of_the_interval(study, random_verifier_dir, tmp_path):
    """max_steps 3 with a checkpoint every 2 steps: Lightning's own last.ckpt stays at step 2, LastCheckpoint's is step 3."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from taps_train.drafter.checkpoint import read_checkpoint
    from taps_train.training import Eagle2Module
    from taps_train.training.checkpointing import LastCheckpoint
    from tests.eval.test_eval import fit

    steps = {}
    for callback in (ModelCheckpoint, LastCheckpoint):
        directory = tmp_path / callback.__name__
        fit(Eagle2Module(verifier=str(random_verifier_dir)), study.domains["a"].recipe, random_verifier_dir, directory,
            [callback(dirpath=directory, every_n_train_steps=2, save_last=True, save_top_k=-1)], steps=3, limit_val_batches=0)
        steps[callback.__name__] = read_checkpoint(directory / "last.ckpt")["global_step"]
    assert steps == {"ModelCheckpoint": 2, "LastCheckpoint": 3}


def test_a_cell_dies_with_its_study_even_when_the_study_started_with_sigint_ignored(tmp_path):
    """`nohup taps-train study ... &` from a script starts the study with SIGINT ignored; its cells would inherit that
    and outlive it (the death signal is SIGINT) unless the runner gives them the default back."""
    pid_file = tmp_path / "child.pid"
    (tmp_path / "cell.py").write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    (tmp_path / "study.py").write_text(f"import subprocess, sys\nfrom taps_train.study.run import _die_with_parent\n"
                                       f"subprocess.run([sys.executable, {str(tmp_path / 'cell.py')!r}], preexec_fn=_die_with_parent)\n")
    parent = subprocess.Popen([sys.executable, str(tmp_path / "study.py")], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and "zombie" not in _state(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = Path(f"/proc/{child}").exists() and "zombie" not in _state(child)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the cell outlived its study"


def _state(pid: int) -> str:
    try:
        return next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("State:"))
    except (OSError, StopIteration):
        return "zombie"
