"""Losses of the multi-pass trainings, EAGLE-3's training-time test and HASS's alignment: value and gradients equal
the per-pass definition whatever the chunking, and the verifier's side of the vocabulary product, the loss's largest,
runs once per counted position whatever the passes."""

import pytest
import torch
import torch.nn.functional as F

from taps_train.features import FEATURES
from taps_train.training import Eagle3Module, HassModule
from taps_train.training.losses import feature_loss, vocab_losses
from tests.training.test_training import data, recipe  # noqa: F401 - the recipe fixture


def first_batch(recipe: str, verifier_dir, module) -> dict:
    """The first training batch of `recipe`, with the verifier states `module`'s drafter reads."""
    dm = data(recipe, verifier_dir, verifier_states=module.drafter.feature_contract().layers)
    dm.prepare_data()
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.fixture
def module_and_batch(recipe, random_verifier_dir):  # noqa: F811
    torch.manual_seed(0)
    module = Eagle3Module(verifier=str(random_verifier_dir), draft_vocab_size=0.5, ttt_steps=3, step_weight_decay=0.8)
    batch = first_batch(recipe, random_verifier_dir, module)
    module.drafter.set_vocabulary(torch.randperm(module.drafter.config.vocab_size)[: module.drafter.config.draft_vocab_size])
    return module, batch


def dense_loss(module: Eagle3Module, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Pass k's index t guesses x_{t+k+2}: cross-entropy of its draft-vocabulary distribution against the verifier's
    softmax over the draft tokens there, mean over the positions that count and whose verifier top-1 is a draft token;
    passes weighted decay^k."""
    drafter, tensors = module.drafter, module.batch_features(batch)
    next_ids = batch["input_ids"][:, 1:]
    counts = module.loss_positions(batch["loss_mask"])
    verifier_logits = drafter.feature_contract().targets(tensors)[:, 1:].float() @ drafter.verifier_head.float().T
    in_draft = drafter.t2d[verifier_logits.argmax(-1)]
    verifier_p = verifier_logits[..., drafter.draft_token_ids].softmax(-1)
    length, per_pass = next_ids.shape[1], []
    for k, predicted in enumerate(drafter.unroll(next_ids, tensors[FEATURES][:, :-1], module.hparams.ttt_steps)):
        log_q = drafter.draft_logits(predicted[:, : length - k]).float().log_softmax(-1)
        cross_entropy = -(verifier_p[:, k:] * log_q).sum(-1)
        per_pass.append(cross_entropy[counts[:, k:] & in_draft[:, k:]].mean())
    return sum(module.hparams.step_weight_decay ** k * loss for k, loss in enumerate(per_pass)), per_pass


@pytest.mark.parametrize("chunk", [1, 7, None])
def test_loss_and_gradients_equal_the_dense_definition(module_and_batch, chunk):
    module, batch = module_and_batch
    module.hparams.loss_chunk_size = chunk
    parameters = [p for p in module.drafter.parameters() if p.requires_grad]
    expected, expected_passes = dense_loss(module, batch)
    loss, logs = module.step_losses(batch, train=True)
    assert torch.allclose(loss, expected, atol=1e-5)
    for k, value in enumerate(expected_passes):
        assert torch.allclose(logs[f"loss_step{k}"], value, atol=1e-5)
    for got, want in zip(torch.autograd.grad(loss, parameters), torch.autograd.grad(expected, parameters)):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)


def test_the_full_vocabulary_product_runs_once_per_counted_position(module_and_batch, monkeypatch):
    module, batch = module_and_batch
    head, rows, linear = module.drafter.verifier_head, [], F.linear

    def counting_linear(input, weight, bias=None):
        if weight is head:
            rows.append(input.shape[0])
        return linear(input, weight, bias)

    monkeypatch.setattr(F, "linear", counting_linear)
    module.step_losses(batch, train=True)
    assert sum(rows) == int(module.loss_positions(batch["loss_mask"]).sum()) > 0  # not once per pass


def hass_per_pass(module: HassModule, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Alignment pass n's loss on its own: feature_weight * SmoothL1 + the vocabulary terms against the same targets;
    the passes' mean."""
    h, features = module.hparams, module.batch_features(batch)[FEATURES]
    counts = module.loss_positions(batch["loss_mask"])
    per_pass = []
    for predicted in module.drafter.unroll(batch["input_ids"][:, 1:], features[:, :-1], h.align_steps):
        vocab, _ = vocab_losses(predicted[counts], features[:, 1:][counts], module.drafter.lm_head.weight, h.prob_weight,
                                h.topk_weight, h.topk, h.accuracy_topk, None)
        per_pass.append(h.feature_weight * feature_loss(predicted[counts], features[:, 1:][counts]).mean() + vocab)
    return sum(per_pass) / len(per_pass), per_pass


@pytest.mark.parametrize("chunk", [7, None])
def test_hass_loss_and_gradients_equal_each_alignment_pass_on_its_own(recipe, random_verifier_dir, chunk):  # noqa: F811
    torch.manual_seed(0)
    module = HassModule(verifier=str(random_verifier_dir), align_steps=3, feature_noise=0.0, loss_chunk_size=chunk)
    batch = first_batch(recipe, random_verifier_dir, module)
    parameters = [p for p in module.drafter.parameters() if p.requires_grad]
    expected, _ = hass_per_pass(module, batch)
    loss, logs = module.step_losses(batch, train=True)
    assert torch.allclose(loss, expected, atol=1e-5) and {"prob_loss_step3", "topk_loss_step3", "feature_loss_step1"} <= set(logs)
    for got, want in zip(torch.autograd.grad(loss, parameters), torch.autograd.grad(expected, parameters)):
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-4)
