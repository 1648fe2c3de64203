"""The router's Prometheus metrics (the ingress's /metrics, beside every replica's) and a window
of its recent per-request overheads for /cluster/replicas and the benchmark."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cluster.router import Decision, Router
from telemetry.prometheus import LATENCY_BUCKETS, P

OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05) + LATENCY_BUCKETS[5:]


class RouterMetrics:
    def __init__(self, recent: int = 4096) -> None:
        self.registry = r = CollectorRegistry()
        self.decisions = Counter(P + "router_decisions", "Requests routed, by replica and reason "
                                 "(affinity, load, balance, round_robin).", ["replica", "reason"], registry=r)
        self.cached_tokens = Counter(P + "router_expected_cached_tokens", "Prompt tokens the router expected "
                                     "the chosen replica to have cached.", ["replica"], registry=r)
        self.retries = Counter(P + "router_retries", "Requests sent again to another replica after a "
                               "failure before their response began.", ["replica"], registry=r)
        self.replica_sheds = Counter(P + "router_replica_sheds", "Answers a replica shed (429 with Retry-After) "
                                     "before its response began; the request went on to a replica not yet "
                                     "tried, or was answered 429 by the ingress.", ["replica"], registry=r)
        self.shed_requests = Counter(P + "router_shed_requests", "Requests the ingress answered 429: every replica "
                                     "it could try shed them.", registry=r)
        self.failed = Counter(P + "router_stream_failures", "Responses cut by their replica's failure after "
                              "they began (answered with an error).", ["replica"], registry=r)
        self.load = Gauge(P + "router_replica_load_tokens", "Queued + running tokens of each replica, as the "
                          "router last heard.", ["replica"], registry=r)
        self.healthy = Gauge(P + "router_replica_healthy", "1 while the replica answers and is ready.",
                             ["replica"], registry=r)
        self.overhead = Histogram(P + "router_overhead_seconds", "Ingress time before a request is sent to "
                                  "its replica (body, tokenizing, hashing, choosing).", buckets=OVERHEAD_BUCKETS,
                                  registry=r)
        self.recent_overheads: deque[float] = deque(maxlen=recent)

    def on_decision(self, decision: Decision, overhead_s: float) -> None:
        self.decisions.labels(decision.replica, decision.reason).inc()
        self.cached_tokens.labels(decision.replica).inc(decision.cached_tokens)
        self.overhead.observe(overhead_s)
        self.recent_overheads.append(overhead_s)

    def on_loads(self, router: Router) -> None:
        for replica, load in router.loads.items():
            self.load.labels(replica).set(load.tokens)
            self.healthy.labels(replica).set(1 if load.healthy else 0)
