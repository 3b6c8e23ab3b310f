"""`taps-train report` and notebooks/analysis.ipynb on small synthetic eval reports."""

import json
from pathlib import Path

import pytest

from taps_train.cli import main
from taps_train.errors import TapsError
from taps_train.eval.plots import (
    drafter_name,
    interpolation_points,
    load_reports,
    machine_caveat,
    plot_interpolation,
    plot_tau,
    tau_table,
    variant,
)

ROOT = Path(__file__).resolve().parents[2]
MATH, CHAT = "checkpoints/hass_math/last.ckpt", "checkpoints/hass_chat/last.ckpt"
PNG = b"\x89PNG\r\n\x1a\n"


def result(tau: float, depth: list[float], routing: dict | None = None) -> dict:
    calls = 50
    out = {"acceptance_length": tau, "verify_calls": calls, "new_tokens": round(tau * calls), "prompts": 4, "mean_tree_tokens": 58.0,
           "accept_rate_by_depth": depth, "draft_entropy": {"accepted": 0.8, "rejected": 2.1 + tau / 10},
           "draft_confidence": {"accepted": 0.7, "rejected": None}, "wall_time_s": 1.5}
    return out | ({"routing": routing} if routing else {})


def report(drafters: list[str], strategy: str, temperature: float, math_tau: float, chat_tau: float, **extra) -> dict:
    routing = extra.pop("routing", None)
    benchmarks = {"gsm8k": result(math_tau, [min(1.0, math_tau / 5 * r) for r in (0.9, 0.7, 0.5, 0.3)], routing and {MATH: 40, CHAT: 10}),
                  "mt_bench": result(chat_tau, [min(1.0, chat_tau / 5 * r) for r in (0.8, 0.5, 0.3, 0.1)], routing and {MATH: 12, CHAT: 38})}
    return {"verifier": "taps-tiny", "drafters": drafters, "strategy": strategy, "temperature": temperature,
            "tree": {"total_tokens": 60, "depth": 5, "top_k": 10}, "benchmarks": benchmarks,
            "average_acceptance_length": (math_tau + chat_tau) / 2, **extra}


def write_reports(folder: Path) -> Path:
    """The paper's variants at T=0 and T=1: two specialists, routing, merged trees, three averaging weights."""
    folder.mkdir(parents=True, exist_ok=True)
    variants = {
        "math": ([MATH], "single", 5.0, 2.9, {}),
        "chat": ([CHAT], "single", 4.1, 4.0, {}),
        "routed": ([MATH, CHAT], "route-confidence", 5.0, 3.9, {"routing": True}),
        "merged": ([MATH, CHAT], "merge", 5.4, 4.1, {}),
        **{f"avg{w}": ([MATH, CHAT], "average", 2.0 + w, 2.6 - w / 2, {"weights": [w, 1 - w]}) for w in (0.25, 0.5, 0.75)},
    }
    for name, (drafters, strategy, math_tau, chat_tau, extra) in variants.items():
        for temperature in (0.0, 1.0):
            data = report(drafters, strategy, temperature, math_tau - temperature / 2, chat_tau - temperature / 2, **extra)
            (folder / f"{name}_T{temperature:g}.json").write_text(json.dumps(data))
    return folder


def test_report_command_writes_every_view(tmp_path, capsys):
    reports = write_reports(tmp_path / "reports")
    main(["report", str(reports), "--out", str(tmp_path / "out")])
    names = {"tau.png", "accept_by_depth.png", "draft_entropy.png", "routing.png", "interpolation.png", "report.md"}
    assert {p.name for p in (tmp_path / "out").iterdir()} == names
    for png in (tmp_path / "out").glob("*.png"):
        assert png.read_bytes().startswith(PNG) and png.stat().st_size > 10_000
    page = (tmp_path / "out" / "report.md").read_text()
    assert page.index("## What the reports show") < page.index("## Acceptance length τ (Table 1)")  # the findings first
    assert "| 0 | gsm8k | merge (hass_math/last + hass_chat/last) | 5.40 | hass_math/last: 5.00 | +0.40 |" in page
    assert "| variant | T=0 gsm8k τ (n=4) | T=0 mt_bench τ (n=4) | T=0 average τ | T=1 gsm8k τ (n=4) |" in page
    assert "| merge (hass_math/last + hass_chat/last) | 5.40 | 4.10 | 4.75 |" in page
    assert "| gsm8k | 40 (80.0%) | 10 (20.0%) | 50 |" in page  # Table 2
    assert "| 0.75 | average λ=0.75/0.25 (hass_math/last + hass_chat/last) | 0 | 2.49 |" in page  # Figure 6's numbers
    for image in ("tau", "accept_by_depth", "draft_entropy", "routing", "interpolation"):
        assert f"({image}.png)" in page
    assert "wrote" in capsys.readouterr().out


def test_views_without_routing_or_averaging_are_left_out(tmp_path):
    reports = write_reports(tmp_path / "reports")
    main(["report", str(reports / "math_T0.json"), str(reports / "chat_T0.json"), "--out", str(tmp_path / "out")])
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"tau.png", "accept_by_depth.png", "draft_entropy.png", "report.md"}
    assert "Table 2" not in (tmp_path / "out" / "report.md").read_text()


def test_drafter_names_are_run_and_checkpoint():
    assert drafter_name("checkpoints/tiny_hass_math/best-step=500.ckpt") == "tiny_hass_math/best-step=500"
    assert drafter_name("checkpoints/tiny_hass_mixed_wandb/taps-train/4092rj5u/checkpoints/last.ckpt") == "4092rj5u/last"
    assert drafter_name("math.ckpt") == "math" and drafter_name("merged") == "merged"


def test_interpolation_runs_from_one_specialist_to_the_other(tmp_path):
    reports = load_reports([write_reports(tmp_path / "reports")])
    curve = interpolation_points(reports)[((MATH, CHAT), 0.0)]
    assert [lam for lam, _ in curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert variant(curve[0][1]) == "hass_chat/last" and variant(curve[-1][1]) == "hass_math/last"


def test_unreadable_or_ambiguous_reports_are_user_errors(tmp_path, capsys):
    reports = write_reports(tmp_path / "reports")
    (tmp_path / "other.json").write_text('{"config": 1}')
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "other.json")])
    assert exit_info.value.code == 1 and "is not a `taps-train eval` report" in capsys.readouterr().err
    with pytest.raises(TapsError, match="two reports for hass_math/last at T=0"):
        tau_table(load_reports([reports / "math_T0.json", reports / "math_T0.json"]))


def test_notebook_executes_headless_on_a_folder_of_reports(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    reports = write_reports(tmp_path / "reports")
    notebook = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    (parameters,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    parameters.source = f"REPORTS = {str(reports)!r}"  # the cell a user edits
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5
    markdown = "".join(o["data"].get("text/markdown", "") for o in outputs if "data" in o)
    assert "| merge (hass_math/last + hass_chat/last) |" in markdown


def test_tau_table_puts_a_speedup_column_next_to_each_tau_when_reports_measured_it(tmp_path):
    timed = report([MATH], "single", 0.0, 2.5, 1.5)
    timed["benchmarks"]["gsm8k"].update(speedup=1.16, speedup_ci95=[1.09, 1.22], tokens_per_s=23.2, baseline_tokens_per_s=20.0)
    untimed = report([CHAT], "single", 0.0, 1.2, 2.0)
    table = tau_table([timed, untimed])
    assert table.splitlines()[0] == ("| variant | T=0 gsm8k τ (n=4) | T=0 gsm8k speedup | T=0 mt_bench τ (n=4) | T=0 mt_bench speedup | "
                                     "T=0 average τ | tree tokens per call |")
    assert "| hass_math/last | 2.50 | 1.16× \\[1.09, 1.22\\] | 1.50 | – | 2.00 | 58 |" in table
    assert "speedup" not in tau_table([untimed])  # no baseline anywhere: no speedup columns


def counted(data: dict, new: list[int], calls: list[int]) -> dict:
    """`data` with per-prompt counts on every benchmark (its pooled fields made to fit them)."""
    for result in data["benchmarks"].values():
        result.update(prompt_new_tokens=new, prompt_verify_calls=calls, prompts=len(new), new_tokens=sum(new), verify_calls=sum(calls),
                      acceptance_length=sum(new) / sum(calls))
    data["average_acceptance_length"] = sum(new) / sum(calls)
    return data


def test_readable_names_come_in_a_fixed_order_with_the_files_in_a_column_and_every_interval_from_the_counts():
    merged = counted(report([MATH, CHAT], "merge", 0.0, 0, 0), [31] * 8, [14, 15, 13, 16, 14, 15, 13, 16])
    chat = counted(report([CHAT], "single", 0.0, 0, 0), [31] * 8, [19, 20, 18, 26, 18, 19, 26, 19])
    math = counted(report([MATH], "single", 0.0, 0, 0), [31] * 8, [15, 16, 14, 17, 15, 16, 14, 17])
    names = {"hass_math/last": "math specialist", "hass_chat/last": "chat specialist"}
    rows = tau_table([merged, chat, math], names).splitlines()
    assert rows[0].startswith("| variant | drafters | T=0 gsm8k τ (n=8) |")
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| math specialist", "| chat specialist", "| merge (math specialist + chat specialist)"]
    assert "| chat specialist | hass_chat/last | 1.50 \\[1.29, 1.71\\] |" in rows[3]  # the jackknife interval of its counts
    assert variant(merged, names) == "merge (math specialist + chat specialist)"


def test_tau_bars_carry_their_intervals_as_error_bars():
    reports = [counted(report([MATH], "single", t, 0, 0), [31] * 8, [15, 16, 14, 17, 15, 16, 14, 17]) for t in (0.0, 1.0)]
    reports.append(report([CHAT], "single", 0.0, 4.0, 3.0))  # no counts: no interval, no error bar
    figure = plot_tau(reports)
    bars = [container for ax in figure.axes for container in ax.containers if getattr(container, "errorbar", None) is not None]
    assert len(bars) == 3
    drawn = [segments for container in bars for line in container.errorbar.lines[2] for segments in [line.get_segments()]]
    spans = sorted(round(float(segment[1][1] - segment[0][1]), 3) for group in drawn for segment in group)
    assert spans.count(0.0) == 3 and max(spans) > 0.1  # the counted drafter's bars span its intervals; the other's are flat


def test_machines_of_timed_reports_are_named_and_speedups_not_ranked_across_them():
    a, b, old = (report([MATH], "single", 0.0, 2.5, 1.5) for _ in range(3))
    for data in (a, b, old):
        data["benchmarks"]["gsm8k"].update(speedup=1.1, speedup_ci95=[1.0, 1.2], tokens_per_s=11.0, baseline_tokens_per_s=10.0)
    a["machine"] = {"processor": "AMD EPYC 9R14", "flags": ["avx2", "avx512_bf16"], "threads": 2, "torch": "2.13.0"}
    b["machine"] = {**a["machine"], "processor": "Intel Xeon 8488C"}
    assert machine_caveat([a]) == "Speedups timed on one machine: AMD EPYC 9R14, 2 threads."
    said = machine_caveat([a, b, old])
    assert "2 machines (AMD EPYC 9R14, 2 threads; Intel Xeon 8488C, 2 threads)" in said and "1 report(s) that do not record theirs" in said
    assert "not across these reports" in said


def test_interpolation_names_its_reference_lines_in_the_legend_not_on_the_plot(tmp_path):
    figure = plot_interpolation(load_reports([write_reports(tmp_path / "reports")]))
    assert not [text for ax in figure.axes for text in ax.texts]  # labels on the lines overlapped where two lines were close
    labels = {label for ax in figure.axes for label in ax.get_legend_handles_labels()[1]}
    assert {"merge (average)", "route-confidence (average)", "average"} <= labels


def test_report_command_names_drafters_for_readers_and_refuses_names_of_no_drafter(tmp_path, capsys):
    reports = write_reports(tmp_path / "reports")
    main(["report", str(reports), "--out", str(tmp_path / "out"), "--name", "hass_math/last=math specialist", "--name",
          "hass_chat/last = chat specialist"])
    page = (tmp_path / "out" / "report.md").read_text()
    assert "| math specialist | hass_math/last | 5.00 |" in page and "| merge (math specialist + chat specialist) | hass_math/last + hass_chat/last |" in page
    for bad, message in (("hass_math/last", "write RUN/CHECKPOINT=NAME"), ("nowhere/last=x", "no report has a drafter nowhere/last")):
        with pytest.raises(SystemExit):
            main(["report", str(reports), "--out", str(tmp_path / "out"), "--name", bad])
        assert message in capsys.readouterr().err


def test_a_pooled_tau_outside_its_counts_interval_draws_without_negative_error_bars():
    """Older reports pool turns their per-prompt counts leave out: τ 3.2 against counts of ratio 3.0."""
    data = counted(report([MATH], "single", 0.0, 0, 0), [30, 31, 29, 30], [10, 10, 10, 10])
    data["benchmarks"]["gsm8k"]["acceptance_length"] = 3.2
    assert plot_tau([data]) is not None


def test_two_drafters_may_not_share_a_readable_name(tmp_path, capsys):
    reports = write_reports(tmp_path / "reports")
    with pytest.raises(SystemExit):
        main(["report", str(reports), "--out", str(tmp_path / "out"), "--name", "hass_math/last=x", "--name", "hass_chat/last=x"])
    assert "two drafters share a name" in capsys.readouterr().err
