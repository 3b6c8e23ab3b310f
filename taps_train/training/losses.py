"""Drafter losses and the HASS alignment mask. Every loss is a weighted mean over the positions
that count (assistant tokens), so batches with more padding do not weigh less."""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def feature_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SmoothL1 between predicted and true features, mean over the hidden dim: [N]."""
    return F.smooth_l1_loss(predicted.float(), target.float(), reduction="none").mean(-1)


def soft_cross_entropy(log_q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-sum_x p(x) log q(x) against the verifier's full distribution: [N]."""
    return -(p * log_q).sum(-1)


def topk_distillation(log_q: torch.Tensor, p: torch.Tensor, k: int) -> torch.Tensor:
    """HASS top-K loss, -sum over the verifier's top-K tokens of p_k log q_k: [N]."""
    top_p, top_index = p.topk(k, dim=-1)
    return -(top_p * log_q.gather(-1, top_index)).sum(-1)


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
    softmax, log-softmax and their gradients need several. So positions go in chunks of
    `chunk_size` (None: one chunk), each under activation checkpointing: forward keeps only each
    chunk's scalar sums, backward recomputes one chunk's [chunk, V] tensors at a time, and peak extra
    memory is O(chunk_size x V) whatever N is. Logits are taken in the head's dtype and turned to
    float32 for (log-)softmax, as an unchunked `lm_head(x).float()` would.
    """
    n = predicted.shape[0]
    step = max(1, n if chunk_size is None else chunk_size)
    sums: dict[str, torch.Tensor] = {}
    # At least one (possibly empty) chunk, so N == 0 gives zeros that still backpropagate.
    for start in range(0, max(n, 1), step):
        # Nothing inside is random, so there is no RNG state to stash for the recomputation.
        chunk = checkpoint(
            _chunk_sums,
            predicted[start : start + step],
            target[start : start + step],
            head_weight,
            topk,
            accuracy_topk,
            use_reentrant=False,
            preserve_rng_state=False,
        )
        sums = {name: sums.get(name, 0) + value for name, value in chunk.items()}
    return {name: total / max(n, 1) for name, total in sums.items()}


def _chunk_sums(
    predicted: torch.Tensor, target: torch.Tensor, head_weight: torch.Tensor, topk: int, accuracy_topk: int
) -> dict[str, torch.Tensor]:
    """One chunk's sums of the terms `vocab_losses` averages."""
    with torch.no_grad():
        p = F.softmax(F.linear(target.to(head_weight.dtype), head_weight).float(), dim=-1)
    log_q = F.log_softmax(F.linear(predicted.to(head_weight.dtype), head_weight).float(), dim=-1)
    sums = {"prob_loss": soft_cross_entropy(log_q, p).sum()}
    if topk > 0:
        sums["topk_loss"] = topk_distillation(log_q, p, topk).sum()
    with torch.no_grad():
        verifier_top1 = p.argmax(-1, keepdim=True)
        sums["acc_top1"] = (log_q.argmax(-1, keepdim=True) == verifier_top1).sum().float()
        top_hits = (log_q.topk(accuracy_topk, dim=-1).indices == verifier_top1).any(-1)
        sums[f"acc_top{accuracy_topk}"] = top_hits.sum().float()
    return sums


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
