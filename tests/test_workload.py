"""Workload generation: arrival statistics, phases, length distributions, traces and config errors."""

from __future__ import annotations

import numpy as np
import pytest

from autotuner.workload import (ArrivalProcess, Phase, Workload, generate, load_workload, parse_workload,
                                preset_names)


def arrivals(process: ArrivalProcess, qps: float = 5.0, n: int = 20_000) -> np.ndarray:
    w = Workload("w", [Phase("p", arrival=process)])
    return np.array([s.arrival_s for s in generate(w, qps=qps, num_requests=n, seed=1)])


def cv(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_poisson_rate_and_dispersion():
    t = arrivals(ArrivalProcess("poisson"))
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.03)
    counts = np.histogram(t, bins=np.arange(0, np.floor(t[-1])))[0]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)   # index of dispersion
    assert cv(t) == pytest.approx(1.0, abs=0.05)


def test_gamma_is_burstier_and_fixed_is_regular():
    assert cv(arrivals(ArrivalProcess("gamma", burstiness=4.0))) == pytest.approx(2.0, rel=0.1)
    t = arrivals(ArrivalProcess("gamma", burstiness=4.0))
    assert len(t) / t[-1] == pytest.approx(5.0, rel=0.05)
    fixed = arrivals(ArrivalProcess("fixed"), n=100)
    assert cv(fixed) == pytest.approx(0.0, abs=1e-9) and fixed[0] == pytest.approx(0.2)


def test_ramp_rate_increases():
    w = Workload("w", [Phase("p", arrival=ArrivalProcess("ramp", ramp_from=0.5, ramp_to=4.0))])
    t = np.array([s.arrival_s for s in generate(w, qps=2.0, duration_s=1000.0)])
    counts = np.histogram(t, bins=4, range=(0, 1000))[0]
    assert list(counts) == sorted(counts) and counts[-1] > 3 * counts[0]
    assert len(t) == pytest.approx(2.0 * (0.5 + 4.0) / 2 * 1000, rel=0.05)   # integral of the rate


def test_phases_ordered_and_labelled():
    specs = generate(load_workload("shift"), qps=2.0, num_requests=300)
    phases = [s.phase for s in specs]
    assert phases == ["chat-1"] * 100 + ["summarization"] * 100 + ["chat-2"] * 100
    assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)
    by_time = generate(load_workload("shift"), qps=2.0, duration_s=300.0)
    for s in by_time:
        assert s.phase == ("chat-1", "summarization", "chat-2")[int(s.arrival_s // 100)]
    summ = [s.prompt_tokens for s in specs if s.phase == "summarization"]
    assert min(summ) >= 1000 and max(summ) <= 4000


def test_chat_lengths_and_presets():
    specs = generate(load_workload("chat"), num_requests=20_000)
    prompts = np.array([s.prompt_tokens for s in specs])
    outputs = np.array([s.output_tokens for s in specs])
    assert 180 <= prompts.mean() <= 220 and prompts.min() >= 16 and prompts.max() <= 1024
    assert 105 <= outputs.mean() <= 125 and outputs.min() >= 8 and outputs.max() <= 512
    assert {"chat", "summarization", "shift", "bursty-chat", "ramp-chat"} <= set(preset_names())
    for name in preset_names():
        assert generate(load_workload(name), num_requests=10)


def test_seeded_and_qps_rescales_the_same_requests():
    w = load_workload("chat")
    a, b = generate(w, qps=1.0, num_requests=50, seed=3), generate(w, qps=2.0, num_requests=50, seed=3)
    assert a == generate(w, qps=1.0, num_requests=50, seed=3) and a != generate(w, qps=1.0, num_requests=50)
    assert [s.arrival_s / 2 for s in a] == pytest.approx([s.arrival_s for s in b])
    assert [s.prompt_tokens for s in a] == [s.prompt_tokens for s in b]


def test_duration_cuts_arrivals():
    specs = generate(load_workload("chat"), qps=10.0, num_requests=1000, duration_s=5.0)
    assert 0 < len(specs) < 100 and max(s.arrival_s for s in specs) < 5.0


def test_trace_csv(tmp_path):
    (tmp_path / "t.csv").write_text("num_prefill_tokens,num_decode_tokens\n10,1\n20,2\n30,3\n")
    (tmp_path / "w.yaml").write_text(
        "qps: 2\nphases:\n  - {name: replay, requests: 5, lengths: {kind: trace, path: t.csv, order: replay}}\n"
        "  - {name: sampled, requests: 50, arrival: fixed, lengths: {kind: trace, path: t.csv}}\n")
    specs = generate(load_workload(str(tmp_path / "w.yaml")), num_requests=55)
    assert len(specs) == 55
    replay = [(s.prompt_tokens, s.output_tokens) for s in specs if s.phase == "replay"]
    assert replay == [(10, 1), (20, 2), (30, 3), (10, 1), (20, 2)]
    assert {(s.prompt_tokens, s.output_tokens) for s in specs if s.phase == "sampled"} == {(10, 1), (20, 2), (30, 3)}


def test_uniform_and_fixed_lengths():
    w = parse_workload("x", {"phases": [{"lengths": {"kind": "uniform", "prompt": [5, 7], "output": [1, 2]}},
                                        {"lengths": {"kind": "fixed", "prompt": 9, "output": 4}}]})
    specs = generate(w, num_requests=200)
    assert {s.prompt_tokens for s in specs if s.phase == "phase-1"} == {5, 6, 7}
    assert {(s.prompt_tokens, s.output_tokens) for s in specs if s.phase == "phase-2"} == {(9, 4)}


@pytest.mark.parametrize("data, message", [
    ({"phases": []}, "'phases' must be a non-empty list"),
    ({"phases": [{"arrival": "gama"}]}, "unknown arrival process 'gama' (known: poisson, gamma, fixed, ramp)"),
    ({"phases": [{"lengths": "poem"}]}, "unknown lengths kind 'poem'"),
    ({"phases": [{"lengths": {"kind": "uniform", "prompt": [9, 3], "output": [1, 2]}}]}, "1 <= min <= max"),
    ({"phases": [{"name": "a", "share": 1, "requests": 2}]}, "phase 'a': give share or requests, not both"),
    ({"phases": [{"colour": "red"}]}, "unknown key 'colour'"),
    ({"qps": -1, "phases": [{}]}, "qps must be > 0"),
    ({"phases": [{"lengths": {"kind": "trace", "path": "/no/such.csv"}}]}, "cannot read trace /no/such.csv"),
])
def test_bad_configs_give_one_line_errors(data, message):
    with pytest.raises(ValueError) as e:
        parse_workload("x", data)
    assert message in str(e.value) and str(e.value).startswith("workload 'x': ") and "\n" not in str(e.value)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown workload 'nope'.*known: chat, summarization, shift"):
        load_workload("nope")
    with pytest.raises(ValueError, match="num_requests or duration_s"):
        generate(load_workload("chat"))
