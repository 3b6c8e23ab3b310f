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
    topk: int = 0,
    accuracy_topk: int = 5,
    chunk_size: int | None = 1024,
) -> dict[str, torch.Tensor]:
    """The vocabulary-sized terms of the drafter loss, means over the N positions.

    `predicted` [N, H] are the drafter's features, `target` [N, H] the verifier's true ones, and
    `head_weight` [V, H] the frozen LM head. Returns `prob_loss` (soft cross-entropy against
    p = softmax(head(target))), `topk_loss` (HASS top-K distillation, only when `topk` > 0) and the
    no-grad accuracies `acc_top1` and `acc_top{accuracy_topk}` (p's argmax within q's top-k).

    At Llama-3's V = 128,256 a full [N, V] float32 tensor for an 8 x 2,048-token batch is 8 GB, and
    softmax, log-softmax and their gradients need several. So positions go in chunks of `chunk_size`
    (None: one chunk) and each chunk's gradient w.r.t. its features is formed right away from the
    closed form (d/dz of -sum_x w_x log q_x is q * sum(w) - w), then the chunk's [chunk, V] tensors
    are dropped: peak extra memory is O(chunk_size x V) whatever N is, and backward is a scale of the
    stored [N, H] gradients instead of a second pass over the vocabulary. Logits are taken in the
    head's dtype and turned to float32 for (log-)softmax, as an unchunked `lm_head(x).float()` would.
    """
    n = predicted.shape[0]
    step = max(1, n if chunk_size is None else chunk_size)
    names = ["prob_loss", *(["topk_loss"] if topk > 0 else [])]
    terms = _ChunkedVocabLoss.apply(predicted, target, head_weight, topk, accuracy_topk, step)
    sums = dict(zip([*names, "acc_top1", f"acc_top{accuracy_topk}"], terms))
    return {name: total / max(n, 1) for name, total in sums.items()}


class _ChunkedVocabLoss(torch.autograd.Function):
    """Sums of the loss terms and accuracies; the gradients of the loss terms w.r.t. `predicted` are
    computed in forward, chunk by chunk, and only [N, H] of them is kept."""

    @staticmethod
    def forward(ctx, predicted: torch.Tensor, target: torch.Tensor, head_weight: torch.Tensor, topk: int, accuracy_topk: int,
                step: int) -> tuple[torch.Tensor, ...]:
        want_grad = ctx.needs_input_grad[0]
        terms = 2 if topk > 0 else 1
        sums = torch.zeros(terms + 2, dtype=torch.float32, device=predicted.device)
        grads = torch.zeros(terms, *predicted.shape, dtype=torch.float32, device=predicted.device) if want_grad else None
        for start in range(0, predicted.shape[0], step):
            rows = slice(start, start + step)
            # One call per chunk: its [chunk, V] temporaries are freed before the next chunk allocates its own.
            sums += _chunk(predicted[rows], target[rows], head_weight, topk, accuracy_topk, grads[:, rows] if want_grad else None)
        if want_grad:
            ctx.save_for_backward(grads)
        ctx.input_dtype = predicted.dtype
        outputs = tuple(total.clone() for total in sums)
        ctx.mark_non_differentiable(*outputs[terms:])
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grads,) = ctx.saved_tensors
        grad = sum(g * grad_output for g, grad_output in zip(grads, grad_outputs))
        return grad.to(ctx.input_dtype), None, None, None, None, None


def _chunk(predicted: torch.Tensor, target: torch.Tensor, head_weight: torch.Tensor, topk: int, accuracy_topk: int,
           grads: torch.Tensor | None) -> torch.Tensor:
    """One chunk's sums [soft CE, (top-K), top-1 hits, top-k hits]; writes the loss terms' feature
    gradients into `grads` [terms, chunk, H] when given."""
    p = F.softmax(F.linear(target.to(head_weight.dtype), head_weight).float(), dim=-1)
    log_q = F.log_softmax(F.linear(predicted.to(head_weight.dtype), head_weight).float(), dim=-1)
    weights = [p]  # each loss term is -sum_x w_x log q_x
    if topk > 0:
        top_p, top_index = p.topk(topk, dim=-1)
        weights.append(torch.zeros_like(p).scatter_(-1, top_index, top_p))
    verifier_top1 = p.argmax(-1, keepdim=True)
    hits = [(log_q.argmax(-1, keepdim=True) == verifier_top1).sum(), (log_q.topk(accuracy_topk, dim=-1).indices == verifier_top1).any(-1).sum()]
    losses = [-(w * log_q).sum() for w in weights]
    if grads is not None:
        q = log_q.exp_()
        for index, w in enumerate(weights):
            dz = q * w.sum(-1, keepdim=True) - w  # d/dz of -sum_x w_x log softmax(z)_x
            grads[index] = (dz.to(head_weight.dtype) @ head_weight).float()
    return torch.stack([*losses, *hits]).float()


def alignment_mask(length: int, step: int, device: torch.device | None = None) -> torch.Tensor:
    """Which keys a query attends to at HASS alignment step `step` (1-based): bool [T, step*T].

    Keys are the concatenation of the K/V blocks of steps 1..step. Query s sees, at position j <= s,
    the key from step m = step - (s - j): the most recent `step - 1` positions come from the drafter's
    own earlier predictions, older ones (m would be < 1) from the true features of step 1.
    """
    s = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    distance = s - j
    blocks = []
    for m in range(1, step + 1):
        if m == 1:
            blocks.append((distance >= step - 1) & (distance >= 0))
        else:
            blocks.append(distance == step - m)
    return torch.cat(blocks, dim=1)
