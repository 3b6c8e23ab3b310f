"""Drafter losses and the HASS alignment mask. Every loss is a weighted mean over the positions
that count (assistant tokens), so batches with more padding do not weigh less."""

import torch
import torch.nn.functional as F


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
