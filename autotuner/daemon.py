"""The composition root: engine + telemetry (+ the online tuner) behind one HTTP server."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from fastapi import FastAPI, Response

from engine.api_server import ApiConfig, ServerState
from engine.engine_config import EngineConfig
from engine.http_server import serve
from engine.live_cost_model import LiveCostModel
from engine.llm_engine import LLMEngine
from telemetry.device_sampler import DeviceSampler
from telemetry.hardware import DevicePeaks, probe_peaks
from telemetry.model_cost import ModelCost
from telemetry.prometheus import PrometheusMetrics
from telemetry.window import SLO, Arrival, TelemetryWindow
from autotuner.admin_api import add_admin_routes
from autotuner.startup_cost_model import choose_cost_model
from autotuner.tuner_service import TunerService

log = logging.getLogger(__name__)


@dataclass
class DaemonConfig:
    engine: EngineConfig
    api: ApiConfig
    host: str = "127.0.0.1"
    port: int = 8000
    grace_s: float = 30.0
    slo: SLO = SLO()
    peak_flops: float | None = None           # device peaks for MFU/MBU; probed at start-up when unset
    peak_bandwidth: float | None = None
    utilisation_window_s: float = 10.0
    tune: bool = True                         # run the online controller beside the engine
    state_dir: str = "state"                  # tuner studies, decisions, calibrated cost models
    calibrate: bool = True                    # calibrate at start-up when no cost model describes this machine


class Telemetry:
    """Wires the engine's records into the sliding window and the Prometheus metrics."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.window = TelemetryWindow(config.slo)
        self.metrics = PrometheusMetrics(config.api.served_model_name, slo=config.slo)
        self.sampler: DeviceSampler | None = None
        self._knobs_seen: tuple[str, int] | None = None

    def attach(self, engine: LLMEngine) -> LLMEngine:
        cfg = self.config
        dtype = engine.runner.dtype
        self.window.cost = ModelCost(engine.model_config, dtype.itemsize)
        self.window.peaks = (DevicePeaks(cfg.peak_flops, cfg.peak_bandwidth, "config")
                             if cfg.peak_flops and cfg.peak_bandwidth else probe_peaks(cfg.engine.device, dtype))
        engine.step_listeners += [self.window.on_step, self.metrics.on_step, lambda r: self._scheduler_changed(engine, r)]
        engine.finish_listeners += [self.window.on_finish, self.metrics.on_finish]
        engine.arrival_listeners += [self.metrics.on_arrival, lambda r: self.window.on_arrival(
            Arrival(r.arrival_time, r.num_prompt_tokens, r.params.max_tokens))]
        self.metrics.set_scheduler(engine.scheduler.policy.name, engine.scheduler.knobs)
        self.sampler = DeviceSampler(cfg.engine.device, self._on_sample)
        self.sampler.start()
        return engine

    def _scheduler_changed(self, engine: LLMEngine, record) -> None:
        seen = (record.policy, record.knobs_version)
        if seen != self._knobs_seen:
            self._knobs_seen = seen
            self.metrics.set_scheduler(record.policy, engine.scheduler.knobs)

    def _on_sample(self, sample: dict[str, float]) -> None:
        self.window.hardware = sample
        self.metrics.set_hardware(sample)
        summary = self.window.window(self.config.utilisation_window_s)
        self.metrics.set_utilisation(summary.mfu, summary.mbu)


def extra_routes(telemetry: Telemetry, tuner: TunerService | None = None):
    def add(app: FastAPI, state: ServerState) -> None:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(telemetry.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

        add_admin_routes(app, state, telemetry.window, tuner)
    return add


def run_daemon(config: DaemonConfig) -> None:
    telemetry = Telemetry(config)
    tuner = (TunerService(config.state_dir, config.slo, telemetry.metrics.registry, config.engine.max_token_budget)
             if config.tune else None)

    def load() -> LLMEngine:
        engine = telemetry.attach(LLMEngine(config.engine))
        # the deadline policy prices each step with it, kept to the machine's live speed
        choice = choose_cost_model(engine, config.state_dir, config.calibrate)
        cost = LiveCostModel(choice.model, choice.source, choice.describes_machine).attach(engine)
        engine.scheduler.arrival_guard_s = config.api.slo_classes.arrival_guard_s()
        # What exists now (the tokenizer's vocabulary, checkpoint metadata, imported modules) lives as
        # long as the daemon: keep it out of every later full GC pass, which would otherwise walk it
        # in the middle of a step (a TBT spike), as vLLM and SGLang do after start-up.
        gc.collect()
        gc.freeze()
        if tuner:
            tuner.start(engine, telemetry.window, cost)
        return engine

    try:
        serve(load, config.api, config.host, config.port, config.grace_s, extra_routes(telemetry, tuner))
    finally:
        if tuner:
            tuner.stop()
