"""The composition root: engine + telemetry (+ the online tuner) behind one HTTP server."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from fastapi import FastAPI, Response

from engine.scheduling.error_budget import ErrorBudget
from engine.llm_engine import LLMEngine
from serving.admin_api import add_admin_routes
from serving.api_server import ServerState, build_app
from serving.auth import install_auth
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.http_server import drain, serve
from simulation.live_cost_model import LiveCostModel
from simulation.startup_cost_model import choose_cost_model
from autotuner.controller import ControllerSettings
from autotuner.tuner_service import TunerService, tuning_config
from telemetry.constant_labels import labelled, render

log = logging.getLogger(__name__)


def extra_routes(telemetry: DaemonTelemetry, tuner: TunerService | None = None,
                 metric_labels: dict[str, str] | None = None):
    def add(app: FastAPI, state: ServerState) -> None:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(render_metrics(telemetry, metric_labels),
                            media_type="text/plain; version=0.0.4; charset=utf-8")

        add_admin_routes(app, state, telemetry.window, tuner)
    return add


def render_metrics(telemetry: DaemonTelemetry, labels: dict[str, str] | None) -> bytes:
    if not labels:
        return telemetry.metrics.render()
    return render(labelled(telemetry.metrics.registry.collect(), labels))


@dataclass
class Daemon:
    """What serves: the telemetry, the tuner (if tuning), the handlers' state and their app. The
    single daemon runs it under uvicorn; a cluster replica (cluster/replica.py) calls the app in process."""

    config: DaemonConfig
    telemetry: DaemonTelemetry
    tuner: TunerService | None
    state: ServerState
    app: FastAPI

    def stop(self) -> None:
        drain(self.state, self.config.grace_s)
        if self.tuner:
            self.tuner.stop()
        if self.telemetry.sampler:
            self.telemetry.sampler.stop()


def build_daemon(config: DaemonConfig) -> Daemon:
    """The daemon's parts, the engine not yet loading (state.start_loading() does that)."""
    telemetry = DaemonTelemetry(config)
    tuner = make_tuner(config, telemetry)
    state = ServerState(config.api, engine_loader(config, telemetry, tuner))
    app = build_app(state, extra_routes(telemetry, tuner, config.metric_labels))
    install_auth(app, config.auth_config())
    return Daemon(config, telemetry, tuner, state, app)


def make_tuner(config: DaemonConfig, telemetry: DaemonTelemetry) -> TunerService | None:
    if not config.tune:
        return None
    return TunerService(config.state_dir, config.slo, telemetry.metrics.registry, config.engine.max_token_budget,
                        storage=config.tuner_storage, owner=config.tuner_owner)


def engine_loader(config: DaemonConfig, telemetry: DaemonTelemetry, tuner: TunerService | None):
    def load() -> LLMEngine:
        engine = LLMEngine(config.engine)
        engine.scheduler.error_budget = ErrorBudget(error_budget_horizon_s(tuner))
        # the deadline policy prices each step with it, kept to the machine's live speed; chosen before
        # telemetry attaches, so a start-up calibration's steps stay out of the metrics, and the
        # quantized kernels' crossover (which a calibration may move) is final when MBU is priced
        choice = choose_cost_model(engine, config.state_dir, config.calibrate, config.calibration_budget_s)
        telemetry.attach(engine)
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
    return load


def error_budget_horizon_s(tuner: TunerService | None) -> float:
    """The controller's context window: the deadline policy spends the TBT percentile's long gaps
    over the horizon the tuner reads its windows' P99 on (the tuner's settings; with tuning off, the
    tuning config's)."""
    settings = tuner.settings if tuner else ControllerSettings.load(tuning_config())
    return settings.context_window_s


def run_daemon(config: DaemonConfig) -> None:
    telemetry = DaemonTelemetry(config)
    tuner = make_tuner(config, telemetry)
    try:
        serve(engine_loader(config, telemetry, tuner), config.api, config.host, config.port, config.grace_s,
              extra_routes(telemetry, tuner, config.metric_labels), config.auth_config())
    finally:
        if tuner:
            tuner.stop()
