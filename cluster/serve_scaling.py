"""Setting one deployment's replica count through Ray Serve's external scaler API (Ray 2.60:
an application deployed with `external_scaler_enabled`; the dashboard's public
`POST /api/v1/applications/{app}/deployments/{name}/scale` makes this same controller call).
Called from inside the cluster, so it needs no dashboard. Serve starts or stops the replica
itself (health checks, restarts, graceful shutdown): the planner only says how many."""

from __future__ import annotations

import ray
from ray.serve._private.common import DeploymentID
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE


async def scale_deployment(app_name: str, deployment: str, replicas: int) -> None:
    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    await controller.update_deployment_replicas.remote(DeploymentID(name=deployment, app_name=app_name), replicas)
