"""Test-only: Lightning's `DeepSpeedStrategy` on CPU processes (gloo), so the DeepSpeed paths run in CI.

Lightning refuses DeepSpeed on anything but a CUDA accelerator; DeepSpeed itself runs ZeRO-2/3 on
its CPU accelerator (`DS_ACCELERATOR=cpu`). This subclass only lifts that check, using DDP's
environment setup instead. It lives in tests/ on purpose: users train DeepSpeed on GPUs.
"""

import os
import signal

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch import Callback
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy


class CpuDeepSpeedStrategy(DeepSpeedStrategy):
    def setup_environment(self) -> None:
        DDPStrategy.setup_environment(self)  # skips DeepSpeedStrategy's CUDA-only check, nothing else

    def setup_distributed(self) -> None:
        # As DeepSpeedStrategy, minus its check that device indices are CUDA ordinals.
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        return torch.device("cpu", self.local_rank)  # DeepSpeed reads the local rank from the device index

    def _get_process_group_backend(self) -> str:
        return "gloo"


class KillAtStep(Callback):
    """SIGKILL every rank once `step` optimizer steps are done: a crash, not a clean stop."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)
