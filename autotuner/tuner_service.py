"""The controller inside the daemon: its own thread beside the engine loop, operator controls for
/admin/tuning and Prometheus gauges."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from autotuner.background import BackgroundRunner
from autotuner.controller import SLO_HEADROOM, Controller, ControllerSettings, paused_line
from autotuner.failures import STAGES
from autotuner.search_space import CONFIG, load_search_space
from simulation.cost_model_files import find_cost_model
from autotuner.targets import EngineTarget
from autotuner.tuner_state import TunerState
from autotuner.warm_start import SimulatorWarmStart, background_runner, search, slo_token_budget
from simulation.live_cost_model import LiveCostModel
from engine.llm_engine import LLMEngine
from telemetry.prometheus import P
from telemetry.window import SLO, TelemetryWindow

log = logging.getLogger(__name__)
SAMPLE_TIMEOUT_S = 60.0     # one TPE sample in the background (~1 s: a Python start and the sample)
TUNING_CONFIG_ENV = "AUTOTUNED_SERVE_TUNING"   # another tuning.yaml for the daemon's tuner (benchmarks, ablations)


class TunerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.decisions = Counter(P + "tuner_decisions", "Tuner decisions by action.", ["action"], registry=r)
        self.violations = Counter(P + "tuner_violating_windows", "Measured windows that missed the SLO.", registry=r)
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


class TunerService:
    def __init__(self, state_dir: str, slo: SLO, registry: CollectorRegistry, max_token_budget: int,
                 settings: ControllerSettings | None = None, storage: str | None = None,
                 owner: str | None = None) -> None:
        """`storage`, `owner`: a shared Optuna storage and this daemon's name there (autotuner/tuner_state.py)."""
        self.state_dir, self.slo = state_dir, slo
        self.storage, self.owner = storage, owner
        config = os.environ.get(TUNING_CONFIG_ENV) or CONFIG
        self.settings = settings or ControllerSettings.load(config)
        self.space = load_search_space(config, max_token_budget=max_token_budget)
        self.metrics = TunerMetrics(registry)
        self.stop_event = threading.Event()
        self.controller: Controller | None = None
        self.cost: LiveCostModel | None = None
        self._thread: threading.Thread | None = None

    def start(self, engine: LLMEngine, telemetry: TelemetryWindow, cost: LiveCostModel | None = None) -> None:
        """`cost`: the engine's live cost model (the daemon attaches one at load); else one is attached."""
        s = self.settings
        # The tuner's compute, TPE's samples and the warm start's simulations, in low-priority child
        # processes: never on the engine's CPU time (in this process only for comparisons: background false).
        sampling = simulating = None
        if s.background:
            sampling = BackgroundRunner(s.background_cpu_share, SAMPLE_TIMEOUT_S, self.stop_event)
            simulating = BackgroundRunner(s.background_cpu_share, s.warm_start_timeout_s, self.stop_event)
        state = TunerState(self.state_dir, runner=sampling, storage=self.storage, owner=self.owner)
        self.cost = cost or LiveCostModel(find_cost_model(None, self.state_dir)).attach(engine)
        target = EngineTarget(engine, telemetry, self.stop_event)
        warm = SimulatorWarmStart(self.cost.current, self.space, self.slo, s.policy, target.knobs,
                                  telemetry.recent_requests, s.warm_start_trials, s.warm_start_enqueue,
                                  runner=background_runner(simulating) if simulating else search)
        self.controller = Controller(target, self.space, state, self.slo, self.settings, warm)
        self.controller.listeners.append(self.metrics.on_decision)
        if sampling:
            sampling.on_failure = lambda cause: self.controller.record_failure("sample", cause)
        self.controller.cold_start(slo_token_budget(self.cost.current(), self.slo, self.space, SLO_HEADROOM))
        self._thread = threading.Thread(target=self.controller.run, args=(self.stop_event,), name="tuner",
                                        daemon=True)
        self._thread.start()
        log.info("tuner started: state in %s, tuning policy %s", self.state_dir, self.settings.policy)

    def stop(self) -> None:
        self.stop_event.set()
        if self._thread:
            self._thread.join(timeout=5)

    def status(self) -> dict[str, Any]:
        c = self.controller
        if c is None:
            return {"running": False}
        return {"running": self._thread is not None and self._thread.is_alive(), "paused": c.paused,
                "pinned": c.pinned.as_dict() if c.pinned else None, "regime": c.regime.key if c.regime else None,
                "incumbent": c.incumbent() if c.study else None, "windows": c.windows,
                "violating_windows": c.violations, "exploration": exploration_status(c),
                "failures": c.failures.as_dict(), "state_dir": self.state_dir,
                "cost_model": self.cost.describe() if self.cost else None}


def exploration_status(c: Controller) -> str:
    """One line for operators: whether the tuner explores, and why not when it does not."""
    if c.paused or c.pinned:
        return "paused by an operator" if c.paused else "pinned by an operator"
    if c.attainment_held is not None:
        return paused_line(c.attainment_held)
    if c.anchor is not None:
        return "warm start failed: exploring only within the trust region around the configured knobs"
    return "exploring" if c.study is not None else "waiting for traffic"
