"""What a calibration was measured on: a short, stable description of the device, so a cost model
fitted on one machine is not used to price steps on another (a faster CPU, another ISA, a GPU)."""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

import psutil
import torch

# the instruction sets that change a CPU's matmul speed several-fold (field notes: AMX bf16 ~7x fp32)
CPU_FEATURES = ("amx_tile", "avx512_bf16", "avx512f", "avx2")


def machine_fingerprint(device: str) -> str:
    """e.g. "cpu: AMD EPYC 7B13, 2 cores, avx2" or "cuda: NVIDIA H100 80GB HBM3"."""
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        return f"cuda: {torch.cuda.get_device_name(index)}"
    return _cpu_fingerprint()


@cache
def _cpu_fingerprint() -> str:
    name, flags = _cpu_info()
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    isa = next((f for f in CPU_FEATURES if f in flags), "baseline")
    # kernels capped below the CPU's best (engine/kernels/cpu_kernels.py) run at another speed: another machine
    cap = os.environ.get("QLINEAR_ISA", "best")
    return f"cpu: {name}, {cores} cores, {isa}" + ("" if cap == "best" else f", kernels capped at {cap}")


def _cpu_info() -> tuple[str, set[str]]:
    """(model name, flags) from /proc/cpuinfo; the platform's processor string elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())
