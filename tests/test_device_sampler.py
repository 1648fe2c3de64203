"""The NVML/GPM hardware reader, run against a fake pynvml: what it reads, how it pairs GPM samples,
and what it does when NVML (or one of its fields) is not there. The real library's names are checked
against the fake's, so the fake cannot drift from what the reader would call on a GPU."""

from __future__ import annotations

import sys
import threading
import types
from types import SimpleNamespace

import pytest

from telemetry import device_sampler
from telemetry.device_sampler import CpuReader, DeviceSampler, GpmReader, NvmlReader, open_reader

GIB = 2**30


class FakeNvmlError(Exception):
    pass


class FakeGpmRequest:
    """c_nvmlGpmMetricsGet_t: a fixed array of metric slots the caller fills in."""

    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=-1, value=0.0) for _ in range(210)]


def fake_pynvml(gpm: bool | str = True, failing: tuple[str, ...] = (), init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in for one H100 at index 1. `gpm`: True (supported), False (the device says
    no), "error" (the query raises NVMLError), "old" (a pynvml without the GPM API). `failing`: the
    optional readings that raise NVMLError. A GPM metric value is 10 x its id plus (sample2's
    sequence number - sample1's), so pairing samples out of order shows in the values."""
    n = types.ModuleType("pynvml")
    n.NVMLError = FakeNvmlError
    n.NVML_SUCCESS, n.NVML_ERROR_NOT_SUPPORTED, n.NVML_CLOCK_SM = 0, 3, 1
    n.NVML_GPM_METRICS_GET_VERSION = 1
    n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_ANY_TENSOR_UTIL, n.NVML_GPM_METRIC_DRAM_BW_UTIL = 2, 5, 10
    n.handles, n.samples, n.freed, n.requests = {}, [], [], []

    def init():
        if init_error:
            raise FakeNvmlError("NVML Shared Library Not Found")

    def handle(index):
        return n.handles.setdefault(index, SimpleNamespace(index=index))

    def optional(name, value):
        def read(*args):
            if name in failing:
                raise FakeNvmlError(f"{name}: Not Supported")
            return value
        return read

    n.nvmlInit = init
    n.nvmlDeviceGetHandleByIndex = handle
    n.nvmlDeviceGetName = lambda h: f"NVIDIA H100 80GB HBM3 #{h.index}"
    n.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=87, memory=41)
    n.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=80 * GIB, free=30 * GIB, used=50 * GIB)
    n.nvmlDeviceGetPowerUsage = optional("power", 412_345)                 # milliwatts
    n.nvmlDeviceGetClockInfo = lambda h, clock: optional("clock", 1980 if clock == n.NVML_CLOCK_SM else 0)()
    n.nvmlDeviceGetCurrentClocksEventReasons = optional("reasons", 4)

    if gpm == "old":
        return n

    def query(h):
        if gpm == "error":
            raise FakeNvmlError("GPM query: Not Supported")
        return SimpleNamespace(version=1, isSupportedDevice=int(bool(gpm)))

    def sample_get(h, sample):
        if sample in n.freed:
            raise FakeNvmlError("use after free")
        sample.seq = n.samples_taken
        n.samples_taken += 1

    def metrics_get(request):
        assert request.version == n.NVML_GPM_METRICS_GET_VERSION
        if request.sample1 in n.freed or request.sample2 in n.freed:
            raise FakeNvmlError("use after free")
        n.requests.append((request.sample1.seq, request.sample2.seq))
        for slot in request.metrics[:request.numMetrics]:
            if slot.metricId == n.NVML_GPM_METRIC_SM_UTIL and "gpm_sm" in failing:
                slot.nvmlReturn = n.NVML_ERROR_NOT_SUPPORTED
                continue
            slot.nvmlReturn = n.NVML_SUCCESS
            slot.value = 10.0 * slot.metricId + (request.sample2.seq - request.sample1.seq)
        return request

    def sample_alloc():
        sample = SimpleNamespace(seq=None)
        n.samples.append(sample)
        return sample

    n.samples_taken = 0
    n.nvmlGpmQueryDeviceSupport = query
    n.nvmlGpmSampleAlloc = sample_alloc
    n.nvmlGpmSampleGet = sample_get
    n.nvmlGpmSampleFree = n.freed.append
    n.nvmlGpmMetricsGet = metrics_get
    n.c_nvmlGpmMetricsGet_t = FakeGpmRequest
    return n


def install(monkeypatch, **kwargs) -> types.ModuleType:
    module = fake_pynvml(**kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_reads_name_memory_utilisation_power_clock_and_gpm(monkeypatch):
    nvml = install(monkeypatch)
    reader = open_reader("cuda:1")
    assert isinstance(reader, NvmlReader) and reader.handle is nvml.handles[1]
    assert reader.name == "NVIDIA H100 80GB HBM3 #1" and isinstance(reader.gpm, GpmReader)
    assert reader.read() == {"gpu_util_perc": 87.0, "gpu_mem_util_perc": 41.0, "gpu_mem_used_bytes": 50.0 * GIB,
                             "gpu_power_w": pytest.approx(412.345), "gpu_sm_clock_mhz": 1980.0,
                             "gpu_throttle_reasons": 4.0, "gpm_dram_bw_util_perc": 101.0,
                             "gpm_tensor_util_perc": 51.0, "gpm_sm_util_perc": 21.0}


def test_gpm_pairs_each_sample_with_the_previous_one_and_frees_it(monkeypatch):
    """Every read is one interval: (previous, current) in that order; the previous is freed after
    use and the current kept as the next read's start."""
    nvml = install(monkeypatch)
    reader = NvmlReader(0)
    for _ in range(3):
        sample = reader.read()
        assert sample["gpm_dram_bw_util_perc"] == 101.0         # 10 x 10 + (newer - older) = 1
    assert nvml.requests == [(0, 1), (1, 2), (2, 3)]
    assert nvml.freed == nvml.samples[:3] and reader.gpm.previous is nvml.samples[3]


def test_a_gpm_metric_the_device_does_not_report_is_left_out(monkeypatch):
    install(monkeypatch, failing=("gpm_sm",))
    sample = NvmlReader(0).read()
    assert "gpm_sm_util_perc" not in sample and sample["gpm_tensor_util_perc"] == 51.0


@pytest.mark.parametrize("gpm", [False, "error", "old"])
def test_without_gpm_the_basic_fields_remain(monkeypatch, gpm):
    """Pre-Hopper boards (isSupportedDevice 0 or NVMLError) and a pynvml without the GPM API."""
    install(monkeypatch, gpm=gpm)
    reader = NvmlReader(0)
    assert reader.gpm is None
    sample = reader.read()
    assert not any(k.startswith("gpm_") for k in sample) and sample["gpu_util_perc"] == 87.0


def test_optional_fields_that_raise_nvml_errors_are_skipped(monkeypatch):
    install(monkeypatch, failing=("power", "clock", "reasons"))
    sample = NvmlReader(0).read()
    assert {"gpu_power_w", "gpu_sm_clock_mhz", "gpu_throttle_reasons"}.isdisjoint(sample)
    assert sample["gpu_mem_used_bytes"] == 50.0 * GIB and sample["gpm_tensor_util_perc"] == 51.0


def test_nvml_init_error_falls_back_to_cpu(monkeypatch, caplog):
    install(monkeypatch, init_error=True)
    with caplog.at_level("INFO", logger=device_sampler.__name__):
        reader = open_reader("cuda:0")
    assert isinstance(reader, CpuReader)
    assert any("NVML unavailable (NVML Shared Library Not Found)" in m for m in caplog.messages)


def test_missing_pynvml_falls_back_to_cpu(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)       # import pynvml raises ImportError
    with caplog.at_level("INFO", logger=device_sampler.__name__):
        assert isinstance(open_reader("cuda"), CpuReader)
    assert any("NVML unavailable" in m for m in caplog.messages)


def test_cpu_device_never_touches_nvml(monkeypatch):
    nvml = install(monkeypatch)
    assert isinstance(open_reader("cpu"), CpuReader) and not nvml.handles


def test_sampler_thread_reports_samples_and_survives_a_failing_read(monkeypatch, caplog):
    nvml = install(monkeypatch)
    got, done = [], threading.Event()
    real = nvml.nvmlDeviceGetUtilizationRates
    calls = iter(range(1000))

    def flaky(h):
        if next(calls) == 0:
            raise FakeNvmlError("GPU is lost")
        return real(h)

    nvml.nvmlDeviceGetUtilizationRates = flaky

    def on_sample(sample):
        got.append(sample)
        done.set()

    sampler = DeviceSampler("cuda", on_sample, interval_s=0.01)
    with caplog.at_level("ERROR", logger=device_sampler.__name__):
        sampler.start()
        assert done.wait(5.0)
        sampler.stop()
    assert got[0]["gpu_util_perc"] == 87.0
    assert any("device sample failed" in m for m in caplog.messages)


def test_the_fake_has_the_real_pynvml_names():
    """Every name the reader uses from the fake exists in the installed nvidia-ml-py, with the
    GPM metric ids the fake encodes and the metrics structure's fields."""
    real = pytest.importorskip("pynvml")
    fake = fake_pynvml()
    used = [name for name in vars(fake) if name.startswith(("nvml", "NVML", "c_nvml"))]
    missing = [name for name in used if not hasattr(real, name)]
    assert not missing, missing
    for name in ("NVML_SUCCESS", "NVML_CLOCK_SM", "NVML_GPM_METRICS_GET_VERSION", "NVML_GPM_METRIC_SM_UTIL",
                 "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "NVML_GPM_METRIC_DRAM_BW_UTIL"):
        assert getattr(fake, name) == getattr(real, name), name
    fields = {f[0] for f in real.c_nvmlGpmMetricsGet_t._fields_}
    assert {"version", "numMetrics", "sample1", "sample2", "metrics"} <= fields
    assert {f[0] for f in real.c_nvmlGpmMetric_t._fields_} >= {"metricId", "nvmlReturn", "value"}
    assert issubclass(real.NVMLError, Exception)
