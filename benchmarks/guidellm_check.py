"""A load generator nobody here wrote against our own: GuideLLM (`guidellm`, from PyPI, in its own virtual
environment) and `autotuned-serve bench` drive the same daemon (tuner off) one after the other at one fixed
rate, with fixed prompt and output lengths, and their median TTFT and inter-token latency are set side by
side (docs/benchmarking.md).

Definitions: TTFT is request sent to first streamed token, on the client, for both. GuideLLM's inter-token
latency is per request (last token - first token) / (output tokens - 1), its median over requests: our
`tpot_p50_s`, the same definition; our pooled TBT (every gap between streamed tokens) is shown beside it.

    python benchmarks/guidellm_check.py --guidellm /opt/guidellm/bin/guidellm --tokenizer out/smollm2-tokenizer \\
        --json docs/results/guidellm_check_xeon.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

import results_file
from server_health import running

ROOT = Path(__file__).resolve().parent.parent


def client_cpu(args: argparse.Namespace) -> list[str]:
    """With --pin, a load generator runs on the last core and the daemon on the others, so neither
    generator's own work slows the daemon's steps (on a 2-core machine it otherwise does)."""
    return ["taskset", "-c", str(os.cpu_count() - 1)] if args.pin else []


def daemon_cpus(args: argparse.Namespace) -> list[str]:
    return ["taskset", "-c", f"0-{os.cpu_count() - 2}"] if args.pin else []


def server_itl(url: str) -> tuple[float, float]:
    """(sum, count) of the daemon's own inter-token latency histogram: what its steps took while a
    generator ran, whatever that generator measures on its side."""
    text = httpx.get(url + "/metrics").text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("autotuned:inter_token_latency_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("autotuned:inter_token_latency_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def workload_yaml(prompt: int, output: int) -> str:
    return ("name: fixed\nqps: 1.0\nphases:\n"
            f"  - {{name: fixed, share: 1, arrival: fixed, lengths: {{kind: fixed, prompt: {prompt}, output: {output}}}}}\n")


def our_bench(args: argparse.Namespace, url: str, work: Path) -> dict[str, float]:
    (work / "fixed.yaml").write_text(workload_yaml(args.prompt_tokens, args.output_tokens))
    subprocess.run([*client_cpu(args), sys.executable, "-P", "-m", "serving.cli", "bench", "--base-url", url, "--workload",
                    str(work / "fixed.yaml"), "--qps", str(args.rate), "--num-requests", str(args.requests),
                    "--out-dir", str(work / "ours"), "--no-progress"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    s = json.loads((work / "ours" / "bench.json").read_text())
    return {"ttft_p50_s": s["ttft_p50_s"], "itl_p50_s": s["tpot_p50_s"], "tbt_p50_s": s["tbt_p50_s"],
            "requests": s["num_finished"]}


def guidellm(args: argparse.Namespace, url: str, model: str, work: Path) -> dict[str, float]:
    out = work / "guidellm.json"
    subprocess.run([*client_cpu(args), args.guidellm, "benchmark", "--target", url, "--model", model, "--processor", args.tokenizer,
                    "--data", json.dumps({"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens}),
                    "--rate-type", "constant", "--rate", str(args.rate), "--max-requests", str(args.requests),
                    "--output-path", str(out), "--disable-progress"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    pick = lambda name: metrics[name]["successful"]["median"] / 1000     # noqa: E731 (ms in the report)
    return {"ttft_p50_s": pick("time_to_first_token_ms"), "itl_p50_s": pick("inter_token_latency_ms"),
            "output_tokens_p50": metrics["output_token_count"]["successful"]["median"],
            "requests": metrics["request_totals"]["successful"] if "request_totals" in metrics else None}


def render_doc(paths: list[Path]) -> str:
    rows = ["| machine | rate (req/s) | prompt / output tokens | median TTFT: bench / GuideLLM (ms) | ratio | "
            "median ITL: bench / GuideLLM (ms) | ratio | bench's pooled TBT p50 (ms) | the daemon's own mean ITL "
            "during each: bench / GuideLLM (ms) |",
            "|---|---:|---|---|---:|---|---:|---:|---|"]
    for path in paths:
        r = results_file.read(path)
        o, g, m = r["bench"], r["guidellm"], r["meta"]["machine"]
        rows.append(f"| {m['cpu_model']}, {m['cores']} cores | {r['rate']} | {r['prompt_tokens']} / {r['output_tokens']} | "
                    f"{o['ttft_p50_s'] * 1000:.1f} / {g['ttft_p50_s'] * 1000:.1f} | {o['ttft_p50_s'] / g['ttft_p50_s']:.3f} | "
                    f"{o['itl_p50_s'] * 1000:.1f} / {g['itl_p50_s'] * 1000:.1f} | {o['itl_p50_s'] / g['itl_p50_s']:.3f} | "
                    f"{o['tbt_p50_s'] * 1000:.1f} | {o['server_itl_mean_s'] * 1000:.1f} / "
                    f"{g['server_itl_mean_s'] * 1000:.1f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--guidellm", required=True, help="the guidellm command of its own virtual environment")
    p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer folder of the served model")
    p.add_argument("--model", default=None, help="the daemon's --model (default: the bundled one)")
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--requests", type=int, default=60)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--port", type=int, default=8125)
    p.add_argument("--pin", action="store_true", help="the daemon on all cores but the last, each generator on the last")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cmd = [*daemon_cpus(args), sys.executable, "-P", "-m", "serving.cli", "--port", str(args.port), "--state-dir",
               str(work / "state"), "--no-tune", *(["--model", args.model] if args.model else [])]
        url = f"http://127.0.0.1:{args.port}"
        with running(cmd, url + "/health", work / "daemon.log", "the daemon", cwd=ROOT):
            model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
            before = server_itl(url)
            ours = our_bench(args, url, work)
            between = server_itl(url)
            theirs = guidellm(args, url, model, work)
            after = server_itl(url)
            ours["server_itl_mean_s"] = (between[0] - before[0]) / max(1, between[1] - before[1])
            theirs["server_itl_mean_s"] = (after[0] - between[0]) / max(1, after[1] - between[1])
    results_file.write(args.json, {"pinned": args.pin, "rate": args.rate, "requests": args.requests,
                                   "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                                   "bench": ours, "guidellm": theirs})
    print(render_doc([Path(args.json)]))


if __name__ == "__main__":
    main()
