"""The machine a timing was taken on: what a reader must know before comparing two speedups (they depend on the
processor, its instruction set and the threads a run had, not on the drafter alone)."""

import platform
from pathlib import Path

import torch

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # what decides CPU matmul speed per dtype


def cpu_flags() -> list[str]:
    """Of FLAGS, those this CPU reports (Linux /proc/cpuinfo; none elsewhere)."""
    try:
        found = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [flag for flag in FLAGS if flag in found]


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX); elsewhere PyTorch emulates it, slower than fp32."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def processor() -> str:
    """The CPU's model name (Linux), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: torch.device | str = "cpu") -> dict:
    """The eval report's `machine`: processor, flags, PyTorch's threads and, on a GPU, the GPU's name."""
    found = {"processor": processor(), "flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__}
    device = torch.device(device)
    if device.type == "cuda":
        found["gpu"] = torch.cuda.get_device_name(device)
    return found
