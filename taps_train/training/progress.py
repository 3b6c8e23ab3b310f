"""Training progress bars that stay true when a run is bounded by steps.

A config that trains by `max_steps` leaves Lightning's `max_epochs` at -1, and RichProgressBar (Lightning's
default when rich is installed) then titles the bar "Epoch 3/-2". These bars title it "Epoch 3" and show
`step: 300/500` with the metrics, the count that says how much of such a run is left.
"""

import copy

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar


class _StepCount(ProgressBar):
    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        if trainer.max_steps > 0:
            metrics["step"] = f"{trainer.global_step}/{trainer.max_steps}"
        return metrics


class StepTQDMProgressBar(_StepCount, TQDMProgressBar):
    """TQDMProgressBar with `step: done/max_steps` in its postfix."""


class StepRichProgressBar(_StepCount, RichProgressBar):
    """RichProgressBar with `step: done/max_steps` among its metrics and no "/-2" epoch total."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        # as Lightning pads it, so the title does not flicker against "Validation"
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"


_STEP_BARS: dict[type[ProgressBar], type[ProgressBar]] = {TQDMProgressBar: StepTQDMProgressBar, RichProgressBar: StepRichProgressBar}


def step_progress_bar(bar: ProgressBar | None) -> ProgressBar | None:
    """A step-counting copy of one of Lightning's stock bars, with its settings (refresh rate, theme, ...);
    None for no bar or any other bar, so a disabled bar or a user's own bar class stays as chosen."""
    step_class = _STEP_BARS.get(type(bar))
    if step_class is None:
        return None
    clone = copy.copy(bar)
    clone.__class__ = step_class
    return clone
