"""Where a verifier runs and in which precision: `--device` and `--verifier-dtype`.

`auto` means what a GPU user wants without thinking: the current CUDA device in bfloat16 when CUDA is
available, else the CPU in float32 (CPUs have no fast bf16 matmul and the tiny verifier is tiny).
`auto-shard` spreads the layers of a verifier too big for one GPU over every visible GPU, through
transformers' `device_map="auto"` (accelerate). The compute dtype is not the feature cache's storage
dtype (`cache --dtype`): features are computed in this one and stored in that one.
"""

import argparse
from dataclasses import dataclass

import torch

from taps_train.errors import TapsError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "auto-shard")
COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
COMPUTE_DTYPE_CHOICES = ("auto", *COMPUTE_DTYPES)
AUTO_SHARD = "auto-shard"


@dataclass(frozen=True)
class Placement:
    """A resolved placement: `device` is a torch device string, or `auto-shard`."""

    device: str
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def from_pretrained_kwargs(self) -> dict:
        """`dtype` and `device_map` for `from_pretrained`: weights load straight onto the device(s)."""
        return {"dtype": self.dtype, "device_map": "auto" if self.device == AUTO_SHARD else {"": self.device}}


def resolve_placement(device: str = "auto", dtype: str = "auto") -> Placement:
    """Check both options against this machine before anything heavy runs."""
    resolved = resolve_device(device)
    return Placement(resolved, resolve_compute_dtype(dtype, resolved))


def resolve_device(device: str) -> str:
    if not isinstance(device, str):
        raise TapsError(f"verifier device must be a string, one of {', '.join(DEVICE_CHOICES)}; got {device!r}")
    name = device.strip().lower()
    has_cuda = torch.cuda.is_available()
    if name == "auto":
        return f"cuda:{torch.cuda.current_device()}" if has_cuda else "cpu"
    if name == "cpu":
        return "cpu"
    if name == AUTO_SHARD or name == "cuda" or name.startswith("cuda:"):
        if not has_cuda:
            raise TapsError(f"--device {device} needs CUDA, but torch {torch.__version__} sees no CUDA device on this machine; "
                            "use --device cpu (or auto), or install a CUDA build of torch")
        if name == AUTO_SHARD:
            _require_accelerate()
            return AUTO_SHARD
        if name == "cuda":
            return f"cuda:{torch.cuda.current_device()}"
        index = name.removeprefix("cuda:")
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise TapsError(f"--device {device}: this machine has CUDA devices 0..{torch.cuda.device_count() - 1}; use one of them, cuda, auto or auto-shard")
        return name
    raise TapsError(f"unknown verifier device {device!r}; use one of {', '.join(DEVICE_CHOICES)}")


def resolve_compute_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        if device == "cpu":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dtype not in COMPUTE_DTYPES:
        raise TapsError(f"unknown verifier compute dtype {dtype!r}; use one of {', '.join(COMPUTE_DTYPE_CHOICES)}")
    return COMPUTE_DTYPES[dtype]


def training_dtype(precision: str) -> torch.dtype:
    """The dtype Lightning's precision plugin computes in ("bf16-mixed" -> bfloat16, "32-true" -> float32)."""
    text = str(precision)
    if text.startswith("bf16"):
        return torch.bfloat16
    if text.startswith("16"):
        return torch.float16
    if text.startswith("64"):
        return torch.float64
    return torch.float32


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """`--device` / `--verifier-dtype`, the same for every command that runs the verifier."""
    parser.add_argument("--device", default="auto", metavar="{" + ",".join(DEVICE_CHOICES) + "}",
                        help="where the verifier runs: auto = the current CUDA device if any, else cpu; auto-shard = layers spread over all visible GPUs")
    parser.add_argument("--verifier-dtype", default="auto", metavar="{" + ",".join(COMPUTE_DTYPE_CHOICES) + "}",
                        help="the verifier's compute dtype: auto = bfloat16 on CUDA, float32 on CPU (not the cache's storage dtype)")


def _require_accelerate() -> None:
    try:
        import accelerate  # noqa: F401
    except ImportError as err:
        raise TapsError("--device auto-shard needs the `accelerate` package (pip install accelerate)") from err
