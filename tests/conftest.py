"""Shared fixtures: a tiny *random* Llama verifier for unit tests (seconds to build) and the real
offline tiny verifier for integration tests (built once per machine, then reused)."""

import importlib.util
import json
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from taps_train.cli import main
from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.verifier.offline.tokenizer import EOT, train_chat_tokenizer

# Unit tests use tiny models whose ops are too small to gain from threads; one thread also keeps
# timings stable when the machine is shared. Real models get the machine's threads back (`machine_threads`).
MACHINE_THREADS = torch.get_num_threads()
torch.set_num_threads(1)


@contextmanager
def machine_threads():
    """Torch's threads as a user's process has them, for work on real models (one thread made the tiny verifier's
    build take 18 minutes instead of 8 on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(MACHINE_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _random_verifier(path: Path, seed: int) -> Path:
    texts = [m["content"] for c in gsm_symbolic_conversations(60, seed=7) for m in c.messages]
    tokenizer = train_chat_tokenizer(texts, vocab_size=400)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOT),
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def taps_home(tmp_path, monkeypatch) -> Path:
    """A temporary $TAPS_HOME: feature caches, conversions and weight-hash memos never touch ~/.cache."""
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="session")
def random_verifier_dir(tmp_path_factory) -> Path:
    """A saved HF model directory: BPE tokenizer (~400 tokens) + 2-layer hidden-32 random Llama."""
    return _random_verifier(tmp_path_factory.mktemp("random_verifier"), seed=0)


@pytest.fixture(scope="session")
def other_verifier_dir(tmp_path_factory) -> Path:
    """Same shapes and tokenizer as `random_verifier_dir`, different weights."""
    return _random_verifier(tmp_path_factory.mktemp("other_verifier"), seed=1)


@pytest.fixture(scope="session")
def tiny_verifier_dir() -> Path:
    """The real offline tiny verifier under $TAPS_HOME (builds it on first use, ~8 min on 2 cores)."""
    from taps_train.verifier.offline.tiny import ensure_tiny_verifier

    with machine_threads():
        return ensure_tiny_verifier()


STANDIN_SMALL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2}


@pytest.fixture(scope="session")
def standin(tmp_path_factory) -> Path:
    """A small Llama-3-shaped stand-in verifier: 128,256-token vocabulary, GQA, untied head, sharded
    bf16 safetensors with embedding and head in different shards; 2 layers of hidden 64 (seconds)."""
    from taps_train.verifier.offline.standin import build_standin

    return build_standin(tmp_path_factory.mktemp("standin") / "model", **STANDIN_SMALL)


def write_source(path: Path, n: int, seed: int) -> Path:
    """`n` conversations of varied length (every third one multi-turn), cut from gsm_symbolic problems."""
    records = []
    for i, conversation in enumerate(gsm_symbolic_conversations(n, seed)):
        question, answer = conversation.messages[0]["content"], conversation.messages[1]["content"]
        messages = [{"role": "user", "content": question[: 30 + 17 * i % 90]}, {"role": "assistant", "content": answer[: 20 + 29 * i % 150]}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": answer[-40:]}]
        records.append({"id": f"{seed}-{i}", "messages": messages})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Hostile-input tests (tests/*/test_hostile_*.py): a YAML alias bomb, and what every refusal must be.
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def bench_script(name: str) -> ModuleType:
    """bench/<name>.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for(condition, what: str, timeout_s: float = 90.0) -> None:
    """Poll `condition` every 0.1 s; fail naming `what` after `timeout_s` (tests of processes that take turns)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
