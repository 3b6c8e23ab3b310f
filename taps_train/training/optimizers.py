"""The drafter's optimizer: AdamW, or Muon on its hidden weight matrices with AdamW on the rest.

Muon (torch.optim.Muon) orthogonalizes each update of a 2-D weight matrix; it has no meaning for norm gains, biases or
vectors, and is not used on vocabulary-sized matrices (embedding, LM head), whose rows are per-token and not one linear
map. speculators trains its EAGLE-3 drafters this way by default. Lightning drives one optimizer per module in automatic
optimization, so the pair is one `torch.optim.Optimizer`: its param groups and state are the two inner optimizers' own
(shared objects), which is what LR schedulers, gradient clipping, checkpoints and device moves read.
"""

from collections.abc import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "muon")
VOCABULARY_MATRICES = ("embed_tokens", "lm_head")  # EAGLE checkpoint names every backbone keeps


def muon_parameters(named: Iterable[tuple[str, nn.Parameter]]) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(Muon's, AdamW's) among the trainable parameters: Muon takes the matrices (both sides > 1) that are not per-token."""
    muon, adamw = [], []
    for name, param in named:
        if not param.requires_grad:
            continue
        matrix = param.ndim == 2 and min(param.shape) > 1 and not any(part in name.split(".") for part in VOCABULARY_MATRICES)
        (muon if matrix else adamw).append(param)
    return muon, adamw


class MuonAdamW(torch.optim.Optimizer):
    """Muon over `muon_params`, AdamW over `adamw_params`, stepped together. Muon's rate is scaled to match AdamW's
    update size (`adjust_lr_fn="match_rms_adamw"`), so one learning rate and one schedule serve both."""

    def __init__(self, muon_params: list[nn.Parameter], adamw_params: list[nn.Parameter], lr: float,
                 betas: tuple[float, float], weight_decay: float):
        self.inner: list[torch.optim.Optimizer] = []  # each over a non-empty list (torch refuses empty ones)
        if muon_params:
            self.inner.append(torch.optim.Muon(muon_params, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw"))
        if adamw_params:
            self.inner.append(torch.optim.AdamW(adamw_params, lr=lr, betas=betas, weight_decay=weight_decay))
        super().__init__([group for optimizer in self.inner for group in optimizer.param_groups], {"lr": lr})
        self._share_with_inner()

    def _share_with_inner(self) -> None:
        """The inner optimizers read this one's groups and state (loading a state dict replaces both objects)."""
        groups = iter(self.param_groups)
        for optimizer in self.inner:
            optimizer.param_groups = [next(groups) for _ in optimizer.param_groups]
            optimizer.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._share_with_inner()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.inner:
            optimizer.step()
        return loss


def make_optimizer(name: str, model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer `name` (one of OPTIMIZERS) over `model`'s trainable parameters."""
    if name == "adamw":
        trainable = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(trainable, lr=lr, betas=betas, weight_decay=weight_decay)
    muon, adamw = muon_parameters(model.named_parameters())
    return MuonAdamW(muon, adamw, lr=lr, betas=betas, weight_decay=weight_decay)
