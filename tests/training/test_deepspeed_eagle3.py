"""EAGLE-3 under DeepSpeed ZeRO-3 (bf16, every parameter partitioned) on two CPU processes: it trains with the
τ callback, its checkpoint directory holds the trained weights and the token maps (no frozen embedding), and
the drafter read from it decodes exactly."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from taps_train.drafter import Eagle3Drafter  # noqa: E402
from taps_train.drafter.checkpoint import load_drafter, read_checkpoint  # noqa: E402
from taps_train.decoding.decoder import SpeculativeDecoder  # noqa: E402
from taps_train.decoding.tree import TreeConfig  # noqa: E402
from taps_train.verifier.fingerprint import verifier_fingerprint  # noqa: E402
from tests.training.test_deepspeed import STEPS, _config, _fit  # noqa: E402
from tests.decoding.test_spec import greedy_reference  # noqa: E402

pytestmark = pytest.mark.deepspeed


def test_eagle3_trains_checkpoints_and_decodes_under_zero3(tmp_path, random_verifier_dir):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: ds\nseed: 0\nmax_length: 256\nsources:\n  - source: gsm_symbolic\n    args: {size: 60, seed: 5}\n    heldout: 4\n    count: 24\n")
    root = tmp_path / "run"
    config = _config(root, random_verifier_dir, recipe, stage=3, precision="bf16-mixed", kill=False)
    config["model"] = {"class_path": "taps_train.training.Eagle3Module",
                       "init_args": {"verifier": str(random_verifier_dir), "lr": 1e-3, "draft_vocab_size": 64, "ttt_steps": 3}}
    done = _fit(tmp_path, root, config)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = read_checkpoint(root / f"epoch=0-step={STEPS}.ckpt")  # a ZeRO-3 directory, partitions merged
    weights = checkpoint["state_dict"]
    assert "drafter.embed_tokens.weight" not in weights and weights["drafter.t2d"].sum() == 64
    assert weights["drafter.lm_head.weight"].shape == (64, 32)
    verifier = AutoModelForCausalLM.from_pretrained(random_verifier_dir).eval()
    fingerprint = verifier_fingerprint(str(random_verifier_dir), AutoTokenizer.from_pretrained(random_verifier_dir))
    drafter = load_drafter(root / f"epoch=0-step={STEPS}.ckpt", verifier, fingerprint)
    assert isinstance(drafter, Eagle3Drafter) and torch.equal(drafter.t2d, weights["drafter.t2d"])
    prompt = [0, 5, 17, 33, 2, 9]
    result = SpeculativeDecoder(verifier, [drafter], TreeConfig(total_tokens=12, depth=3, top_k=4), eos_token_ids=[]).generate(prompt, 24)
    assert result.tokens == greedy_reference(verifier, prompt, 24, [])
