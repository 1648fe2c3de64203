"""Hardware samples on a background thread: NVML on NVIDIA GPUs, process CPU figures otherwise.

Without a GPU, pynvml.nvmlInit() raises an NVMLError (NVMLError_LibraryNotFound on a machine
with no driver); the sampler then says so once in the log and reports CPU utilisation, leaving
compute and bandwidth saturation to the model-based MFU/MBU estimates.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Sample = dict[str, float]


class NvmlReader:
    def __init__(self, index: int = 0) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.name = pynvml.nvmlDeviceGetName(self.handle)
        self.gpm = GpmReader(pynvml, self.handle) if GpmReader.supported(pynvml, self.handle) else None

    def read(self) -> Sample:
        n, h = self.nvml, self.handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        memory = n.nvmlDeviceGetMemoryInfo(h)
        sample = {"gpu_util_perc": float(util.gpu), "gpu_mem_util_perc": float(util.memory),
                  "gpu_mem_used_bytes": float(memory.used)}
        for key, read in (("gpu_power_w", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
                          ("gpu_sm_clock_mhz", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                          ("gpu_throttle_reasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))):
            try:
                sample[key] = float(read())
            except n.NVMLError:
                pass   # not every board reports every field
        if self.gpm:
            sample.update(self.gpm.read())
        return sample


class GpmReader:
    """Hopper+ GPU performance monitoring: metrics between two samples taken one interval apart."""

    METRICS = {"gpm_dram_bw_util_perc": "NVML_GPM_METRIC_DRAM_BW_UTIL",
               "gpm_tensor_util_perc": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
               "gpm_sm_util_perc": "NVML_GPM_METRIC_SM_UTIL"}

    @staticmethod
    def supported(nvml, handle) -> bool:
        try:
            return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (nvml.NVMLError, AttributeError):
            return False

    def __init__(self, nvml, handle) -> None:
        self.nvml, self.handle = nvml, handle
        self.previous = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, self.previous)

    def read(self) -> Sample:
        n = self.nvml
        current = n.nvmlGpmSampleAlloc()
        n.nvmlGpmSampleGet(self.handle, current)
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.METRICS)
        request.sample1, request.sample2 = self.previous, current
        for i, metric in enumerate(self.METRICS.values()):
            request.metrics[i].metricId = getattr(n, metric)
        n.nvmlGpmMetricsGet(request)
        n.nvmlGpmSampleFree(self.previous)
        self.previous = current
        return {name: float(request.metrics[i].value) for i, name in enumerate(self.METRICS)
                if request.metrics[i].nvmlReturn == n.NVML_SUCCESS}


class CpuReader:
    """This process's CPU use across all cores, in percent of the machine."""

    name = "cpu"

    def __init__(self) -> None:
        self._last = (time.monotonic(), time.process_time())

    def read(self) -> Sample:
        now, cpu = time.monotonic(), time.process_time()
        wall, used = now - self._last[0], cpu - self._last[1]
        self._last = (now, cpu)
        cores = os.cpu_count() or 1
        return {"cpu_util_perc": 100.0 * used / (wall * cores) if wall > 0 else 0.0,
                "cpu_load_1m": os.getloadavg()[0]}


def open_reader(device: str) -> NvmlReader | CpuReader:
    if device.startswith("cuda"):
        try:
            return NvmlReader(int(device.split(":")[1]) if ":" in device else 0)
        except Exception as e:  # pynvml.NVMLError, or the package missing
            log.info("NVML unavailable (%s): reporting CPU figures and model-based MFU/MBU estimates", e)
    else:
        log.info("no GPU in use: reporting CPU figures and model-based MFU/MBU estimates")
    return CpuReader()


class DeviceSampler:
    def __init__(self, device: str, on_sample: Callable[[Sample], None], interval_s: float = 1.0) -> None:
        self.reader = open_reader(device)
        self.on_sample = on_sample
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.on_sample(self.reader.read())
            except Exception:
                log.exception("device sample failed")
