"""Tree verification and lossless decoding on verifier families beyond Llama: Qwen2/3, Mistral and
Gemma-2/3, under sdpa and eager attention, with sliding windows (16) far shorter than the prompts and
generations, and on mixed sliding/full layer stacks."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
)

from taps_train.cli import main
from taps_train.data.corpora import gsm_symbolic_conversations
from taps_train.drafter import Drafter, drafter_config
from taps_train.errors import TapsError
from taps_train.decoding.decoder import SpeculativeDecoder, Strategy, single
from taps_train.decoding.draft import DrafterState
from taps_train.decoding.tree import DraftTree, TreeConfig, pack, select_nodes
from taps_train.decoding.verify import VerifierSession, layer_windows
from taps_train.verifier.offline.tokenizer import EOT, train_chat_tokenizer
from tests.eval.test_eval import FIXTURES
from tests.decoding.test_spec import greedy_reference, random_drafter

WINDOW = 16
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "max_position_embeddings": 256}


@dataclass(frozen=True)
class Family:
    name: str
    config: type[PretrainedConfig]
    attention: str
    extra: dict = field(default_factory=dict)


FAMILIES = [
    Family("llama-eager", LlamaConfig, "eager", {"num_hidden_layers": 2}),
    Family("llama-sdpa", LlamaConfig, "sdpa", {"num_hidden_layers": 2}),
    # layer 0 full, layer 1 sliding
    Family("qwen2", Qwen2Config, "sdpa", {"num_hidden_layers": 2, "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    Family("qwen3", Qwen3Config, "sdpa", {"num_hidden_layers": 2}),
    Family("mistral", MistralConfig, "sdpa", {"num_hidden_layers": 2, "sliding_window": WINDOW}),
    # sliding/full alternating, attention and final-logit softcapping (eager only)
    Family("gemma2", Gemma2Config, "eager", {"num_hidden_layers": 2, "sliding_window": WINDOW, "query_pre_attn_scalar": 8}),
    # per-layer-type RoPE (local 1e4, global 1e6), scaled embeddings, q/k norms
    Family("gemma3", Gemma3TextConfig, "sdpa", {"num_hidden_layers": 3, "sliding_window": WINDOW, "query_pre_attn_scalar": 8,
                                                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}),
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    texts = [m["content"] for c in gsm_symbolic_conversations(60, seed=7) for m in c.messages]
    return train_chat_tokenizer(texts, vocab_size=400)


def build_verifier(family: Family, tokenizer: PreTrainedTokenizerBase, path: Path) -> Path:
    """A saved HF directory (model + tokenizer) of a tiny random verifier of `family`."""
    config = family.config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.convert_tokens_to_ids(EOT), **SIZES, **family.extra)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
def verifier(request, tokenizer, tmp_path_factory) -> PreTrainedModel:
    family = request.param
    path = build_verifier(family, tokenizer, tmp_path_factory.mktemp(family.name))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=family.attention).eval()
    assert model.config._attn_implementation == family.attention
    return model


@pytest.fixture(scope="module")
def prompts(tokenizer) -> dict[str, list[int]]:
    """One prompt inside the window (generation grows past it), one 3x longer than it."""
    ids = tokenizer(gsm_symbolic_conversations(1, seed=11)[0].messages[0]["content"])["input_ids"]
    assert len(ids) >= 3 * WINDOW
    return {"short": ids[: WINDOW // 2], "long": ids[: 3 * WINDOW]}


def path_tokens(tree: DraftTree, node: int) -> list[int]:
    """Tokens from the root to `node`, root first."""
    path = []
    while node >= 0:
        path.append(int(tree.tokens[node]))
        node = int(tree.parents[node])
    return path[::-1]


def plain_forward(model: PreTrainedModel, ids: list[int]):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True)


def assert_tree_equals_paths(model: PreTrainedModel, session: VerifierSession, prefix: list[int], tree: DraftTree) -> None:
    """Every node's tree logits/hidden state equal those of its root-to-node path run after `prefix`."""
    logits, hidden = session.tree_forward(pack(tree, session.length))
    for node in range(len(tree)):
        plain = plain_forward(model, prefix + path_tokens(tree, node))
        torch.testing.assert_close(logits[node], plain.logits[0, -1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(hidden[-1][node], plain.hidden_states[-1][0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prompt_kind", ["short", "long"])
def test_tree_node_logits_equal_their_paths_across_commits(verifier, prompts, prompt_kind):
    """Prefill, verify a tree, commit its deepest path (non-contiguous in the packed tree), verify again:
    each step equals plain forwards, past the sliding window."""
    prompt = prompts[prompt_kind]
    session = VerifierSession(verifier)
    logits, hidden = session.prefill(torch.tensor(prompt[:-1]))
    torch.testing.assert_close(logits, plain_forward(verifier, prompt[:-1]).logits[0, -1], atol=1e-4, rtol=1e-4)  # only the last position's
    state = DrafterState(random_drafter(verifier, seed=2))
    state.extend(hidden, torch.tensor(prompt[1:]))
    tree = state.draft(prompt[-1], TreeConfig(total_tokens=24, depth=3, top_k=4))
    prefix = prompt[:-1]
    for _ in range(3):
        assert_tree_equals_paths(verifier, session, prefix, tree)
        deepest = int(tree.depths.argmax())
        path = [deepest]
        while path[-1] > 0:
            path.append(int(tree.parents[path[-1]]))
        session.commit(path[::-1])
        prefix = prefix + path_tokens(tree, deepest)
    assert session.length == len(prefix) > len(prompt) + WINDOW // 2


def with_greedy_branch(reference: list[int], start: int) -> Strategy:
    """A strategy that grafts the verifier's own greedy continuation of the root (from `reference`) onto
    the drafted tree as a chain after the drafted nodes, dropping drafted subtrees that start with the
    same token. The chain is then accepted whole, so every round commits the root and `levels` nodes
    that are not contiguous in the packed tree, and the root's index in `reference` advances by `levels + 1`."""
    cursor = [start]

    def strategy(trees: list[DraftTree], config: TreeConfig) -> tuple[DraftTree, int]:
        tree, at = trees[0], cursor[0]
        assert int(tree.tokens[0]) == reference[at]
        chain = reference[at + 1 : at + 1 + config.levels]
        top = torch.tensor([path_tokens(tree, node)[1:2] != chain[:1] for node in range(len(tree))])
        tree = select_nodes(tree, top.nonzero().flatten())
        n, length = len(tree), len(chain)
        ones = torch.ones(length)
        grafted = DraftTree(torch.cat([tree.tokens, torch.tensor(chain)]), torch.cat([tree.parents, torch.tensor([0] + list(range(n, n + length - 1)))]),
                            torch.cat([tree.depths, torch.arange(1, length + 1)]), torch.cat([tree.probs, ones]),
                            torch.cat([tree.confidence, ones]), torch.cat([tree.entropy, 0 * ones]))
        cursor[0] = at + length + 1
        return grafted, 0

    return strategy


@pytest.mark.parametrize("prompt_kind", ["short", "long"])
@pytest.mark.parametrize("graft", [False, True], ids=["random-drafter", "greedy-branch"])
def test_greedy_speculative_equals_hf_generate_past_the_window(verifier, prompts, prompt_kind, graft):
    prompt, new_tokens, tree = prompts[prompt_kind], 3 * WINDOW, TreeConfig(total_tokens=10, depth=3, top_k=3)
    reference = greedy_reference(verifier, prompt, new_tokens + tree.levels + 1, [])
    strategy = with_greedy_branch(prompt + reference, len(prompt)) if graft else single
    decoder = SpeculativeDecoder(verifier, [random_drafter(verifier, seed=len(prompt))], tree, strategy=strategy, eos_token_ids=[])
    result = decoder.generate(prompt, max_new_tokens=new_tokens)
    assert result.tokens == reference[:new_tokens]
    if graft:
        assert all(r.accepted == tree.levels for r in result.rounds[:-1])


# --- refusals ------------------------------------------------------------------------------------


def test_flash_attention_verifier_is_refused_in_one_line(random_verifier_dir):
    model = AutoModelForCausalLM.from_pretrained(random_verifier_dir)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(TapsError, match="cannot apply a tree mask; load the verifier with attn_implementation one of eager, sdpa"):
        VerifierSession(model)


def test_layer_types_without_a_prefix_cache_are_refused():
    config = Qwen2Config(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(TapsError, match="layer type 'linear_attention' cannot verify a draft tree"):
        layer_windows(config)


def test_layer_windows_per_family():
    assert layer_windows(LlamaConfig()) == {"full_attention": None}
    assert layer_windows(MistralConfig(sliding_window=WINDOW)) == {"sliding_attention": WINDOW}
    assert layer_windows(Gemma3TextConfig(sliding_window=WINDOW)) == {"sliding_attention": WINDOW, "full_attention": None}


# --- drafter config ------------------------------------------------------------------------------


def test_gemma3_drafter_takes_the_global_rope_and_stays_a_silu_llama_layer():
    verifier_config = Gemma3TextConfig(**SIZES, num_hidden_layers=2, vocab_size=100)
    assert verifier_config.rope_parameters["full_attention"]["rope_theta"] == 1e6  # local layers: 1e4
    config = drafter_config(verifier_config)
    assert config.rope_parameters["rope_theta"] == 1e6 and config.rope_parameters["rope_type"] == "default"
    assert config.hidden_act == "silu" and config.head_dim == 8
    expected = 1e6 ** (-torch.arange(0, 8, 2, dtype=torch.float32) / 8)
    torch.testing.assert_close(Drafter(config).rotary_emb.inv_freq, expected)


def test_multimodal_config_gives_the_text_models_drafter():
    verifier_config = Gemma3Config(text_config=Gemma3TextConfig(**SIZES, num_hidden_layers=2, vocab_size=100))
    config = drafter_config(verifier_config)
    assert (config.hidden_size, config.vocab_size, config.num_key_value_heads, config.head_dim) == (32, 100, 2, 8)


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("family", [f for f in FAMILIES if f.name != "llama-eager"], ids=lambda family: family.name)
def test_cache_fit_eval_export_through_the_cli(family, tokenizer, tmp_path, monkeypatch):
    """~2 s a family. The CLI loads each verifier with its default attention (eager for Gemma-2)."""
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    verifier = str(build_verifier(family, tokenizer, tmp_path / "verifier"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: t\nseed: 0\nmax_length: 128\nsources:\n  - source: gsm_symbolic\n    args: {size: 24, seed: 3}\n    heldout: 4\n    count: 8\n")
    main(["cache", "--recipe", str(recipe), "--verifier", verifier])
    main(["fit", "--model", "taps_train.training.Eagle2Module", "--model.verifier", verifier, "--data", "taps_train.data.datamodule.DrafterDataModule",
          "--data.recipe", str(recipe), "--data.batch_size", "4", "--trainer.accelerator", "cpu", "--trainer.max_steps", "2",
          "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path)])
    checkpoint = str(next((tmp_path / "checkpoints").glob("*.ckpt")))
    main(["eval", "--drafters", checkpoint, "--verifier", verifier, "--benchmarks", f"gsm8k:{FIXTURES / 'gsm8k.jsonl'}", "--prompts", "1",
          "--max-new-tokens", str(2 * WINDOW), "--total-tokens", "10", "--depth", "2", "--top-k", "3", "--output", str(tmp_path / "r.json")])
    assert json.loads((tmp_path / "r.json").read_text())["benchmarks"]["gsm8k"]["new_tokens"] > 0
    main(["export", checkpoint, "--out", str(tmp_path / "export"), "--verifier", verifier])
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["hidden_act"] == "silu" and exported["head_dim"] == SIZES["head_dim"]
    assert exported["rope_theta"] == (1e6 if family.config is Gemma3TextConfig else 1e4)
