"""Response regeneration with the random verifier: the verifier's own replies replace the dataset's,
prompts are kept, results are deterministic, and an interrupted run resumes to the same file."""

import json

import pytest
import torch

from taps_train.data import regenerate as regen
from taps_train.data.conversation import Conversation
from taps_train.data.prepare import RecipePreparer
from taps_train.data.recipe import Regenerate, load_recipe
from taps_train.verifier import load_verifier
from taps_train.verifier.generation import stop_token_ids

GREEDY = Regenerate(temperature=0.0, max_new_tokens=6, seed=0)
SAMPLED = Regenerate(temperature=1.0, max_new_tokens=6, seed=0)


pytestmark = pytest.mark.usefixtures("taps_home")  # conftest: a temporary $TAPS_HOME


@pytest.fixture(scope="module")
def verifier(random_verifier_dir):
    return load_verifier(str(random_verifier_dir))


def conversations(n: int = 7) -> list[Conversation]:
    result = []
    for i in range(n):
        messages = [{"role": "user", "content": f"What is {i} + {i + 3}?"}, {"role": "assistant", "content": f"ORIGINAL reply {i}"}]
        if i % 2:
            messages += [{"role": "user", "content": f"And times {i}?"}, {"role": "assistant", "content": f"ORIGINAL second reply {i}"}]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "Answer briefly."})
        result.append(Conversation(f"c{i}", messages))
    return result


def greedy_reply(verifier, messages: list[dict]) -> str:
    prompt = verifier.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = verifier.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = verifier.model.generate(**ids, max_new_tokens=GREEDY.max_new_tokens, do_sample=False,
                                      eos_token_id=verifier.model.generation_config.eos_token_id, pad_token_id=verifier.tokenizer.pad_token_id)
    return verifier.tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def run(verifier, items, spec, path, max_length: int = 256) -> list[Conversation]:
    return regen.regenerate(items, regen.transformers_generator(verifier.model, verifier.tokenizer), verifier.tokenizer,
                            stop_token_ids(verifier.model, verifier.tokenizer), spec, max_length, path)


def test_assistant_turns_are_the_verifiers_greedy_replies_and_prompts_are_kept(verifier, tmp_path, monkeypatch):
    monkeypatch.setattr(regen, "CHUNK", 1)  # unbatched, so replies compare exactly with plain `generate`
    source = conversations(4)
    result = run(verifier, source, GREEDY, tmp_path / "regen.jsonl")
    assert [c.id for c in result] == [c.id for c in source]
    for original, new in zip(source, result):
        assert [m["role"] for m in new.messages] == [m["role"] for m in original.messages]
        history = []
        for before, after in zip(original.messages, new.messages):
            if before["role"] == "assistant":
                assert "ORIGINAL" not in after["content"]
                assert after["content"] == greedy_reply(verifier, history)  # conditioned on the regenerated history
            else:
                assert after == before
            history.append(after)


def test_regeneration_is_deterministic_and_batched_chunks_cover_every_conversation(verifier, tmp_path):
    first = run(verifier, conversations(), GREEDY, tmp_path / "a.jsonl")
    second = run(verifier, conversations(), GREEDY, tmp_path / "b.jsonl")
    assert first == second
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [c.id for c in conversations()]


def test_sampling_is_seeded(verifier, tmp_path):
    first = run(verifier, conversations(), SAMPLED, tmp_path / "a.jsonl")
    assert run(verifier, conversations(), SAMPLED, tmp_path / "b.jsonl") == first
    other = run(verifier, conversations(), Regenerate(temperature=1.0, max_new_tokens=6, seed=1), tmp_path / "c.jsonl")
    assert other != first


@pytest.mark.parametrize("spec", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_resume_from_a_partial_file_with_a_cut_last_line(verifier, tmp_path, monkeypatch, spec):
    monkeypatch.setattr(regen, "CHUNK", 2)
    uninterrupted = run(verifier, conversations(), spec, tmp_path / "full.jsonl")
    full_text = (tmp_path / "full.jsonl").read_text()
    lines = full_text.splitlines(keepends=True)
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # killed while writing line 4

    regenerated = []
    real_chunk = regen._regenerate_chunk

    def counting_chunk(chunk, *args):
        regenerated.extend(c.id for c in chunk)
        return real_chunk(chunk, *args)

    monkeypatch.setattr(regen, "_regenerate_chunk", counting_chunk)
    resumed = run(verifier, conversations(), spec, partial)
    assert regenerated == ["c2", "c3", "c4", "c5", "c6"]  # resumes at the chunk boundary before the cut
    assert resumed == uninterrupted
    assert partial.read_text() == full_text

    regenerated.clear()
    assert run(verifier, conversations(), spec, partial) == uninterrupted  # complete: nothing to do
    assert regenerated == []


def test_a_smaller_selection_reads_a_larger_one_s_file_and_leaves_it_whole(verifier, tmp_path, monkeypatch):
    """A recipe's first N conversations share its replies file (a learning curve's smaller sizes): reading them must
    not cut the replies of the rest, which cost the larger run its regeneration time."""
    monkeypatch.setattr(regen, "CHUNK", 2)
    path = tmp_path / "r.jsonl"
    everything = run(verifier, conversations(), GREEDY, path)
    written = path.read_bytes()

    def no_engine():
        raise AssertionError("an engine started for replies already in the file")

    for size in (1, 3, 4):
        first = regen.regenerate(conversations(size), no_engine, verifier.tokenizer, stop_token_ids(verifier.model, verifier.tokenizer),
                                 GREEDY, 256, path)
        assert first == everything[:size]
        assert path.read_bytes() == written
    assert regen.regenerate(conversations(), no_engine, verifier.tokenizer, stop_token_ids(verifier.model, verifier.tokenizer),
                            GREEDY, 256, path) == everything


def test_conversation_ends_where_the_context_is_full(verifier, tmp_path):
    long_question = "How many apples are left? " * 4
    item = Conversation("long", [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "x"},
                                 {"role": "user", "content": long_question}, {"role": "assistant", "content": "y"}])
    prompt = verifier.tokenizer.apply_chat_template(item.messages[:3], tokenize=False, add_generation_prompt=True)
    budget = len(verifier.tokenizer(prompt, add_special_tokens=False)["input_ids"])
    [result] = run(verifier, [item], GREEDY, tmp_path / "r.jsonl", max_length=budget)
    assert [m["role"] for m in result.messages] == ["user", "assistant"]  # no room for the second reply


def test_recipe_option_regenerates_once_and_records_it_in_the_cache(verifier, random_verifier_dir, tmp_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in conversations(6)))
    recipe = tmp_path / "regen.yaml"
    recipe.write_text(f"name: regen\nmax_length: 128\nsources:\n  - source: jsonl\n    args: {{path: {data}}}\n"
                      "    heldout: 1\n    count: 5\n    regenerate: {temperature: 0.0, max_new_tokens: 6, seed: 0}\n")
    preparer = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache")
    [source] = preparer.sources()
    assert all("ORIGINAL" not in m["content"] for c in source.conversations for m in c.messages)
    [cache] = preparer.build([source])
    assert cache.manifest["fingerprint"]["regenerated"] == {"temperature": 0.0, "max_new_tokens": 6, "seed": 0}
    assert len(list((tmp_path / "cache" / "regenerated").glob("*.jsonl"))) == 1

    monkeypatch.setattr(regen, "_regenerate_chunk", lambda *a: pytest.fail("regenerated twice"))
    [again] = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache").sources()
    assert again.conversations == source.conversations and again.directory == source.directory
    recipe.write_text(recipe.read_text().replace("    regenerate: {temperature: 0.0, max_new_tokens: 6, seed: 0}\n", ""))
    [fixed_text] = RecipePreparer(load_recipe(recipe), str(random_verifier_dir), tmp_path / "cache").sources()
    assert fixed_text.directory != source.directory  # fixed and regenerated text never share a cache


def test_leading_assistant_turns_and_prompts_without_room_do_not_crash(verifier, tmp_path, capsys):
    items = [Conversation("lead", [{"role": "assistant", "content": "Hello! Ask me."}, {"role": "user", "content": "What is 2 + 2?"},
                                   {"role": "assistant", "content": "ORIGINAL"}]),
             Conversation("only-reply", [{"role": "assistant", "content": "ORIGINAL monologue"}]),
             Conversation("too-long", [{"role": "user", "content": "How many apples? " * 40}, {"role": "assistant", "content": "ORIGINAL"}])]
    lead, only_reply, too_long = run(verifier, items, GREEDY, tmp_path / "r.jsonl", max_length=64)
    assert [m["role"] for m in lead.messages] == ["user", "assistant"] and lead.messages[1]["content"] != "ORIGINAL"
    assert only_reply == items[1] and too_long == items[2]  # nothing to regenerate: kept as they were, and counted
    assert "2 conversations kept their original replies" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["cut", "not json", "wrong type", "foreign id", "deep nesting"])
def test_damaged_lines_in_the_resume_file_are_dropped_from_there(verifier, tmp_path, damage):
    items = conversations(40)
    path = tmp_path / "r.jsonl"
    first = run(verifier, items, GREEDY, path)
    lines = path.read_text().split("\n")
    bad = {"cut": lines[35][:10], "not json": "{{{", "wrong type": json.dumps({"id": items[35].id, "messages": "hi"}),
           "foreign id": json.dumps({"id": "other", "messages": []}), "deep nesting": "[" * 100_000}[damage]
    path.write_text("\n".join(lines[:35] + [bad] + lines[36:]))
    assert run(verifier, items, GREEDY, path) == first  # resumed at chunk 32 and regenerated the rest identically
