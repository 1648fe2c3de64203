"""The fleet simulator (simulation/fleet.py), a day run through the router (cluster/fleet_run.py)
and the day's traffic (loadgen/fleet_traffic.py): start-up delay, scale-down with requests in
flight, diurnal and burst rates. No Ray needed; a few seconds."""

from __future__ import annotations

import pytest

from cluster.fleet_run import DayRun, prefix_keys
from cluster.fleet_scalers import StaticScaler
from cluster.fleet_telemetry import FleetTelemetry
from loadgen.fleet_traffic import Burst, DiurnalShape, RateCurve
from loadgen.workload import RequestSpec
from policies import Knobs
from simulation.fleet import Fleet
from simulation.profile_cost_model import ProfileCostModel
from simulation.workload_run import make_simulator

COST = ProfileCostModel.named("h100-llama3.1-8b")


def simulator():
    return make_simulator(COST, "deadline", Knobs())


def specs(n: int, rate: float, start: float = 0.0, groups: int = 4) -> list[RequestSpec]:
    return [RequestSpec(start + i / rate, 512, 200, "test", None, f"g{i % groups}", 256) for i in range(n)]


class Script:
    """A scaler that asks for `counts[i]` replicas from `times[i]` on."""

    def __init__(self, steps: list[tuple[float, int]], interval_s: float = 1.0) -> None:
        self.steps, self.interval_s, self.initial_replicas = steps, interval_s, steps[0][1]
        self.seen: list[FleetTelemetry] = []

    def observe(self, now: float, ongoing: int) -> None:
        pass

    def decide(self, telemetry: FleetTelemetry, now: float) -> int:
        self.seen.append(telemetry)
        return [n for t, n in self.steps if t <= now][-1]


def test_a_new_replica_takes_requests_only_after_its_start_up():
    fleet = Fleet(simulator, startup_s=30)
    replica = fleet.add("r", now=10)
    assert replica.starting(20) and not replica.ready(20) and replica.ready(40)
    fleet.drain("r", now=25)                            # still loading: nothing to finish, stops now
    assert replica.stopped_s == 25 and fleet.replica_seconds(100) == 15


def test_scale_down_with_requests_in_flight_loses_nothing():
    """Two busy replicas, then one: the leaving one gets no new request, its prefixes leave the
    router's index, it finishes every request it holds and only then stops (its time counted)."""
    scaler = Script([(0, 2), (10, 1)])
    run = DayRun(simulator, scaler, startup_s=30, initial_replicas=2)
    day = specs(600, rate=30)                           # 20 s of 30 req/s: both replicas busy at t=10
    result = run.run(day, duration_s=20)
    assert result.requests == len(day) == len(run.fleet.finished)
    assert all(record.finish_reason == "length" and record.num_output_tokens == 200
               for _, record in run.fleet.finished)
    leaving = [r for r in run.fleet.all() if r.draining]
    assert len(leaving) == 1
    gone = leaving[0]
    served = [record for name, record in run.fleet.finished if name == gone.name]
    assert any(record.arrival < 10 < record.finished for record in served)      # in flight at the drain
    assert all(record.arrival < 10.2 for record in served)                      # nothing new after it
    assert gone.stopped_s >= max(record.finished for record in served)
    assert gone.name not in run.router.replicas
    assert not any(gone.name in holders for holders in run.router.index._holders.values())
    assert result.replica_seconds == pytest.approx(gone.stopped_s + result.duration_s)


def test_scale_up_waits_for_the_model_load_and_telemetry_reports_the_interval():
    scaler = Script([(0, 1), (5, 2)], interval_s=5.0)
    run = DayRun(simulator, scaler, startup_s=10, initial_replicas=1)
    run.run(specs(300, rate=15), duration_s=20)
    names = {name for name, _ in run.fleet.finished}
    assert names == {"replica-0", "replica-1"}
    late = [r for name, r in run.fleet.finished if name == "replica-1"]
    assert min(r.arrival for r in late) >= 15                   # asked at t=5, loaded at t=15
    first = scaler.seen[0]
    assert first.arrivals == 75 and first.rate_rps == pytest.approx(15) and first.prompt_tokens == 512
    assert 0 < first.cached_fraction < 0.5 and first.finished > 0 and first.attainment == 1.0
    assert (scaler.seen[1].serving, scaler.seen[1].starting) == (1, 1)


def test_telemetry_reports_the_queue_waiting_for_first_tokens():
    """A burst of 400 req/s on one replica (~40 req/s of capacity): at the first plan most of its
    2,000 requests wait, and the planner reads their work (prompt + output tokens) as its backlog."""
    scaler = Script([(0, 1)], interval_s=5.0)
    DayRun(simulator, scaler, startup_s=10, initial_replicas=1).run(specs(2000, rate=400), duration_s=6)
    assert 1000 * (512 + 200) < scaler.seen[0].queued_tokens <= 2000 * (512 + 200)
    steady = Script([(0, 2)], interval_s=5.0)
    DayRun(simulator, steady, startup_s=10, initial_replicas=2).run(specs(75, rate=15), duration_s=6)
    assert steady.seen[0].queued_tokens < 5 * (512 + 200)


def test_a_static_fleet_holds_its_size_and_counts_every_replica_hour():
    run = DayRun(simulator, StaticScaler(3), startup_s=30)
    result = run.run(specs(100, rate=10), duration_s=30)
    assert result.attainment == 1.0 and result.replica_seconds == pytest.approx(3 * result.duration_s)
    assert result.goodput_per_replica_hour == pytest.approx(100 / (3 * result.duration_s / 3600))


def test_prefix_keys_name_the_shared_blocks_only():
    spec = RequestSpec(0.0, 100, 10, "p", None, "sys", 40)
    assert prefix_keys(spec, 16) == [b"sys/0", b"sys/1"]
    assert prefix_keys(RequestSpec(0.0, 100, 10, "p"), 16) == []


# -- the day's traffic --
def test_the_diurnal_curve_peaks_and_bottoms_where_asked_and_bursts_multiply_it():
    shape = DiurnalShape(peak_rps=100, day_s=2400, trough=0.2, peak_at=0.5, noise=0.0, bursts_per_day=0)
    curve = RateCurve.draw(shape, seed=3)
    assert curve.rate(1200) == pytest.approx(100) and curve.rate(0) == pytest.approx(20)
    assert curve.rate(600) == pytest.approx(60)
    burst = RateCurve(shape, curve.noise, (Burst(100, 50, 4.0),))
    assert burst.rate(120) == pytest.approx(4 * curve.rate(120)) and burst.rate(151) == pytest.approx(curve.rate(151))
    drawn = RateCurve.draw(DiurnalShape(peak_rps=10, bursts_per_day=3), seed=1)
    assert len(drawn.bursts) == 3 and all(3 <= b.factor <= 5 and 60 <= b.length_s <= 300 for b in drawn.bursts)


def test_arrivals_follow_the_rate():
    shape = DiurnalShape(peak_rps=50, day_s=600, trough=0.2, noise=0.1, noise_period_s=10, bursts_per_day=2)
    curve = RateCurve.draw(shape, seed=2)
    times = curve.arrivals(seed=2)
    expected = sum(curve.rate(t + 0.05) * 0.1 for t in [i * 0.1 for i in range(6000)])
    assert abs(len(times) - expected) < 4 * expected ** 0.5
    assert list(times) == sorted(times) and times[-1] < 600
    b = curve.bursts[0]
    inside = ((times >= b.start_s) & (times < b.start_s + b.length_s)).sum()
    expected_inside = sum(curve.rate(b.start_s + (i + 0.5) * b.length_s / 100) for i in range(100)) * b.length_s / 100
    assert abs(inside - expected_inside) < 4 * expected_inside ** 0.5 + 2


def test_bad_diurnal_settings_fail_with_one_line():
    with pytest.raises(ValueError, match="diurnal: need peak_rps > 0"):
        DiurnalShape(peak_rps=0)
    with pytest.raises(ValueError, match="burst factor and length ranges"):
        DiurnalShape(peak_rps=1, burst_factor=(5, 3))
