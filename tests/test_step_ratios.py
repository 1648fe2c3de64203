"""benchmarks/step_ratios.py's grouping of live steps by the prefill tokens they carry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name
from step_ratios import ratios_by_kind  # noqa: E402


def test_each_kind_of_step_gets_its_own_ratios():
    decodes = [{"duration_s": 0.01 * f, "predicted_s": 0.01, "prefill": 0, "running": 3} for f in (0.5, 1.0, 1.5)]
    chunks = [{"duration_s": 0.2 * f, "predicted_s": 0.2, "prefill": 200, "running": 3} for f in (0.9, 1.0, 1.1)]
    rows = ratios_by_kind(decodes + chunks)
    assert [r["prefill_tokens"] for r in rows] == [[0, 0], [129, 256]]   # empty kinds are left out
    decode, chunk = rows
    assert decode["steps"] == 3 and decode["ratio_p50"] == pytest.approx(1.0)
    assert decode["ratio_p90"] == pytest.approx(1.4) and chunk["ratio_p90"] == pytest.approx(1.08)
    assert chunk["duration_p50_s"] == pytest.approx(0.2)
