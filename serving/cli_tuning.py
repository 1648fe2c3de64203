"""Command-line subcommands around the cost model: calibrate, simulate (and the tuner's, added beside)."""

from __future__ import annotations

import argparse
import json
import sys

from serving.setting_flags import DAEMON_URL, add_knob_flags, add_setting_flag, knob_overrides, parse_knobs
from serving.settings import SLO_FLAGS


def add_parsers(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="profile the engine over a grid of step shapes and fit its cost model")
    for name in ("model", "dtype", "weights", "device", "kv_cache_memory_mb"):
        add_setting_flag(cal, name)
    cal.add_argument("--points", type=int, default=120, help="grid points measured (default 120)")
    cal.add_argument("--repeats", type=int, default=3, help="timed runs per point; the median is kept (default 3)")
    cal.add_argument("--holdout", type=float, default=0.2, help="share of points kept out of the fit (default 0.2)")
    cal.add_argument("--out", default=None, help="cost model file (default STATE_DIR/cost_models/MODEL-DTYPE-DEVICE.json)")
    add_setting_flag(cal, "state_dir")

    sim = sub.add_parser("simulate", help="run a workload through the simulator and print its JSON summary")
    sim.add_argument("--workload", default="chat", help="a preset in configs/workloads.yaml or a YAML file")
    add_rate_arguments(sim)
    sim.add_argument("--requests", type=int, default=None,
                     help="requests (default 1000; with --duration, at most this many)")
    sim.add_argument("--duration", type=float, default=None,
                     help="simulated seconds of arrivals, the phases splitting them by share (e.g. 86400 "
                     "for the diurnal preset's day); without --requests, every arrival in them")
    add_setting_flag(sim, "policy")        # the daemon's policy and knobs unless told
    add_knob_flags(sim)
    add_cost_model_arguments(sim)
    add_setting_flag(sim, "state_dir")
    sim.add_argument("--seed", type=int, default=0)
    add_what_if_slo_flags(sim)
    add_report_parser(sub)
    add_tune_parsers(sub)
    prof = sub.add_parser("profiles", help="list the hardware profiles (GPU + model step-time models) the "
                          "simulator can use, with the result of their checks against published figures")
    prof.add_argument("--checks", action="store_true", help="also print every check: predicted vs published")


def add_cost_model_arguments(p: argparse.ArgumentParser) -> None:
    """--cost-model FILE or --profile NAME: how the simulator prices steps."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cost-model", default=None, help="cost model file (default: the state dir's, else shipped)")
    group.add_argument("--profile", default=None, metavar="NAME",
                       help="a hardware profile instead of a calibration (see `autotuned-serve profiles`)")


def add_rate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--qps", type=float, default=None, help="base request rate in req/s (default: --load)")
    p.add_argument("--load", type=float, default=None,
                   help="base rate as a share of the modelled machine's simulated capacity under the SLO "
                   "(deadline policy, default knobs); default 0.8 unless --qps is given")


def add_what_if_slo_flags(p: argparse.ArgumentParser) -> None:
    """--slo-ttft-s and --slo-tbt-s for a what-if, None unless given (`what_if_slo` picks the class)."""
    for target in SLO_FLAGS:
        p.add_argument(f"--slo-{target.replace('_', '-')}", dest=f"slo_{target}", type=float, default=None,
                       help=f"the SLO's {target} bound (default: the default SLO class's, or the first shipped "
                       "class, strictest first, whose targets the workload meets at some rate)")


def what_if_slo(args: argparse.Namespace, workload, cost):
    """(SLO, base rate) of a what-if. Given --slo-* flags or --qps, the SLO is the default class's with the
    flags applied; otherwise the first shipped SLO class, strictest TTFT first, at which the modelled
    machine meets the workload at some rate (long prompts on a CPU meet the batch class, not the
    interactive one), said on stderr when it is not the default class."""
    from engine.slo_class import SloClass, shipped_slo_classes
    from simulation.relative_load import NoRateMeetsSlo

    classes = shipped_slo_classes()
    default = classes.get(None)
    if args.qps is not None or args.slo_ttft_s is not None or args.slo_tbt_s is not None:
        slo = SloClass(ttft_s=default.ttft_s if args.slo_ttft_s is None else args.slo_ttft_s,
                       tbt_s=default.tbt_s if args.slo_tbt_s is None else args.slo_tbt_s)
        return slo, resolve_rate(args, workload, cost, slo)
    candidates = [default, *sorted((c for c in classes.classes.values() if c != default), key=lambda c: c.ttft_s)]
    for slo in candidates:
        try:
            rate = resolve_rate(args, workload, cost, slo)
        except NoRateMeetsSlo:
            print(f"the {slo.name!r} SLO class (TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s:g} s) is met at no rate "
                  "probed; trying the next", file=sys.stderr)
            continue
        if slo != default:
            print(f"judged at the {slo.name!r} SLO class (TTFT {slo.ttft_s:g} s, TBT {slo.tbt_s:g} s); "
                  "--slo-ttft-s/--slo-tbt-s or --qps choose otherwise", file=sys.stderr)
        return slo, rate
    raise ValueError(f"the modelled machine meets no shipped SLO class on {workload.name!r} at any rate probed; "
                     "give --qps, or looser --slo-ttft-s/--slo-tbt-s")


def resolve_rate(args: argparse.Namespace, workload, cost, slo):
    from simulation.relative_load import base_rate

    rate = base_rate(workload, cost, slo, args.qps, args.load, args.seed)
    if rate.load is not None:
        print(f"base rate {rate.qps:.4g} req/s: {rate.load:g} of the simulated capacity "
              f"{rate.capacity_qps:.4g} req/s on {workload.name}", file=sys.stderr)
    return rate


def slo_fields(slo) -> dict:
    return {"slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s}}


def rate_fields(rate) -> dict:
    return {"qps": round(rate.qps, 6), "load": rate.load,
            "simulated_capacity_qps": None if rate.capacity_qps is None else round(rate.capacity_qps, 6)}


def add_tune_parsers(sub: argparse._SubParsersAction) -> None:
    tune = sub.add_parser("tune", help="run the online tuner against the simulator (what-if analysis) and "
                          "compare it with static configurations")
    tune.add_argument("--simulate", action="store_true", required=True,
                      help="required: the live daemon tunes itself (see `autotuned-serve tuner`)")
    tune.add_argument("--workload", default="shift", help="a preset in configs/workloads.yaml or a YAML file "
                      "(default shift: chat -> summarization -> chat)")
    tune.add_argument("--duration", type=float, default=3600.0, help="simulated seconds of arrivals (default 3600)")
    add_rate_arguments(tune)
    add_cost_model_arguments(tune)
    add_setting_flag(tune, "state_dir")
    tune.add_argument("--seed", type=int, default=0)
    add_what_if_slo_flags(tune)
    tune.add_argument("--no-ablation", action="store_true",
                      help="skip the plain-budget grid (best_static_plain_budget): 21 fewer runs of the workload")
    tune.add_argument("--no-speculation", action="store_true",
                      help="simulate without a drafter (default: prompt lookup, drafts faring as "
                      "configs/speculation.yaml measured for the workload)")

    ctl = sub.add_parser("tuner", help="pause, resume or pin a running daemon's tuner, or show its status")
    ctl.add_argument("action", choices=["status", "pause", "resume", "pin"])
    ctl.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="for pin (repeatable)")
    ctl.add_argument("--url", default=DAEMON_URL, help="the daemon (default %(default)s)")
    ctl.add_argument("--api-key", default=None, help="admin key (default: AUTOTUNED_SERVE_API_KEY)")


def run_calibrate(args: argparse.Namespace) -> None:
    import torch

    from simulation.calibrate import calibrate, default_cost_model_path
    from engine import EngineConfig, LLMEngine

    if args.points < 10 or args.repeats < 1 or not 0 <= args.holdout < 0.9:
        raise ValueError("--points must be >= 10, --repeats >= 1 and --holdout in [0, 0.9)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available on this machine")
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, weights=args.weights, device=args.device,
                                    kv_cache_memory_mb=args.kv_cache_memory_mb))
    model = calibrate(engine, args.points, args.repeats, args.holdout)
    path = model.save(args.out or default_cost_model_path(args.state_dir, model.model, model.dtype, model.device,
                                                          model.weights))
    print(json.dumps({"path": str(path), "weights": model.weights, "kernel_max_rows": model.kernel_max_rows,
                      "coefficients": model.coefficients, "kernel_coefficients": model.kernel_coefficients,
                      "fit_mape": model.fit_mape,
                      "holdout_mape": model.holdout_mape, "num_samples": model.num_samples}, indent=2))


def run_simulate(args: argparse.Namespace) -> None:
    import time

    from simulation.cost_model_files import resolve_cost_model

    from simulation.speculation_model import workload_speculation
    from simulation.workload_run import simulate
    from loadgen.workload import generate, load_workload
    from policies import Knobs, get_policy
    if args.requests is not None and args.requests < 1:
        raise ValueError("--requests must be >= 1")
    if args.duration is not None and not args.duration > 0:
        raise ValueError("--duration must be > 0")
    get_policy(args.policy)
    knobs = Knobs().replace(**knob_overrides(args))
    cost = resolve_cost_model(args.cost_model, args.profile, args.state_dir)
    workload = load_workload(args.workload)
    slo, rate = what_if_slo(args, workload, cost)
    requests = args.requests if args.requests is not None or args.duration is not None else 1000
    specs = generate(workload, qps=rate.qps, num_requests=requests, duration_s=args.duration, seed=args.seed)
    if not specs:
        raise ValueError("the workload produced no requests; raise --duration or --qps")
    start = time.perf_counter()
    run = simulate(specs, cost, args.policy, knobs, slo, speculation=workload_speculation(workload.name))
    result = {"workload": args.workload, **slo_fields(slo), **rate_fields(rate), "policy": args.policy,
              "cost_model": cost_model_label(cost, args.profile),
              "knobs": {k: v for k, v in knobs.as_dict().items() if k != "version"}, **run.summary.as_dict(),
              "num_steps": run.num_steps, "num_rejected": run.num_rejected,
              "wall_s": round(time.perf_counter() - start, 3)}
    print(json.dumps(result, indent=2))


def run_tune(args: argparse.Namespace) -> None:
    import time

    from autotuner.controller import ControllerSettings
    from autotuner.simulated_tuning import compare
    from simulation.cost_model_files import resolve_cost_model
    from simulation.speculation_model import workload_speculation
    from loadgen.workload import generate, load_workload

    if not args.duration > 0:
        raise ValueError("--duration must be > 0")
    cost = resolve_cost_model(args.cost_model, args.profile, args.state_dir)
    workload = load_workload(args.workload)
    slo, rate = what_if_slo(args, workload, cost)
    specs = generate(workload, qps=rate.qps, duration_s=args.duration, seed=args.seed)
    if not specs:
        raise ValueError("the workload produced no requests; raise --duration or --qps")
    start = time.perf_counter()
    speculation = None if args.no_speculation else workload_speculation(workload.name)
    result = compare(specs, cost, args.state_dir, slo, ControllerSettings.load(), args.seed,
                     ablation=not args.no_ablation, speculation=speculation)
    print(json.dumps({"workload": args.workload, **slo_fields(slo), **rate_fields(rate), "cost_model": cost_model_label(cost, args.profile),
                      **result,
                      "wall_s": round(time.perf_counter() - start, 1)}, indent=2, default=str))


def cost_model_label(cost, profile: str | None) -> str:
    """What priced the simulated steps, for the JSON summaries."""
    return f"profile {profile}" if profile else f"{cost.model} {cost.dtype} {cost.device}"


def run_profiles(args: argparse.Namespace) -> None:
    """One line per profile: name, hardware, model, checks; with --checks every check under it."""
    from simulation.hardware_profile import load_profile, profile_names
    from simulation.profile_checks import run_checks

    for name in profile_names():
        profile = load_profile(name)
        results = run_checks(profile)
        passed = sum(r.ok for r in results)
        held_out = sum(r.check.role == "held-out" for r in results)
        verdict = "ok" if passed == len(results) else "FAILED"
        hardware = f"{profile.hardware.name} x{profile.tp}"
        model = f"{profile.model.name} {profile.model.dtype} TP{profile.tp}"
        print(f"{name:<24} {hardware:<18} {model:<26} kv {profile.kv_blocks() * profile.block_size:>9,} tokens  "
              f"checks {verdict} {passed}/{len(results)} ({held_out} held-out)")
        if args.checks:
            for result in results:
                print(f"    {result.line()}")


def run_tuner_control(args: argparse.Namespace) -> None:
    import os

    import httpx

    key = args.api_key or os.environ.get("AUTOTUNED_SERVE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{args.url.rstrip('/')}/admin/tuning"
    try:
        if args.action == "status":
            response = httpx.get(url, headers=headers, timeout=10)
        else:
            body = {"knobs": parse_knobs(args.knob)} if args.action == "pin" else {}
            response = httpx.post(f"{url}/{args.action}", json=body, headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach the daemon at {args.url}: {e}") from None
    if response.status_code != 200:
        raise ValueError(f"the daemon answered {response.status_code}: {response.text.strip()[:300]}")
    print(json.dumps(response.json(), indent=2))


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="write the tuning report (per regime: trials, chosen knobs, before/after)")
    rep.add_argument("--format", default="html", choices=["html", "json", "csv"], help="default html")
    rep.add_argument("--out", required=True, help="output file; - writes json or csv to stdout")
    add_setting_flag(rep, "state_dir")


def run_report(args: argparse.Namespace) -> None:
    import os

    from serving.report import build_report
    from serving.report_render import RENDERERS

    if args.out == "-" and args.format == "html":
        raise ValueError("--out - writes json or csv; give a file path for the html report")
    report = build_report(args.state_dir)
    text = RENDERERS[args.format](report)
    if args.out == "-":
        sys.stdout.write(text)
        return
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(json.dumps({"path": args.out, "format": args.format, "regimes": len(report.regimes),
                      "trials": sum(r.counts.total for r in report.regimes), "decisions": len(report.timeline)}))


COMMANDS = {"calibrate": run_calibrate, "simulate": run_simulate, "tune": run_tune, "tuner": run_tuner_control,
            "report": run_report, "profiles": run_profiles}


def run(args: argparse.Namespace) -> bool:
    """Run the subcommand if it is one of this module's; False if not."""
    command = COMMANDS.get(args.command)
    if command is None:
        return False
    command(args)
    sys.stdout.flush()
    return True
