"""benchmarks/step_time.py on the tiny preset on the CPU (the script's GPU run is one-shot: its arithmetic
and its JSON are checked here), and its profiler attribution on hand-made events."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name
import bench_common  # noqa: E402
import step_time  # noqa: E402

from torch.autograd import DeviceType  # noqa: E402

TINY = ["--model", "tiny", "--device", "cpu", "--batch-sizes", "1", "4", "--steps", "2", "--warmup-steps", "1",
        "--prefill-requests", "2", "--chunk", "32", "64", "--prefill-prompt-len", "64", "--context", "40",
        "--wait-idle", "0", "--retries", "0"]


@pytest.fixture(autouse=True)
def no_idle_wait(monkeypatch):
    """retry_contended's idle check watches the CPU for 2 s before every measurement: not in a test."""
    monkeypatch.setattr(bench_common, "wait_until_idle", lambda *args, **kwargs: 0.0)


def event(name: str, start: float, device: bool = False, us: float = 0.0, annotation: bool = False):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA if device else DeviceType.CPU,
                           time_range=SimpleNamespace(start=start, end=start + us), self_device_time_total=us,
                           is_user_annotation=annotation)


def test_device_events_count_for_the_step_they_run_in():
    mark = step_time.STEP_MARK
    events = [event("early_kernel", 5.0, device=True, us=7.0),            # before any step: nobody's
              event(mark, 10.0), event("aten::mm", 11.0), event("gemm", 12.0, device=True, us=30.0),
              event(mark, 12.5, device=True, us=40.0, annotation=True),   # the range on the GPU timeline
              event("Memcpy DtoH", 45.0, device=True, us=2.0),
              event(mark, 50.0), event("gemm", 51.0, device=True, us=20.0),
              event("other_annotation", 52.0, device=True, us=9.0, annotation=True)]
    assert step_time.device_time_per_step(events) == [(pytest.approx(32e-6), 2), (pytest.approx(20e-6), 1)]


def test_kernel_mbu_is_the_step_bytes_over_the_device_time():
    cost = SimpleNamespace(step_bytes=lambda r: 1e6)
    meter = step_time.Meter(cost, step_time.Peaks(None, 1e9, "flags"), "cuda")
    stats = step_time.StepStats("decode", 1, 0, 1, *[1e-3] * 10, 0.0, 0.0)
    profiled = [step_time.Profiled(None, 2e-3, 10), step_time.Profiled(None, 4e-3, 12)]
    out = step_time.with_profile(stats, profiled, meter)
    assert (out.profiled_steps, out.kernel_s, out.kernels_per_step) == (2, pytest.approx(3e-3), 11)
    assert out.kernel_mbu == pytest.approx(2e6 / 6e-3 / 1e9)


def test_the_tiny_preset_on_the_cpu_with_peaks_and_the_profiler(tmp_path):
    path = tmp_path / "out.json"
    summary = step_time.main(TINY + ["--peak-flops", "1e12", "--peak-bandwidth", "1e11", "--torch-profile", "2",
                                     "--json", str(path)])
    assert summary["complete"] and not summary["errors"]
    results = json.loads(path.read_text())["results"]
    kinds = [(r["kind"], r["batch"]) for r in results]
    assert kinds[:2] == [("decode", 1), ("decode", 4)] and {("prefill", 32), ("prefill", 64)} <= set(kinds)
    for r in results:
        assert isinstance(r["mbu"], float) and r["mbu"] > 0 and isinstance(r["mfu"], float) and r["mfu"] > 0
        assert r["profiled_steps"] == 2 and r["kernel_s"] is None and r["kernel_mbu"] is None   # no GPU here
    assert summary["peaks"]["source"] == "flags" and summary["device_description"].startswith("cpu")


def test_without_peaks_mbu_and_mfu_are_none():
    summary = step_time.main(TINY[:4] + ["--retries", "0", "--batch-sizes", "1", "--steps", "1", "--chunk", "64",
                                         "--prefill-requests", "2", "--prefill-prompt-len", "64", "--context", "40"])
    assert summary["peaks"]["source"] == "none" and summary["results"]
    assert all(r["mbu"] is None and r["mfu"] is None for r in summary["results"])


def test_a_hardware_profile_gives_the_peaks():
    args = step_time.parse_args(["--hardware-profile", "h100-llama3.1-8b", "--peak-bandwidth", "2e12"])
    assert step_time.resolve_peaks(args) == step_time.Peaks(989e12, 2e12, "flags and profile h100-llama3.1-8b")
