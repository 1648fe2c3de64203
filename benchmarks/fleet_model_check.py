"""How far the queue model of a replica (cluster/queue_replica.py) agrees with the step-level
simulator (the real scheduler) on fleet days: the same compressed day and the same fleets (static
fleets, Ray Serve's default policy, the SLO planner with a given configuration) run on both replica
models in one run; per fleet, the share of requests within their SLO class, the mean replica count
and the goodput per replica-hour, and the planner's ratio over the smallest static fleet that keeps
the SLO target in each model. The day and the planner's configuration are read from a fleet_day.py
results file (its settings and its tuned planner).

    nice -n 19 .venv/bin/python benchmarks/fleet_model_check.py --from docs/results/fleet_day_720s_chat.json \\
        --static 7 8 9 --json docs/results/fleet_model_check_chat.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import results_file  # noqa: E402
from fleet_day import REGIMES, prepare_day, ray_default_run  # noqa: E402
from cluster.fleet_scalers import PlannerScaler, StaticScaler  # noqa: E402
from cluster.planner import Planner  # noqa: E402
from cluster.planner_config import PlannerConfig  # noqa: E402
from loadgen.workload import parse_workload  # noqa: E402
from simulation.profile_cost_model import ProfileCostModel  # noqa: E402

MODELS = ("engine", "queue")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", required=True, help="a fleet_day.py results file: its day and planner")
    p.add_argument("--static", type=int, nargs="+", required=True, help="static fleet sizes to run")
    p.add_argument("--json", default=None)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    source = results_file.read(args.source)
    s = source["settings"]
    cost = ProfileCostModel.named(s["profile"])
    out = {"source": args.source, "settings": s, "regimes": {}}
    for name, recorded in source["regimes"].items():
        out["regimes"][name] = check_regime(name, s, recorded, cost, args.static)
        print(json.dumps({name: out["regimes"][name]}, indent=1), flush=True)
    if args.json:
        results_file.write(args.json, out, indent=1)


def check_regime(name: str, s: dict, recorded: dict, cost, static_sizes: list[int]) -> dict:
    """The results file's day and fleets on each replica model (fleet_day.prepare_day builds the
    same day, profile and requests for both)."""
    workload = parse_workload(name, REGIMES[name])
    planner_config = PlannerConfig(**recorded["planner_config"])
    rows: dict[str, dict] = {}
    for model in MODELS:
        settings = SimpleNamespace(**{**s, "replica_model": model})
        d = prepare_day(settings, cost, workload)
        fleets = {f"static {n}": lambda n=n: d.simulate(StaticScaler(n), warm=None) for n in static_sizes}
        fleets |= {f"Ray default, target {t:g}": lambda t=t: ray_default_run(d, settings, t) for t in s["ray_targets"]}
        fleets["SLO planner (the results file's tuned configuration)"] = \
            lambda: d.simulate(PlannerScaler(Planner(planner_config, d.capacity), d.initial))
        for label, run in fleets.items():
            started = time.time()
            rows.setdefault(label, {})[model] = run().summary() | {"wall_s": time.time() - started}
    return {"requests": len(d.specs), "fleets": rows, "planner_over_static": planner_ratios(rows, s["slo_target"])}


def planner_ratios(rows: dict, slo_target: float) -> dict:
    """Per replica model: the planner's goodput per replica-hour over the smallest static fleet run
    that kept the SLO target (None if none did)."""
    planner = next(v for k, v in rows.items() if k.startswith("SLO planner"))
    out = {}
    for model in MODELS:
        kept = [v[model] for k, v in rows.items() if k.startswith("static") and v[model]["attainment"] >= slo_target]
        smallest = min(kept, key=lambda r: r["mean_replicas"], default=None)
        out[model] = planner[model]["goodput_per_replica_hour"] / smallest["goodput_per_replica_hour"] \
            if smallest else None
    return out


def render_doc(sources: list[Path]) -> str:
    """docs/cluster.md's table of the two replica models side by side."""
    lines = ["| regime | fleet | within SLO: engine / queue | mean replicas: engine / queue |",
             "|---|---|---|---|"]
    notes = []
    for source in sources:
        run = json.loads(Path(source).read_text())
        for name, r in run["regimes"].items():
            for label, pair in r["fleets"].items():
                e, q = pair["engine"], pair["queue"]
                lines.append(f"| {name} | {label} | {e['attainment']:.1%} / {q['attainment']:.1%} | "
                             f"{e['mean_replicas']:.2f} / {q['mean_replicas']:.2f} |")
            ratio = r["planner_over_static"]
            walls = {m: sum(p[m]["wall_s"] for p in r["fleets"].values()) for m in MODELS}
            notes.append(f"- {name} ({r['requests']:,} requests): the planner over the smallest static fleet that kept "
                         f"{run['settings']['slo_target']:.0%}: engine {_ratio(ratio['engine'])}, queue "
                         f"{_ratio(ratio['queue'])}; wall time of all these days: engine {walls['engine']:,.0f} s, "
                         f"queue {walls['queue']:,.0f} s.")
    return "\n".join(lines + [""] + notes)


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "no static fleet kept it"


if __name__ == "__main__":
    main()
