"""Admission from predicted TTFT (engine/scheduling/admission.py): the prediction against queues priced
by hand, what it admits and refuses, the late rule, Retry-After against the drain a simulated overload
shows, and shed requests counted as misses."""

from __future__ import annotations

import math

import pytest

from autotuner.objective import score
from engine.kv_cache.block_manager import BlockManager
from engine.outputs import RequestRecord
from engine.sampling_params import SamplingParams
from engine.scheduling.admission import CORRECTION_SPACING_S, CORRECTION_STEP, SHED_EXPIRED, SHED_PREDICTED, predict_ttft
from engine.scheduling.request import Request
from engine.scheduling.scheduler import Scheduler
from engine.slo_class import SloClass, SloClasses
from loadgen.workload import RequestSpec
from policies import Knobs
from simulation.cost_model import CostModel
from simulation.simulator import Simulator
from telemetry.window import TelemetryWindow

INTERACTIVE = SloClass("interactive", 2.0, 0.25)
BATCH = SloClass("batch", 30.0, 2.0, late="serve")
NOW = 100.0


class LinearCost:
    """20 ms a step + 1 ms a token (prefill or decode): priced by hand below."""

    tile_tokens = 1
    grammar_row_s = 0.0

    def predict_counts(self, prefill: int, decode: int, sampled: int, context: int, pairs: int, seqs: int) -> float:
        return 0.02 + 1e-3 * (prefill + decode)


def scheduler(knobs: Knobs | None = None) -> Scheduler:
    s = Scheduler(BlockManager(10_000, 16), "deadline", knobs or Knobs(token_budget=256, admission_slack=1.0), clock=lambda: NOW)
    s.cost = LinearCost()
    s.arrival_guard_s = 1.0
    return s


def request(i: int, prompt: int, arrived_ago: float = 0.0, slo: SloClass = INTERACTIVE, max_tokens: int = 16) -> Request:
    return Request(f"r{i}", [7] * prompt, SamplingParams(max_tokens=max_tokens), NOW - arrived_ago, slo=slo)


def decoding(i: int, left: int = 100) -> Request:
    r = request(100 + i, 50, arrived_ago=5.0, max_tokens=left + 1)
    r.output_token_ids = [9]
    r.num_computed_tokens = 50
    r.timings.token_times.append(NOW - 0.01)
    return r


def test_prediction_prices_the_queue_ahead_in_steps_of_the_arrival_guard():
    s = scheduler()
    for i in range(3):
        s.add(request(i, 500, arrived_ago=0.5))
    own = request(9, 300)
    # no decode runs: steps up to the 1 s guard, capped by the 256-token budget: 0.02 + 0.256 s each;
    # 1500 tokens ahead + 300 of its own = 7 such steps and one of 8 tokens
    p = predict_ttft(own, s, NOW)
    assert math.isclose(p.total_s, 7 * 0.276 + 0.028)
    assert math.isclose(p.own_s, 0.276 + 0.064)        # its own 300 tokens alone: 256, then 44


def test_running_decodes_shrink_the_chunks_to_their_tbt_slack():
    s = scheduler()
    s.running.extend(decoding(i) for i in range(10))
    own = request(9, 390)
    # 10 decodes of a 0.25 s TBT at step_headroom 0.9: 0.02 + 0.001 (10 + P) <= 0.225 -> P = 195, a 0.225 s step
    assert math.isclose(predict_ttft(own, s, NOW).total_s, 2 * 0.225)


def test_only_earlier_deadlines_are_ahead():
    s = scheduler()
    s.add(request(1, 2000, arrived_ago=1.0, slo=BATCH))       # deadline NOW + 29: behind an interactive arrival
    own = request(9, 200)
    assert math.isclose(predict_ttft(own, s, NOW).total_s, 0.02 + 0.2)


def test_full_running_slots_add_the_wait_for_one_to_finish():
    s = scheduler(Knobs(token_budget=256, max_num_seqs=2, admission_slack=1.0))
    s.running.extend([decoding(0, left=30), decoding(1, left=80)])
    own = request(9, 100)
    # both slots taken: the first frees after 30 decode steps of 0.02 + 0.002 s, then its own 100-token chunk
    assert math.isclose(predict_ttft(own, s, NOW).total_s, 30 * 0.022 + 0.02 + 0.001 * 102)


def test_a_request_that_can_make_its_target_is_admitted_and_one_that_cannot_is_refused():
    s = scheduler()
    for i in range(3):
        s.add(request(i, 500, arrived_ago=0.5))
    fits = request(8, 20)                     # 1520 tokens: 5 x 0.276 + 0.26 = 1.64 s <= 2 s
    late = request(9, 600)                    # 2100 tokens: 8 x 0.276 + 0.072 = 2.28 s > 2 s
    assert s.admission.decide(fits, s, NOW).admitted
    refused = s.admission.decide(late, s, NOW)
    assert not refused.admitted and refused.reason == SHED_PREDICTED
    assert math.isclose(refused.retry_after_s, 8 * 0.276 + 0.072 - 2.0)


def test_a_prompt_too_long_for_its_target_alone_is_admitted_on_an_idle_engine():
    s = scheduler()
    huge = request(9, 4000)                   # 16 steps of 0.276 s: 4.4 s even alone
    assert s.admission.decide(huge, s, NOW).admitted
    s.add(request(1, 500, arrived_ago=0.1))
    assert not s.admission.decide(request(10, 4000), s, NOW).admitted


def test_admission_off_admits_everything():
    s = scheduler(Knobs(token_budget=256, admission_slack=0.0))
    for i in range(20):
        s.add(request(i, 500))
    assert s.admission.decide(request(99, 500), s, NOW).admitted


def observe_all(admission, count: int, spacing_s: float, predicted_s: float, observed_s: float) -> None:
    """`count` first tokens `spacing_s` apart, each `observed_s` after its arrival, predicted `predicted_s` uncorrected."""
    for i in range(count):
        r = request(i, 100)
        r.arrival_time = NOW + i * spacing_s
        r.predicted_ttft_s = predicted_s * admission.correction
        admission.observe(r, r.arrival_time + observed_s)


def test_the_correction_tracks_observed_ttft():
    admission = scheduler().admission
    observe_all(admission, 300, 1.0, 0.5, 1.0)    # every first token comes 1 s after arrival, the model says 0.5 s
    assert 1.9 < admission.correction < 2.2


def test_a_burst_of_observations_moves_the_correction_as_far_as_one_per_spacing():
    """300 first tokens in 3 s (a GPU's rate) move it about as far as those that come CORRECTION_SPACING_S
    apart over the same span: a correction that moved a full step on each swung between its bounds, its
    feedback a TTFT late."""
    burst, spaced = scheduler().admission, scheduler().admission
    observe_all(burst, 300, 0.01, 0.5, 1.0)
    steps = round(3.0 / CORRECTION_SPACING_S) + 1
    observe_all(spaced, steps, CORRECTION_SPACING_S, 0.5, 1.0)
    assert burst.correction == pytest.approx(spaced.correction, rel=0.02)
    assert burst.correction < math.exp((steps + 1) * CORRECTION_STEP)


def test_late_interactive_requests_are_shed_and_batch_ones_served():
    s = scheduler()
    stale, fresh, batch = request(1, 50, arrived_ago=3.0), request(2, 50), request(3, 50, 40.0, slo=BATCH)
    for r in (stale, fresh, batch):
        s.add(r)
    shed: list[tuple[str, str]] = []
    s.admission.on_shed.append(lambda cls, reason: shed.append((cls, reason)))
    assert s.admission.expired(s, NOW) == [stale]
    assert shed == [("interactive", SHED_EXPIRED)]


def overload_sim(num_requests: int, prompt: int = 400) -> Simulator:
    cost = CostModel((0.02, 1e-3, 0.0, 0.0, 0.0, 0.0, 0.0))
    sim = Simulator(cost, num_blocks=100_000, knobs=Knobs(token_budget=256, admission_slack=1.0), coast=False,
                    slo_classes=SloClasses.single(INTERACTIVE))
    sim.submit([RequestSpec(0.0, prompt, 8, "burst", None) for _ in range(num_requests)])
    return sim


def test_retry_after_is_within_a_factor_of_two_of_the_observed_drain():
    sim = overload_sim(60)
    sim.run_until(0.001)
    assert sim.num_shed > 0
    first, retry_after = sim.shed_retry_after[0]
    while True:     # after each step: would a request like the refused one be admitted now?
        probe = Request("probe", [7] * first.num_prompt_tokens, SamplingParams(max_tokens=8), sim.now,
                        slo=INTERACTIVE)
        if sim.scheduler.admission.decide(probe, sim.scheduler, sim.now).admitted:
            break
        sim.step()
    drain = sim.now
    assert retry_after > 0 and drain / 2 <= retry_after <= 2 * drain


def test_no_request_is_shed_below_capacity_and_the_admitted_make_their_ttft():
    sim = overload_sim(60)
    records: list[RequestRecord] = []
    sim.finish_listeners.append(records.append)
    sim.run()
    admitted = [r for r in records if r.finish_reason != "shed"]
    assert sim.num_shed == len(records) - len(admitted) > 0
    assert all(r.ttft_s <= INTERACTIVE.ttft_s for r in admitted)
    light = overload_sim(4)
    light.run()
    assert light.num_shed == 0


def test_a_shed_request_counts_as_an_arrival_and_a_miss():
    window = TelemetryWindow(INTERACTIVE, clock=lambda: 10.0)
    served = RequestRecord("a", 1.0, 1.5, 3.0, (1.5, 1.6), 10, 2, 2, "length", 0, "interactive", 2.0, 0.25)
    shed = RequestRecord("b", 2.0, None, 2.0, (), 10, 0, 2, "shed", 0, "interactive", 2.0, 0.25)
    from telemetry.window import Arrival
    for r in (served, shed):
        window.on_arrival(Arrival(r.arrival, 10, 2))
        window.on_finish(r)
    w = window.window(10.0)
    assert w.goodput_rps == 0.1 and w.shed_rps == 0.1 and w.arrival_rate_rps == 0.2
    assert score(w.goodput_rps, w.arrival_rate_rps, w.ttft_p50_s, w.tbt_p99_s, INTERACTIVE).value \
        < score(w.goodput_rps, w.goodput_rps, w.ttft_p50_s, w.tbt_p99_s, INTERACTIVE).value
