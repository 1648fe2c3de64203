"""The Serve application: one deployment per replica (each one process, restarted by Serve on
its own, with a stable name, so its state dir and metrics label survive restarts) and the ingress
holding a handle to each, so the router, not Serve's own load balancing, picks the replica.

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
    replicas = [Replica.options(name=name, num_replicas=1, max_ongoing_requests=spec.max_ongoing_requests,
                                health_check_period_s=HEALTH_CHECK_PERIOD_S,
                                health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
                                ray_actor_options={"num_cpus": spec.replica_cpus, "num_gpus": spec.replica_gpus})
                .bind(spec, name) for name in spec.replica_names()]
    return Ingress.options(name="ingress", max_ongoing_requests=spec.max_ongoing_requests,
                           ray_actor_options={"num_cpus": 0}).bind(spec, replicas)


def build(args: dict[str, Any]) -> Application:
    """Serve's application builder: the config file's `args` are ClusterSpec's fields."""
    return cluster_app(ClusterSpec.from_dict(args))
