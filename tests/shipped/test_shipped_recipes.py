"""Every shipped recipe builds end to end with `taps-train cache`.

Offline recipes run against the real tiny verifier, cut to a few samples each (their whole selection is checked
without building it). Hub recipes (MathInstruct, ShareGPT) read generated files in their published layouts from a
local Hugging Face cache (HF_HUB_OFFLINE), the way a machine that downloaded them once would, against a random Llama
with a 2,048-token context (the recipes' max_length). Each build must produce every sample it selects, with checksums
that verify, and put the recipe's own text into the cache.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from taps_train.data.feature_cache import FeatureCache
from taps_train.data.recipe import load_recipe, select
from taps_train.verifier.offline.tokenizer import EOT, train_chat_tokenizer

ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "data_recipes").glob("*.yaml"))
HUB_FILES = {  # source -> (hub dataset repo, file name): the defaults of taps_train.data.sources
    "mathinstruct": ("TIGER-Lab/MathInstruct", "MathInstruct.json"),
    "sharegpt": ("Aeala/ShareGPT_Vicuna_unfiltered", "ShareGPT_V4.3_unfiltered_cleaned_split.json"),
}
OFFLINE_RECIPES = [p for p in RECIPES if p.stem.startswith(("tiny_", "smol_"))]  # packaged corpora: no hub
HUB_RECIPES = [p for p in RECIPES if p not in OFFLINE_RECIPES]
HUB_RECORDS = 71_000  # more than the largest hub selection (500 held-out + 70,000)


def mathinstruct_records(n: int) -> list[dict]:
    return [{"source": "fixture", "instruction": f"What is {i} plus {i % 97}?", "output": f"{i} plus {i % 97} is {i + i % 97}."}
            for i in range(n)]


def sharegpt_records(n: int) -> list[dict]:
    return [{"id": f"chat-{i}", "conversations": [{"from": "human", "value": f"Tell me about the number {i}."},
                                                  {"from": "gpt", "value": f"The number {i} comes after {i - 1}."}]}
            for i in range(n)]


def write_hub_cache(root: Path) -> Path:
    """A Hugging Face hub cache holding both datasets, as `hf_hub_download` leaves it."""
    revision = "0" * 40
    for source, records in (("mathinstruct", mathinstruct_records), ("sharegpt", sharegpt_records)):
        repo, filename = HUB_FILES[source]
        repo_dir = root / f"datasets--{repo.replace('/', '--')}"
        (repo_dir / "refs").mkdir(parents=True)
        (repo_dir / "refs" / "main").write_text(revision)
        (repo_dir / "snapshots" / revision).mkdir(parents=True)
        (repo_dir / "snapshots" / revision / filename).write_text(json.dumps(records(HUB_RECORDS)))
    return root


def long_context_verifier(path: Path) -> Path:
    """A one-layer random Llama with the recipes' 2,048-token context and a tokenizer trained on the fixture text."""
    texts = [r["instruction"] + " " + r["output"] for r in mathinstruct_records(300)]
    texts += [t["value"] for r in sharegpt_records(300) for t in r["conversations"]]
    tokenizer = train_chat_tokenizer(texts, vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.convert_tokens_to_ids(EOT),
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run_cache(recipe: Path, verifier: Path, cache_dir: Path, env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-m", "taps_train", "cache", "--recipe", str(recipe), "--verifier", str(verifier),
                             "--cache-dir", str(cache_dir)], capture_output=True, text=True, env={**os.environ, **env}, timeout=1800)
    assert result.returncode == 0, f"{recipe.name} failed:\n{result.stderr[-3000:]}"
    return result.stdout


def check_built(recipe_path: Path, stdout: str, verifier: Path, expected_text: dict[str, str]) -> None:
    """One ready cache per source, holding at least the recipe's samples, checksums intact, the source's text inside."""
    recipe = load_recipe(recipe_path)
    ready = [line.removeprefix("ready: ").rsplit(" (", 1)[0] for line in stdout.splitlines() if line.startswith("ready: ")]
    assert len(ready) == len(recipe.sources), stdout
    tokenizer = AutoTokenizer.from_pretrained(verifier)
    for directory, source in zip(ready, recipe.sources):
        cache = FeatureCache(directory)
        assert len(cache) >= source.heldout + source.count
        cache.verify()
        first = tokenizer.decode(cache[0]["input_ids"])
        assert expected_text[source.source] in first, first[:300]
        assert torch.isfinite(cache[len(cache) - 1]["features"]).all()


@pytest.mark.integration
def test_every_hub_recipe_builds_from_a_local_hub_cache(tmp_path):
    assert {p.stem for p in HUB_RECIPES} == {"mathinstruct_70k", "sharegpt_70k", "mixed_35k_35k", "mixed_70k_70k"}
    env = {"HF_HUB_CACHE": str(write_hub_cache(tmp_path / "hub")), "HF_HUB_OFFLINE": "1", "TAPS_HOME": str(tmp_path / "home")}
    verifier = long_context_verifier(tmp_path / "verifier")
    for recipe in HUB_RECIPES:  # mixtures reuse the single-source caches built before them
        check_built(recipe, run_cache(recipe, verifier, tmp_path / "features", env), verifier,
                    {"mathinstruct": " plus ", "sharegpt": "Tell me about the number"})


@pytest.mark.integration
def test_every_offline_recipe_builds(tiny_verifier_dir, tmp_path):
    """Each recipe's whole selection exists in its source, and the recipe, its counts cut to a few samples, builds through
    `taps-train cache` (regeneration included) on the tiny verifier: building every sample of the SmolLM2 recipes' 14,000
    regenerations on it took 11 of CI's minutes and tested nothing more."""
    assert "tiny_chat_regen" in {p.stem for p in OFFLINE_RECIPES}
    (tmp_path / "recipes").mkdir()
    for recipe_path in OFFLINE_RECIPES:
        recipe = load_recipe(recipe_path)
        for selection in recipe.sources:
            selected = select(selection, recipe.seed)
            assert (len(selected.heldout), len(selected.train)) == (selection.heldout, selection.count), recipe_path.name
        raw = yaml.safe_load(recipe_path.read_text())
        for source in raw["sources"]:
            source.update(heldout=min(source["heldout"], 2), count=min(source["count"], 4))
        shortened = tmp_path / "recipes" / recipe_path.name
        shortened.write_text(yaml.safe_dump(raw))
        stdout = run_cache(shortened, tiny_verifier_dir, tmp_path / "features", {})
        check_built(shortened, stdout, tiny_verifier_dir, {"gsm_symbolic": "user", "sharegpt": "user"})
