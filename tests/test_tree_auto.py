"""`--tree auto`: the shapes searched, the replay of smaller trees from the largest one (exact against drafting them),
the calibration's measured curve and choice, and the eval report that records them."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from taps_train.cli import main
from taps_train.eval.report import read_report
from taps_train.spec.baseline import plain_generate
from taps_train.spec.calibrate import RecordedDraft, calibrate_tree, shapes
from taps_train.spec.draft import DrafterState
from taps_train.spec.tree import TreeConfig
from taps_train.spec.verify import VerifierSession
from tests.test_eval import FIXTURES, checkpoint, recipe  # noqa: F401 (fixtures)
from tests.test_spec import random_drafter, tiny_vocab_verifier

PROMPT = [5, 9, 14, 2, 7, 7, 30, 11]


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()


def test_shapes_stay_within_the_bounds_hold_chains_and_never_exceed_what_a_tree_can_hold():
    found = shapes(TreeConfig(total_tokens=24, depth=4, top_k=6))
    assert len(found) == len(set(found))
    assert all(s.total_tokens <= 24 and 1 <= s.depth <= 4 and s.top_k <= 6 for s in found)
    assert all(s.total_tokens <= 1 + s.top_k + s.depth * s.top_k**2 for s in found)
    assert TreeConfig(3, 1, 1) in found and TreeConfig(6, 4, 1) in found  # chains: depth + 2 tokens at most
    assert TreeConfig(24, 4, 6) in found  # the bounds themselves


def drafts_along(verifier, drafter, widest: TreeConfig, shape: TreeConfig, prompt: list[int], tokens: int = 32):
    """At each position of the greedy continuation: the replay record of the widest tree and the tree of `shape`
    drafted directly, from the same drafter state."""
    continuation = plain_generate(verifier, prompt, tokens, set())
    _, hidden = VerifierSession(verifier).prefill(torch.tensor(prompt + continuation))
    n = len(prompt)
    state = DrafterState(drafter)
    state.extend({-1: hidden[-1][:n]}, torch.tensor(prompt[1:] + continuation[:1]))
    for position in range(len(continuation) - widest.levels - 1):
        window = continuation[position + 1 : position + 1 + widest.levels]
        yield RecordedDraft.of(state.draft(continuation[position], widest), window), RecordedDraft.of(state.draft(continuation[position], shape), window)
        state.extend({-1: hidden[-1][n + position : n + position + 1]}, torch.tensor(continuation[position + 1 : position + 2]))


@pytest.mark.parametrize("shape", [TreeConfig(4, 1, 3), TreeConfig(8, 2, 3), TreeConfig(12, 3, 3), TreeConfig(5, 3, 1), TreeConfig(9, 3, 2)])
def test_replayed_acceptance_equals_drafting_the_smaller_tree(shape):
    """Over a 6-token vocabulary even a random drafter's top-3 often holds the verifier's token, so the check has teeth."""
    verifier = tiny_vocab_verifier(seed=5)
    drafter = random_drafter(verifier, seed=1)
    widest = TreeConfig(1 + 3 + 3 * 9, 3, 3)
    checked = accepted = 0
    for recorded, direct in drafts_along(verifier, drafter, widest, shape, [1, 2, 3, 4, 5, 0, 1, 2]):
        expected = len(direct.budgets(shape.depth, shape.top_k)) if len(direct.children) - 1 <= shape.total_tokens - 1 else None
        replayed = sum(b <= shape.total_tokens - 1 for b in recorded.budgets(shape.depth, shape.top_k))
        assert replayed == expected
        checked += 1
        accepted += replayed
    assert checked > 10 and accepted > 0, (checked, accepted)


def test_calibration_measures_a_cost_curve_and_picks_the_fastest_expected_shape(verifier):
    drafter = random_drafter(verifier, seed=0)
    bound = TreeConfig(total_tokens=16, depth=3, top_k=4)
    calibration = calibrate_tree(verifier, drafter, [PROMPT, PROMPT[::-1]], set(), bound, continuation_tokens=16)
    assert sorted(calibration.call_ms) == [1, 2, 3, 4, 6, 8, 12, 16] and all(ms > 0 for ms in calibration.call_ms.values())
    assert set(calibration.draft_ms) == {(s.depth, s.top_k) for s in shapes(bound)}
    ranking = calibration.ranking
    assert ranking[0] == calibration.choice and all(a.tokens_per_s >= b.tokens_per_s for a, b in zip(ranking, ranking[1:]))
    choice = calibration.choice.tree
    assert choice.total_tokens <= 16 and choice.depth <= 3 and choice.top_k <= 4
    assert 1.0 <= calibration.choice.expected_tau <= choice.levels + 1
    data = json.loads(json.dumps(calibration.as_dict()))
    assert data["choice"]["total_tokens"] == choice.total_tokens and data["positions"] == calibration.positions > 0


def test_eval_with_tree_auto_decodes_with_the_chosen_tree_and_records_the_curve(checkpoint, random_verifier_dir, tmp_path, capsys):  # noqa: F811
    output = tmp_path / "r.json"
    main(["eval", "--drafters", str(checkpoint), "--verifier", str(random_verifier_dir), "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}",
          "--prompts", "2", "--max-new-tokens", "12", "--tree", "auto", "--total-tokens", "12", "--depth", "2", "--top-k", "3",
          "--calibration-prompts", "1", "--output", str(output)])
    report = json.loads(output.read_text())
    choice = report["tree_calibration"]["choice"]
    assert report["tree"] == {key: choice[key] for key in ("total_tokens", "depth", "top_k")}
    assert report["benchmarks"]["gsm8k"]["mean_tree_tokens"] <= choice["total_tokens"]
    assert "1" in report["tree_calibration"]["call_ms_by_tokens"] and report["benchmarks"]["gsm8k"]["identical_to_greedy"] is True
    assert read_report(output).tree.total_tokens == choice["total_tokens"]
    assert "--tree auto: total tokens" in capsys.readouterr().out
    merged = tmp_path / "merged.json"
    main(["eval", "--drafters", str(checkpoint), str(checkpoint), "--strategy", "merge", "--verifier", str(random_verifier_dir),
          "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", "1", "--max-new-tokens", "8", "--no-baseline",
          "--tree-from", str(output), "--output", str(merged)])
    assert json.loads(merged.read_text())["tree"] == report["tree"]  # a composition evaluated with the calibrated tree
    for extra, message in ((["--tree-from", str(merged)], "--tree-from needs a report of `taps-train eval --tree auto`"),
                           (["--tree-from", str(output), "--depth", "2"], "--tree-from takes the tree from a calibrated report; drop --depth"),
                           (["--tree-from", str(output), "--tree", "auto"], "pass one of them"),
                           (["--tree-from", str(tmp_path / "none.json")], "cannot read eval report")):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", "--drafters", str(checkpoint), "--verifier", str(random_verifier_dir), "--output", str(tmp_path / "x.json"), *extra])
        assert exit_info.value.code == 1 and message in capsys.readouterr().err
