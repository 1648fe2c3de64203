"""/admin endpoints: read and set the scheduler's policy and knobs, read telemetry windows.

serving/auth.py guards them: with an admin key set only it opens /admin, else any client key does
(`Authorization: Bearer KEY`); the server refuses to bind a non-loopback address without a client key.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import FastAPI, Query, Response
from pydantic import BaseModel, ConfigDict

from autotuner.background import BackgroundRunner
from serving.api_server import ApiError, ServerState
from policies import POLICIES
from telemetry.window import TelemetryWindow

REPORT_TIMEOUT_S = 120.0    # building the report in a background process (~3 s: a Python start, then the report)


class SchedulerUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str | None = None
    knobs: dict[str, Any] | None = None


def add_admin_routes(app: FastAPI, state: ServerState, telemetry: TelemetryWindow, tuner=None) -> None:
    def scheduler_state() -> dict[str, Any]:
        sched = state.require_loop().engine.scheduler
        return {"policy": sched.policy.name, "knobs": sched.knobs.as_dict(),
                "policies": {name: list(cls.knobs) for name, cls in POLICIES.items()}}

    @app.get("/admin/scheduler")
    async def get_scheduler() -> dict[str, Any]:
        return scheduler_state()

    @app.post("/admin/scheduler")
    async def set_scheduler(update: SchedulerUpdate) -> dict[str, Any]:
        engine = state.require_loop().engine
        try:
            if update.policy is not None:
                engine.set_policy(update.policy)
            knobs = engine.set_knobs(**(update.knobs or {})) if update.knobs else engine.scheduler.knobs
        except ValueError as e:
            raise ApiError(400, str(e), param="knobs" if update.knobs else "policy") from e
        return {"applied_at": "next step", "policy": update.policy or engine.scheduler.policy.name,
                "knobs": knobs.as_dict()}

    @app.get("/admin/telemetry")
    async def get_telemetry(seconds: float = Query(30.0, gt=0, le=3600)) -> dict[str, Any]:
        return dataclasses.asdict(telemetry.window(seconds))

    if tuner is not None:
        add_tuning_routes(app, tuner)


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, Any]


def add_tuning_routes(app: FastAPI, tuner) -> None:
    """/admin/tuning: the controller's status, pause/resume/pin, and its report."""

    def controller():
        if tuner.controller is None:
            reason = (f"the tuner is off: its storage does not open ({tuner.storage_error})" if tuner.storage_error
                      else "the tuner starts once the model is loaded")
            raise ApiError(503, reason, "service_unavailable")
        return tuner.controller

    @app.get("/admin/tuning")
    async def tuning_status() -> dict[str, Any]:
        return tuner.status()

    @app.post("/admin/tuning/pause")
    async def pause() -> dict[str, Any]:
        controller().pause()
        return tuner.status()

    @app.post("/admin/tuning/resume")
    async def resume() -> dict[str, Any]:
        controller().resume()
        return tuner.status()

    @app.post("/admin/tuning/pin")
    async def pin(request: PinRequest) -> dict[str, Any]:
        try:
            controller().pin(request.knobs)
        except ValueError as e:
            raise ApiError(400, str(e), param="knobs") from e
        return tuner.status()

    reports = BackgroundRunner(cpu_share=1.0, timeout_s=REPORT_TIMEOUT_S)

    @app.get("/admin/tuning/report")
    async def report(format: str = Query("json", pattern="^(json|html|csv)$")) -> Response:
        status, body = await asyncio.to_thread(reports.run, render_report, (tuner.state_dir, format),
                                               (503, "the report could not be built; see the daemon's log"))
        if status != 200:
            raise ApiError(status, body, "not_found_error" if status == 404 else "service_unavailable")
        media = {"json": "application/json", "html": "text/html", "csv": "text/csv"}[format]
        return Response(body, media_type=media)


def render_report(request: tuple[str, str]) -> tuple[int, str]:
    """(HTTP status, body) of the tuning report of a state dir, in a format. Run in a background
    process: built on the event loop it stalled token streaming (~0.1 s for JSON, ~0.8 s of
    matplotlib for HTML on the 2-core dev VM). At the lowest priority it takes longer (a few
    seconds to start, and on a busy daemon only the CPU time the engine leaves)."""
    from serving.report import build_report
    from serving.report_render import RENDERERS

    state_dir, format = request
    try:
        return 200, RENDERERS[format](build_report(state_dir))
    except ValueError as e:
        return 404, str(e)
