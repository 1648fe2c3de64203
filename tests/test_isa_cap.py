"""QLINEAR_ISA caps the CPU kernels' code, and a capped machine is another machine to the calibration."""

import pytest

from engine.kernels.cpu_kernels import isa_cap
from simulation.machine import _cpu_fingerprint


def test_isa_cap_reads_the_environment_and_names_bad_values(monkeypatch):
    monkeypatch.delenv("QLINEAR_ISA", raising=False)
    assert isa_cap() == "best"
    monkeypatch.setenv("QLINEAR_ISA", "avx2")
    assert isa_cap() == "avx2"
    monkeypatch.setenv("QLINEAR_ISA", "sse9")
    with pytest.raises(ValueError, match="QLINEAR_ISA='sse9'.*best, scalar, avx2, avx512"):
        isa_cap()


def test_kernels_capped_below_the_cpu_change_the_machine_fingerprint(monkeypatch):
    monkeypatch.delenv("QLINEAR_ISA", raising=False)
    _cpu_fingerprint.cache_clear()
    plain = _cpu_fingerprint()
    monkeypatch.setenv("QLINEAR_ISA", "avx2")
    _cpu_fingerprint.cache_clear()
    try:
        assert _cpu_fingerprint() == plain + ", kernels capped at avx2"
    finally:
        monkeypatch.delenv("QLINEAR_ISA")
        _cpu_fingerprint.cache_clear()
