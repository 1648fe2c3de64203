"""Running the API under uvicorn: load in the background, drain on SIGTERM/SIGINT, exit 0."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from serving.api_server import ApiConfig, ServerState, build_app
from serving.auth import AuthConfig, install_auth
from engine.errors import EngineFailed, ModelLoadError
from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
FAILED_SHUTDOWN_S = 3    # after the engine's death: the longest wait for open responses (they were ended)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: AuthConfig) -> None:
    """Anything but loopback is reachable by others: it needs a client key on the API."""
    if not is_loopback(host) and not auth.client_keys:
        raise ValueError(f"binding {host} (not loopback) needs a client API key: set api_key or api_keys_file "
                         "in the config, --api-key or AUTOTUNED_SERVE_API_KEY")


def make_app(state: ServerState, grace_s: float,
             extra_routes: Callable[[FastAPI, ServerState], None] | None = None,
             auth: AuthConfig | None = None) -> FastAPI:
    """The app under uvicorn; `auth` (None: the API config's one key) guards its paths (serving/auth.py)."""
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        state.start_loading()
        yield
        drain(state, grace_s)

    app = build_app(state, extra_routes)
    install_auth(app, auth if auth is not None else AuthConfig.from_api_key(state.config.api_key))
    app.router.lifespan_context = lifespan
    return app


def drain(state: ServerState, grace_s: float) -> None:
    """uvicorn has already stopped accepting and waited for open responses; abort what is left."""
    state.draining = True
    loop = state.loop
    if loop is None:
        return
    deadline = time.monotonic() + grace_s
    while loop.num_unfinished and time.monotonic() < deadline:
        time.sleep(0.05)
    if loop.num_unfinished:
        log.warning("aborting %d requests still running after the %.0f s grace period", loop.num_unfinished, grace_s)
        loop.abort_all()
    loop.stop()
    log.info("engine stopped")


def serve(load_engine: Callable[[], LLMEngine], api: ApiConfig, host: str, port: int, grace_s: float,
          extra_routes: Callable[[FastAPI, ServerState], None] | None = None, auth: AuthConfig | None = None) -> None:
    auth = auth if auth is not None else AuthConfig.from_api_key(api.api_key)
    check_bind(host, auth)
    state = ServerState(api, load_engine)
    app = make_app(state, grace_s, extra_routes, auth)
    config = uvicorn.Config(app, host=host, port=port, timeout_graceful_shutdown=int(grace_s), log_level="info")
    DrainingServer(config, state).run()
    if state.load_error:
        raise ModelLoadError(f"cannot load model {api.served_model_name}: {state.load_error}")
    if state.engine_failure:
        raise EngineFailed(f"the engine failed: {state.engine_failure}")


class DrainingServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies by the signal;
    a daemon that drained cleanly should exit 0 instead. A second signal forces the exit. A model
    that failed to load stops the server: it would never serve, and only a non-zero exit tells the
    supervisor (systemd, Kubernetes) so, where /health answering 503 reads as still loading. So does
    the engine loop's death, within a few seconds: its open requests have been ended with errors."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    async def on_tick(self, counter: int) -> bool:
        if self.state.engine_failure:
            self.config.timeout_graceful_shutdown = min(self.config.timeout_graceful_shutdown or FAILED_SHUTDOWN_S,
                                                        FAILED_SHUTDOWN_S)
            return True
        return self.state.load_error is not None or await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self):
        def handle(sig: int, frame) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True
            log.info("received %s: draining", signal.Signals(sig).name)

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
