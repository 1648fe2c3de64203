"""lm-evaluation-harness against the daemon and against its own `hf` backend on the same GGUF weights,
side by side: the daemon through `local-completions` (a loglikelihood task, which needs echo and prompt
logprobs, and a generate_until task), then lm-eval's transformers model on the file dequantized, on the
local tasks in benchmarks/lm_eval_tasks/ (docs/benchmarking.md renders the results). With --llama-server,
llama.cpp's server on the same file runs the generate_until task too (it refuses `echo`, so it cannot
run the loglikelihood one).

lm-eval pins its own dependencies: give it its own virtual environment with torch, transformers, gguf and
accelerate (`python3 -m venv /opt/lmeval && /opt/lmeval/bin/pip install torch==2.13.0 "lm-eval[api]"
transformers gguf accelerate`). Nothing is downloaded at run time (HF_HUB_OFFLINE=1).

    python benchmarks/lm_eval_check.py --gguf $M/qwen2.5-coder-0.5b.gguf --lm-eval-python /opt/lmeval/bin/python \\
        --json docs/results/lm_eval_0.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import results_file
from server_health import running

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"
TASK_METRICS = {"arith_choice": "acc,none", "arith_generate": "exact_match,strip"}
EXPORT_TOKENIZER = ("import sys; from transformers import AutoTokenizer; "
                    "AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained(sys.argv[3])")


def lm_eval(python: str, model: str, model_args: str, out: Path, extra: list[str],
            tasks: tuple[str, ...] = tuple(TASK_METRICS)) -> dict[str, float]:
    """One lm-eval run over `tasks`; {task: score}."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    subprocess.run([python, "-m", "lm_eval", "--model", model, "--model_args", model_args, "--tasks",
                    ",".join(tasks), "--include_path", str(TASKS), "--output_path", str(out), *extra],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    return {task: results[task][TASK_METRICS[task]] for task in tasks}


def served_scores(cmd: list[str], port: int, name: str, args: argparse.Namespace, tokenizer: Path, work: Path,
                  tasks: tuple[str, ...]) -> dict[str, float]:
    """lm-eval's local-completions against the server `cmd` starts on `port`."""
    with running(cmd, f"http://127.0.0.1:{port}/health", work / f"{name}.log", name, cwd=ROOT):
        model = Path(args.gguf).name.removesuffix(".gguf")
        return lm_eval(args.lm_eval_python, "local-completions",
                       f"model={model},base_url=http://127.0.0.1:{port}/v1/completions,"
                       f"tokenizer_backend=huggingface,tokenizer={tokenizer},num_concurrent=4,max_retries=1",
                       work / name, [], tasks)


def render_doc(paths: list[Path]) -> str:
    rows = ["| GGUF | task | lm-eval output type | the daemon (local-completions) | lm-eval's hf backend | "
            "llama.cpp's server (local-completions) |", "|---|---|---|---:|---:|---:|"]
    for path in paths:
        r = results_file.read(path)
        for task, kind in (("arith_choice", "loglikelihood"), ("arith_generate", "generate_until")):
            peer = r.get("llama_cpp", {}).get(task)
            rows.append(f"| {r['gguf']} | {task} ({r['items']} items) | {kind} | {r['daemon'][task]:.4f} | "
                        f"{r['hf'][task]:.4f} | {'-' if peer is None else f'{peer:.4f}'} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True)
    p.add_argument("--lm-eval-python", required=True, help="the python of lm-eval's own virtual environment")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--llama-server", default=None, help="llama.cpp's llama-server binary: runs generate_until too")
    p.add_argument("--state-dir", default="out/lm_eval_state")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = work / "tokenizer"
        gguf = Path(args.gguf).resolve()
        subprocess.run([args.lm_eval_python, "-c", EXPORT_TOKENIZER, str(gguf.parent), gguf.name, str(tokenizer)],
                       check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        daemon = served_scores([sys.executable, "-P", "-m", "serving.cli", "--model", args.gguf, "--port",
                                str(args.port), "--state-dir", str(args.state_dir)], args.port, "daemon", args,
                               tokenizer, work, tuple(TASK_METRICS))
        peer = {} if not args.llama_server else served_scores(
            [args.llama_server, "-m", str(gguf), "--port", str(args.port + 1), "-np", "4", "-c", "8192"],
            args.port + 1, "llama_cpp", args, tokenizer, work, ("arith_generate",))
        hf = lm_eval(args.lm_eval_python, "hf", f"pretrained={gguf.parent},gguf_file={gguf.name},"
                     f"tokenizer={tokenizer},dtype=float32", work / "hf", ["--batch_size", "16"])
    items = sum(1 for _ in open(TASKS / "arith_choice.jsonl"))
    results_file.write(args.json, {"gguf": gguf.name, "items": items, "daemon": daemon, "hf": hf,
                                   **({"llama_cpp": peer} if peer else {})})
    print(render_doc([Path(args.json)]))


if __name__ == "__main__":
    main()
