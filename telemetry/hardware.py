"""Peak compute and memory bandwidth of the device, to turn FLOP/s and bytes/s into MFU and MBU.

Given in the config when known; otherwise measured once at start-up with a short matmul and
copy probe (well under a second), which is what this machine can actually reach.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevicePeaks:
    flops_per_s: float
    bytes_per_s: float
    source: str            # "config" or "probe"


def probe_peaks(device: str, dtype: torch.dtype, seconds: float = 0.3) -> DevicePeaks:
    flops = _best_rate(lambda: _matmul_flops(device, dtype), seconds / 2)
    bandwidth = _best_rate(lambda: _copy_bytes(device), seconds / 2)
    log.info("device peaks (probe): %.2f TFLOP/s %s, %.1f GB/s", flops / 1e12, dtype, bandwidth / 1e9)
    return DevicePeaks(flops, bandwidth, "probe")


def _best_rate(run, seconds: float) -> float:
    best, deadline = 0.0, time.perf_counter() + seconds
    while True:
        best = max(best, run())
        if time.perf_counter() >= deadline:
            return best


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _matmul_flops(device: str, dtype: torch.dtype, n: int = 1024) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    _sync(device)
    start = time.perf_counter()
    a @ a
    _sync(device)
    return 2 * n**3 / (time.perf_counter() - start)


def _copy_bytes(device: str, mib: int = 64) -> float:
    src = torch.empty(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    _sync(device)
    start = time.perf_counter()
    dst.copy_(src)
    _sync(device)
    return 2 * src.numel() * 4 / (time.perf_counter() - start)   # read + write
