"""The planner's live service (cluster/planner_service.py) without Ray: which deployment it
scales, and a scale-down with requests in flight (the leaving replica leaves the router and its
prefix index at once, and is set to 0 only once nothing is in flight on it)."""

from __future__ import annotations

import asyncio

from cluster.planner_config import PlannerConfig
from cluster.planner_service import PlannerService
from cluster.prefix_index import prompt_block_keys
from cluster.replica_telemetry import ReplicaTelemetry
from cluster.router import ReplicaLoad, Router

NAMES = ["replica-0", "replica-1", "replica-2"]


def service(calls: list) -> PlannerService:
    async def scale(name: str, count: int) -> None:
        calls.append((name, count))

    config = PlannerConfig(max_replicas=3, interval_s=1.0, forecaster="last", headroom=0.0, scale_down_delay_s=0,
                           replica_capacity_rps=1.0)
    return PlannerService(config, NAMES, NAMES[:1], Router(NAMES[:1]), scale)


def test_scale_down_with_requests_in_flight_waits_for_them():
    calls: list = []
    s = service(calls)
    asyncio.run(s.scale_to(2))
    assert calls == [("replica-1", 1)] and s.active == NAMES[:2] and "replica-1" in s.router.replicas
    s.router.update("replica-1", ReplicaLoad(incarnation="1"))
    keys = prompt_block_keys(list(range(64)), 16)
    s.router.index.insert("replica-1", keys)
    for name, n in (("replica-0", 3), ("replica-1", 2)):
        for _ in range(n):
            s.sent(name)
    asyncio.run(s.scale_to(1))
    assert s.active == ["replica-0"] and s.draining == ["replica-1"]       # the one with fewer in flight leaves
    assert "replica-1" not in s.router.replicas and s.router.index.matched_blocks(keys) == {}
    asyncio.run(s.retire_drained())
    assert calls == [("replica-1", 1)]                                     # 2 still in flight: not stopped
    s.done("replica-1")
    s.done("replica-1")
    asyncio.run(s.retire_drained())
    assert calls[-1] == ("replica-1", 0) and s.draining == []


def test_a_replica_wanted_again_while_draining_stays_without_a_restart():
    calls: list = []
    s = service(calls)
    asyncio.run(s.scale_to(2))
    s.sent("replica-1")
    s.sent("replica-0")
    s.sent("replica-0")
    asyncio.run(s.scale_to(1))
    asyncio.run(s.scale_to(3))
    assert s.draining == [] and sorted(s.active) == NAMES and calls == [("replica-1", 1), ("replica-2", 1)]


def test_an_interval_sums_arrivals_and_the_replicas_answers():
    calls: list = []
    s = service(calls)
    for _ in range(3):
        s.on_routed(100, 20, 50)
    answers = [ReplicaTelemetry(4, 3, 2.0, 0.4, 4, 0.5, ttft_count=4), ReplicaTelemetry(0, 0, 0.0, 0.0, 0, 0.1)]
    s.router.update("replica-0", ReplicaLoad(queued_tokens=360, running_tokens=500, incarnation="1"))
    seen = s.telemetry(ReplicaTelemetry.total(answers))
    assert seen.queued_tokens == 360           # the queue the router last heard of, the planner's backlog
    assert (seen.arrivals, seen.rate_rps, seen.prompt_tokens, seen.output_tokens, seen.cached_fraction) == \
        (3, 3.0, 100, 20, 0.5)
    assert (seen.finished, seen.ttft_s, seen.tpot_s, seen.attainment) == (4, 0.5, 0.1, 0.75)
    assert seen.kv_usage == 0.3 and s.telemetry(ReplicaTelemetry()).arrivals == 0    # counts start again
    for _ in range(3):
        s.on_routed(100, 20, 50)

    async def ask(names, seconds):
        return answers

    decision = asyncio.run(s.step(ask))        # 3 req/s at 1 req/s a replica, the SLO missed: 3 replicas
    assert decision.target == 3 and calls == [("replica-1", 1), ("replica-2", 1)]


def test_a_cluster_with_a_planner_deploys_every_replica_it_may_run_and_starts_some():
    import pytest

    from cluster.cli import spec_from_args
    from cluster.cluster_spec import ClusterSpec
    from serving.cli import build_parser

    spec = ClusterSpec.from_dict({"replicas": 1, "planner": {"max_replicas": 3, "replica_capacity_rps": 2.0}})
    assert spec.replica_names() == NAMES and spec.initial_replicas() == ["replica-0"]
    assert ClusterSpec(replicas=2).initial_replicas() == ClusterSpec(replicas=2).replica_names()
    with pytest.raises(ValueError) as error:
        ClusterSpec.from_dict({"planner": {"max_replicas": 3}})
    assert "replica_capacity_rps is needed" in str(error.value) and "\n" not in str(error.value)
    args = build_parser().parse_args(["cluster", "--replicas", "2", "--max-replicas", "4", "--min-replicas", "2",
                                      "--replica-capacity-rps", "0.5", "--plan-interval-s", "10"])
    planner = spec_from_args(args).planner
    assert (planner.min_replicas, planner.max_replicas, planner.interval_s, planner.replica_capacity_rps) == \
        (2, 4, 10.0, 0.5)
    assert spec_from_args(build_parser().parse_args(["cluster"])).planner is None
