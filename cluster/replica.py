"""One replica: the daemon (engine, telemetry, tuner with its own state dir) as a Ray Serve
deployment. The ingress sends it HTTP requests over Ray (asgi_call), asks it for its load and
metrics, and Serve probes its health and restarts it when its process dies or the engine fails."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator

from ray import serve

from cluster.asgi_call import HttpCall, ResponseHead, call_app
from cluster.cluster_spec import ClusterSpec
from cluster.replica_telemetry import ReplicaTelemetry
from cluster.router import ReplicaLoad
from serving.daemon import build_daemon
from telemetry.constant_labels import labelled

log = logging.getLogger(__name__)


@serve.deployment
class Replica:
    def __init__(self, spec: ClusterSpec, name: str) -> None:
        if spec.torch_threads:
            import torch

            torch.set_num_threads(spec.torch_threads)
        self.name = name
        self.incarnation = uuid.uuid4().hex      # the router forgets this replica's cache when it changes
        self.daemon = build_daemon(spec.daemon_config(name))
        self.daemon.state.start_loading()
        log.info("replica %s (pid %d) loading; state in %s", name, os.getpid(), self.daemon.config.state_dir)

    async def handle_http(self, call: HttpCall) -> AsyncIterator[ResponseHead | bytes]:
        async for part in call_app(self.daemon.app, call):
            yield part

    async def load(self) -> ReplicaLoad:
        state = self.daemon.state
        if state.loop is None or state.draining or state.engine_failure:
            return ReplicaLoad(healthy=False, incarnation=self.incarnation)
        queued, running = state.loop.token_load()
        return ReplicaLoad(queued, running, True, self.incarnation)

    async def telemetry(self, seconds: float) -> ReplicaTelemetry:
        """What finished here in the last `seconds`, for the planner."""
        window = self.daemon.telemetry.window
        return ReplicaTelemetry.of(window.recent_requests(seconds), window.slo, window.window(seconds).kv_usage_mean)

    async def metric_families(self) -> list:
        return labelled(self.daemon.telemetry.metrics.registry.collect(), {"replica": self.name})

    async def pid(self) -> int:
        return os.getpid()

    def check_health(self) -> None:
        """Serve restarts a replica whose engine failed to load or whose engine loop died or stuck."""
        state = self.daemon.state
        if state.load_error:
            raise RuntimeError(f"the engine failed to load: {state.load_error}")
        if state.engine_failure:
            raise RuntimeError(f"the engine failed: {state.engine_failure}")
        if state.loop is not None and not state.loop.alive:
            raise RuntimeError("the engine loop stopped")

    def __del__(self) -> None:
        self.daemon.stop()
