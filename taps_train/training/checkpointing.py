"""Checkpoint callbacks for run directories that also hold the run's logs.

The shipped configs write checkpoints and the CSV/W&B logs under one directory (`checkpoints/<run>`, logs
in `logs/`). Lightning creates the loggers' folders before a checkpoint callback's setup, so its
"exists and is not empty" check fires on every fresh run; `RunCheckpoint` warns only when the directory
already holds checkpoints that this run may overwrite or mix with.

Both replace a checkpoint of the same name, where Lightning would save beside it as `last-v1.ckpt`: a run
resumed with another checkpoint schedule, or started afresh in a directory that holds a `last.ckpt`, would
write `last-v1.ckpt` and leave `last.ckpt` (what `--ckpt_path`, eval and export read) the old weights.

Both write every checkpoint under a temporary name and rename it into place (`files`): a kill or a full disk during a
save leaves the previous checkpoint of that name, never a truncated one that `--ckpt_path`, eval or a study would take.

`LastCheckpoint` also makes `last.ckpt` end as the weights training ended with. Lightning refreshes its
`save_last` copy only when the callback saves another checkpoint: with `every_n_train_steps: 2000` and a
20-epoch budget, `last.ckpt` would hold the last multiple of 2,000 steps, not the trained drafter that
`eval`, `export`, HASS stage 2's `init_from` and `taps-train study` read.
"""

import shutil
from pathlib import Path, PurePosixPath
from weakref import proxy

from lightning.fabric.utilities.rank_zero import rank_zero_warn
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from taps_train import files


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that warns about earlier checkpoints in its directory, not about other files (logs)."""

    def __init__(self, *args, enable_version_counter: bool = False, **kwargs) -> None:
        super().__init__(*args, enable_version_counter=enable_version_counter, **kwargs)

    def _ModelCheckpoint__warn_if_dir_not_empty(self, dirpath: str) -> None:  # replaces Lightning's private check, called in `setup`
        if self.save_top_k == 0 or not self._fs.isdir(dirpath):
            return
        found = sorted(name for path in self._fs.ls(dirpath, detail=False) if (name := PurePosixPath(path).name).endswith(self.FILE_EXTENSION))
        if found:
            shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
            rank_zero_warn(f"Checkpoint directory {dirpath} already holds {len(found)} checkpoint(s) ({shown}); "
                           "this run saves beside them and replaces those of the same name")


    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:  # replaces Lightning's, which writes in place
        target = Path(filepath)
        if trainer.is_global_zero:  # what killed saves left: a folder moved aside and not put back, dead writers' temporaries
            files.recover_directory(target, "checkpoint save")
            files.remove_dead_leftovers(list(target.parent.glob(f".{target.name}.*.tmp")), target.name)
        staged = Path(trainer.strategy.broadcast(str(files.temporary_path(target))))  # one name for every rank (DeepSpeed writes a folder)
        try:
            with files.full_disk_reported(staged, target):
                trainer.save_checkpoint(str(staged), self.save_weights_only)
        except Exception:
            shutil.rmtree(staged, ignore_errors=True) if staged.is_dir() else staged.unlink(missing_ok=True)
            raise
        try:
            if trainer.is_global_zero:
                files.replace(staged, target)
        finally:
            trainer.strategy.barrier("RunCheckpoint._save_checkpoint")  # every rank waits, also when the rename failed
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


class LastCheckpoint(RunCheckpoint):
    """RunCheckpoint that also writes `last.ckpt` at the end of training when its last save was earlier."""

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.save_last and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
