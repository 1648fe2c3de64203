"""A simulated day of an H100 + Llama-3.1-8B fleet behind the cluster's router: goodput per
replica-hour of the SLO planner (its parameters tuned by Optuna) against the smallest static fleet
that keeps the SLO target and Ray Serve's default autoscaler (target ongoing requests per replica,
tuned to its best on the same day), each at >= 99% of requests within their SLO class
(docs/cluster.md, "Sizing the fleet"). By default the planner is tuned on the measured day too,
as the baseline is; --tuning-seed tunes it on another day.

    nice -n 19 .venv/bin/python benchmarks/fleet_day.py --json docs/results/fleet_day.json \
        --plot docs/results/fleet_day.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import results_file  # noqa: E402
from bench_common import MachineInfo  # noqa: E402
from cluster.capacity_profile import profile_replica  # noqa: E402
from cluster.fleet_run import DayResult, run_day  # noqa: E402
from cluster.fleet_scalers import PlannerScaler, StaticScaler  # noqa: E402
from cluster.planner import Planner  # noqa: E402
from cluster.planner_config import PlannerConfig  # noqa: E402
from cluster.planner_tuning import tune_planner  # noqa: E402
from cluster.ray_default_scaler import RayDefaultConfig, RayDefaultScaler  # noqa: E402
from loadgen.fleet_traffic import DiurnalShape, RateCurve, day_requests  # noqa: E402
from loadgen.workload import Workload, load_workload, parse_workload  # noqa: E402
from policies import Knobs  # noqa: E402
from simulation.profile_cost_model import ProfileCostModel  # noqa: E402
from cluster.queue_replica import QueueReplica, fit_queue_model  # noqa: E402
from simulation.workload_run import make_simulator  # noqa: E402

SHAREGPT4 = {"kind": "lognormal", "prompt": {"mean": 2666, "sigma": 0.93, "min": 16, "max": 7168},
             "output": {"mean": 481, "sigma": 0.545, "min": 8, "max": 1024}}
ARXIV = {"kind": "lognormal", "prompt": {"mean": 2808, "sigma": 0.238, "min": 256, "max": 3840},
         "output": {"mean": 203, "sigma": 0.625, "min": 8, "max": 1024}}
# GPU-scale regimes: chat is ShareGPT4 conversations (the project's GPU chat workload, configs/
# workloads.yaml `sharegpt4`); mixed-classes is that chat (interactive class) with arXiv
# summarization arriving at a tenth of its rate (batch class), as `mixed-classes` mixes them on the CPU.
REGIMES = {
    "chat": {"phases": [{"name": "chat", "arrival": "poisson", "lengths": SHAREGPT4, "slo_class": "interactive"}]},
    "mixed-classes": {"phases": [{"name": "mixed", "streams": [
        {"name": "chat", "rate": 1.0, "lengths": SHAREGPT4, "slo_class": "interactive"},
        {"name": "summarization", "rate": 0.1, "lengths": ARXIV, "slo_class": "batch"}]}]},
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="h100-llama3.1-8b")
    p.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    p.add_argument("--day-s", type=float, default=720.0, help="the simulated day's length (86400: a real day)")
    p.add_argument("--peak-replicas", type=float, default=4.0, help="the sinusoid's peak, in replicas at capacity")
    p.add_argument("--startup-s", type=float, default=30.0, help="a new replica's model load")
    p.add_argument("--bursts", type=float, default=2.0, help="bursts per day (3-5x)")
    p.add_argument("--burst-s", type=float, nargs=2, default=[5.0, 15.0], help="burst length range")
    p.add_argument("--noise-period-s", type=float, default=20.0)
    p.add_argument("--trials", type=int, default=5, help="Optuna trials of the planner per regime")
    p.add_argument("--planner-try", metavar="RESULTS", default=None,
                   help="a results file whose regimes' tuned planner configurations are tried right after the defaults")
    p.add_argument("--ray-targets", type=float, nargs="+", default=[8, 16, 32])
    p.add_argument("--ray-downscale-delay-s", type=float, default=60.0)
    p.add_argument("--max-replicas", type=int, default=16)
    p.add_argument("--slo-target", type=float, default=0.99)
    p.add_argument("--seed", type=int, default=1, help="the measured day")
    p.add_argument("--tuning-seed", type=int, default=None, help="tune the planner on another day (default: "
                   "on the measured day, as the Ray baseline's target is tuned)")
    p.add_argument("--replica-model", choices=["engine", "queue"], default="engine",
                   help="engine: each replica the step-level simulator (the real scheduler); queue: a queue of work "
                        "fitted to the same profile (cluster/queue_replica.py), ~100x faster, for days of real length")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--add-ray-targets", nargs=2, metavar=("RESULTS", "TARGETS"), default=None,
                   help="only run Ray's default policy at more targets (comma-separated) on an existing results "
                        "file's days and add them to it, then exit (with --plot: plot it)")
    p.add_argument("--compact", metavar="RESULTS", default=None,
                   help="only rewrite an existing results file as this script now stores one (compact()), then exit "
                        "(with --plot: plot it)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.add_ray_targets or args.compact:
        if args.add_ray_targets:
            path, targets = args.add_ray_targets
            add_ray_targets(path, [float(t) for t in targets.split(",")])
        else:
            path, stored = args.compact, results_file.read(args.compact)
            stored["regimes"] = {name: compact(r) for name, r in stored["regimes"].items()}
            rewrite(path, stored)
        if args.plot:
            plot(results_file.read(path), args.plot)
        return
    started = time.time()
    cost = ProfileCostModel.named(args.profile)
    results = {"command": " ".join(["python", *sys.argv]), "machine": MachineInfo.collect().as_dict(),
               "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
               "settings": vars(args), "regimes": {}}
    for name in args.regimes:
        results["regimes"][name] = compact(regime(args, cost, parse_workload(name, REGIMES[name])))
        print(json.dumps({name: {k: v for k, v in results["regimes"][name].items() if k != "timeline"}}, indent=1),
              flush=True)
    results["wall_s"] = time.time() - started
    if args.json:
        results_file.write(args.json, results, indent=1)     # + meta: machine, commit, date, command
    if args.plot:
        plot(results, args.plot)


def prepare_day(s, cost, workload: Workload) -> SimpleNamespace:
    """One replica's profile, the drawn day and its requests, and `simulate(scaler)` of a fleet on it
    (`s`: the parsed arguments, or a results file's settings)."""
    capacity = profile_replica(workload, cost, slo_target=s.slo_target)
    shape = DiurnalShape(peak_rps=s.peak_replicas * capacity.rate_rps, day_s=s.day_s,
                         noise_period_s=s.noise_period_s, bursts_per_day=s.bursts, burst_length_s=tuple(s.burst_s))
    day = RateCurve.draw(shape, s.seed)
    specs = day_requests(workload, day, s.seed)
    make, queue_model = replica_factory(s.replica_model, cost, capacity, workload, s.slo_target)
    initial = max(1, math.ceil(day.rate(0.0) / capacity.rate_rps))

    def simulate(scaler, day_specs=specs, warm: int | None = initial) -> DayResult:
        return run_day(day_specs, make, scaler, s.startup_s, s.day_s, initial_replicas=warm)
    return SimpleNamespace(capacity=capacity, shape=shape, day=day, specs=specs, queue_model=queue_model,
                           initial=initial, simulate=simulate)


def ray_default_run(d: SimpleNamespace, s, target: float) -> DayResult:
    config = RayDefaultConfig(target, 1, s.max_replicas, downscale_delay_s=s.ray_downscale_delay_s)
    return d.simulate(RayDefaultScaler(config, d.initial))


def regime(args, cost, workload: Workload) -> dict:
    d = prepare_day(args, cost, workload)
    capacity, shape, day, specs, initial = d.capacity, d.shape, d.day, d.specs, d.initial
    tuning_seed = args.seed if args.tuning_seed is None else args.tuning_seed
    tuning_specs = specs if tuning_seed == args.seed else day_requests(workload, RateCurve.draw(shape, tuning_seed),
                                                                        tuning_seed)
    base = PlannerConfig(max_replicas=args.max_replicas, startup_s=args.startup_s, slo_target=args.slo_target)
    tried = [PlannerConfig(**r["planner_config"]) for r in results_file.read(args.planner_try)["regimes"].values()] \
        if args.planner_try else []
    tuned = tune_planner(lambda c: d.simulate(PlannerScaler(Planner(c, capacity), initial), tuning_specs),
                         base, args.trials, seed=args.seed, also_try=tried)
    planner_scaler = PlannerScaler(Planner(tuned.config, capacity), initial)
    planner = d.simulate(planner_scaler)
    ray_runs = {target: ray_default_run(d, args, target) for target in args.ray_targets}
    static = static_for_peak(lambda n: d.simulate(StaticScaler(n), warm=None),
                             math.ceil(shape.peak_rps / capacity.rate_rps),
                             math.ceil(day.max_rate() / capacity.rate_rps), args.slo_target)
    ray_best = best(ray_runs, args.slo_target)
    return {
        "replica_model": args.replica_model,
        "queue_decode_share": d.queue_model.decode_share if d.queue_model else None,
        "capacity": dataclasses.asdict(capacity), "requests": len(specs), "bursts": [dataclasses.asdict(b) for b in day.bursts],
        "planner_config": dataclasses.asdict(tuned.config), "tuning_trials": tuned.trials,
        "planner": planner.summary(), "static": {str(n): r.summary() for n, r in static.items()},
        "ray_default": {str(t): r.summary() for t, r in ray_runs.items()}, "ray_default_best_target": ray_best,
        "ratios": ratios(planner, static, ray_runs, ray_best, args.slo_target),
        "timeline": {"planner": [dataclasses.asdict(p) for p in planner.timeline],
                     "ray_default": [dataclasses.asdict(p) for p in ray_runs[ray_best].timeline] if ray_best else [],
                     "rate_curve": [[t, day.rate(t)] for t in range(0, int(args.day_s), 5)]},
        "plan": [{"t": t, **dataclasses.asdict(decision)} for t, decision in planner_scaler.decisions],
    }


def add_ray_targets(path: str, targets: list[float]) -> None:
    """More of Ray's targets on a results file's days (the same settings, so the same requests): added
    to its Ray runs, its best target and the planner's ratio over it recomputed, the run recorded
    under "added" (machine, commit, date, command)."""
    stored = results_file.read(path)
    s = SimpleNamespace(**{"replica_model": "engine", **stored["settings"]})
    cost = ProfileCostModel.named(s.profile)
    for name, r in stored["regimes"].items():
        d = prepare_day(s, cost, parse_workload(name, REGIMES[name]))
        runs = {float(t): ray_default_run(d, s, t) for t in targets}
        r["ray_default"] |= {str(t): run.summary() for t, run in runs.items()}
        summaries = {float(t): SimpleNamespace(**v) for t, v in r["ray_default"].items()}
        ray_best = best(summaries, s.slo_target)
        if ray_best in runs:
            r["timeline"]["ray_default"] = [dataclasses.asdict(p) for p in runs[ray_best].timeline]
            r["timeline"] = compact(r)["timeline"]
        r["ray_default_best_target"] = ray_best
        static = {int(n): SimpleNamespace(**v) for n, v in r["static"].items()}
        r["ratios"] = ratios(SimpleNamespace(**r["planner"]), static, summaries, ray_best, s.slo_target)
        r.setdefault("added", []).append({"ray_targets": targets, **results_file.meta()})
    rewrite(path, stored)


def rewrite(path: str, stored: dict) -> None:
    """A results file rewritten in place, its meta kept as it was (results_file.write would add a new one)."""
    Path(path).write_text(json.dumps(stored, indent=1, default=str) + "\n")


MAX_POINTS = 1000        # a stored timeline: a day of real length (8,640 10-s points) is pooled to this many


def compact(r: dict) -> dict:
    """A regime's results as stored: the exact-following bound computed on the full 5-s rate curve,
    then each timeline max-pooled to at most MAX_POINTS (a window keeps its point with the most
    replicas, or the highest rate, so the plot's peaks and "at most N at once" survive), and the
    plan reduced to the decisions that changed the fleet. A compressed day is left as it is but for
    the plan."""
    r = dict(r)
    timeline = r["timeline"]
    if "following_mean_replicas" not in r and timeline["rate_curve"]:
        r["following_mean_replicas"] = following(r)
    r["timeline"] = {"planner": _pooled(timeline["planner"], lambda p: p["serving"] + p["starting"]),
                     "ray_default": _pooled(timeline["ray_default"], lambda p: p["serving"] + p["starting"]),
                     "rate_curve": _pooled(timeline["rate_curve"], lambda p: p[1])}
    r["plan"] = [_rounded(d) for d in r["plan"] if d["reason"] != "hold"]
    r["timeline"] = {k: [_rounded(p) for p in v] for k, v in r["timeline"].items()}
    return r


def _rounded(value):
    """Floats to 4 decimals (a plan's and a timeline's: seconds, rates and factors), through dicts and lists."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _pooled(points: list, key) -> list:
    size = math.ceil(len(points) / MAX_POINTS)
    if size <= 1:
        return points
    return [max(points[i:i + size], key=key) for i in range(0, len(points), size)]


def replica_factory(kind: str, cost, capacity, workload: Workload, slo_target: float):
    """(a new replica, the fitted queue model or None): the step-level simulator of the deadline policy
    on the profile, or the queue model fitted to that replica's capacity profile."""
    if kind == "queue":
        model = fit_queue_model(capacity, workload, slo_target)
        return (lambda: QueueReplica(model)), model
    return (lambda: make_simulator(cost, "deadline", Knobs())), None


def static_for_peak(run, peak: int, high: int, slo_target: float) -> dict[int, DayResult]:
    """The smallest static fleet that keeps the SLO target (attainment grows with the fleet),
    searched from the sinusoid's peak in replicas, where the runs are cheap: down one at a time while
    it keeps the target; else up in steps of 1, 2, 4, ... to the highest burst's count, then
    bisection (a day of real length on 50 replicas takes ten minutes of wall time)."""
    runs: dict[int, DayResult] = {}

    def keeps(n: int) -> bool:
        if n not in runs:
            runs[n] = run(n)
        return runs[n].attainment >= slo_target

    n, step = max(peak, 1), 1
    if keeps(n):
        while n > 1 and keeps(n - 1):
            n -= 1
        return runs
    short = n
    while not keeps(n):
        if n >= high:
            return runs
        short, n, step = n, min(n + step, high), step * 2
    while n - short > 1:
        mid = (short + n) // 2
        short, n = (short, mid) if keeps(mid) else (mid, n)
    return runs


def best(runs: dict, slo_target: float):
    feasible = {k: r for k, r in runs.items() if r.attainment >= slo_target}
    pool = feasible or runs
    key = (lambda k: pool[k].goodput_per_replica_hour) if feasible else (lambda k: pool[k].attainment)
    return max(pool, key=key) if pool else None


def ratios(planner: DayResult, static: dict, ray_runs: dict, ray_best, slo_target: float) -> dict:
    static_best = best(static, slo_target)
    out = {"planner_meets_slo": planner.attainment >= slo_target}
    if static_best is not None:
        s = static[static_best]
        out |= {"static_replicas": static_best, "static_meets_slo": s.attainment >= slo_target,
                "vs_static": planner.goodput_per_replica_hour / s.goodput_per_replica_hour}
    if ray_best is not None:
        r = ray_runs[ray_best]
        out |= {"ray_meets_slo": r.attainment >= slo_target,
                "vs_ray_default": planner.goodput_per_replica_hour / r.goodput_per_replica_hour}
    return out


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = results["regimes"]
    fig, axes = plt.subplots(len(regimes), 1, figsize=(10, 3.6 * len(regimes)), squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], regimes.items()):
        per_replica = r["capacity"]["rate_rps"]
        curve = r["timeline"]["rate_curve"]
        ax.plot([t for t, _ in curve], [v / per_replica for _, v in curve], color="0.6", lw=0.8,
                label="arrival rate / one replica's capacity")
        for key, color in (("planner", "C0"), ("ray_default", "C3")):
            points = r["timeline"][key]
            ax.step([p["t"] for p in points], [p["serving"] + p["starting"] for p in points], where="post",
                    color=color, label=f"{key.replace('_', ' ')} replicas")
        static_n = r["ratios"].get("static_replicas")
        if static_n:
            ax.axhline(static_n, color="C2", ls="--", label=f"static for the peak ({static_n})")
        ax.set_title(f"{name}: H100 + Llama-3.1-8B replicas against load (day of {results['settings']['day_s']:.0f} s)")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("replicas")
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# the planner's design targets for goodput per replica-hour (docs/cluster.md, "The SLO planner")
TARGET_VS_STATIC, TARGET_VS_RAY = 1.5, 1.2


def render_doc(sources: list[Path]) -> str:
    """docs/cluster.md's fleet-day table of one or more results files (benchmarks/render_docs.py): each
    regime's day, then the planner, the smallest static fleet that kept the SLO target and every Ray
    target, then what the planner's tuning found."""
    runs = [json.loads(Path(s).read_text()) for s in sources]
    lines = []
    for run in runs:
        for name, r in run["regimes"].items():
            lines.append(_day_text(name, r, run))
    lines += ["", "| regime | fleet | within SLO | replica-hours (mean replicas) | goodput per replica-hour | "
              "planner over it |", "|---|---|---|---|---:|---|"]
    for run in runs:
        for name, r in run["regimes"].items():
            lines += _fleet_rows(name, r)
    lines.append("")
    for run in runs:
        for name, r in run["regimes"].items():
            lines.append(_tuning_text(name, r, run))
    return "\n".join(lines)


def _day_text(name: str, r: dict, run: dict) -> str:
    s, cap = run["settings"], r["capacity"]["rate_rps"]
    peak = max(v for _, v in r["timeline"]["rate_curve"]) / cap
    bursts = "; ".join(f"{b['factor']:.1f}x for {b['length_s']:.0f} s at t={b['start_s']:.0f} s" for b in r["bursts"])
    model = ("each replica the queue model fitted to that profile (decode share "
             f"{r['queue_decode_share']:.2f})" if r.get("replica_model") == "queue" else
             "each replica the step-level simulator")
    return (f"- **{name}** ({model}): one replica's profiled capacity at {s['slo_target']:.0%} within SLO "
            f"{cap:.3g} requests/s; a {s['day_s']:.0f}-s day of {r['requests']:,} requests, sinusoid peak at "
            f"{s['peak_replicas']:g} replicas' capacity (highest rate, sampled every 5 s: {peak:.2f}), bursts "
            f"{bursts or 'none'}; "
            f"replicas load for {s['startup_s']:.0f} s; {run['wall_s']:,.0f} s of wall time.{_ceiling_text(r)}")


def following(r: dict) -> float:
    """Mean replicas of a fleet that follows the rate exactly: max(1, ceil(rate / one replica's
    capacity)) at every 5-s sample of the rate curve, no start-up, no headroom, no SLO misses
    counted: a bound on what sizing at one replica's profiled capacity can save (a fleet that runs
    its replicas past it, pooling their queues behind the router, can save more). Stored by
    compact() before the curve is pooled."""
    if "following_mean_replicas" in r:
        return r["following_mean_replicas"]
    cap, curve = r["capacity"]["rate_rps"], r["timeline"]["rate_curve"]
    return sum(max(1, math.ceil(v / cap - 1e-9)) for _, v in curve) / len(curve)


def _ceiling_text(r: dict) -> str:
    n = r["ratios"].get("static_replicas")
    if not n or not r["timeline"]["rate_curve"]:
        return ""
    mean = following(r)
    return (f" A fleet following the rate exactly (ceil(rate / capacity) replicas at every 5-s sample, no "
            f"start-up or headroom) would average {mean:.2f} replicas: at the static fleet's goodput, "
            f"{n / mean:.2f}x its goodput per replica-hour is the most sizing at one replica's capacity could show.")


def _fleet_rows(name: str, r: dict) -> list[str]:
    ratios, most = r["ratios"], lambda key: max(p["serving"] + p["starting"] for p in r["timeline"][key])
    rows = [_fleet_row(name, f"SLO planner (tuned; at most {most('planner')} at once)", r["planner"], "")]
    n = ratios.get("static_replicas")
    if n is not None:
        rows.append(_fleet_row(name, f"static for the peak: {n}", r["static"][str(n)],
                               _vs(ratios["vs_static"], TARGET_VS_STATIC, ratios["planner_meets_slo"])))
    best_target = r["ray_default_best_target"]
    for target, run in r["ray_default"].items():
        label = f"Ray default, target {float(target):g}"
        if best_target is not None and float(target) == float(best_target):
            label += f" (best; at most {most('ray_default')} at once)"
            ratio = _vs(ratios["vs_ray_default"], TARGET_VS_RAY, ratios["planner_meets_slo"]) if "vs_ray_default" in ratios else ""
        else:
            ratio = f"{r['planner']['goodput_per_replica_hour'] / run['goodput_per_replica_hour']:.2f}x"
        rows.append(_fleet_row(name, label, run, ratio))
    return rows


def _fleet_row(name: str, fleet: str, s: dict, ratio: str) -> str:
    classes = s.get("by_class", {})
    within = f"{s['attainment']:.1%}"
    if len(classes) > 1:
        within += " (" + ", ".join(f"{c} {v['attainment']:.1%}" for c, v in classes.items()) + ")"
    return (f"| {name} | {fleet} | {within} | {s['replica_hours']:.3f} ({s['mean_replicas']:.2f}) | "
            f"{s['goodput_per_replica_hour']:,.0f} | {ratio} |")


def _vs(ratio: float, target: float, planner_meets_slo: bool) -> str:
    if not planner_meets_slo:        # a ratio at a lower attainment is not the target's
        return f"{ratio:.2f}x, the planner below the SLO target (target {target:g}x)"
    return f"**{ratio:.2f}x** (target {target:g}x)"


def _tuning_text(name: str, r: dict, run: dict) -> str:
    trials, c = r["tuning_trials"], r["planner_config"]
    day = "the measured day" if trials and trials[0]["requests"] == r["requests"] else \
        f"another day ({trials[0]['requests']:,} requests)" if trials else "no day"
    best_kept = max((t["attainment"] for t in trials), default=float("nan"))
    drain = f", backlog drain {c['backlog_drain_s']:.0f} s" if "backlog_drain_s" in c else ""   # files written before the backlog term have none
    return (f"- {name}: {len(trials)} Optuna trials on {day}: the defaults (first trial) kept "
            f"{trials[0]['attainment']:.1%}, the most any trial kept {best_kept:.1%}; chosen: {c['forecaster']}, "
            f"interval {c['interval_s']:.0f} s, headroom {c['headroom']:.2f}, scale-down delay "
            f"{c['scale_down_delay_s']:.0f} s{drain}.")


if __name__ == "__main__":
    main()
