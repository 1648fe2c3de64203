"""The `autotuned-serve` command line."""

from __future__ import annotations

import argparse
import os
import sys

from serving import cli_tuning
from serving.cli_tuning import WEIGHTS_HELP
from engine.errors import EngineError, EngineFailed


EXIT_ENGINE_FAILED = 3   # the engine died while serving: restarting helps (2, a bad model or setting, it does not)
PLUGIN_GROUP = "autotuned_serve.commands"   # entry points adding subcommands (cluster/cli.py: `cluster`)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotuned-serve", description="A self-tuning LLM serving daemon.")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate a completion for one prompt and print it")
    gen.add_argument("prompt", help="the prompt (sent through the model's chat template unless --raw)")
    gen.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    gen.add_argument("--model", default=None,
                     help="a .gguf file, a Hugging Face model directory, a Hugging Face repo id in the local "
                          "cache (owner/name), or a preset name (default: the bundled SmolLM2-135M-Instruct)")
    gen.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                     help="auto: bf16 where the hardware runs it fast, else fp32")
    gen.add_argument("--weights", default="auto", choices=["auto", "quantized", "dense"], help=WEIGHTS_HELP)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    sub.add_parser("policies", help="list the scheduling policies with the knobs each reads")
    bench = sub.add_parser("bench", help="benchmark an OpenAI-compatible server with an open-loop workload")
    add_bench_arguments(bench)
    cap = sub.add_parser("capacity", help="search the largest QPS a server sustains within TTFT/TBT bounds (a "
                         "running server; each probe lasts ~--num-requests/QPS s) or, with --simulate, the simulator")
    add_bench_arguments(cap)
    cap.add_argument("--max-probes", type=int, default=8, help="most bench runs in the search (default 8)")
    cap.add_argument("--start-qps", type=float, default=1.0, help="first rate probed (default 1)")
    cap.add_argument("--tolerance", type=float, default=0.05,
                     help="stop when the passing and failing rates are this close, relatively (default 0.05)")
    cap.add_argument("--min-duration-s", type=float, default=60.0,
                     help="a probe sends more than --num-requests where they would arrive within this many "
                          "seconds (default 60; 0: --num-requests only): a short probe measures the burst a "
                          "server can queue, not the rate it keeps up with")
    cap.add_argument("--max-failed-fraction", type=float, default=0.0,
                     help="a probe with more failed or unfinished requests fails (default 0)")
    cap.add_argument("--simulate", action="store_true",
                     help="probe the simulator instead of a server (with --profile or --cost-model)")
    cap.add_argument("--policy", default="sarathi", help="with --simulate: scheduling policy (default sarathi)")
    cap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                     help="with --simulate: a knob value (repeatable)")
    cli_tuning.add_cost_model_arguments(cap)
    cap.add_argument("--state-dir", default=cli_tuning.DEFAULT_STATE_DIR,
                     help="with --simulate: where a calibrated cost model is looked for (default state)")
    cli_tuning.add_parsers(sub)
    add_plugin_parsers(sub)
    srv = sub.add_parser("serve", help="run the OpenAI-compatible daemon (the default command)")
    add_serve_arguments(srv)
    add_serve_arguments(parser)   # `autotuned-serve` alone serves with these
    return parser


def add_plugin_parsers(sub) -> None:
    """Subcommands of packages above serving/ (docs/architecture.md), found by entry point so this
    module need not import them; each sets `run_plugin` (its handler) in the parsed arguments."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            add = entry.load()
        except ImportError:     # an install older than this checkout: the CLI works without the command
            continue
        add(sub)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """Flags override the config file; unset flags leave its values (or the defaults) alone."""
    p.add_argument("--config", default=None, help="YAML settings file (see configs/default.yaml)")
    p.add_argument("--model", default=None, help="a .gguf file, an HF model directory, an HF repo id in the local "
                   "cache (owner/name[:FILE.gguf], never downloaded) or a preset (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1; any other needs an API key)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument("--dtype", default=None, choices=["auto", "bf16", "fp32"], help="default auto")
    p.add_argument("--weights", default=None, choices=["auto", "quantized", "dense"], help=WEIGHTS_HELP)
    p.add_argument("--device", default=None, help="cpu (default), cuda or cuda:N")
    p.add_argument("--policy", default=None, help="scheduling policy (default deadline; see `autotuned-serve policies`)")
    p.add_argument("--token-budget", type=int, default=None,
                   help="token budget per step (default 512): the deadline policy's cap; under a plain budget "
                   "policy a tuned daemon's cold start lowers it to what the cost model fits in the TBT SLO")
    p.add_argument("--kv-cache-memory-mb", type=float, default=None, help="KV cache size in MiB (default 256)")
    p.add_argument("--kv-cache-dtype", default=None, choices=["auto", "fp32", "fp16", "bf16"],
                   help="how K/V are stored (default auto: fp16 for an fp32 model on the CPU kernels, else the model's)")
    p.add_argument("--max-waiting", type=int, default=None, help="queued requests beyond this get 429 (default 256)")
    p.add_argument("--api-key", default=None, help="key for /admin (default: AUTOTUNED_SERVE_API_KEY)")
    p.add_argument("--grace-s", type=float, default=None, help="on SIGTERM, how long in-flight requests may finish")
    p.add_argument("--engine-stall-s", type=float, default=None,
                   help="an engine step running longer than this is the engine's death: open requests end with "
                   "an error and the daemon exits 3 for its supervisor to restart it (default 600, above a big model's "
                   "whole-prompt step on the CPU; 0: never)")
    p.add_argument("--slo-classes", default=None, help="YAML file of the SLO classes requests may name "
                   "(default configs/slo_classes.yaml; the config's `slo` re-targets the default class)")
    p.add_argument("--state-dir", default=None, help="where tuner state lives (default ./state)")
    p.add_argument("--no-tune", dest="tune", action="store_const", const=False, default=None,
                   help="serve with fixed knobs, no online tuning")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_const", const=False, default=None,
                   help="recompute every prompt instead of reusing the KV blocks of prefixes already in the pool")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_const", const=False, default=None,
                   help="where no cost model describes this model/dtype/machine, skip the start-up calibration "
                        "(--calibration-budget-s) and scale the shipped one by live step times")
    p.add_argument("--calibration-budget-s", type=float, default=None,
                   help="wall time the start-up calibration may take (default 60): fewer grid points for a slower "
                        "model; too few to fit and it serves as with --no-calibrate")


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default http://127.0.0.1:8000)")
    p.add_argument("--workload", default="chat",
                   help="a preset in configs/workloads.yaml or a YAML file (default chat)")
    p.add_argument("--qps", type=float, default=None, help="base request rate (default: the workload's)")
    p.add_argument("--num-requests", type=int, default=200, help="requests per run (default 200)")
    p.add_argument("--max-duration-s", type=float, default=600.0,
                   help="arrivals stop and unfinished requests fail after this long (default 600)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-s", type=float, default=2.0, help="TTFT bound (default 2.0)")
    p.add_argument("--slo-tbt-s", type=float, default=0.25, help="time-between-tokens bound (default 0.25)")
    p.add_argument("--out-dir", default=None, help="write the JSON and PNG plots here")
    p.add_argument("--model", default=None, help="model name for the requests (default: the first of GET /v1/models)")
    p.add_argument("--tokenizer", default=None, help="model whose tokenizer makes the prompts: a .gguf, an HF "
                   "directory or a preset (default: the bundled SmolLM2)")
    p.add_argument("--text-prompts", action="store_true", help="send text instead of token ids")
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"],
                   help="/v1/completions (default) or /v1/chat/completions (text prompts in one user message)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: OPENAI_API_KEY")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def bench_setup(args: argparse.Namespace):
    """(workload, prompt source, options, SLO) from the bench flags; bad values raise ValueError."""
    from loadgen.bench_client import BenchOptions
    from loadgen.prompts import PromptSource, load_prompt_tokenizer
    from loadgen.workload import load_workload
    from engine.slo_class import SloClass

    for flag in ("qps", "slo_ttft_s", "slo_tbt_s"):
        if getattr(args, flag) is not None and not getattr(args, flag) > 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be > 0")
    if args.num_requests < 1:
        raise ValueError("--num-requests must be at least 1")
    workload = load_workload(args.workload)
    options = BenchOptions(args.base_url, args.model, args.text_prompts, args.endpoint, args.api_key,
                           args.max_duration_s, args.progress)
    source = PromptSource(load_prompt_tokenizer(args.tokenizer), args.seed)
    return workload, source, options, SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)


def run_bench_command(args: argparse.Namespace) -> None:
    import json

    from loadgen.bench_client import bench_workload, write_outputs
    from telemetry.latency_summary import class_lines

    workload, source, options, slo = bench_setup(args)
    run = bench_workload(workload, source, options, slo, args.qps, args.num_requests, args.seed)
    settings = {"workload": workload.name, "qps": args.qps or workload.qps, "seed": args.seed,
                "base_url": options.root, "endpoint": options.endpoint, "model": run.model}
    if args.out_dir:
        write_outputs(run, args.out_dir, settings)
    print(json.dumps({**settings, **run.summary.as_dict()}, indent=2))
    for line in class_lines(run.summary.as_dict()):    # stderr: stdout stays one JSON document
        print(line, file=sys.stderr)


def run_capacity_command(args: argparse.Namespace) -> None:
    import json

    from loadgen.bench_client import live_probe
    from loadgen.capacity import CapacityCriteria, check_search, search_capacity
    from telemetry.latency_summary import class_lines

    check_search(args.start_qps, args.max_probes, args.tolerance)
    if not args.min_duration_s >= 0:
        raise ValueError(f"--min-duration-s must be >= 0, got {args.min_duration_s}")
    criteria = CapacityCriteria(args.slo_ttft_s, args.slo_tbt_s, args.max_failed_fraction)
    if args.simulate:
        probe, where = simulated_capacity_probe(args)
    else:
        if args.profile or args.cost_model:
            raise ValueError("--profile and --cost-model price simulated steps: add --simulate")
        workload, source, options, slo = bench_setup(args)
        probe = live_probe(workload, source, options, slo, args.num_requests, args.seed, args.min_duration_s)
        where = {"workload": workload.name, "base_url": options.root}
    search = search_capacity(probe, criteria, args.start_qps, args.max_probes, args.tolerance)
    result = {**where, **search.as_dict()}
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "capacity.json"), "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    for p in search.probes:
        for line in class_lines(p.summary):
            print(f"qps {p.qps:.3g} {line}", file=sys.stderr)


def simulated_capacity_probe(args: argparse.Namespace):
    """The capacity search's probe on the simulator: --num-requests of the workload at each rate."""
    from simulation.cost_model_files import resolve_cost_model
    from simulation.workload_run import simulated_probe
    from loadgen.workload import load_workload
    from policies import Knobs, get_policy
    from engine.slo_class import SloClass

    if args.num_requests < 1 or not (args.slo_ttft_s > 0 and args.slo_tbt_s > 0):
        raise ValueError("--num-requests must be >= 1 and the SLO bounds > 0")
    get_policy(args.policy)
    knobs = Knobs().replace(**cli_tuning.parse_knobs(args.knob))
    cost = resolve_cost_model(args.cost_model, args.profile, args.state_dir)
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    workload = load_workload(args.workload)
    probe = simulated_probe(workload, cost, args.policy, knobs, slo, args.num_requests, args.seed,
                            args.min_duration_s)
    where = {"workload": workload.name, "simulated": True, "cost_model": cli_tuning.cost_model_label(cost, args.profile),
             "policy": args.policy,
             "knobs": {k: v for k, v in knobs.as_dict().items() if k != "version"}}
    return probe, where


def run_policies() -> None:
    from policies import POLICIES, Knobs
    from policies.knobs import KNOB_SPECS

    defaults = Knobs()
    for name, cls in POLICIES.items():
        print(f"{name}: {cls.help}")
        for knob in cls.knobs:
            spec = KNOB_SPECS[knob]
            print(f"    {knob:<30} {spec.describe():<16} default {getattr(defaults, knob)!s:<8} {spec.help}")


def run_serve(args: argparse.Namespace) -> None:
    import logging

    from serving.daemon import run_daemon
    from serving.daemon_config import DaemonConfig
    from serving.settings import load_settings

    overrides = {k: getattr(args, k) for k in ("model", "host", "port", "dtype", "weights", "device", "policy",
                                               "kv_cache_memory_mb", "kv_cache_dtype", "max_waiting", "api_key", "grace_s", "engine_stall_s", "state_dir", "tune",
                                               "slo_classes", "calibrate", "calibration_budget_s", "prefix_caching")}
    settings = load_settings(args.config, overrides)
    if args.token_budget:
        settings.knobs = {**settings.knobs, "token_budget": args.token_budget}
        settings.validate()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    enable_stack_dumps()
    run_daemon(DaemonConfig(settings.engine_config(), settings.api_config(served_model_name(settings.model)),
                            settings.host, settings.port, settings.grace_s, settings.slo_values(),
                            settings.peak_flops, settings.peak_bandwidth, tune=settings.tune,
                            state_dir=settings.state_dir, calibrate=settings.calibrate,
                            calibration_budget_s=settings.calibration_budget_s))


def enable_stack_dumps() -> None:
    """A crash in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints every thread's Python stack
    to stderr before the process dies; `kill -USR1 PID` prints them from a live daemon (a stuck step)."""
    import faulthandler
    import signal

    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def served_model_name(model: str | None) -> str:
    from engine.checkpoint import BUNDLED_GGUF, DEFAULT_MODEL

    if model in (None, "", DEFAULT_MODEL, "default"):
        return BUNDLED_GGUF.split(".")[0]
    return os.path.basename(os.path.normpath(model)).removesuffix(".gguf")


def run_generate(args: argparse.Namespace) -> None:
    from engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, weights=args.weights)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    tokenizer = llm.tokenizer
    if args.raw or not tokenizer.chat_template:
        prompt = args.prompt
    else:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    print(llm.generate([prompt], params, use_tqdm=False)[0].text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            run_generate(args)
        elif args.command == "policies":
            run_policies()
        elif args.command == "bench":
            run_bench_command(args)
        elif args.command == "capacity":
            run_capacity_command(args)
        elif cli_tuning.run(args):
            pass
        elif getattr(args, "run_plugin", None):
            args.run_plugin(args)
        else:
            run_serve(args)
        return 0
    except EngineFailed as e:
        print(f"autotuned-serve: error: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # exit now: a thread stuck in a C kernel, or native pools mid-work, can hang or abort interpreter
        # teardown; the supervisor must see this status, and promptly
        os._exit(EXIT_ENGINE_FAILED)
    except (EngineError, ValueError) as e:
        print(f"autotuned-serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
