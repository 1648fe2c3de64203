"""Workload generation: arrival statistics, phases, length distributions, traces and config errors."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from loadgen.workload import (ArrivalProcess, Phase, RequestSpec, Workload, generate, load_workload,
                                parse_workload, preset_names)


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
    assert {"chat", "summarization", "shift", "bursty-chat", "ramp-chat", "mixed-classes",
            "shift-classes"} <= set(preset_names())
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
    ({"phases": [{"name": "a", "slo_class": "gold"}]},
     "phase 'a': unknown slo_class 'gold'; known: interactive, batch"),
    ({"phases": [{"name": "a", "streams": [{"name": "s", "slo_class": "Batch"}]}]},
     "phase 'a': stream 's': unknown slo_class 'Batch'"),
    ({"phases": [{"name": "a", "slo_class": "gold", "streams": [{"slo_class": "batch"}]}]}, "unknown slo_class 'gold'"),
    ({"phases": [{"name": "a", "streams": []}]}, "phase 'a': 'streams' must be a non-empty list"),
    ({"phases": [{"name": "a", "streams": [{"name": "s"}, {"name": "s"}]}]}, "stream names must be unique"),
    ({"phases": [{"name": "a", "streams": [{"name": "s", "share": 1}]}]}, "stream 1: unknown key 'share'"),
    ({"phases": [{"name": "a", "streams": [{"name": "s", "rate": 0}]}]}, "stream 's': rate must be > 0"),
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


def digest(specs: list[RequestSpec]) -> str:
    rows = [(round(s.arrival_s, 9), s.prompt_tokens, s.output_tokens, s.phase, s.slo_class) for s in specs]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


# Recorded with the generator before phases had streams and SLO classes: same seed, same requests.
OLD_PRESETS = {
    "chat": ("57b85805134fa001", "65c769db245bb5f8", "7628510f4037be38"),
    "summarization": ("1d1deb8045a0bd3c", "34b49fa876817c3a", "a144ddccb7e3a43c"),
    "shift": ("ea38ec43e83ac68a", "8fae44ab9d064ada", "bcd47d0738c8b32a"),
    "bursty-chat": ("6bf024e407ada1d8", "3e0db7090a3f5f1d", "1a43309d7d6c05ff"),
    "ramp-chat": ("4149a9327eb1b4a2", "b372c49883a06336", "9f839afeab26b27e"),
}


@pytest.mark.parametrize("name", OLD_PRESETS)
def test_old_presets_generate_the_same_requests(name):
    w = load_workload(name)
    assert (digest(generate(w, qps=1.5, num_requests=300, seed=7)), digest(generate(w, duration_s=200.0, seed=2)),
            digest(generate(w, qps=2.0, num_requests=100, duration_s=30.0, seed=0))) == OLD_PRESETS[name]


TWO_STREAMS = {"phases": [{"name": "p", "streams": [
    {"name": "a", "rate": 1.0, "arrival": {"process": "gamma", "burstiness": 4}, "lengths": "chat"},
    {"name": "b", "rate": 0.25, "arrival": "poisson", "lengths": "summarization", "slo_class": "batch"}]}]}


def test_streams_merge_in_arrival_order_each_at_its_own_rate():
    w = parse_workload("two", TWO_STREAMS)
    for specs in (generate(w, qps=4.0, duration_s=5000.0, seed=1), generate(w, qps=4.0, num_requests=25_000, seed=1)):
        assert [s.arrival_s for s in specs] == sorted(s.arrival_s for s in specs)
        span = specs[-1].arrival_s
        a = np.array([s.arrival_s for s in specs if s.phase == "p/a"])
        b = np.array([s.arrival_s for s in specs if s.phase == "p/b"])
        assert len(a) + len(b) == len(specs)
        assert len(a) / span == pytest.approx(4.0, rel=0.05) and len(b) / span == pytest.approx(1.0, rel=0.05)
        assert cv(a) == pytest.approx(2.0, rel=0.1) and cv(b) == pytest.approx(1.0, rel=0.05)   # own processes
        assert min(s.prompt_tokens for s in specs if s.phase == "p/b") >= 1000                    # own lengths
        assert {(s.phase, s.slo_class) for s in specs} == {("p/a", None), ("p/b", "batch")}


def test_streams_count_mode_is_exact_and_qps_rescales_the_same_requests():
    w = parse_workload("two", TWO_STREAMS)
    one, two = generate(w, qps=1.0, num_requests=500, seed=3), generate(w, qps=2.0, num_requests=500, seed=3)
    assert len(one) == 500 and [s.arrival_s / 2 for s in one] == pytest.approx([s.arrival_s for s in two])
    assert [(s.phase, s.prompt_tokens) for s in one] == [(s.phase, s.prompt_tokens) for s in two]
    # the first 500 of a longer run: drawing more arrivals does not change the earlier ones
    longer = generate(w, qps=1.0, num_requests=2000, seed=3)
    assert [(s.arrival_s, s.phase) for s in longer[:500]] == [(s.arrival_s, s.phase) for s in one]
    fixed = parse_workload("ties", {"phases": [{"requests": 3, "streams": [{"name": "x", "arrival": "fixed"},
                                                                            {"name": "y", "arrival": "fixed"}]}]})
    assert [s.phase for s in generate(fixed, num_requests=3)] == ["phase-1/x", "phase-1/y", "phase-1/x"]


def test_classes_land_on_the_specs():
    specs = generate(load_workload("mixed-classes"), num_requests=2000)
    assert Counter((s.phase, s.slo_class) for s in specs).keys() == {("mixed/chat", "interactive"),
                                                                     ("mixed/summarization", "batch")}
    n_batch = sum(s.slo_class == "batch" for s in specs)
    assert n_batch / len(specs) == pytest.approx(0.01 / 0.21, abs=0.015)
    phases = [s.phase.split("/")[0] for s in generate(load_workload("shift-classes"), num_requests=300)]
    assert phases == ["chat-1"] * 100 + ["mixed"] * 100 + ["chat-2"] * 100
    # a phase's class is its streams' default; a stream's own class wins
    w = parse_workload("x", {"phases": [{"name": "p", "slo_class": "batch", "lengths": "summarization",
                                         "streams": [{"name": "a"}, {"name": "b", "slo_class": "interactive"}]}]})
    assert {(s.phase, s.slo_class) for s in generate(w, num_requests=200)} == {("p/a", "batch"), ("p/b", "interactive")}
    assert min(s.prompt_tokens for s in generate(w, num_requests=200)) >= 1000   # lengths from the phase too


def test_diurnal_follows_the_day_curve():
    """24 hourly ramps: the trough at 04:00 (0.2 of the peak rate), the peak at 16:00, mean 0.6."""
    w = load_workload("diurnal")
    assert [p.name for p in w.phases] == [f"{h:02d}h" for h in range(24)]
    t = np.array([s.arrival_s for s in generate(w, qps=1.0, duration_s=86_400.0, seed=0)])
    per_hour = np.histogram(t, bins=24, range=(0, 86_400))[0] / 3600
    assert len(t) / 86_400 == pytest.approx(0.6, rel=0.03)
    assert int(np.argmax(per_hour)) in (15, 16) and int(np.argmin(per_hour)) in (3, 4)
    assert per_hour.max() == pytest.approx(1.0, rel=0.05) and per_hour.min() == pytest.approx(0.2, rel=0.1)
    # the ramps join: each phase ends at the rate the next starts from
    assert all(a.arrival.ramp_to == b.arrival.ramp_from for a, b in zip(w.phases, w.phases[1:] + w.phases[:1]))


def test_shift_gpu_moves_from_decode_heavy_to_prefill_heavy_and_back():
    specs = generate(load_workload("shift-gpu"), qps=2.0, duration_s=3000.0, seed=0)
    by_phase = {name: [s for s in specs if s.phase == name]
                for name in ("sharegpt4-1", "arxiv-summarization", "sharegpt4-2")}
    assert [s.phase for s in specs] == sorted((s.phase for s in specs), key=list(by_phase).index)
    rates = {name: len(group) / 1000.0 for name, group in by_phase.items()}
    assert rates["arxiv-summarization"] / rates["sharegpt4-1"] == pytest.approx(1.3, rel=0.1)
    ratio = {name: np.mean([s.prompt_tokens for s in g]) / np.mean([s.output_tokens for s in g])
             for name, g in by_phase.items()}
    assert ratio["arxiv-summarization"] > 2 * ratio["sharegpt4-1"]


def test_the_operator_suite_has_the_shape_its_name_promises():
    def lengths(name):
        specs = generate(load_workload(name), qps=1.0, num_requests=2000, seed=0)
        return specs, np.array([s.prompt_tokens for s in specs]), np.array([s.output_tokens for s in specs])

    _, rag_p, rag_o = lengths("rag")
    assert np.median(rag_p) > 4000 and np.median(rag_o) < 200          # long prompts, short answers
    code, code_p, code_o = lengths("code-completion")
    gaps = np.diff([s.arrival_s for s in code])
    assert np.median(code_o) < 64 and np.var(gaps) / np.mean(gaps) ** 2 > 2    # short answers, in bursts
    agentic, _, _ = lengths("agentic")
    assert len({s.prefix_group for s in agentic}) < len(agentic) / 3           # turns resend a conversation
    _, reason_p, reason_o = lengths("reasoning")
    assert np.median(reason_o) > 3 * np.median(reason_p)                       # decode-heavy
