"""A plain, resumable, deterministic pretraining loop for the tiny verifier.

Plain PyTorch on purpose: one model, one CPU process, a fixed number of steps. Lightning would add
nothing here, and a step-indexed data order plus a state file makes resume exact.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import LlamaForCausalLM

from taps_train import files


@dataclass(frozen=True)
class PretrainSchedule:
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine decay to `min_lr_ratio * lr`."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_indices(step: int, num_blocks: int, batch_size: int, seed: int) -> torch.Tensor:
    """Block indices of `step`: a fresh seeded permutation per epoch, so any step is reproducible."""
    blocks_per_epoch = num_blocks // batch_size
    epoch, position = divmod(step, blocks_per_epoch)
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[position * batch_size : (position + 1) * batch_size]


def pretrain(
    model: LlamaForCausalLM,
    blocks: torch.Tensor,
    schedule: PretrainSchedule,
    seed: int,
    state_path: Path,
    checkpoint_every: int = 100,
) -> list[float]:
    """Train `model` on rows of `blocks` ([N, seq_len] token ids); resume from `state_path` if present.

    Returns the loss of every step run in this call (resumed steps excluded).
    """
    if len(blocks) < schedule.batch_size:
        raise ValueError(f"need at least {schedule.batch_size} training blocks, got {len(blocks)}")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": schedule.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=schedule.lr,
        betas=(0.9, 0.95),
    )
    start = 0
    if state_path.exists():
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    model.train()
    losses = []
    tokens_per_step = schedule.batch_size * blocks.shape[1]
    began = time.perf_counter()
    with tqdm(total=schedule.steps, initial=start, desc="pretraining tiny verifier", unit="step") as bar:
        for step in range(start, schedule.steps):
            for group in optimizer.param_groups:
                group["lr"] = schedule.lr_at(step)
            batch = blocks[batch_indices(step, len(blocks), schedule.batch_size, seed)]
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), schedule.grad_clip)
            optimizer.step()
            losses.append(loss.item())
            done = step + 1
            if done % checkpoint_every == 0 and done < schedule.steps:
                _save_state(state_path, model, optimizer, done)
            rate = len(losses) * tokens_per_step / (time.perf_counter() - began)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:,.0f}")
            bar.update(1)
    model.eval()
    return losses


def _save_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    files.save_torch(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step})


@torch.no_grad()
def mean_loss(model: LlamaForCausalLM, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Mean next-token loss (nats/token) over all rows of `blocks`."""
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        batch = blocks[start : start + batch_size]
        tokens = batch.shape[0] * (batch.shape[1] - 1)
        total += model(input_ids=batch, labels=batch).loss.item() * tokens
        count += tokens
    return total / count
