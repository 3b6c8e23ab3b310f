"""vocab_losses: chunked over positions, it equals the unchunked definition (values, gradients,
accuracies) while its peak memory stays that of one chunk."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from taps_train.training import losses
from taps_train.training.losses import vocab_losses

N, H, V = 37, 16, 50


def naive_losses(predicted: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, topk: int, accuracy_topk: int) -> dict:
    """The unchunked definition, straight from the formulas, with full [N, V] tensors."""
    p = F.softmax(F.linear(target.to(weight.dtype), weight).float(), dim=-1)
    log_q = F.log_softmax(F.linear(predicted.to(weight.dtype), weight).float(), dim=-1)
    out = {"prob_loss": -(p * log_q).sum(-1).mean()}
    if topk > 0:
        top_p, top_index = p.topk(topk, dim=-1)
        out["topk_loss"] = -(top_p * log_q.gather(-1, top_index)).sum(-1).mean()
    verifier_top1 = p.argmax(-1, keepdim=True)
    out["acc_top1"] = (log_q.argmax(-1, keepdim=True) == verifier_top1).float().mean()
    out[f"acc_top{accuracy_topk}"] = (log_q.topk(accuracy_topk, -1).indices == verifier_top1).any(-1).float().mean()
    return out


def _inputs(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, H, generator=generator).to(dtype)
    target = torch.randn(N, H, generator=generator)
    # Predictions near the target so some, not all, top-1s agree: accuracies strictly inside (0, 1).
    predicted = target + 0.8 * torch.randn(N, H, generator=generator)
    return predicted, target, weight


def assert_grads_close(got: torch.Tensor, expected: torch.Tensor, head_dtype: torch.dtype) -> None:
    """float32 heads: float tolerance. bf16 heads round the [N, V] logit gradient to bf16 before the
    head's matmul, and the closed form and autograd's chain rule reach that gradient by different
    float32 operations, so the two agree to bf16 precision (~0.4% of the gradient's scale), not bit for bit."""
    if head_dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-2 * expected.abs().max().item())


TOPK_WEIGHT = 0.7


def _weighted_sum(terms: dict) -> torch.Tensor:
    return terms["prob_loss"] + TOPK_WEIGHT * terms.get("topk_loss", 0.0)


def chunked(predicted: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, topk: int, chunk_size: int | None) -> tuple[torch.Tensor, dict]:
    return vocab_losses(predicted, target, weight, prob_weight=1.0, topk_weight=TOPK_WEIGHT if topk else 0.0, topk=topk,
                        accuracy_topk=3, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("topk", [0, 5])
@pytest.mark.parametrize("chunk_size", [None, 1, 7, 16, 36, 37, 1024])
def test_chunked_values_and_gradients_equal_the_unchunked_definition(chunk_size, topk, dtype):
    predicted, target, weight = _inputs(dtype)
    leaf_ref = predicted.clone().requires_grad_()
    expected = naive_losses(leaf_ref, target, weight, topk, accuracy_topk=3)
    _weighted_sum(expected).backward()

    leaf = predicted.clone().requires_grad_()
    loss, got = chunked(leaf, target, weight, topk, chunk_size)
    loss.backward()
    torch.testing.assert_close(loss, _weighted_sum(expected), rtol=1e-5, atol=1e-6)

    assert set(got) == set(expected)
    assert 0.0 < expected["acc_top1"].item() < 1.0
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    assert not any(value.requires_grad for value in got.values())  # logged terms are detached; `loss` carries the gradient
    assert_grads_close(leaf.grad, leaf_ref.grad, dtype)


def test_chunked_loss_under_bf16_autocast_matches_the_unchunked_definition():
    predicted, target, weight = _inputs(torch.float32, seed=1)
    results = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for losses_of in (
            lambda x: (lambda terms: (_weighted_sum(terms), terms))(naive_losses(x, target, weight, 5, 3)),
            lambda x: chunked(x, target, weight, 5, chunk_size=10),
        ):
            leaf = predicted.clone().requires_grad_()
            loss, terms = losses_of(leaf.to(torch.bfloat16))  # the drafter's output is bf16 under autocast
            loss.backward()
            results.append((terms, leaf.grad))
    (expected, expected_grad), (got, got_grad) = results
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    assert_grads_close(got_grad, expected_grad, torch.bfloat16)
    # Autocast really applied: bf16 logits give a different loss from fp32 ones.
    assert not torch.allclose(got["prob_loss"], naive_losses(predicted, target, weight, 5, 3)["prob_loss"], rtol=1e-5)


def test_chunked_loss_without_grad_gives_the_same_values():
    predicted, target, weight = _inputs(torch.float32, seed=2)
    with torch.no_grad():
        _, got = chunked(predicted, target, weight, 5, chunk_size=8)
    expected = naive_losses(predicted, target, weight, 5, 3)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name])


def test_no_positions_gives_zero_losses_that_still_backpropagate():
    weight = torch.randn(V, H)
    predicted = torch.randn(0, H, requires_grad=True)
    loss, got = chunked(predicted, torch.randn(0, H), weight, 5, chunk_size=1024)
    assert set(got) == {"prob_loss", "topk_loss", "acc_top1", "acc_top3"}
    assert loss.item() == 0.0 and all(value.item() == 0.0 for value in got.values())
    loss.backward()
    assert predicted.grad.shape == (0, H)


_PEAK_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    import torch

    # Loaded by path: the taps_train.training package imports Lightning, seconds this does not need.
    spec = importlib.util.spec_from_file_location("losses", sys.argv[1])
    losses_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(losses_module)

    torch.set_num_threads(1)
    V, H, CHUNK = 16_000, 64, 128
    weight = torch.randn(V, H) / H**0.5

    def status_mb(field):
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

    def peak_growth_mb(n, chunk_size):
        predicted = torch.randn(n, H, requires_grad=True)
        target = torch.randn(n, H)
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets the peak (VmHWM) to the current RSS
        before = status_mb("VmRSS")
        loss, _ = losses_module.vocab_losses(predicted, target, weight, topk_weight=1.0, topk=10, accuracy_topk=5, chunk_size=chunk_size)
        loss.backward()
        return status_mb("VmHWM") - before

    peak_growth_mb(CHUNK, CHUNK)  # warm-up: the BLAS keeps its first-use buffers for good
    figures = {"small": peak_growth_mb(CHUNK, CHUNK), "large": peak_growth_mb(4 * CHUNK, CHUNK)}
    figures["unchunked"] = peak_growth_mb(2 * CHUNK, None)
    json.dump(figures, sys.stdout)
    """
)


@pytest.mark.skipif(
    sys.platform != "linux" or not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's resettable peak RSS"
)
def test_peak_memory_of_forward_and_backward_does_not_grow_with_positions():
    # A fresh process, so pytest's own allocations are not in the figures. A fixed mmap threshold makes
    # glibc hand each freed [chunk, V] tensor straight back to the OS, so RSS follows the live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, losses.__file__], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    mb = json.loads(result.stdout)
    chunk_tensor_mb = 128 * 16_000 * 4 / 2**20  # 7.8 MB; a [512, V] float32 tensor is 31 MB
    assert 2 * chunk_tensor_mb < mb["small"] < 12 * chunk_tensor_mb, mb  # a few [chunk, V] tensors at a time
    assert mb["large"] < mb["small"] + 0.5 * chunk_tensor_mb, mb  # 4x the positions, the same peak
    assert mb["unchunked"] > mb["small"] + 2 * chunk_tensor_mb, mb  # while 256 positions in one chunk cost more


@pytest.mark.parametrize("chunk_size", [None, 7])
def test_stacked_predictions_equal_one_call_each_and_share_the_verifiers_distribution(chunk_size, monkeypatch):
    """HASS's alignment passes: S predictions of the same targets give each one's own loss, terms and gradient, while
    the head meets the targets once per chunk, not once per prediction."""
    predicted, target, weight = _inputs(torch.float32, seed=3)
    stacked = torch.stack([predicted, predicted + 0.3, predicted - 0.2]).requires_grad_()
    alone = [row.detach().clone().requires_grad_() for row in stacked]
    expected = [chunked(leaf, target, weight, 5, chunk_size) for leaf in alone]
    sum(loss * (k + 1) for k, (loss, _) in enumerate(expected)).backward()

    real_linear, heads = F.linear, []

    def counted_linear(x, w, b=None):
        heads.append(x.shape[0])
        return real_linear(x, w, b)

    monkeypatch.setattr(losses.F, "linear", counted_linear)
    loss, got = chunked(stacked, target, weight, 5, chunk_size)
    (loss * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    for k, (expected_loss, expected_terms) in enumerate(expected):
        torch.testing.assert_close(loss[k], expected_loss)
        for name, value in expected_terms.items():
            torch.testing.assert_close(got[name][k], value)
        torch.testing.assert_close(stacked.grad[k], alone[k].grad)
    assert sum(heads) == (3 + 1) * N  # each prediction's logits, and the targets' once
