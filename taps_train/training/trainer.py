"""Lightning's Trainer with one more `precision`: `auto`, bfloat16 compute wherever the hardware computes it natively.

The same config then trains fast on every machine: bf16-mixed trains drafters to the same τ per step as fp32 (the
recipe study, `bench/curves/smol_eagle2_math_recipes.yaml`) and takes ~0.6-0.7x of its time on a CPU with AVX512-BF16
or AMX, but several times fp32's on one without, where PyTorch emulates it. `taps-train fit` builds this Trainer.
"""

from typing import Literal

import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch import Trainer as LightningTrainer
from lightning.pytorch.utilities import rank_zero_info

from taps_train.machine import native_bf16, processor
from taps_train.verifier.placement import resolve_compute_dtype


def auto_precision(accelerator: object = "auto") -> tuple[str, str]:
    """What `auto` means on this machine for a Trainer's `accelerator`, and why: bf16-mixed on a CUDA GPU with bf16
    (16-mixed on one without) and on a CPU with native bf16, 32-true on any other CPU or device."""
    name = (accelerator if isinstance(accelerator, str) else type(accelerator).__name__).lower()
    if torch.cuda.is_available() and (name == "auto" or name.startswith(("gpu", "cuda"))):
        gpu = torch.cuda.get_device_name()  # its half dtype: the one the verifier computes in there (`--verifier-dtype auto`)
        if resolve_compute_dtype("auto", "cuda") == torch.bfloat16:
            return "bf16-mixed", f"{gpu} computes bf16"
        return "16-mixed", f"{gpu} has no bf16"
    if name == "auto" or name.startswith("cpu"):
        if native_bf16():
            return "bf16-mixed", f"{processor()} computes bf16 (AVX512-BF16 or AMX)"
        return "32-true", f"{processor()} has no AVX512-BF16 or AMX: bf16 would be emulated, slower than fp32"
    return "32-true", f"accelerator {name}"


class Trainer(LightningTrainer):
    """`precision: auto` resolves by `auto_precision` (and says what it chose); every other value is Lightning's."""

    def __init__(self, *, precision: _PRECISION_INPUT | Literal["auto"] | None = None, **kwargs) -> None:
        if precision == "auto":
            precision, reason = auto_precision(kwargs.get("accelerator", "auto"))
            rank_zero_info(f"trainer.precision auto: {precision} ({reason})")
        super().__init__(precision=precision, **kwargs)
