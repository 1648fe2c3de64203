"""The daemon's settings: engine, API, SLO, device peaks, tuner and state dir."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.engine_config import EngineConfig
from serving.api_server import ApiConfig
from serving.auth import AuthConfig
from engine.slo_class import SloClass


@dataclass
class DaemonConfig:
    engine: EngineConfig
    api: ApiConfig
    host: str = "127.0.0.1"
    port: int = 8000
    grace_s: float = 30.0
    slo: SloClass = SloClass()
    peak_flops: float | None = None           # device peaks for MFU/MBU; probed at start-up when unset
    peak_bandwidth: float | None = None
    utilisation_window_s: float = 10.0
    tune: bool = True                         # run the online controller beside the engine
    state_dir: str = "state"                  # tuner studies, decisions, calibrated cost models
    calibrate: bool = True                    # calibrate at start-up when no cost model describes this machine
    calibration_budget_s: float = 60.0        # ... within this much wall time (fewer grid points for a big model)
    tuner_storage: str | None = None          # an Optuna storage shared with other daemons (None: state_dir's SQLite)
    tuner_owner: str | None = None            # this daemon's name there (a cluster's replica name)
    metric_labels: dict[str, str] = field(default_factory=dict)   # on every /metrics sample (replica="...")
    auth: AuthConfig | None = None            # keys, tenants, CORS (None: api.api_key alone guards /v1 and /admin)

    def auth_config(self) -> AuthConfig:
        return self.auth if self.auth is not None else AuthConfig.from_api_key(self.api.api_key)
