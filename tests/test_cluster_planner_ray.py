"""The SLO planner on a live local Ray cluster (tiny replicas of the bundled model, one torch
thread each): a request rate stepping low -> high -> low scales the fleet 1 -> 2 -> 1 through
Ray Serve's external scaler API, and every request is answered (none failed, none lost while a
replica joins or leaves). Skipped where Ray is not installed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from cluster.app import cluster_app  # noqa: E402
from cluster.cluster_spec import ClusterSpec  # noqa: E402
from cluster.planner_config import PlannerConfig  # noqa: E402
from tests.live_server import free_port  # noqa: E402

pytestmark = pytest.mark.slow
APP = "autotuned-planner-test"
# one replica "sustains" 1 req/s here: 0.4 req/s wants one replica, 2 req/s wants two
PLANNER = PlannerConfig(min_replicas=1, max_replicas=2, interval_s=2.0, forecaster="last", headroom=0.0,
                        scale_down_delay_s=4.0, startup_s=0.0, min_samples=10_000, replica_capacity_rps=1.0)


def replicas_view(url: str) -> dict:
    return httpx.get(url + "/cluster/replicas", timeout=5).json()


def running(deployment: str) -> int:
    """Live replica actors of a deployment, by their names in Serve's namespace (serve.status()
    cannot show a deployment deployed at 0, docs/cluster.md)."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return sum(f"{APP}#{deployment}#" in a["name"] for a in names if a["namespace"] == "serve")


def test_a_rate_step_scales_one_to_two_to_one_with_no_request_lost(tmp_path):
    spec = ClusterSpec(replicas=1, state_dir=str(tmp_path), torch_threads=1, replica_cpus=1, planner=PLANNER,
                       settings={"tune": False, "calibrate": False, "kv_cache_memory_mb": 24,
                                 "default_max_tokens": 4})
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(cluster_app(spec), name=APP, route_prefix="/", external_scaler_enabled=True)
        url = f"http://127.0.0.1:{port}"
        assert running("replica-1") == 0                        # deployed at 0: the planner's to start
        wait(lambda: replicas_view(url)["replicas"].get("replica-0", {}).get("healthy"), 180, "replica-0 healthy")
        traffic = Traffic(url)
        seen: list[int] = []

        def active() -> int:
            planner = replicas_view(url)["planner"]
            seen.append(len(planner["active"]))
            return len(planner["active"])

        traffic.run(rate=0.4, seconds=6)
        assert active() == 1
        traffic.start(rate=2.0)                                 # high: the planner asks for replica-1
        wait(lambda: active() == 2, 60, "the planner to add a replica")
        wait(lambda: replicas_view(url)["replicas"].get("replica-1", {}).get("healthy"), 240, "replica-1 loaded")
        traffic.keep(seconds=6)                                 # both serve
        traffic.set_rate(0.2)                                   # low again: one leaves once drained
        wait(lambda: active() == 1 and not replicas_view(url)["planner"]["draining"], 90, "scale-down")
        wait(lambda: sum(running(f"replica-{i}") for i in range(2)) == 1, 90, "Serve to stop the idle replica")
        traffic.stop()
        assert traffic.failures == [] and traffic.answered == traffic.sent > 20
        assert set(traffic.replicas) == {"replica-0", "replica-1"}
        assert seen[0] == 1 and 2 in seen and seen[-1] == 1
    finally:
        serve.shutdown()
        ray.shutdown()


def wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (httpx.HTTPError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


class Traffic:
    """Open-loop completions at a rate, from a thread; every answer checked."""

    def __init__(self, url: str) -> None:
        self.url, self.rate = url, 0.0
        self.sent = self.answered = 0
        self.failures: list[str] = []
        self.replicas: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(16)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def one(self, i: int) -> None:
        try:
            r = httpx.post(self.url + "/v1/completions", timeout=300,
                           json={"prompt": f"Request {i}: the colour of the sky is", "max_tokens": 4})
            ok = r.status_code == 200 and r.json()["choices"][0]["text"] is not None
        except httpx.HTTPError as e:
            ok, r = False, e
        with self._lock:
            if ok:
                self.answered += 1
                self.replicas.add(r.headers.get("x-autotuned-replica", "?"))
            else:
                self.failures.append(str(getattr(r, "text", r))[:200])

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._pool.submit(self.one, self.sent)
            self.sent += 1
            self._stop.wait(1.0 / self.rate)

    def start(self, rate: float) -> None:
        self.rate = rate
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def run(self, rate: float, seconds: float) -> None:
        self.start(rate)
        time.sleep(seconds)

    def keep(self, seconds: float) -> None:
        time.sleep(seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._pool.shutdown(wait=True)
