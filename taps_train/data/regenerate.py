"""Response regeneration: replace a source's assistant turns with the verifier's own replies.

A drafter learns to predict the verifier; training on the verifier's own text (EAGLE-3, SpecForge)
rather than on what ChatGPT once wrote removes a distribution shift. Turns are regenerated in order,
so later prompts see the regenerated earlier replies. Results are cached as JSONL, one line per
conversation, appended chunk by chunk: an interrupted run resumes where it stopped, and each chunk has
its own seed so the result does not depend on where it was interrupted. Two processes regenerating
into one file take turns (a lock beside it): the second finds the replies done.

The replies come from a `ReplyGenerator`: transformers' batched `generate` on the loaded verifier, or a serving
engine (taps_train/data/vllm_generation.py: vLLM), started only when something is left to regenerate.
"""

import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Protocol

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from taps_train import files
from taps_train.data.chat_format import render_chat
from taps_train.data.conversation import Conversation
from taps_train.files import exclusive_beside
from taps_train.data.recipe import Regenerate

CHUNK = 32  # conversations per chunk, by default: what a kill can lose (~30 s with transformers, fp32 SmolLM2 math on 2 cores)
MAX_SEED = 2**63  # vLLM's per-request seeds go through torch.Generator.manual_seed


class ReplyGenerator(Protocol):
    name: str  # recorded in the key of the regenerated file: engines sample differently

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_token_ids: list[int], temperature: float,
                 seeds: list[int]) -> list[list[int]]:
        """Each prompt's generated ids, greedy at temperature 0, else sampled (seeded per prompt where the engine can)."""


class TransformersGenerator:
    """The loaded verifier's batched `generate`, prompts left-padded; sampling draws from torch's global generator,
    which `regenerate` seeds per chunk."""

    name = "transformers"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase):
        self.model, self.tokenizer = model, tokenizer

    def generate(self, prompts: list[list[int]], max_new_tokens: int, stop_token_ids: list[int], temperature: float,
                 seeds: list[int]) -> list[list[int]]:
        encoded = self.tokenizer.pad({"input_ids": prompts}, padding=True, padding_side="left", return_tensors="pt")
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0} if temperature > 0 else {"do_sample": False}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (stop_token_ids or [None])[0]
        output = self.model.generate(**encoded.to(self.model.device), max_new_tokens=max_new_tokens,
                                     eos_token_id=stop_token_ids,  # the model's own end of turn (ChatML's <|im_end|>), not only its generation config's
                                     pad_token_id=pad, **sampling)
        return [_until_stop(row.tolist(), stop_token_ids) for row in output[:, encoded["input_ids"].shape[1]:]]


def _until_stop(ids: list[int], stops: list[int]) -> list[int]:
    """`ids` up to and including the first stop id (what follows it in a batch is padding)."""
    for index, token in enumerate(ids):
        if token in stops:
            return ids[: index + 1]
    return ids


def regenerate(
    conversations: list[Conversation],
    start_generator: Callable[[], AbstractContextManager[ReplyGenerator]],
    tokenizer: PreTrainedTokenizerBase,
    stop_token_ids: list[int],
    spec: Regenerate,
    max_length: int,
    cache_file: Path,
    chunk: int | None = None,
    start_from: tuple[Path, str] | None = None,
) -> list[Conversation]:
    """The conversations with their assistant turns regenerated, read back from `cache_file` where a previous run
    wrote them; `start_generator()` is entered only when some are left to do. `chunk` (default `CHUNK`): conversations
    per batch, seed and write; a file is always written with one chunk size. `start_from` (a file of replies and the
    engine that wrote them): what a `cache_file` that does not exist yet begins with."""
    chunk = chunk or CHUNK
    with _writing(cache_file):
        if start_from and not cache_file.exists() and start_from[0].exists():
            _copy_replies(*start_from, cache_file)
        done = _read_done(cache_file, conversations, chunk)
        if len(done) == len(conversations):
            return done
        with start_generator() as generator:
            return _regenerate_into(conversations, done, generator, tokenizer, stop_token_ids, spec, max_length, cache_file, chunk)


def _writing(cache_file: Path) -> AbstractContextManager[None]:
    """One writer of a replies file at a time, across processes."""
    return exclusive_beside(cache_file, f"another regeneration into {cache_file}")


def _copy_replies(source: Path, engine: str, target: Path) -> None:
    with _writing(source):
        text = source.read_text(errors="replace")
    files.write_text(target, text)
    print(f"regeneration: starting from the {text.count(chr(10)):,} greedy replies {engine} gave ({source})", file=sys.stderr, flush=True)


def transformers_generator(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Callable[[], AbstractContextManager[ReplyGenerator]]:
    """`regenerate`'s `start_generator` for a loaded model."""
    return lambda: nullcontext(TransformersGenerator(model, tokenizer))


def _regenerate_into(conversations: list[Conversation], done: list[Conversation], generator: ReplyGenerator,
                     tokenizer: PreTrainedTokenizerBase, stops: list[int], spec: Regenerate, max_length: int,
                     cache_file: Path, chunk_size: int) -> list[Conversation]:
    """`regenerate` from `done` on, with the lock of `cache_file` held."""
    kept, tokens, began = 0, 0, time.perf_counter()
    with open(cache_file, "a") as out, tqdm(total=len(conversations), initial=len(done), desc=f"regenerating replies ({generator.name})",
                                            unit="conv") as bar:
        for start in range(len(done), len(conversations), chunk_size):
            seed = (spec.seed * 1_000_003 + start) % MAX_SEED
            torch.manual_seed(seed)
            originals = conversations[start : start + chunk_size]
            chunk, generated = _regenerate_chunk(originals, generator, tokenizer, stops, spec, max_length, seed)
            tokens += generated
            # No reply could be generated (no user turn before any reply, or no room within max_length):
            # the conversation keeps its original text rather than leaving a hole in the sample positions.
            chunk = [new if new.messages else original for new, original in zip(chunk, originals)]
            kept += sum(new is original for new, original in zip(chunk, originals))
            for conversation in chunk:
                out.write(json.dumps({"id": conversation.id, "messages": conversation.messages}) + "\n")
            out.flush()
            done += chunk
            bar.update(len(chunk))
            bar.set_postfix_str(f"{tokens / (time.perf_counter() - began):.0f} tokens/s")
    if kept:
        print(f"regeneration: {kept} conversations kept their original replies (no user turn before a reply, or no room for one within max_length)")
    return done[: len(conversations)]


def _read_done(cache_file: Path, conversations: list[Conversation], chunk: int) -> list[Conversation]:
    """The valid records of a previous run, in order; reading stops at the first cut, damaged or foreign
    line, and when that leaves conversations to do, the file is trimmed to what is kept (rewritten only then).

    An unfinished run resumes on a chunk boundary (seeds are per chunk); a finished one is kept whole,
    or its last, shorter chunk would be regenerated on every call. Records beyond `conversations` are a larger
    selection's work (a recipe's first N conversations share its file): they are read past, never trimmed.
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
    if len(done) == len(conversations):
        return done
    done = done[: len(done) // chunk * chunk]
    if len(done) != len(lines) - 1 or lines[-1]:
        files.write_text(cache_file, "".join(json.dumps({"id": c.id, "messages": c.messages}) + "\n" for c in done))
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
def _regenerate_chunk(chunk: list[Conversation], generator: ReplyGenerator, tokenizer: PreTrainedTokenizerBase, stops: list[int],
                      spec: Regenerate, max_length: int, seed: int) -> tuple[list[Conversation], int]:
    """Regenerate turn by turn across the chunk, batching every conversation waiting for a reply; also the number
    of tokens generated."""
    messages = [[] for _ in chunk]
    finished = [False] * len(chunk)
    generated = 0
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
        prompts = {i: tokenizer(render_chat(tokenizer, messages[i]), add_special_tokens=False)["input_ids"] for i in waiting}
        for i in waiting:  # no room left for a reply within max_length: the conversation ends here
            if len(prompts[i]) >= max_length - 1:
                finished[i] = True
        waiting = [i for i in waiting if not finished[i]]
        if not waiting:
            continue
        budget = min(spec.max_new_tokens, max_length - max(len(prompts[i]) for i in waiting))
        seeds = [(seed + turn * len(chunk) + i) % MAX_SEED for i in waiting]
        replies = generator.generate([prompts[i] for i in waiting], budget, stops, spec.temperature, seeds)
        for i, reply in zip(waiting, replies):
            generated += len(reply)
            messages[i].append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True).strip()})
    return [Conversation(c.id, _ending_with_reply(m)) for c, m in zip(chunk, messages)], generated


def _ending_with_reply(messages: list[dict]) -> list[dict]:
    """Drop trailing non-assistant turns so each conversation ends with a reply."""
    messages = list(messages)
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages
