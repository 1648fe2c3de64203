"""The composition root: engine + telemetry (+ the online tuner) behind one HTTP server."""

from __future__ import annotations

import gc
import logging

from fastapi import FastAPI, Response

from engine.llm_engine import LLMEngine
from serving.admin_api import add_admin_routes
from serving.api_server import ServerState
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.http_server import serve
from simulation.live_cost_model import LiveCostModel
from simulation.startup_cost_model import choose_cost_model
from autotuner.tuner_service import TunerService

log = logging.getLogger(__name__)


def extra_routes(telemetry: DaemonTelemetry, tuner: TunerService | None = None):
    def add(app: FastAPI, state: ServerState) -> None:
        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(telemetry.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

        add_admin_routes(app, state, telemetry.window, tuner)
    return add


def run_daemon(config: DaemonConfig) -> None:
    telemetry = DaemonTelemetry(config)
    tuner = (TunerService(config.state_dir, config.slo, telemetry.metrics.registry, config.engine.max_token_budget)
             if config.tune else None)

    def load() -> LLMEngine:
        engine = LLMEngine(config.engine)
        # the deadline policy prices each step with it, kept to the machine's live speed; chosen before
        # telemetry attaches, so a start-up calibration's steps stay out of the metrics, and the
        # quantized kernels' crossover (which a calibration may move) is final when MBU is priced
        choice = choose_cost_model(engine, config.state_dir, config.calibrate)
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

    try:
        serve(load, config.api, config.host, config.port, config.grace_s, extra_routes(telemetry, tuner))
    finally:
        if tuner:
            tuner.stop()
