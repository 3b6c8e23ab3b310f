"""Drafter losses and the HASS alignment mask. Every loss is a weighted mean over the positions
that count (assistant tokens), so batches with more padding do not weigh less."""

import torch
import torch.nn.functional as F


def feature_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SmoothL1 between predicted and true features, mean over the hidden dim: [N]."""
    return F.smooth_l1_loss(predicted.float(), target.float(), reduction="none").mean(-1)


def vocab_losses(
    predicted: torch.Tensor,
    target: torch.Tensor,
    head_weight: torch.Tensor,
    prob_weight: float = 1.0,
    topk_weight: float = 0.0,
    topk: int = 10,
    accuracy_topk: int = 5,
    chunk_size: int | None = 1024,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The vocabulary-sized terms of the drafter loss, means over the N positions.

    `predicted` [N, H] are the drafter's features, `target` [N, H] the verifier's true ones, and
    `head_weight` [V, H] the frozen LM head. Returns the differentiable `prob_weight * prob_loss +
    topk_weight * topk_loss` and, detached for logging, `prob_loss` (soft cross-entropy against
    p = softmax(head(target))), `topk_loss` (HASS top-K distillation, only when `topk_weight` > 0),
    `acc_top1` and `acc_top{accuracy_topk}` (p's argmax within q's top-k). `predicted` may also be
    [S, N, H], S predictions of the same targets (HASS's alignment passes): p is then formed once per
    chunk for all of them, and the loss and every term are [S], one per prediction.

    At Llama-3's V = 128,256 a full [N, V] float32 tensor for an 8 x 2,048-token batch is 8 GB, and
    softmax, log-softmax and their gradients need several. So positions go in chunks of `chunk_size`
    (None: one chunk) and each chunk's gradient w.r.t. its features is formed right away from the
    closed form (d/dz of -sum_x w_x log softmax(z)_x is softmax(z) * sum(w) - w, with w the weighted
    sum of both terms' targets: one matmul with the head per chunk), then the chunk's [chunk, V]
    tensors are dropped: peak extra memory is O(chunk_size x V) whatever N is, and backward is a
    scale of the stored [N, H] gradient instead of a second pass over the vocabulary. Logits are taken
    in the head's dtype and turned to float32 for (log-)softmax, as an unchunked `lm_head(x).float()` would.
    """
    stacked = predicted if predicted.dim() == 3 else predicted[None]
    n = stacked.shape[1]
    step = max(1, n if chunk_size is None else chunk_size)
    topk = topk if topk_weight > 0 else 0
    loss, *sums = _ChunkedVocabLoss.apply(stacked, target, head_weight, prob_weight, topk_weight, topk, accuracy_topk, step)
    names = ["prob_loss", *(["topk_loss"] if topk > 0 else []), "acc_top1", f"acc_top{accuracy_topk}"]
    terms = {name: total / max(n, 1) for name, total in zip(names, sums)}
    if predicted.dim() == 2:
        return loss[0] / max(n, 1), {name: value[0] for name, value in terms.items()}
    return loss / max(n, 1), terms


class _ChunkedVocabLoss(torch.autograd.Function):
    """The weighted loss sums [S] (differentiable) and the sums of its terms and accuracies [S] (not) of S
    predictions [S, N, H]; the gradient w.r.t. `predicted` is computed in forward, chunk by chunk, and only
    [S, N, H] of it kept."""

    @staticmethod
    def forward(ctx, predicted: torch.Tensor, target: torch.Tensor, head_weight: torch.Tensor, prob_weight: float,
                topk_weight: float, topk: int, accuracy_topk: int, step: int) -> tuple[torch.Tensor, ...]:
        grad = torch.zeros(predicted.shape, dtype=torch.float32, device=predicted.device) if ctx.needs_input_grad[0] else None
        sums = [torch.zeros(predicted.shape[0], device=predicted.device) for _ in range(4 if topk > 0 else 3)]
        for start in range(0, predicted.shape[1], step):
            rows = slice(start, start + step)
            # One call per chunk: its [chunk, V] temporaries are freed before the next chunk allocates its own.
            chunk = _chunk(predicted[:, rows], target[rows], head_weight, prob_weight, topk_weight, topk, accuracy_topk,
                           grad[:, rows] if grad is not None else None)
            sums = [a + b for a, b in zip(sums, chunk)]
        if grad is not None:
            ctx.save_for_backward(grad)
        ctx.input_dtype = predicted.dtype
        loss = prob_weight * sums[0] + (topk_weight * sums[1] if topk > 0 else 0.0)
        ctx.mark_non_differentiable(*sums)
        return (loss, *sums)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, *ignored: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss[:, None, None]).to(ctx.input_dtype), None, None, None, None, None, None, None


def _chunk(predicted: torch.Tensor, target: torch.Tensor, head_weight: torch.Tensor, prob_weight: float, topk_weight: float,
           topk: int, accuracy_topk: int, grad: torch.Tensor | None) -> list[torch.Tensor]:
    """One chunk's sums [S] [soft CE, (top-K), top-1 hits, top-k hits] of its S predictions [S, chunk, H]; writes
    the weighted loss's feature gradients into `grad` [S, chunk, H] when given."""
    p = F.softmax(F.linear(target.to(head_weight.dtype), head_weight).float(), dim=-1)
    verifier_top1 = p.argmax(-1, keepdim=True)
    if topk > 0:
        top_p, top_index = p.topk(topk, dim=-1)
    # sum(w) of the weighted loss -sum_x w_x log q_x, w = prob_weight * p + topk_weight * (p on its top-K)
    w_sum = prob_weight * p.sum(-1, keepdim=True) + (topk_weight * top_p.sum(-1, keepdim=True) if topk > 0 else 0.0)
    sums = []
    for index, features in enumerate(predicted):
        log_q = F.log_softmax(F.linear(features.to(head_weight.dtype), head_weight).float(), dim=-1)
        # In-place updates keep at most two [chunk, V] float32 tensors alive (p and this one) besides the logits being made.
        terms = [-torch.dot(p.flatten(), log_q.flatten())]
        if topk > 0:
            terms.append(-(top_p * log_q.gather(-1, top_index)).sum())
        terms.append((log_q.argmax(-1, keepdim=True) == verifier_top1).sum().float())
        terms.append((log_q.topk(accuracy_topk, dim=-1).indices == verifier_top1).any(-1).sum().float())
        sums.append(torch.stack(terms))
        if grad is not None:
            dz = log_q.exp_().mul_(w_sum).sub_(p, alpha=prob_weight)  # softmax(z) * sum(w) - w
            if topk > 0:
                dz.scatter_add_(-1, top_index, -topk_weight * top_p)
            grad[index].copy_((dz.to(head_weight.dtype) @ head_weight).float())
    return list(torch.stack(sums, dim=1))
