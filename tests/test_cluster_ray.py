"""Two replicas of the bundled model on a local Ray cluster (loopback) behind the ingress: concurrent
streaming requests through the openai client reach both, and when one replica is killed in the
middle of a stream that stream ends with an error (nothing hangs), the other replica keeps
serving, and Serve restarts the killed one. Skipped where Ray is not installed (the `cluster`
extra); CI installs it."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from cluster.app import cluster_app  # noqa: E402
from cluster.cluster_spec import ClusterSpec  # noqa: E402
from cluster.ingress import REPLICA_HEADER  # noqa: E402
from tests.live_server import free_port  # noqa: E402

pytestmark = pytest.mark.slow
APP = "autotuned-test"
REPLICAS = ["replica-0", "replica-1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster-state")
    # each replica: one torch thread, a small KV pool, no tuner or calibration (2 cores for everything)
    spec = ClusterSpec(replicas=2, state_dir=str(state), torch_threads=1, replica_cpus=1,
                       settings={"tune": False, "calibrate": False, "kv_cache_memory_mb": 24,
                                 "default_max_tokens": 16})
    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(cluster_app(spec), name=APP, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: all(r["healthy"] for r in replicas_view(url).values()), 120, "both replicas healthy")
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def replicas_view(url: str) -> dict:
    return httpx.get(url + "/cluster/replicas", timeout=5).json()["replicas"]


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def served_by_replica(url: str) -> dict[str, float]:
    """Finished requests per replica, from the ingress's /metrics (each replica's, labelled)."""
    counts = dict.fromkeys(REPLICAS, 0.0)
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("autotuned:request_success_total{"):
            replica = line.split('replica="')[1].split('"')[0]
            counts[replica] += float(line.rsplit(" ", 1)[1])
    return counts


def chat(client, i: int) -> str:
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", stream=True, max_tokens=8,
        messages=[{"role": "user", "content": f"Question number {i}: name a colour and a fruit, please."}])
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_concurrent_streams_reach_both_replicas(cluster):
    from openai import OpenAI

    client = OpenAI(base_url=cluster + "/v1", api_key="unused", timeout=60, max_retries=0)
    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(lambda i: chat(client, i), range(6)))
    assert all(texts)
    served = served_by_replica(cluster)
    assert all(served[r] >= 1 for r in REPLICAS), served
    metrics = httpx.get(cluster + "/metrics", timeout=10).text
    assert 'autotuned:router_decisions_total{reason="load",replica="replica-0"}' in metrics
    bad = httpx.post(cluster + "/v1/completions", json={"prompt": 5}, timeout=30)     # the replica's own 400
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_a_killed_replica_ends_its_stream_cleanly_and_the_other_keeps_serving(cluster):
    from openai import OpenAI

    body = {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", cluster + "/v1/completions", json=body, timeout=30) as response:
        victim = response.headers[REPLICA_HEADER]
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        old = replicas_view(cluster)[victim]["incarnation"]
        pid = serve.get_deployment_handle(victim, APP).pid.remote().result()
        os.kill(pid, signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]     # ends: no hang (30 s read timeout)
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2].removeprefix("data: "))["error"]["code"] == "replica_failed"

    client = OpenAI(base_url=cluster + "/v1", api_key="unused", timeout=60, max_retries=0)
    with ThreadPoolExecutor(3) as pool:
        texts = list(pool.map(lambda i: chat(client, i), range(100, 106)))
    assert all(texts)                 # every one served, by the survivor or (retried) after the restart

    wait_for(lambda: (v := replicas_view(cluster)[victim])["healthy"] and v["incarnation"] != old, 90,
             f"Serve to restart {victim}")
    assert chat(client, 200)
