"""The large-vocabulary path end to end on CPU, with the Llama-3-shaped stand-in verifier (128,256
tokens, sharded bf16 safetensors): cache -> HASS training step (chunked == unchunked) -> fit -> eval
-> export. Training runs in float32 here: CPUs have no fast bf16 matmul, so the frozen parts are cast
to float32 as `precision: 32-true` does (bf16 parts are checked on small shapes in test_placement.py)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from taps_train.cli import main
from taps_train.data.datamodule import DrafterDataModule
from taps_train.training import HassModule
from tests.training.test_training import trainer

VOCAB = 128_256


@pytest.fixture
def standin_recipe(tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("TAPS_HOME", str(tmp_path / "home"))
    path = tmp_path / "recipe.yaml"
    path.write_text("name: standin_test\nseed: 0\nmax_length: 128\nsources:\n"
                    "  - source: gsm_symbolic\n    args: {size: 40, seed: 3}\n    heldout: 4\n    count: 24\n")
    return str(path)


def _batch(recipe: str, standin) -> dict[str, torch.Tensor]:
    dm = DrafterDataModule(recipe, verifier=str(standin), batch_size=4)
    dm.prepare_data()
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_hass_step_at_llama3_vocabulary_is_the_same_chunked_and_unchunked(standin, standin_recipe):
    batch = _batch(standin_recipe, standin)
    results = []
    for chunk in (None, 37):
        torch.manual_seed(0)
        module = HassModule(verifier=str(standin), loss_chunk_size=chunk, feature_noise=0.0)
        assert module.drafter.lm_head.weight.shape == (VOCAB, 64) and module.drafter.lm_head.weight.dtype == torch.bfloat16
        module.drafter.cast_verifier_parts(torch.float32)
        loss, logs = module.step_losses(batch, train=True)
        loss.backward()
        results.append((loss.detach(), logs, {n: p.grad.clone() for n, p in module.drafter.named_parameters() if p.requires_grad}))
    (loss_a, logs_a, grads_a), (loss_b, logs_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-6)
    for name in ("prob_loss_step3", "topk_loss_step3", "acc_top1_step2"):
        torch.testing.assert_close(logs_a[name], logs_b[name], rtol=1e-5, atol=1e-6)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grad, grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_standin_fits_then_evaluates_and_exports(standin, standin_recipe, tmp_path, capsys):
    dm = DrafterDataModule(standin_recipe, verifier=str(standin), batch_size=4)
    module = HassModule(verifier=str(standin), lr=1e-3)
    run = trainer(tmp_path, max_steps=3)
    run.fit(module, datamodule=dm)
    checkpoint = tmp_path / "standin.ckpt"
    run.save_checkpoint(checkpoint)
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert not any(key.endswith(("embed_tokens.weight", "lm_head.weight")) for key in saved), "frozen verifier parts were saved"

    report = tmp_path / "eval.json"
    main(["eval", "--drafters", str(checkpoint), "--verifier", str(standin), "--device", "cpu", "--benchmarks",
          "gsm8k:tests/fixtures/benchmarks/gsm8k.jsonl", "--prompts", "2", "--max-new-tokens", "8", "--output", str(report)])
    benchmark = json.loads(report.read_text())["benchmarks"]["gsm8k"]
    assert benchmark["prompts"] == 2 and benchmark["acceptance_length"] >= 1.0

    out = tmp_path / "export"
    main(["export", str(checkpoint), "--out", str(out), "--verifier", str(standin)])
    exported = load_file(out / "model.safetensors")
    embedding = load_file(standin / json.loads((standin / "model.safetensors.index.json").read_text())["weight_map"]["model.embed_tokens.weight"])
    assert torch.equal(exported["embed_tokens.weight"], embedding["model.embed_tokens.weight"])
    assert "lm_head.weight" not in exported
