"""The controller inside the daemon: its own thread beside the engine loop, operator controls for
/admin/tuning and Prometheus gauges."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from autotuner.background import BackgroundRunner
from autotuner.controller import SLO_HEADROOM, Controller, ControllerSettings, paused_line
from autotuner.failures import STAGES, TunerFailures
from autotuner.search_space import CONFIG, load_search_space
from simulation.cost_model_files import find_cost_model
from autotuner.targets import EngineTarget
from autotuner.tuner_state import TunerState, storage_reason
from autotuner.warm_start import SimulatorWarmStart, background_runner, search, slo_token_budget
from simulation.speculation_model import workload_speculation
from simulation.live_cost_model import LiveCostModel
from engine.llm_engine import LLMEngine
from telemetry.prometheus import P
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow

log = logging.getLogger(__name__)
SAMPLE_TIMEOUT_S = 60.0     # one TPE sample in the background (~1 s: a Python start and the sample)
STORAGE_RETRY_S = 60.0      # a storage that did not open is tried again this often (a lock may clear)
TUNING_CONFIG_ENV = "AUTOTUNED_SERVE_TUNING"   # another tuning.yaml for the daemon's tuner (benchmarks, ablations)


class TunerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(P + "tuner_decisions", "Tuner decisions by action.", ["action"], registry=r)
        self.violations = Counter(P + "tuner_violating_windows", "Tuning windows that missed the SLO.", registry=r)
        self.failures = Counter(P + "tuner_failures", "Failures of the tuner's own work (warm start, TPE sample) "
                                "by stage; serving goes on, on the last good knobs.", ["stage"], registry=r)
        for stage in STAGES:
            self.failures.labels(stage)
        self.paused = Gauge(P + "tuner_paused", "1 while the tuner is paused or pinned.", registry=r)
        self.knob = Gauge(P + "tuner_applied_knob", "Knob values of the tuner's latest decision.", ["knob"],
                          registry=r)
        self.regime = Gauge(P + "tuner_regime_info", "The workload regime being tuned (value 1).", ["regime"],
                            registry=r)

    def on_decision(self, entry: dict[str, Any]) -> None:
        self.decisions.labels(entry["action"]).inc()
        if entry["action"] == "failure":
            self.failures.labels(entry["stage"]).inc()
        if entry.get("violated"):
            self.violations.inc()
        if entry["action"] in ("pause", "pin", "resume"):
            self.paused.set(0 if entry["action"] == "resume" else 1)
        for name, value in entry["knobs"].items():
            if isinstance(value, (int, float)):
                self.knob.labels(name).set(value)
        if entry.get("regime"):
            self.regime.clear()
            self.regime.labels(entry["regime"]).set(1)


def tuning_config() -> str | Path:
    """The tuning.yaml the daemon's tuner reads: $AUTOTUNED_SERVE_TUNING, else configs/tuning.yaml."""
    return os.environ.get(TUNING_CONFIG_ENV) or CONFIG


class TunerService:
    def __init__(self, state_dir: str, slo: SloClass, registry: CollectorRegistry, max_token_budget: int,
                 settings: ControllerSettings | None = None, storage: str | None = None,
                 owner: str | None = None) -> None:
        """`storage`, `owner`: a shared Optuna storage and this daemon's name there (autotuner/tuner_state.py)."""
        self.state_dir, self.slo = state_dir, slo
        self.storage, self.owner = storage, owner
        config = tuning_config()
        self.settings = settings or ControllerSettings.load(config)
        self.space = load_search_space(config, max_token_budget=max_token_budget)
        self.metrics = TunerMetrics(registry)
        self.stop_event = threading.Event()
        self.controller: Controller | None = None
        self.cost: LiveCostModel | None = None
        self.failures = TunerFailures()          # the controller's, and the storage's before there is one
        self.storage_error: str | None = None    # why the storage does not open now, or None
        self._created = time.monotonic()
        self._thread: threading.Thread | None = None

    def start(self, engine: LLMEngine, telemetry: TelemetryWindow, cost: LiveCostModel | None = None) -> None:
        """`cost`: the engine's live cost model (the daemon attaches one at load); else one is attached.
        Where the tuner's storage cannot be opened (corrupt, locked, read-only) the engine serves on its
        configured knobs, the reason is said once, and the storage is tried again every STORAGE_RETRY_S."""
        s = self.settings
        # The tuner's compute, TPE's samples and the warm start's simulations, in low-priority child
        # processes: never on the engine's CPU time (in this process only for comparisons: background false).
        self._sampling = self._simulating = None
        if s.background:
            self._sampling = BackgroundRunner(s.background_cpu_share, SAMPLE_TIMEOUT_S, self.stop_event)
            self._simulating = BackgroundRunner(s.background_cpu_share, s.warm_start_timeout_s, self.stop_event)
        self.cost = cost or LiveCostModel(find_cost_model(None, self.state_dir)).attach(engine)
        state = self._open_state()
        if state is None:
            self._thread = threading.Thread(target=self._retry_storage, args=(engine, telemetry), name="tuner",
                                            daemon=True)
        else:
            self._begin(state, engine, telemetry)
            self._thread = threading.Thread(target=self.controller.run, args=(self.stop_event,), name="tuner",
                                            daemon=True)
        self._thread.start()

    def _open_state(self) -> TunerState | None:
        try:
            state = TunerState(self.state_dir, runner=self._sampling, storage=self.storage, owner=self.owner)
        except Exception as e:   # the storage is all TunerState opens: whatever it raised, tuning is off
            self.storage_error = storage_reason(e)
            self.metrics.failures.labels("storage").inc()
            if self.failures.record("storage", self.storage_error, time.monotonic() - self._created):
                log.error("tuner: cannot open its storage in %s (%s): serving on the configured knobs; "
                          "retrying every %.0f s (move a corrupt tuner.db aside to start afresh)",
                          self.storage or self.state_dir, self.storage_error, STORAGE_RETRY_S)
            return None
        if self.storage_error:
            log.info("tuner: its storage opens again; tuning starts")
        self.storage_error = None
        return state

    def _retry_storage(self, engine: LLMEngine, telemetry: TelemetryWindow) -> None:
        while not self.stop_event.wait(STORAGE_RETRY_S):
            state = self._open_state()
            if state is not None:
                self._begin(state, engine, telemetry)
                self.controller.run(self.stop_event)
                return

    def _begin(self, state: TunerState, engine: LLMEngine, telemetry: TelemetryWindow) -> None:
        """The controller over an open storage, its cold start applied."""
        s = self.settings
        target = EngineTarget(engine, telemetry, self.stop_event)
        warm = SimulatorWarmStart(self.cost.current, self.space, self.slo, s.policy, target.knobs,
                                  telemetry.recent_requests, s.warm_start_trials, s.warm_start_enqueue,
                                  runner=background_runner(self._simulating) if self._simulating else search,
                                  error_budget_horizon_s=s.context_window_s, base_policy=target.policy,
                                  speculation=workload_speculation("observed"))
        controller = Controller(target, self.space, state, self.slo, self.settings, warm, failures=self.failures)
        controller.listeners.append(self.metrics.on_decision)
        if self._sampling:
            self._sampling.on_failure = lambda cause: controller.record_failure("sample", cause)
        controller.cold_start(slo_token_budget(self.cost.current(), self.slo, self.space, SLO_HEADROOM))
        self.controller = controller
        log.info("tuner started: state in %s, tuning policy %s", self.state_dir, self.settings.policy)

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread:
            self._thread.join(timeout=5)

    def status(self) -> dict[str, Any]:
        c = self.controller
        if c is None:
            status: dict[str, Any] = {"running": False, "state_dir": self.state_dir,
                                      "failures": self.failures.as_dict()}
            if self.storage_error:
                status["exploration"] = storage_line(self.storage_error)
                status["storage_error"] = self.storage_error
            return status
        return {"running": self._thread is not None and self._thread.is_alive(), "paused": c.paused,
                "pinned": c.pinned.as_dict() if c.pinned else None, "regime": c.regime.key if c.regime else None,
                "incumbent": c.incumbent() if c.study else None, "windows": c.windows,
                "violating_windows": c.violations, "exploration": exploration_status(c),
                "failures": c.failures.as_dict(), "state_dir": self.state_dir,
                "decision_log_error": c.state.decision_log_error,
                "cost_model": self.cost.describe() if self.cost else None}


def storage_line(reason: str) -> str:
    return f"off: the tuner's storage does not open ({reason}); serving on the configured knobs"


def exploration_status(c: Controller) -> str:
    """One line for operators: whether the tuner explores, and why not when it does not."""
    if c.storage_failing:
        return f"held: its storage fails ({c.storage_failing}); the engine stays on the last good knobs"
    if c.paused or c.pinned:
        return "paused by an operator" if c.paused else "pinned by an operator"
    if c.attainment_held is not None:
        return paused_line(c.attainment_held)
    if c.anchor is not None:
        return "warm start failed: exploring only within the trust region around the configured knobs"
    return "exploring" if c.study is not None else "waiting for traffic"
