"""A periodic checkpoint whose `last.ckpt` ends as the weights training ended with.

Lightning refreshes its `save_last` copy only when the callback saves another checkpoint: with
`every_n_train_steps: 2000` and a 20-epoch budget, `last.ckpt` would hold the last multiple of 2,000 steps,
not the trained drafter that `eval`, `export`, HASS stage 2's `init_from` and `taps-train study` read.
"""

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


class LastCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that also writes `last.ckpt` at the end of training when its last save was earlier."""

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
