"""Save the weights a run ended with under a fixed name.

Lightning's `save_last` copy is written only when another checkpoint is: with `every_n_train_steps: 100` and
`max_steps: 150`, `last.ckpt` holds step 100, not the trained drafter. `taps-train study` evaluates this file.
"""

from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer


class FinalCheckpoint(Callback):
    """Write `path` (a file, or a directory under DeepSpeed) when training ends."""

    def __init__(self, path: str):
        self.path = path

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(self.path)
