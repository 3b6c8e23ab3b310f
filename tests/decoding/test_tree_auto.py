"""`--tree auto`: the shapes searched, the replay of smaller trees from the largest one (exact against drafting them),
the calibration's measured curve and choice, and the eval report that records them."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from taps_train.cli import main
from taps_train.eval.report import read_report
from taps_train.decoding.baseline import plain_generate
from taps_train.decoding.calibrate import Replay, call_sizes, calibrate_tree, capacity, shapes, top_ks
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.tree import TreeConfig
from taps_train.decoding.verify import VerifierSession
from tests.eval.test_eval import FIXTURES, checkpoint, recipe  # noqa: F401 (fixtures)
from tests.decoding.test_spec import random_drafter, tiny_vocab_verifier

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


@pytest.mark.parametrize("verifier_seed, drafter_seed", [(5, 1), (1, 2)])
def test_replayed_acceptance_equals_drafting_every_shape_the_search_considers(verifier_seed, drafter_seed):
    """Every shape of the search (deep narrow ones included, whose frontier a wider tree need not hold), at every
    position: replaying it from the whole tree of its top_k accepts exactly what drafting it directly accepts. Over a
    6-token vocabulary even a random drafter's top-k often holds the verifier's token, so the check has teeth."""
    verifier = tiny_vocab_verifier(seed=verifier_seed)
    drafter = random_drafter(verifier, seed=drafter_seed)
    bound = TreeConfig(total_tokens=24, depth=4, top_k=4)
    prompt = [1, 2, 3, 4, 5, 0, 1, 2]
    continuation = plain_generate(verifier, prompt, 40, set())
    _, hidden = VerifierSession(verifier).prefill(torch.tensor(prompt + continuation))
    n = len(prompt)
    state = DrafterState(drafter)
    state.extend({-1: hidden[-1][:n]}, torch.tensor(prompt[1:] + continuation[:1]))
    searched = shapes(bound)
    checked = deep = 0
    for position in range(len(continuation) - bound.levels - 1):
        root, window = continuation[position], continuation[position + 1 : position + 1 + bound.levels]
        replays = {k: Replay.of(state.draft(root, TreeConfig(capacity(bound.depth, k), bound.depth, k)), window, bound.depth)
                   for k in top_ks(bound)}
        for shape in searched:
            direct = accepted_length(state.draft(root, shape), window)
            assert replays[shape.top_k].accepted(shape) == direct, (position, shape)
            checked += 1
            deep += direct >= 2
        state.extend({-1: hidden[-1][n + position : n + position + 1]}, torch.tensor(continuation[position + 1 : position + 2]))
    assert checked > 1000 and deep > 20, (checked, deep)


def accepted_length(tree, continuation: list[int]) -> int:
    """Greedy acceptance of `tree` against the verifier's continuation: the longest root path it holds."""
    node, accepted = 0, 0
    for token in continuation:
        node = next((c for c in tree.children(node) if int(tree.tokens[c]) == token), None)
        if node is None:
            break
        accepted += 1
    return accepted


def test_costs_are_timed_until_stable_at_every_searched_size(monkeypatch):
    """A cost that varies more than STABLE allows gets more rounds (up to MAX_ROUNDS); steady costs stop at ROUNDS.
    The call sizes are exactly the searched shapes' (and 1), so no cost is interpolated or reshaped."""
    from taps_train.decoding import calibrate

    clock = iter(range(10**6))
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: next(clock) / 1000)  # every run "takes" 1 ms
    calls = {"steady": 0, "noisy": 0}

    def run(key, noisy):
        def timed():
            calls[key] += 1
            if noisy and calls[key] % 2:
                next(clock), next(clock)  # every other run takes 3 ms
        return timed

    medians, spread = calibrate._timed({"steady": run("steady", False)})
    assert calls["steady"] == calibrate.ROUNDS + 1 and medians["steady"] == pytest.approx(1.0) and spread["steady"] < 1e-9
    medians, spread = calibrate._timed({"noisy": run("noisy", True)})
    assert calls["noisy"] == calibrate.MAX_ROUNDS + 1 and spread["noisy"] > calibrate.STABLE
    bound = TreeConfig(16, 3, 4)
    assert calibrate.call_sizes(bound) == sorted({1} | {shape.total_tokens for shape in shapes(bound)})


@pytest.mark.parametrize("steep", [True, False], ids=["calls-steep:plain", "calls-flat:tree"])
def test_calibration_chooses_plain_decoding_where_no_tree_is_expected_to_beat_it(monkeypatch, steep):
    """With a verifier call of two tokens 50x the cost of one, no tree can pay and plain decoding is chosen (and no gate
    is needed); with every call as costly as one, a drafter that accepts tokens wins with a tree, gated at its break-even."""
    from taps_train.decoding import calibrate

    def costs(model, hidden_indices, ids, sizes):
        return {s: (10.0 if s == 1 or not steep else 500.0) for s in sizes}, {s: 0.0 for s in sizes}

    monkeypatch.setattr(calibrate, "_call_costs", costs)
    verifier = tiny_vocab_verifier(seed=1)
    prompt = [1, 2, 3, 4, 5, 0, 1, 2]
    calibration = calibrate_tree(verifier, random_drafter(verifier, seed=2), [prompt], set(), TreeConfig(16, 3, 4), continuation_tokens=24)
    assert calibration.plain.tree.plain and calibration.plain.expected_tau == 1.0 and calibration.plain.round_ms == 10.0
    if steep:
        assert calibration.choice.tree.plain and calibration.gate() is None and calibration.as_dict()["plain_chosen"] is True
    else:
        assert not calibration.choice.tree.plain and calibration.choice.expected_tau > 2
        assert calibration.gate().break_even == pytest.approx(calibration.choice.round_ms / 10.0)


def test_calibration_measures_a_cost_curve_and_picks_the_fastest_expected_shape(verifier):
    drafter = random_drafter(verifier, seed=0)
    bound = TreeConfig(total_tokens=16, depth=3, top_k=4)
    calibration = calibrate_tree(verifier, drafter, [PROMPT, PROMPT[::-1]], set(), bound, continuation_tokens=16)
    call_ms = calibration.costs.call_ms
    assert sorted(call_ms) == call_sizes(bound) and all(ms > 0 for ms in call_ms.values())
    assert sorted(calibration.call_ms_spread) == sorted(call_ms) and all(s >= 0 for s in calibration.call_ms_spread.values())
    assert set(calibration.costs.draft_ms) == {(s.depth, s.top_k) for s in shapes(bound)}
    ranking = calibration.ranking
    assert ranking[0] == calibration.choice and all(a.tokens_per_s >= b.tokens_per_s for a, b in zip(ranking, ranking[1:]))
    assert calibration.choice.tokens_per_s >= calibration.plain.tokens_per_s
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
    measured = report["tree_calibration"]["measured"]["gsm8k"]
    assert measured["tau"] == pytest.approx(report["benchmarks"]["gsm8k"]["acceptance_length"], abs=1e-4)
    out = capsys.readouterr().out
    assert ("--tree auto: total tokens" in out) != ("--tree auto: plain decoding" in out) and "predicted τ" in out
    assert "has no prompts beyond" not in out  # gsm8k's third prompt calibrates, the first two are evaluated
    if choice["total_tokens"] > 1:
        assert report["speculation_gate"]["break_even_tau"] > 1
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


def test_calibrate_on_chooses_the_tree_from_the_named_benchmarks_prompts_only(checkpoint, random_verifier_dir, tmp_path, capsys):  # noqa: F811
    """A math specialist evaluated on math and chat: its tree is chosen on math, as it would be deployed."""
    output = tmp_path / "r.json"
    benchmarks = [f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", f"mt_bench:{FIXTURES / 'mt_bench.jsonl'}"]
    main(["eval", "--drafters", str(checkpoint), "--verifier", str(random_verifier_dir), "--benchmarks", *benchmarks, "--prompts", "1",
          "--max-new-tokens", "8", "--tree", "auto", "--total-tokens", "6", "--depth", "2", "--top-k", "2", "--calibration-prompts", "1",
          "--calibrate-on", "gsm8k", "--no-baseline", "--output", str(output)])
    report = json.loads(output.read_text())
    assert report["tree_calibration"]["calibrated_on"] == ["gsm8k"] and set(report["benchmarks"]) == {"gsm8k", "mt_bench"}
    assert "--tree auto: measuring call costs and acceptance on 1 prompts of gsm8k " in capsys.readouterr().out
    for extra, message in ((["--calibrate-on", "gsm8k"], "add --tree auto"),
                           (["--tree", "auto", "--calibrate-on", "gsm8k", "chat"], "--calibrate-on chat: not among --benchmarks (gsm8k, mt_bench)")):
        with pytest.raises(SystemExit) as exit_info:
            main(["eval", "--drafters", str(checkpoint), "--verifier", str(random_verifier_dir), "--benchmarks", *benchmarks,
                  "--output", str(tmp_path / "x.json"), *extra])
        assert exit_info.value.code == 1 and message in capsys.readouterr().err
