"""/admin endpoints: read and set the scheduler's policy and knobs, read telemetry windows.

Whenever an API key is configured every /admin call must carry it (`Authorization: Bearer KEY`);
the server refuses to bind a non-loopback address without one.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from fastapi import Depends, FastAPI, Header, Query, Response
from pydantic import BaseModel, ConfigDict

from engine.api_server import ApiError, ServerState
from policies import POLICIES
from telemetry.window import TelemetryWindow


class SchedulerUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str | None = None
    knobs: dict[str, Any] | None = None


def add_admin_routes(app: FastAPI, state: ServerState, telemetry: TelemetryWindow, tuner=None) -> None:
    def authorised(authorization: str | None = Header(default=None)) -> None:
        key = state.config.api_key
        if key and not secrets.compare_digest(authorization or "", f"Bearer {key}"):
            raise ApiError(401, "a valid API key is required for /admin", "authentication_error",
                           code="invalid_api_key")

    def scheduler_state() -> dict[str, Any]:
        sched = state.require_loop().engine.scheduler
        return {"policy": sched.policy.name, "knobs": sched.knobs.as_dict(),
                "policies": {name: list(cls.knobs) for name, cls in POLICIES.items()}}

    @app.get("/admin/scheduler", dependencies=[Depends(authorised)])
    async def get_scheduler() -> dict[str, Any]:
        return scheduler_state()

    @app.post("/admin/scheduler", dependencies=[Depends(authorised)])
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

    @app.get("/admin/telemetry", dependencies=[Depends(authorised)])
    async def get_telemetry(seconds: float = Query(30.0, gt=0, le=3600)) -> dict[str, Any]:
        return dataclasses.asdict(telemetry.window(seconds))

    if tuner is not None:
        add_tuning_routes(app, tuner, authorised)


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, Any]


def add_tuning_routes(app: FastAPI, tuner, authorised) -> None:
    """/admin/tuning: the controller's status, pause/resume/pin, and its report."""

    def controller():
        if tuner.controller is None:
            raise ApiError(503, "the tuner starts once the model is loaded", "service_unavailable")
        return tuner.controller

    @app.get("/admin/tuning", dependencies=[Depends(authorised)])
    async def tuning_status() -> dict[str, Any]:
        return tuner.status()

    @app.post("/admin/tuning/pause", dependencies=[Depends(authorised)])
    async def pause() -> dict[str, Any]:
        controller().pause()
        return tuner.status()

    @app.post("/admin/tuning/resume", dependencies=[Depends(authorised)])
    async def resume() -> dict[str, Any]:
        controller().resume()
        return tuner.status()

    @app.post("/admin/tuning/pin", dependencies=[Depends(authorised)])
    async def pin(request: PinRequest) -> dict[str, Any]:
        try:
            controller().pin(request.knobs)
        except ValueError as e:
            raise ApiError(400, str(e), param="knobs") from e
        return tuner.status()

    @app.get("/admin/tuning/report", dependencies=[Depends(authorised)])
    async def report(format: str = Query("json", pattern="^(json|html|csv)$")) -> Response:
        from autotuner.report import build_report
        from autotuner import report_render

        try:
            built = build_report(tuner.state_dir)
        except ValueError as e:
            raise ApiError(404, str(e), "not_found_error") from e
        render = {"json": report_render.render_json, "html": report_render.render_html,
                  "csv": report_render.render_csv}[format]
        media = {"json": "application/json", "html": "text/html", "csv": "text/csv"}[format]
        return Response(render(built), media_type=media)
