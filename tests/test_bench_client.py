"""The bench client and the bench/capacity commands against a live loopback daemon with a tiny model."""

from __future__ import annotations

import json

import pytest
import torch

from loadgen.bench_client import BenchOptions, bench_workload
from loadgen.capacity import CapacityCriteria, search_capacity
from serving.cli import main
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import parse_workload
from serving.api_server import ApiConfig
from engine.slo_class import SloClass
from tests.conftest import make_engine
from tests.live_server import LiveServer

WORKLOAD = """\
qps: 20
phases:
  - {name: short, arrival: poisson, lengths: {kind: uniform, prompt: [8, 24], output: [4, 10]}}
  - {name: long, arrival: poisson, lengths: {kind: fixed, prompt: 40, output: 12}}
"""


@pytest.fixture(scope="module")
def server(tiny_hf):
    # One torch thread: on a shared machine a descheduled OpenMP thread stalls every step many-fold.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    api = ApiConfig(served_model_name="tiny", max_waiting=64, max_body_bytes=64 * 1024, default_max_tokens=16)
    try:
        with LiveServer(lambda: make_engine(tiny_hf[0], num_kv_blocks=256, block_size=4, token_budget=64), api) as s:
            yield s
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def workload_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.yaml"
    path.write_text(WORKLOAD)
    return str(path)


WORDS = " ".join(f"w{i}" for i in range(3, 300))   # the tiny model's word vocabulary


def test_bench_command_gives_sane_metrics_and_files(server, tiny_hf, workload_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("loadgen.prompts.TEXT", WORDS)
    out = tmp_path / "out"
    assert main(["bench", "--base-url", server.url + "/v1", "--workload", workload_path, "--num-requests", "12",
                 "--tokenizer", tiny_hf[0], "--out-dir", str(out), "--no-progress", "--max-duration-s", "60"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model"] == "tiny" and summary["qps"] == 20
    assert summary["num_requests"] == summary["num_finished"] == 12 and summary["num_failed"] == 0
    assert 0 < summary["ttft_p50_s"] <= summary["ttft_p99_s"] and 0 < summary["tbt_p50_s"] <= summary["tbt_p99_s"]
    assert summary["output_tokens_per_s"] > 0 and summary["request_throughput_rps"] > 0
    assert 0 <= summary["slo_attainment"] <= 1

    saved = json.loads((out / "bench.json").read_text())
    assert {k: saved[k] for k in summary} == summary
    requests = saved["requests"]
    assert [r["phase"] for r in requests] == ["short"] * 6 + ["long"] * 6
    for r in requests:
        assert r["error"] is None and r["finish_reason"] == "length"
        assert r["num_output_tokens"] == r["output_tokens"]                                # exact with ignore_eos
        assert 1 <= len(r["chunk_times_s"]) <= r["output_tokens"]    # tokens without text send no chunk
        assert r["server_prompt_tokens"] == r["prompt_tokens"]                            # token-id prompts
        assert r["sent_s"] >= r["arrival_s"] - 0.01 and r["first_token_s"] > r["sent_s"]
    for name in ("latency_cdf.png", "tbt_over_time.png", "throughput_over_time.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_text_prompts_chat_and_unfinished_requests(server, tiny_hf):
    tokenizer = load_prompt_tokenizer(tiny_hf[0])
    source = PromptSource(tokenizer, text=WORDS)
    workload = parse_workload("w", {"qps": 50, "phases": [{"lengths": {"kind": "fixed", "prompt": 20, "output": 8}}]})
    run = bench_workload(workload, source, BenchOptions(server.url, text_prompts=True, progress=False), SloClass(),
                         num_requests=4)
    assert run.summary.num_finished == 4 and all(r.server_prompt_tokens == 20 for r in run.results)
    chat = bench_workload(workload, source, BenchOptions(server.url, endpoint="chat", progress=False), SloClass(),
                          num_requests=3)
    assert chat.summary.num_finished == 3 and chat.summary.ttft_p50_s > 0
    assert all(r.num_output_tokens == 8 and 1 <= len(r.chunk_times) <= 8 for r in chat.results)
    # 400 tokens in 50 ms would take 0.125 ms a token, streamed: a Zen 5 finished two of them within 0.3 s
    slow = parse_workload("w", {"qps": 50, "phases": [{"lengths": {"kind": "fixed", "prompt": 20, "output": 400}}]})
    run = bench_workload(slow, source, BenchOptions(server.url, max_duration_s=0.05, progress=False), SloClass(),
                         num_requests=3)
    assert run.summary.num_finished == 0 and run.summary.num_failed == 3 and run.summary.goodput_rps == 0
    assert all("not finished within 0.05 s" in r.error for r in run.results)


def test_capacity_command_against_the_server(server, tiny_hf, workload_path, capsys):
    assert main(["capacity", "--base-url", server.url, "--workload", workload_path, "--num-requests", "4",
                 "--tokenizer", tiny_hf[0], "--no-progress", "--max-probes", "2", "--start-qps", "5",
                 "--slo-ttft-s", "30", "--slo-tbt-s", "10", "--min-duration-s", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [p["qps"] for p in result["probes"]] == [5.0, 10.0] and result["capacity_qps"] == 10.0
    assert result["first_failing_qps"] is None and result["probes"][0]["summary"]["num_finished"] == 4


@pytest.mark.parametrize("argv, message", [
    (["bench", "--qps", "-1"], "--qps must be > 0"),
    (["bench", "--workload", "nope"], "unknown workload 'nope'"),
    (["capacity", "--max-probes", "0"], "max_probes must be >= 1"),
    (["capacity", "--min-duration-s", "-1"], "--min-duration-s must be >= 0"),
    (["bench", "--num-requests", "0"], "--num-requests must be at least 1"),
])
def test_bad_arguments_give_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autotuned-serve: error: ") and message in err and "\n" not in err


def test_unreachable_server_is_one_line(tiny_hf, capsys):
    assert main(["bench", "--base-url", "http://127.0.0.1:9", "--tokenizer", tiny_hf[0], "--no-progress"]) == 2
    assert "cannot list models at http://127.0.0.1:9/v1/models" in capsys.readouterr().err


def test_search_with_a_live_probe_is_reusable(server, tiny_hf):
    from loadgen.bench_client import live_probe

    source = PromptSource(load_prompt_tokenizer(tiny_hf[0]), text=WORDS)
    workload = parse_workload("w", {"phases": [{"lengths": {"kind": "fixed", "prompt": 8, "output": 4}}]})
    probe = live_probe(workload, source, BenchOptions(server.url, progress=False), SloClass(), num_requests=3)
    result = search_capacity(probe, CapacityCriteria(30.0, 10.0), start_qps=20.0, max_probes=1)
    assert result.capacity_qps == 20.0 and result.probes[0].summary["num_finished"] == 3


def test_requests_carry_their_slo_class_to_the_server_and_the_summary(server, tiny_hf, monkeypatch):
    from loadgen.bench_client import make_prompts, run_bench
    from loadgen.workload import RequestSpec
    from telemetry.latency_summary import class_lines

    seen: dict[int, str] = {}     # prompt length -> the class the server gave the request
    monkeypatch.setattr(server.engine, "finish_listeners", [lambda r: seen.__setitem__(r.num_prompt_tokens,
                                                                                       r.slo_class)])
    specs = [RequestSpec(0.0, 8, 3, "a", "batch"), RequestSpec(0.01, 9, 3, "a"),
             RequestSpec(0.02, 10, 3, "a", "gold")]             # gold: unknown to the server, answered 400
    source = PromptSource(load_prompt_tokenizer(tiny_hf[0]), text=WORDS)
    run = run_bench(specs, make_prompts(specs, source, False), BenchOptions(server.url, progress=False),
                    SloClass(ttft_s=30.0, tbt_s=10.0), "tiny")
    assert seen == {8: "batch", 9: "interactive"}
    assert "HTTP 400" in run.results[2].error and "slo_class" not in (run.results[0].error or "")
    records = [r.record(run.start) for r in run.results]
    assert [(r.slo_class, r.slo_ttft_s, r.slo_tbt_s) for r in records] == [
        ("batch", 30.0, 2.0), ("interactive", None, None), ("gold", None, None)]
    by_class = run.summary.by_class
    assert {c: v["num_requests"] for c, v in by_class.items()} == {"batch": 1, "gold": 1, "interactive": 1}
    assert by_class["gold"]["slo_attainment"] == 0 and by_class["gold"]["ttft_p50_s"] is None
    assert by_class["batch"]["slo_attainment"] == 1 and by_class["batch"]["ttft_p50_s"] > 0
    lines = class_lines(run.summary.as_dict())
    assert [line.split(":")[0] for line in lines] == ["batch", "gold", "interactive"]


def test_an_empty_closing_chunk_beyond_the_usage_is_not_a_token():
    """llama.cpp's server ends a completions stream with an empty chunk that only carries the finish
    reason (one chunk more than its usage's tokens): counted, it adds a ~0 s gap to every request's
    TBT. The same shape from a server whose last token's text was held back is a token, and stays."""
    from loadgen.bench_client import RequestResult, _drop_closing_chunk, _is_empty_closing
    from loadgen.workload import RequestSpec

    assert _is_empty_closing({"text": "", "finish_reason": "length"})
    assert not _is_empty_closing({"text": " Paris", "finish_reason": "length"})
    assert not _is_empty_closing({"text": "", "finish_reason": None})
    spec = RequestSpec(0.0, 4, 2, "chat")
    llama = RequestResult(0, spec, chunk_times=[1.0, 2.0, 2.001], output_tokens=2)
    _drop_closing_chunk(llama, True)
    ours = RequestResult(0, spec, chunk_times=[1.0, 2.0], output_tokens=2)
    _drop_closing_chunk(ours, True)
    assert llama.chunk_times == [1.0, 2.0] and ours.chunk_times == [1.0, 2.0]


def test_an_error_reply_keeps_its_openai_code():
    from loadgen.bench_client import _error_code
    assert _error_code(b'{"error": {"message": "m", "type": "rate_limit_error", "code": "deadline_expired"}}') \
        == "deadline_expired"
    assert _error_code(b'{"error": {"message": "m", "code": null}}') is None
    assert _error_code(b"<html>bad gateway</html>") is None
