"""The Serve application: one deployment per replica (each one process, restarted by Serve on
its own, with a stable name, so its state dir and metrics label survive restarts) and the ingress
holding a handle to each, so the router, not Serve's own load balancing, picks the replica.
With the SLO planner, there is a deployment for each replica it may run, those beyond the start
at 0 replicas; the planner sets each one's count through Serve's external scaler API (the
application is deployed with `external_scaler_enabled`).

`build` is the import path a Serve config names (configs/serve-cluster.yaml: `serve run` or
`serve deploy`); `autotuned-serve cluster` calls `cluster_app` directly.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from cluster.cluster_spec import ClusterSpec
from cluster.ingress import Ingress
from cluster.replica import Replica

HEALTH_CHECK_PERIOD_S = 2.0
HEALTH_CHECK_TIMEOUT_S = 30.0        # a replica busy loading the model still answers within this


def cluster_app(spec: ClusterSpec) -> Application:
    initial = set(spec.initial_replicas())
    replicas = [replica_deployment(spec, name, name in initial).bind(spec, name) for name in spec.replica_names()]
    return Ingress.options(name="ingress", max_ongoing_requests=spec.max_ongoing_requests,
                           ray_actor_options={"num_cpus": 0}).bind(spec, replicas)


def replica_deployment(spec: ClusterSpec, name: str, started: bool):
    deployment = Replica.options(name=name, num_replicas=1, max_ongoing_requests=spec.max_ongoing_requests,
                                 health_check_period_s=HEALTH_CHECK_PERIOD_S,
                                 health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
                                 ray_actor_options={"num_cpus": spec.replica_cpus, "num_gpus": spec.replica_gpus})
    if not started:
        # A replica the planner may start later is deployed at 0. Serve's options() refuses 0 (its
        # deployment config and the external scaler API take it): set on the config it deploys.
        deployment._deployment_config.num_replicas = 0
    return deployment


def build(args: dict[str, Any]) -> Application:
    """Serve's application builder: the config file's `args` are ClusterSpec's fields."""
    return cluster_app(ClusterSpec.from_dict(args))
