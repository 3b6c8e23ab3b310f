"""bench/learning_curves.py end to end on the random verifier: two training-set sizes x two checkpoints, each point
a record with its trained tokens, a resumed call that redoes nothing (checkpoints or not), and a report with its fit and figures."""

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import bench_script, write_source

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "benchmarks"
curves_module = bench_script("learning_curves")

pytestmark = pytest.mark.usefixtures("taps_home")


@pytest.fixture
def config(random_verifier_dir, tmp_path) -> Path:
    source = write_source(tmp_path / "data.jsonl", 30, seed=2)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "curve", "max_length": 96, "sources": [{"source": "jsonl", "args": {"path": str(source)},
                                                                                      "heldout": 4, "count": 24}]}))
    fit = yaml.safe_load((ROOT / "configs" / "tiny" / "eagle2_math.yaml").read_text())
    fit["trainer"]["callbacks"] = fit["trainer"]["callbacks"][1:]  # no τ callback: the benchmarks are the tiny verifier's
    fit["trainer"]["limit_val_batches"] = 1
    fit["data"]["init_args"].update(batch_size=4, max_tokens_per_batch=384, val_samples_per_source=2)
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(fit))
    path = tmp_path / "curves.yaml"
    path.write_text(yaml.safe_dump({
        "name": "test_curve", "fit_config": str(tmp_path / "fit.yaml"), "recipe": str(recipe), "verifier": str(random_verifier_dir),
        "samples": [24, 8], "steps": [2, 4], "out": str(tmp_path / "out"),
        "evaluations": {"fixed": {"args": ["--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", 2, "--max-new-tokens", 6,
                                           "--total-tokens", 4, "--depth", 2, "--top-k", 2]},
                        "fixed_last": {"args": ["--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", 2, "--max-new-tokens", 6,
                                                "--total-tokens", 4, "--depth", 2, "--top-k", 2, "--no-baseline"], "at": [4]}},
    }))
    return path


def run(config: Path, *extra: str, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["learning_curves.py", "--config", str(config), *extra])
    curves_module.main()


@pytest.mark.integration  # ~1 min: 2 fits and 6 evaluations, each a taps-train process
def test_every_point_is_a_record_and_a_rerun_redoes_nothing(config, tmp_path, monkeypatch):
    run(config, monkeypatch=monkeypatch)
    records = sorted((tmp_path / "out" / "records").glob("*.json"))
    assert [p.name for p in records] == sorted(["n24_step2_fixed.json", "n24_step4_fixed.json", "n24_step4_fixed_last.json",
                                                "n8_step2_fixed.json", "n8_step4_fixed.json", "n8_step4_fixed_last.json"])
    bodies = {p.name: json.loads(p.read_text()) for p in records}
    for samples in (24, 8):
        early, late = bodies[f"n{samples}_step2_fixed.json"], bodies[f"n{samples}_step4_fixed.json"]
        assert 0 < early["trained_tokens"] < late["trained_tokens"] and 0 < early["trained_seconds"] < late["trained_seconds"]
    assert bodies["n24_step4_fixed.json"]["report"]["benchmarks"]["gsm8k"]["acceptance_length"] >= 1
    assert "speedup" not in bodies["n24_step4_fixed_last.json"]["report"]["benchmarks"]["gsm8k"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| 24 | 4 |" in report and "| 8 | 2 |" in report and "predicts τ" in report and "| 4/2/2 |" in report  # the tree decoded with
    assert re.search(r"\| 24 \| 4 \| [\d,]+ \| \d+\.\d min \|", report)  # with its training time
    assert (tmp_path / "out" / "fixed_tau_vs_tokens.png").stat().st_size > 0 and (tmp_path / "out" / "fixed_tau_vs_samples.png").exists()

    stamps = {p: p.stat().st_mtime_ns for p in records}
    monkeypatch.setattr(curves_module.subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a} again"))
    run(config, monkeypatch=monkeypatch)
    assert {p: p.stat().st_mtime_ns for p in records} == stamps
    curves = curves_module.Curves.read(str(config))
    shutil.rmtree(curves.run_dir(24).parent)  # a fresh clone: the committed records, no checkpoints
    run(config, monkeypatch=monkeypatch)
    assert {p: p.stat().st_mtime_ns for p in records} == stamps
    run(config, "--report-only", monkeypatch=monkeypatch)
    assert (tmp_path / "out" / "report.md").read_text() == report  # the report is a function of the records


@pytest.mark.integration
def test_a_run_killed_after_its_first_checkpoint_resumes_from_it(config, tmp_path, monkeypatch):
    curves = curves_module.Curves.read(str(config))
    curves_module.train(curves, 8)
    run_dir = curves.run_dir(8)
    (run_dir / "step=4.ckpt").unlink()  # as if killed between the two checkpoints: last.ckpt is the first one
    (run_dir / "last.ckpt").write_bytes((run_dir / "step=2.ckpt").read_bytes())
    calls = []
    real_run = curves_module.subprocess.run
    monkeypatch.setattr(curves_module.subprocess, "run", lambda command, **k: calls.append(command) or real_run(command, **k))
    curves_module.train(curves, 8)
    assert calls and calls[0][-2:] == ["--ckpt_path", str(run_dir / "last.ckpt")]
    assert (run_dir / "step=4.ckpt").exists()
    before, after = curves_module.trained(run_dir / "step=2.ckpt"), curves_module.trained(run_dir / "step=4.ckpt")
    assert after["trained_tokens"] > before["trained_tokens"]
    assert after["trained_seconds"] > before["trained_seconds"]  # the Timer went on from the checkpoint's time, not from 0


@pytest.mark.integration  # ~40 s: 2 fits and 4 evaluations
def test_a_variant_is_a_run_of_its_own_compared_paired_with_the_curve(config, tmp_path, monkeypatch):
    raw = yaml.safe_load(config.read_text())
    raw.update(samples=[8], evaluations={"fixed": raw["evaluations"]["fixed"]}, variants={"lr_high": {"model": {"lr": 0.02}}})
    config.write_text(yaml.safe_dump(raw))
    run(config, monkeypatch=monkeypatch)
    curves = curves_module.Curves.read(str(config))
    fit = yaml.safe_load((curves.run_dir(8, "lr_high") / "fit.yaml").read_text())
    assert fit["model"]["init_args"]["lr"] == 0.02 and yaml.safe_load((curves.run_dir(8) / "fit.yaml").read_text())["model"]["init_args"]["lr"] != 0.02
    records = tmp_path / "out" / "records"
    assert sorted(p.name for p in (records / "lr_high").glob("*.json")) == ["n8_step2_fixed.json", "n8_step4_fixed.json"]
    assert json.loads((records / "lr_high" / "n8_step4_fixed.json").read_text())["variant"] == "lr_high"
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Recipe variants: N = 8" in report
    [row] = [line for line in report.splitlines() if line.startswith("| lr_high |") and "| 4 |" in line]
    assert (tmp_path / "out" / "fixed_tau_vs_tokens.png").stat().st_size > 0  # the variant a line beside the curve's run
    assert "model.lr=0.02" in row and re.search(r"\| [+-]\d\.\d\d \[[+-]\d\.\d\d, [+-]\d\.\d\d\] \|", row)  # paired: same prompts
    # The equal-time table is there only where a variant point's training time is near a curve point's: these runs last
    # fractions of a second, so the machine decides; its rows are the test below's.
    points = [json.loads(p.read_text()) for p in records.rglob("n8_*.json")]
    matched = any(curves_module.nearest_in_time(r, [c for c in points if not c.get("variant")]) for r in points if r.get("variant"))
    assert ("| variant | evaluation | step (training time) | the curve's step (training time) |" in report) == matched


def test_a_variant_is_also_compared_with_the_curve_checkpoint_nearest_in_training_time():
    def record(step, seconds, evaluation="tree", variant=None):
        return {"step": step, "evaluation": evaluation, "samples": 100} | ({"trained_seconds": seconds} if seconds else {}) | (
            {"variant": variant} if variant else {})

    curve = [record(250, 600), record(500, 1200), record(1000, 2400), record(1000, 2400, "vllm"), record(2000, None)]
    assert curves_module.nearest_in_time(record(500, 2500, variant="v"), curve)["step"] == 1000  # a dearer step: the curve's later one
    assert curves_module.nearest_in_time(record(500, 700, variant="v"), curve)["step"] == 250
    assert curves_module.nearest_in_time(record(500, 2500, "vllm", "v"), curve)["evaluation"] == "vllm"  # the same evaluation only
    assert curves_module.nearest_in_time(record(1000, 5000, variant="v"), curve) is None  # past the curve's time: no equal point
    assert curves_module.nearest_in_time(record(250, 950, variant="v"), curve) is None  # 600 s and 1,200 s are both too far
    assert curves_module.nearest_in_time(record(500, None, variant="v"), curve) is None  # no Timer: no time to match
    assert curves_module.nearest_in_time(record(500, 900, "auto", "v"), curve) is None


@pytest.mark.parametrize("steps, every, last_every", [([2, 4], 2, 2), ([500, 1000], 500, 25), ([1000], 1000, 25)])
def test_a_run_keeps_its_evaluated_steps_and_a_last_checkpoint_every_few_minutes(config, steps, every, last_every):
    curves = dataclasses.replace(curves_module.Curves.read(str(config)), steps=steps)
    callbacks = yaml.safe_load(curves_module.write_run_files(curves, 24).read_text())["trainer"]["callbacks"]
    saves = {(c["init_args"]["every_n_train_steps"], c["init_args"]["save_top_k"], c["init_args"].get("save_last", False))
             for c in callbacks if "every_n_train_steps" in c.get("init_args", {})}
    assert saves == {(every, -1, False), (last_every, 0, True)}  # a kill loses at most `last_every` steps, not a whole stretch


def test_a_variant_with_its_own_steps_trains_evaluates_and_reports_its_own_length(config):
    """A variant that halves a step's cost runs twice the steps, its cosine decay spanning them: at equal time it meets
    the curve at the end of its own schedule, not halfway through the curve's."""
    raw = yaml.safe_load(config.read_text())
    raw.update(samples=[8], variants={"small_batch": {"data": {"batch_size": 2}, "steps": [4, 8]}, "longer": {"steps": [8]}})
    config.write_text(yaml.safe_dump(raw))
    curves = curves_module.Curves.read(str(config))
    assert curves.steps_of("small_batch") == [4, 8] and curves.steps_of(None) == [2, 4] and curves.steps_of("longer") == [8]
    assert curves.overrides_of("small_batch") == {"data": {"batch_size": 2}} and curves.overrides_of("longer") == {}
    fit = yaml.safe_load(curves_module.write_run_files(curves, 8, "small_batch").read_text())
    assert fit["trainer"]["max_steps"] == 8 and fit["data"]["init_args"]["batch_size"] == 2
    assert {c["init_args"]["every_n_train_steps"] for c in fit["trainer"]["callbacks"] if "every_n_train_steps" in c.get("init_args", {})} == {4}
    assert [(step, e.name) for step, e in curves.pending(8, "small_batch")] == [(8, "fixed"), (4, "fixed"), (4, "fixed_last")]
    assert yaml.safe_load(curves_module.write_run_files(curves, 8, "longer").read_text())["trainer"]["max_steps"] == 8

    def record(step, variant=None):
        result = {"acceptance_length": 1.5, "prompt_new_tokens": [3, 3], "prompt_verify_calls": [2, 2]}
        return {"samples": 8, "step": step, "evaluation": "fixed", "trained_tokens": 100 * step, "trained_seconds": 10.0 * step,
                "report": {"benchmarks": {"gsm8k": result}}} | ({"variant": variant} if variant else {})

    assert curves_module.variants_section(curves, [record(2), record(4)], ["gsm8k"]) == []  # variants not run yet: no empty tables
    report = curves_module.variants_section(curves, [record(2), record(4), record(4, "small_batch"), record(8, "small_batch")], ["gsm8k"])
    rows = [line for line in report if line.startswith("| small_batch | data.batch_size=2; a run of 8 steps |")]
    assert [row.split(" | ")[3] for row in rows] == ["4", "8"]  # its own steps, step 8 beside no curve point of that step
    assert rows[0].endswith("| 1.50 | +0.00 [+0.00, +0.00] |") and rows[1].endswith("| 1.50 |  |")


def test_a_variant_is_paired_with_the_curve_only_where_both_decoded_with_the_same_drafting_tree(config):
    """`--tree auto` picks a tree per drafter and machine: a variant at 3/1/2 against the curve at 20/5/6 compares trees."""
    raw = yaml.safe_load(config.read_text())
    raw.update(samples=[8], variants={"small_batch": {"data": {"batch_size": 2}}})
    config.write_text(yaml.safe_dump(raw))
    curves = curves_module.Curves.read(str(config))

    def record(step, seconds, tree, variant=None):
        result = {"acceptance_length": 1.5, "prompt_new_tokens": [3, 3], "prompt_verify_calls": [2, 2]}
        return {"samples": 8, "step": step, "evaluation": "auto", "trained_tokens": 100 * step, "trained_seconds": seconds,
                "report": {"tree": tree, "benchmarks": {"gsm8k": result}}} | ({"variant": variant} if variant else {})

    small, large, plain = ({"total_tokens": 3, "depth": 1, "top_k": 2}, {"total_tokens": 20, "depth": 5, "top_k": 6},
                           {"total_tokens": 1, "depth": 1, "top_k": 1})
    records = [record(2, 10.0, large), record(4, 20.0, plain), record(2, 20.0, small, "small_batch"), record(4, 40.0, plain, "small_batch")]
    report = curves_module.variants_section(curves, records, ["gsm8k"])
    per_step = [line for line in report if line.startswith("| small_batch | data.batch_size=2 |")]
    assert [row.rsplit(" | ", 1)[1] for row in per_step] == ["trees differ (3/1/2 against 20/5/6) |", "both decoded plainly |"]
    [equal_time] = [line for line in report if line.startswith("| small_batch | auto | 2 ")]  # 20 s: the curve's step 4
    assert equal_time.endswith("| trees differ (3/1/2 against plain) |")
    untimed = curves_module.variants_section(curves, [records[0], record(2, None, small, "small_batch")], ["gsm8k"])
    assert not any("At equal training time" in line for line in untimed)  # no point to match: no empty table


def test_overrides_change_every_run_and_a_variant_changes_its_own_on_top(config):
    raw = yaml.safe_load(config.read_text())
    raw.update(overrides={"model": {"proposal_vocab_size": None, "lr": 0.005}}, variants={"lr_high": {"model": {"lr": 0.02}}})
    config.write_text(yaml.safe_dump(raw))
    curves = curves_module.Curves.read(str(config))
    base = yaml.safe_load(curves_module.write_run_files(curves, 24).read_text())["model"]["init_args"]
    variant = yaml.safe_load(curves_module.write_run_files(curves, 24, "lr_high").read_text())["model"]["init_args"]
    assert (base["lr"], variant["lr"]) == (0.005, 0.02)
    assert base["proposal_vocab_size"] is None and variant["proposal_vocab_size"] is None


@pytest.mark.parametrize("change, message", [
    ({"samples": [8, 8]}, "samples must be distinct"),
    ({"steps": [4, 2]}, "steps must be increasing"),
    ({"samples": [100]}, "fewer than 100"),
    ({"evaluations": {"fixed": {"args": [], "at": [3]}}}, r"evaluation fixed is at steps \[3\], not all of them checkpoints"),
    ({"colour": "red"}, "unexpected keyword argument 'colour'"),
    ({"variants": {"a/b": {"model": {"lr": 1}}}}, "variant name 'a/b' must be letters"),
    ({"variants": {"v": {"optimizer": {"lr": 1}}}}, "variant v changes 'optimizer'; only model, data and trainer"),
    ({"variants": {"v": {"trainer": {"max_steps": 9}}}}, "variant v sets trainer.max_steps, which the curve sets for every run"),
    ({"variants": {"v": {"data": {"recipe": "x.yaml"}}}}, "variant v sets data.recipe"),
    ({"variants": {"v": {"model": 3}}}, "variant v must map model, data or trainer"),
    ({"variants": {"v": {}}}, "variant v must map model, data or trainer"),
    ({"variants": {"v": {"steps": [4, 2]}}}, "variant v's steps must be increasing positive counts"),
    ({"variants": {"v": {"model": {"lr": 1}, "steps": []}}}, "variant v's steps must be increasing"),
    ({"variants": {"v": {"steps": "8"}}}, "variant v's steps must be increasing"),
    ({"evaluations": {"fixed": {"args": [], "at": [8]}}, "variants": {"v": {"steps": [8]}}}, None),  # a variant's step: fine
    ({"overrides": {"optimizer": {"lr": 1}}}, "overrides changes 'optimizer'; only model, data and trainer"),
    ({"overrides": {"data": {"recipe": "r.yaml"}}}, "overrides sets data.recipe, which the curve sets for every run"),
    ({"overrides": []}, "overrides must map model, data or trainer"),
])
def test_bad_configs_are_one_line(config, change, message, monkeypatch, capsys):
    raw = yaml.safe_load(config.read_text())
    raw.update(change)
    config.write_text(yaml.safe_dump(raw))
    if message is None:
        curves_module.Curves.read(str(config))
        return
    with pytest.raises(SystemExit, match=message):
        run(config, monkeypatch=monkeypatch)


@pytest.mark.parametrize("path", sorted((ROOT / "bench" / "curves").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_curve_configs_name_real_configs_and_fit_their_recipes(path, monkeypatch, capsys):
    """...and every run they train (each variant included) is a fit config the CLI accepts: a misspelt option would
    otherwise surface only when its run starts, maybe hours into the curve."""
    from taps_train.cli import main

    monkeypatch.chdir(ROOT)
    curves = curves_module.Curves.read(str(path))
    assert Path(curves.fit_config).is_file()
    [source] = yaml.safe_load(Path(curves.recipe).read_text())["sources"]
    assert max(curves.samples) <= source["count"] and "regenerate" in source  # the verifier's own replies, at every size
    for variant in [None, *curves.variants]:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(curves_module.write_run_files(curves, min(curves.samples), variant)), "--print_config"])
        assert exit_info.value.code in (0, None), (variant, capsys.readouterr().err)


def test_larger_data_is_compared_paired_at_equal_steps_and_only_at_the_same_drafting_tree():
    def row(samples, step, new_tokens, tree):
        result = {"acceptance_length": sum(new_tokens) / 30, "prompt_new_tokens": new_tokens, "prompt_verify_calls": [10, 10, 10]}
        return {"samples": samples, "step": step, "report": {"tree": tree, "benchmarks": {"math": result}}}

    chain, plain = {"total_tokens": 4, "depth": 2, "top_k": 1}, {"total_tokens": 1, "depth": 1, "top_k": 1}
    rows = [row(400, 10, [40, 40, 40], chain), row(100, 10, [30, 30, 30], chain), row(100, 20, [30, 30, 30], chain),
            row(400, 30, [40, 40, 40], chain), row(100, 30, [30, 30, 30], plain), row(400, 40, [30, 30, 30], plain),
            row(100, 40, [30, 30, 30], plain)]  # step 40: both plain, τ 1.00 against 1.00 compares no drafters
    assert curves_module.size_differences(rows, ["math"]) == ["- N = 400 minus N = 100 at step 10 [paired 95%]: math +1.00 [+1.00, +1.00]"]


def test_the_fit_over_sizes_predicts_from_drafted_points_only():
    def row(samples, step, tau, tree):
        return {"samples": samples, "step": step, "report": {"tree": tree, "benchmarks": {"math": {"acceptance_length": tau}}}}

    chain, plain = {"total_tokens": 4, "depth": 2, "top_k": 1}, {"total_tokens": 1, "depth": 1, "top_k": 1}
    drafted = [row(100, 20, 1.5, chain), row(1000, 20, 2.0, chain), row(1000, 10, 9.0, chain)]  # step 10: not the fit's step
    [line] = curves_module.predictions(drafted, ["math"], 20)
    assert "τ = 0.50 + 0.500 log10(N) over N = [100, 1000] at step 20" in line and "predicts τ 2.50, at 100x 3.00" in line
    assert curves_module.predictions([row(100, 20, 1.0, plain), row(1000, 20, 1.0, plain)], ["math"], 20) == [
        "- math: N = [100, 1000] decoded plainly at step 20 (`--tree auto` found no tree that pays), left out of the fit"]
    lines = curves_module.predictions(drafted + [row(10, 20, 1.0, plain)], ["math"], 20)
    assert len(lines) == 2 and "over N = [100, 1000]" in lines[0] and "N = [10] decoded plainly" in lines[1]
    assert curves_module.predictions([row(100, 20, 1.5, chain)], ["math"], 20) == []  # one size: nothing to fit


@pytest.mark.parametrize(("tree", "cell"), [(None, ""), ({"total_tokens": 1, "depth": 1, "top_k": 1}, "plain"),
                                            ({"total_tokens": 4, "depth": 2, "top_k": 1}, "chain of 3"),
                                            ({"total_tokens": 16, "depth": 4, "top_k": 4}, "16/4/4"),
                                            ({"total_tokens": 3, "depth": 2, "top_k": 1}, "3/2/1")])  # a chain cut short by total_tokens
def test_a_tree_reads_as_plain_a_chain_or_its_shape(tree, cell):
    assert curves_module.tree_cell(tree) == cell


def test_a_run_with_checkpoints_is_not_resumed_under_another_config(config):
    curves = curves_module.Curves.read(str(config))
    run_dir = curves_module.write_run_files(curves, 24).parent
    (run_dir / "last.ckpt").write_bytes(b"a checkpoint")
    callbacks_only = dataclasses.replace(curves, steps=[1, 4])  # checkpoints every step: the weights it trains to are the same
    assert curves_module.write_run_files(callbacks_only, 24) == run_dir / "fit.yaml"
    for changed, where in [(dataclasses.replace(curves, steps=[2, 8]), "trainer.max_steps, trainer.val_check_interval"),
                           (dataclasses.replace(curves, overrides={"model": {"lr": 0.5}}), "model.init_args.lr")]:
        with pytest.raises(curves_module.TapsError, match=rf"{run_dir} holds checkpoints of a run trained with another config \({where} changed"):
            curves_module.write_run_files(changed, 24)
    (run_dir / "last.ckpt").unlink()  # nothing to resume: a new config is a new run
    assert curves_module.write_run_files(dataclasses.replace(curves, steps=[2, 8]), 24) == run_dir / "fit.yaml"
