"""Response regeneration: replace a source's assistant turns with the verifier's own replies.

A drafter learns to predict the verifier; training on the verifier's own text (EAGLE-3, SpecForge)
rather than on what ChatGPT once wrote removes a distribution shift. Turns are regenerated in order,
so later prompts see the regenerated earlier replies. Results are cached as JSONL, one line per
conversation, appended chunk by chunk: an interrupted run resumes where it stopped, and each chunk has
its own seed so the result does not depend on where it was interrupted. Two processes regenerating
into one file take turns (a lock beside it): the second finds the replies done.
"""

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from taps_train.data.chat_format import render_chat
from taps_train.data.conversation import Conversation
from taps_train.data.locking import exclusive
from taps_train.data.recipe import Regenerate
from taps_train.verifier.generation import stop_token_ids

CHUNK = 32


def regenerate(
    conversations: list[Conversation],
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    spec: Regenerate,
    max_length: int,
    cache_file: Path,
) -> list[Conversation]:
    with exclusive(cache_file.with_name(cache_file.name + ".lock"), f"another regeneration into {cache_file}"):
        return _regenerate_into(conversations, model, tokenizer, spec, max_length, cache_file)


def _regenerate_into(conversations: list[Conversation], model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, spec: Regenerate,
                     max_length: int, cache_file: Path) -> list[Conversation]:
    """`regenerate`, with the lock of `cache_file` held."""
    done = _read_done(cache_file, conversations)
    kept = 0
    with open(cache_file, "a") as out, tqdm(total=len(conversations), initial=len(done), desc="regenerating replies", unit="conv") as bar:
        for start in range(len(done), len(conversations), CHUNK):
            torch.manual_seed(spec.seed * 1_000_003 + start)
            originals = conversations[start : start + CHUNK]
            chunk = _regenerate_chunk(originals, model, tokenizer, spec, max_length)
            # No reply could be generated (no user turn before any reply, or no room within max_length):
            # the conversation keeps its original text rather than leaving a hole in the sample positions.
            chunk = [new if new.messages else original for new, original in zip(chunk, originals)]
            kept += sum(new is original for new, original in zip(chunk, originals))
            for conversation in chunk:
                out.write(json.dumps({"id": conversation.id, "messages": conversation.messages}) + "\n")
            out.flush()
            done += chunk
            bar.update(len(chunk))
    if kept:
        print(f"regeneration: {kept} conversations kept their original replies (no user turn before a reply, or no room for one within max_length)")
    return done[: len(conversations)]


def _read_done(cache_file: Path, conversations: list[Conversation]) -> list[Conversation]:
    """The valid records of a previous run, in order; reading stops at the first cut, damaged or foreign
    line, and the file is trimmed to what is kept (rewritten only then).

    An unfinished run resumes on a chunk boundary (seeds are per chunk); a finished one is kept whole,
    or its last, shorter chunk would be regenerated on every call.
    """
    if not cache_file.exists():
        return []
    lines = cache_file.read_text(errors="replace").split("\n")
    done = []
    for line, expected in zip(lines[:-1], conversations):
        record = _record(line)
        if record is None or record.id != expected.id:
            break
        done.append(record)
    if len(done) < len(conversations):
        done = done[: len(done) // CHUNK * CHUNK]
    if len(done) != len(lines) - 1 or lines[-1]:
        cache_file.write_text("".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in done))
    return done


def _record(line: str) -> Conversation | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("id"), str) or not isinstance(record.get("messages"), list):
        return None
    messages = record["messages"]
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages):
        return None
    return Conversation(record["id"], messages)


@torch.no_grad()
def _regenerate_chunk(chunk, model, tokenizer, spec: Regenerate, max_length: int) -> list[Conversation]:
    """Regenerate turn by turn across the chunk, batching every conversation waiting for a reply."""
    messages = [[] for _ in chunk]
    finished = [False] * len(chunk)
    stops = stop_token_ids(model, tokenizer)
    for turn in range(max(len(c.messages) for c in chunk)):
        waiting = []
        for i, conversation in enumerate(chunk):
            if finished[i] or turn >= len(conversation.messages):
                continue
            if conversation.messages[turn]["role"] == "assistant":
                if any(m["role"] == "user" for m in messages[i]):  # a reply before any prompt has nothing to answer: dropped
                    waiting.append(i)
            else:
                messages[i].append(conversation.messages[turn])
        prompts = {i: render_chat(tokenizer, messages[i]) for i in waiting}
        for i in waiting:  # no room left for a reply within max_length: the conversation ends here
            if len(tokenizer(prompts[i], add_special_tokens=False)["input_ids"]) >= max_length - 1:
                finished[i] = True
        waiting = [i for i in waiting if not finished[i]]
        if not waiting:
            continue
        encoded = tokenizer([prompts[i] for i in waiting], add_special_tokens=False, return_tensors="pt", padding=True, padding_side="left")
        width = encoded["input_ids"].shape[1]
        sampling = {"do_sample": True, "temperature": spec.temperature, "top_k": 0} if spec.temperature > 0 else {"do_sample": False}
        output = model.generate(
            **encoded.to(model.device),
            max_new_tokens=min(spec.max_new_tokens, max_length - int(encoded["attention_mask"].sum(1).max())),
            eos_token_id=stops,  # the model's own end of turn (ChatML's <|im_end|>), not only its generation config's
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops or [None])[0],
            **sampling,
        )
        for row, i in enumerate(waiting):
            reply = tokenizer.decode(output[row, width:], skip_special_tokens=True).strip()
            messages[i].append({"role": "assistant", "content": reply})
    return [Conversation(c.id, _ending_with_reply(m)) for c, m in zip(chunk, messages)]


def _ending_with_reply(messages: list[dict]) -> list[dict]:
    """Drop trailing non-assistant turns so each conversation ends with a reply."""
    messages = list(messages)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages
