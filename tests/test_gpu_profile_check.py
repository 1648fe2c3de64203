"""benchmarks/gpu_profile_check.py: measured steps against a hardware profile's prediction, shape by shape
(on the tiny preset on the CPU here: the errors are huge and only their arithmetic is checked)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name
import gpu_profile_check as check  # noqa: E402

from simulation.calibrate import GridPoint  # noqa: E402
from simulation.hardware_profile import load_profile  # noqa: E402
from simulation.profile_cost_model import ProfileCostModel  # noqa: E402


def row(measured_ms: float, profile_ms: float, prefill: int = 0, decodes: int = 0) -> check.Row:
    return check.Row(prefill, 0, decodes, 32 if decodes else 0, measured_ms, profile_ms,
                     check.relative_error(measured_ms, profile_ms), {})


def test_the_error_arithmetic_by_hand():
    assert check.relative_error(10.0, 12.0) == pytest.approx(0.2)        # the profile 20% slow
    assert check.relative_error(20.0, 15.0) == pytest.approx(-0.25)      # 25% fast
    rows = [row(10.0, 12.0, decodes=4), row(20.0, 15.0, prefill=64), row(4.0, 4.0, prefill=8, decodes=2),
            row(5.0, 10.0, decodes=1)]
    s = check.summarize(rows)
    # |errors|: decode 0.2 and 1.0; prefill-carrying 0.25 and 0.0
    assert s["median_abs_error"] == pytest.approx((0.2 + 0.25) / 2)
    assert s["median_abs_error_decode"] == pytest.approx(0.6) and s["decode_points"] == 2
    assert s["median_abs_error_prefill"] == pytest.approx(0.125) and s["prefill_points"] == 2
    assert s["max_abs_error"] == pytest.approx(1.0) and s["mean_abs_error"] == pytest.approx(1.45 / 4)
    assert s["median_error"] == pytest.approx((0.0 + 0.2) / 2)
    assert s["median_measured_over_profile"] == pytest.approx((10 / 12 + 1.0) / 2)
    assert not s["within_target"]
    assert [r.kind for r in rows] == ["decode", "prefill", "mixed", "decode"]


def test_draw_has_every_kind_and_the_largest_step():
    points = check.draw_points(12, 2048, 16, 8192, seed=0)
    assert points[0] == GridPoint(0, 32, 2048, 0) and len(points) == 13
    kinds = [(bool(p.decodes), bool(p.chunk)) for p in points[1:]]
    assert kinds.count((True, False)) == kinds.count((False, True)) == kinds.count((True, True)) == 4
    assert all(p.decodes + p.chunk <= 2048 for p in points)
    assert check.draw_points(6, 2048, 16, 512, seed=0)[0] != GridPoint(0, 32, 2048, 0)   # past the model's length


def test_the_tiny_preset_on_the_cpu_against_the_h100_profile():
    args = check.parse_args(["--device", "cpu", "--model", "tiny", "--profile", "h100-llama3.1-8b",
                             "--points", "5", "--repeats", "1"])
    points = check.draw_points(args.points, args.max_tokens, 16, 512, args.seed)
    engine = check.build_engine(args, check.blocks_needed(points, 16))
    profile = load_profile(args.profile)
    rows, shapes, seconds = check.compare(engine, ProfileCostModel(profile), points, args.repeats)
    assert len(rows) == len(points) == len(shapes) == len(seconds) == 5
    assert [(r.prefill_tokens, r.decodes) for r in rows] == [(p.chunk, p.decodes) for p in points]
    assert all(r.measured_ms > 0 and r.profile_ms > 0 for r in rows)
    assert all(sum(r.terms_ms.values()) == pytest.approx(r.profile_ms, rel=1e-3) for r in rows)
    assert math.isfinite(check.summarize(rows)["median_abs_error"])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks     # every step freed its KV
    warnings = check.mismatches(profile, engine, check.device_name("cpu"))
    assert any("not the profile's Llama-3.1-8B" in w for w in warnings)
