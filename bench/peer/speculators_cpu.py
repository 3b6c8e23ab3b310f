"""`speculators train` (vllm-project/speculators 0.9) on a CPU, for bench/peer_speculators.py.

speculators assumes an accelerator: its trainer moves the model and every batch to `local_rank` (an accelerator index)
and synchronizes the accelerator to time each step. Here the device is the CPU and synchronizing is a no-op, and
`--max-steps` is a hard stop (speculators' epochs after it would each take a step more). Nothing in speculators is
edited, and its arguments pass through unchanged. Run it with the python speculators is installed in
(it does not import taps-train):

    <speculators venv>/bin/python bench/peer/speculators_cpu.py --speculator-type eagle3 --draft-attn-impl sdpa \
        --loss-implementation eager --num-workers 0 ...

(`--draft-attn-impl sdpa`: FlexAttention has no CPU backward; `--loss-implementation eager`: the fused loss is Triton.)
"""

import sys
from unittest import mock

import torch
import speculators.train.trainer as speculators_trainer
from speculators.train.cli import main
from speculators.train.config import TrainConfig

speculators_trainer.get_local_rank = lambda: "cpu"  # the trainer's `.to(self.local_rank)` then means the CPU
torch.accelerator.synchronize = lambda *args, **kwargs: None
_build = speculators_trainer.Trainer.__init__


def _build_on_cpu(self, *args, **kwargs) -> None:
    """The trainer takes its autocast device type from the current accelerator; only while it is built, so that the
    run's end (which empties the accelerator's cache) still sees none."""
    with mock.patch.object(torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cpu")):
        _build(self, *args, **kwargs)


speculators_trainer.Trainer.__init__ = _build_on_cpu
_train_epoch = speculators_trainer.Trainer.train_epoch


def _train_epoch_until_max_steps(self, *args, **kwargs) -> None:
    """`--max-steps` ends an epoch early, but the epochs after it would each still take one step: none is taken."""
    if self.config.max_steps is None or self.global_step < self.config.max_steps:
        _train_epoch(self, *args, **kwargs)


speculators_trainer.Trainer.train_epoch = _train_epoch_until_max_steps

if __name__ == "__main__":
    main(TrainConfig.resolve(sys.argv[1:]))
