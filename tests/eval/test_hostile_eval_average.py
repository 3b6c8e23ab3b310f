"""Hostile options to `taps-train average` and `taps-train eval`: one-line errors naming the option, before heavy work."""

import json
from pathlib import Path

import pytest
import torch

from taps_train.cli import main
from tests.export.test_export import fingerprint, make_drafter, save_checkpoint, verifier  # noqa: F401 (fixtures)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "benchmarks"


@pytest.fixture(scope="module")
def drafters(verifier, fingerprint, tmp_path_factory) -> list[str]:  # noqa: F811
    directory = tmp_path_factory.mktemp("hostile_drafters")
    return [save_checkpoint(make_drafter(verifier, seed, False), fingerprint, directory / f"d{seed}.ckpt") for seed in (1, 2)]


def one_line_error(capsys, exit_info, *needles: str) -> str:
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("taps-train: error: ") == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1].split("\r")[-1].strip()  # after any progress bars of the decoding run
    assert line.startswith("taps-train: error: ") and err.endswith(line + "\n"), err
    for needle in needles:
        assert needle in line, line
    return line


# ---------------------------------------------------------------- average

@pytest.mark.parametrize("weights", [["nan", "nan"], ["inf", "0"], ["-0.5", "1.5"], ["0.5"], ["0.3", "0.3", "0.4"], ["0.7", "0.7"]],
                         ids=["nan", "inf", "negative", "too-few", "too-many", "sum-not-1"])
def test_average_refuses_bad_weights(drafters, weights, tmp_path, capsys):
    output = tmp_path / "avg.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--drafters", *drafters, "--weights", *weights, "--output", str(output)])
    one_line_error(capsys, exit_info, "--weights")
    assert not output.exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_average_refuses_a_non_finite_input_naming_it(drafters, value, tmp_path, capsys):
    checkpoint = torch.load(drafters[1], weights_only=True)
    key = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][key].view(-1)[0] = value
    bad = tmp_path / "diverged.ckpt"
    torch.save(checkpoint, bad)
    output = tmp_path / "avg.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--drafters", drafters[0], str(bad), "--output", str(output)])
    one_line_error(capsys, exit_info, str(bad), "non-finite", key.removeprefix("drafter."))
    assert not output.exists()


@pytest.mark.parametrize("alias", ["same", "dotted", "symlink"])
def test_average_refuses_to_overwrite_an_input(drafters, alias, tmp_path, capsys):
    before = Path(drafters[0]).read_bytes()
    target = {"same": drafters[0], "dotted": str(Path(drafters[0]).parent / "." / Path(drafters[0]).name)}.get(alias)
    if alias == "symlink":
        target = str(tmp_path / "link.ckpt")
        Path(target).symlink_to(drafters[0])
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--drafters", *drafters, "--output", target])
    one_line_error(capsys, exit_info, "--output", "input drafter")
    assert Path(drafters[0]).read_bytes() == before


def test_average_refuses_a_directory_output(drafters, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["average", "--drafters", *drafters, "--output", str(tmp_path)])
    one_line_error(capsys, exit_info, "--output", "directory")


def test_average_writes_atomically(drafters, tmp_path, capsys):
    output = tmp_path / "out" / "avg.ckpt"
    main(["average", "--drafters", *drafters, "--weights", "0.25", "0.75", "--output", str(output)])
    assert capsys.readouterr().out.strip() == str(output)
    assert [p.name for p in output.parent.iterdir()] == ["avg.ckpt"]  # no temporary file left behind
    averaged = torch.load(output, weights_only=True)
    inputs = [torch.load(d, weights_only=True)["state_dict"] for d in drafters]
    for key, value in averaged["state_dict"].items():
        assert torch.allclose(value, 0.25 * inputs[0][key] + 0.75 * inputs[1][key])


# ---------------------------------------------------------------- eval

EVAL_CASES = {
    "max-new-tokens-0": (["--max-new-tokens", "0"], "--max-new-tokens"),
    "max-new-tokens-negative": (["--max-new-tokens", "-5"], "--max-new-tokens"),
    "max-new-tokens-past-context": (["--max-new-tokens", "512"], "--max-new-tokens"),  # random verifier: 512 positions
    "depth-0": (["--depth", "0"], "--depth"),
    "depth-past-tree": (["--depth", "12", "--total-tokens", "12"], "--depth"),
    "total-tokens-1": (["--total-tokens", "1"], "--total-tokens"),
    "top-k-0": (["--top-k", "0"], "--top-k"),
    "top-k-past-vocab": (["--top-k", "100000"], "--top-k"),
    "temperature-nan": (["--temperatures", "0", "nan"], "--temperatures"),
    "temperature-inf": (["--temperatures", "inf"], "--temperatures"),
    "temperature-negative": (["--temperatures", "-1"], "--temperatures"),
    "top-p-0": (["--top-p", "0"], "--top-p"),
    "top-p-above-1": (["--top-p", "1.5"], "--top-p"),
    "top-p-nan": (["--top-p", "nan"], "--top-p"),
    "prompts-0": (["--prompts", "0"], "--prompts"),
    "output-directory": (["--output", "{tmp}"], "--output"),
    "weights-nan": (["--strategy", "average", "--weights", "nan", "nan"], "--weights"),
    "weights-wrong-count": (["--strategy", "average", "--weights", "1"], "--weights"),
    "weights-without-average": (["--strategy", "route-confidence", "--weights", "0.5", "0.5"], "--weights"),
    "tree-auto-composed": (["--strategy", "route-confidence", "--tree", "auto"], "--tree auto"),
    "engine-threads-0": (["--engine", "vllm", "--engine-threads", "0"], "--engine-threads"),  # issue 36: reached vLLM
    "engine-threads-negative": (["--engine", "vllm", "--engine-threads", "-1"], "--engine-threads"),
    "speculative-tokens-0": (["--engine", "vllm", "--speculative-tokens", "0"], "--speculative-tokens"),
    "calibration-prompts-0": (["--tree", "auto", "--calibration-prompts", "0"], "--calibration-prompts"),
}


@pytest.mark.parametrize("extra,option", list(EVAL_CASES.values()), ids=list(EVAL_CASES))
def test_eval_refuses_out_of_range_options_before_loading(drafters, random_verifier_dir, extra, option, tmp_path, capsys, monkeypatch):
    def no_heavy_work(*args, **kwargs):
        raise AssertionError("the verifier was loaded before the options were checked")

    monkeypatch.setattr("taps_train.commands.eval.load_verifier", no_heavy_work)
    extra = [arg.replace("{tmp}", str(tmp_path)) for arg in extra]
    count = 2 if "--strategy" in extra else 1
    args = ["eval", "--drafters", *drafters[:count], "--verifier", str(random_verifier_dir),
            "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--output", str(tmp_path / "r.json"),
            "--total-tokens", "12", "--depth", "2", "--top-k", "3"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, *extra])
    one_line_error(capsys, exit_info, option)


def test_eval_refuses_a_benchmark_with_no_decoded_prompt(drafters, random_verifier_dir, tmp_path, capsys):
    output = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--drafters", drafters[0], "--verifier", str(random_verifier_dir),
              "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", "2", "--max-new-tokens", "511",
              "--output", str(output), "--total-tokens", "12", "--depth", "2", "--top-k", "3"])
    one_line_error(capsys, exit_info, "benchmark gsm8k", "--max-new-tokens")
    assert not output.exists()


def test_eval_still_writes_a_report_for_sane_options(drafters, random_verifier_dir, tmp_path):
    output = tmp_path / "r.json"
    main(["eval", "--drafters", drafters[0], "--verifier", str(random_verifier_dir),
          "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", "1", "--max-new-tokens", "4",
          "--output", str(output), "--total-tokens", "12", "--depth", "2", "--top-k", "3", "--top-p", "1"])
    assert json.loads(output.read_text())["benchmarks"]["gsm8k"]["prompts"] == 1
