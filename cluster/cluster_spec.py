"""What a cluster runs: how many replicas, the daemon settings each runs with, where their state
lives, the shared tuner storage, the router, and what each replica asks Ray for. Built from the
`cluster` command's flags or a Serve config's `args` (configs/serve-cluster.yaml); bad values
raise ValueError with one line."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from cluster.planner_config import PlannerConfig
from cluster.router import RouterConfig
from serving.cli import served_model_name
from serving.daemon_config import DaemonConfig
from serving.settings import Settings, load_settings


@dataclass(frozen=True)
class ClusterSpec:
    replicas: int = 2
    config: str | None = None                # the daemon's YAML settings (configs/default.yaml) for every replica
    settings: dict[str, Any] = field(default_factory=dict)   # settings fields over the file's
    state_dir: str = "state/cluster"         # replica NAME keeps its state (decisions, cost models) in state_dir/NAME
    tuner_storage: str | None = None         # Optuna storage all replicas share: "journal:PATH" or an RDB URL
    router: RouterConfig = RouterConfig()
    replica_cpus: float = 1.0                # Ray resources per replica (one GPU each on a GPU cluster)
    replica_gpus: float = 0.0
    torch_threads: int | None = None         # torch threads per replica (None: torch's default)
    max_ongoing_requests: int = 1024         # per deployment; the engine's max_waiting answers 429 first
    planner: PlannerConfig | None = None     # the SLO planner sizes the fleet; `replicas` is then the start

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")
        if self.replica_cpus < 0 or self.replica_gpus < 0 or self.max_ongoing_requests < 1:
            raise ValueError("replica_cpus and replica_gpus must be >= 0, max_ongoing_requests >= 1")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError("torch_threads must be at least 1")
        unknown = set(self.settings) - {f.name for f in dataclasses.fields(Settings)}
        if unknown:
            raise ValueError(f"settings: unknown field {sorted(unknown)[0]!r}")
        if self.planner is not None and self.planner.replica_capacity_rps is None:
            raise ValueError("planner: replica_capacity_rps is needed on a live cluster (one replica's rate "
                             "within the SLO, e.g. from autotuned-serve capacity)")
        self.daemon_settings()     # a bad settings file or value fails here, not in every replica

    @staticmethod
    def from_dict(args: dict[str, Any]) -> ClusterSpec:
        known = {f.name for f in dataclasses.fields(ClusterSpec)}
        unknown = set(args) - known
        if unknown:
            raise ValueError(f"unknown cluster field(s): {', '.join(sorted(unknown))}")
        values = dict(args)
        if isinstance(values.get("router"), dict):
            values["router"] = RouterConfig(**values["router"])
        if isinstance(values.get("planner"), dict):
            values["planner"] = PlannerConfig.from_dict(values["planner"])
        return ClusterSpec(**values)

    def replica_names(self) -> list[str]:
        """Every replica deployment: with the planner, one per replica it may run (most at 0)."""
        count = self.planner.max_replicas if self.planner else self.replicas
        return [f"replica-{i}" for i in range(count)]

    def initial_replicas(self) -> list[str]:
        """The deployments that start with a replica."""
        if self.planner is None:
            return self.replica_names()
        return self.replica_names()[:min(max(self.replicas, self.planner.min_replicas), self.planner.max_replicas)]

    def daemon_settings(self) -> Settings:
        return load_settings(self.config, dict(self.settings))

    @property
    def served_model_name(self) -> str:
        return served_model_name(self.daemon_settings().model)

    def daemon_config(self, replica: str) -> DaemonConfig:
        """The daemon a replica runs: the shared settings, its own state dir and metric label."""
        s = self.daemon_settings()
        s.state_dir = os.path.join(self.state_dir, replica)
        return s.daemon_config(served_model_name(s.model), tuner_storage=self.tuner_storage, tuner_owner=replica,
                               metric_labels={"replica": replica})
