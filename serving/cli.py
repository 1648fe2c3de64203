"""The `autotuned-serve` command line."""

from __future__ import annotations

import argparse
import os
import sys

from serving import cli_tuning
from serving.setting_flags import (DAEMON_URL, add_knob_flags, add_serve_flags, add_setting_flag, add_slo_flags,
                                   knob_overrides, serve_overrides)
from engine.errors import EngineError, EngineFailed


EXIT_ENGINE_FAILED = 3   # the engine died while serving: restarting helps (2, a bad model or setting, it does not)
PLUGIN_GROUP = "autotuned_serve.commands"   # entry points adding subcommands (cluster/cli.py: `cluster`)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotuned-serve", description="A self-tuning LLM serving daemon.")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate a completion for one prompt and print it")
    gen.add_argument("prompt", help="the prompt (sent through the model's chat template unless --raw)")
    gen.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    for name in ("model", "dtype", "weights", "kernel_activations"):
        add_setting_flag(gen, name)
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
    add_setting_flag(cap, "policy")        # with --simulate: the daemon's policy and knobs unless told
    add_knob_flags(cap)
    cli_tuning.add_cost_model_arguments(cap)
    add_setting_flag(cap, "state_dir")     # with --simulate: where a calibrated cost model is looked for
    cli_tuning.add_parsers(sub)
    add_plugin_parsers(sub)
    srv = sub.add_parser("serve", help="run the OpenAI-compatible daemon (the default command)")
    add_serve_flags(srv)
    add_serve_flags(parser)   # `autotuned-serve` alone serves with these
    return parser


def add_plugin_parsers(sub) -> None:
    """Subcommands of packages above serving/ (docs/design/architecture.md), found by entry point so this
    module need not import them; each sets `run_plugin` (its handler) in the parsed arguments."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            add = entry.load()
        except ImportError:     # an install older than this checkout: the CLI works without the command
            continue
        add(sub)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from loadgen.bench_client import BenchOptions
    from serving.settings import default_of

    p.add_argument("--base-url", default=DAEMON_URL, help="server root (default %(default)s)")
    p.add_argument("--workload", default="chat",
                   help="a preset in configs/workloads.yaml or a YAML file (default chat)")
    p.add_argument("--qps", type=float, default=None, help="base request rate (default: the workload's)")
    p.add_argument("--num-requests", type=int, default=200, help="requests per run (default 200)")
    p.add_argument("--max-duration-s", type=float, default=default_of(BenchOptions, "max_duration_s"),
                   help="arrivals stop and unfinished requests fail after this long (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    add_slo_flags(p)
    p.add_argument("--out-dir", default=None, help="write the JSON and PNG plots here")
    p.add_argument("--model", default=None, help="model name for the requests (default: the first of GET /v1/models)")
    p.add_argument("--tokenizer", default=None, help="model whose tokenizer makes the prompts: a .gguf, an HF "
                   "directory or a preset (default: the bundled SmolLM2)")
    p.add_argument("--text-prompts", action="store_true", help="send text instead of token ids")
    p.add_argument("--endpoint", default=default_of(BenchOptions, "endpoint"), choices=["completions", "chat"],
                   help="/v1/completions or /v1/chat/completions (text prompts in one user message; default "
                   "%(default)s)")
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
    from simulation.speculation_model import workload_speculation
    from simulation.workload_run import simulated_probe
    from loadgen.workload import load_workload
    from policies import Knobs, get_policy
    from engine.slo_class import SloClass

    if args.num_requests < 1 or not (args.slo_ttft_s > 0 and args.slo_tbt_s > 0):
        raise ValueError("--num-requests must be >= 1 and the SLO bounds > 0")
    get_policy(args.policy)
    knobs = Knobs().replace(**knob_overrides(args))
    cost = resolve_cost_model(args.cost_model, args.profile, args.state_dir)
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    workload = load_workload(args.workload)
    probe = simulated_probe(workload, cost, args.policy, knobs, slo, args.num_requests, args.seed,
                            args.min_duration_s, workload_speculation(workload.name))
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
    from serving.settings import load_settings

    settings = load_settings(args.config, serve_overrides(args))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    enable_stack_dumps()
    run_daemon(settings.daemon_config(served_model_name(settings.model)))


def enable_stack_dumps() -> None:
    """A crash in native code (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) prints every thread's Python stack
    to stderr before the process dies; `kill -USR1 PID` prints them from a live daemon (a stuck step)."""
    import faulthandler
    import signal

    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def served_model_name(model: str | None) -> str:
    from engine.model.checkpoint import BUNDLED_GGUF, DEFAULT_MODEL

    if model in (None, "", DEFAULT_MODEL, "default"):
        return BUNDLED_GGUF.split(".")[0]
    return os.path.basename(os.path.normpath(model)).removesuffix(".gguf")


def run_generate(args: argparse.Namespace) -> None:
    from engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, weights=args.weights, kernel_activations=args.kernel_activations)
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
