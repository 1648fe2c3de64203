"""Goodput past capacity, admission on and off side by side (docs/overload.md#overload).

The sustained capacity is measured first with admission off (`loadgen.capacity`, the same criteria as
`autotuned-serve capacity`); then open-loop Poisson arrivals at each multiple of it run for
`--duration-s`, once with admission off (`admission_slack` 0) and once on. Goodput counts requests
within their SLO per second of arrivals; a shed request (429) counts as a miss.

Simulated, on the CPU calibration and GPU hardware profiles (the admission rule runs in the
simulator as in the engine):

    python benchmarks/overload_sweep.py --simulate --targets cpu,h100-llama3.1-8b,a100-mistral-7b \
        --workloads chat,chat-long-prompts --out docs/results/overload_simulated/overload_sweep.json

Live, against a daemon this script starts (the bundled model unless --model):

    python benchmarks/overload_sweep.py --workloads chat --levels 1,1.5,2,4 --duration-s 300 \
        --out docs/results/overload_live_135m/overload_sweep.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from results_file import meta
from server_health import running
from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from loadgen.bench_client import BenchOptions, BenchRun, live_probe, make_prompts, run_bench
from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import generate, load_workload
from policies import Knobs
from simulation.cost_model_files import resolve_cost_model
from simulation.workload_run import make_simulator, simulated_probe
from telemetry.window import meets_slo

CPU_TARGET = "cpu"                    # the bundled model's CPU calibration (configs/cost_models/)
GPU_TBT_S = 0.1                       # the GPU profiles' TBT target (a CPU step alone is ~0.1 s)


@dataclass(frozen=True)
class LevelResult:
    level: float                      # multiple of the capacity
    rps: float
    admission: bool
    requests: int
    goodput_rps: float                # within SLO per second of arrivals; shed = missed
    shed: int
    admitted_within_slo: float | None # share of the admitted requests that met their SLO
    shed_answer_p99_s: float | None = None   # live: client-side time to a 429 refused on arrival (not the expired)
    shed_expired: int | None = None   # live: 429s `deadline_expired`, answered when the queued request's TTFT
                                      # deadline passed (its class's `late: shed` rule), not on arrival
    shed_without_retry_after: int = 0
    server_errors: int = 0            # live: answers other than 200 and 429, stream errors, and requests unfinished
                                      # --drain-s after the last arrival
    missed_ttft: int = 0              # admitted requests that missed: first token late (whatever their gaps)
    missed_tbt: int = 0               # first token in time, a P99 gap over the target
    missed_unfinished: int = 0        # never finished (an error, or still running at the end)


def judged(records: list[RequestRecord], slo: SloClass, duration_s: float, level: float, rps: float,
           admission: bool) -> LevelResult:
    shed = [r for r in records if r.finish_reason == "shed"]
    admitted = [r for r in records if r.finish_reason != "shed"]
    met = sum(meets_slo(r, slo) for r in admitted)
    causes = Counter(miss_cause(r, slo) for r in admitted if not meets_slo(r, slo))
    return LevelResult(level, rps, admission, len(records), met / duration_s, len(shed),
                       met / len(admitted) if admitted else None, missed_ttft=causes["ttft"],
                       missed_tbt=causes["tbt"], missed_unfinished=causes["unfinished"])


def miss_cause(r: RequestRecord, slo: SloClass) -> str:
    """Why an admitted request missed its SLO: it never finished, its first token was late, or a gap was."""
    if r.finish_reason not in ("stop", "length") or r.ttft_s is None:
        return "unfinished"
    return "ttft" if r.ttft_s > (r.slo_ttft_s if r.slo_ttft_s is not None else slo.ttft_s) else "tbt"


# -- simulated --
def simulated_level(cost, workload: str, rps: float, level: float, admission: bool, slo: SloClass,
                    duration_s: float, seed: int) -> LevelResult:
    specs = generate(load_workload(workload), qps=rps, duration_s=duration_s, seed=seed)
    sim = make_simulator(cost, "deadline", Knobs(admission_slack=1.0 if admission else 0.0), slo)
    records: list[RequestRecord] = []
    sim.finish_listeners.append(records.append)
    sim.submit(specs)
    sim.run()
    return judged(records, slo, duration_s, level, rps, admission)


def simulated_series(target: str, workload: str, levels: list[float], duration_s: float, seed: int
                     ) -> dict[str, Any]:
    cost = resolve_cost_model() if target == CPU_TARGET else resolve_cost_model(profile=target)
    slo = SloClass(ttft_s=2.0, tbt_s=0.25 if target == CPU_TARGET else GPU_TBT_S)
    probe = simulated_probe(load_workload(workload), cost, "deadline", Knobs(admission_slack=0.0), slo, 200, seed,
                            min_duration_s=120.0)
    capacity = search_capacity(probe, CapacityCriteria(slo.ttft_s, slo.tbt_s), start_qps=1.0, max_probes=12)
    rows = [simulated_level(cost, workload, level * capacity.capacity_qps, level, on, slo, duration_s, seed)
            for level in levels for on in (False, True)]
    return {"target": target, "workload": workload, "slo": asdict(slo), "capacity_rps": capacity.capacity_qps,
            "levels": [asdict(r) for r in rows]}


# -- live --
def live_series(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    source = PromptSource(load_prompt_tokenizer(args.model), args.seed)
    capacity, rows = args.capacity_rps, []
    with tempfile.TemporaryDirectory() as state:
        if capacity is None:
            with live_daemon(args, False, f"{state}/capacity") as options:
                probe = live_probe(load_workload(workload), source, options, slo, 40, args.seed, 120.0)
                capacity = search_capacity(probe, CapacityCriteria(slo.ttft_s, slo.tbt_s), start_qps=args.start_qps,
                                           max_probes=args.max_probes).capacity_qps
            print(f"{workload}: capacity {capacity:.3f} req/s", file=sys.stderr, flush=True)
        for level in args.levels:
            for on in (False, True):
                with live_daemon(args, on, f"{state}/{on}-{level}") as options:
                    specs = generate(load_workload(workload), qps=level * capacity, duration_s=args.duration_s,
                                     seed=args.seed)
                    run = run_bench(specs, make_prompts(specs, source, options.sends_text), options, slo)
                rows.append(live_level(run, slo, args.duration_s, level, level * capacity, on))
                print(json.dumps(asdict(rows[-1])), file=sys.stderr, flush=True)
    return {"target": args.model or "bundled", "workload": workload, "slo": asdict(slo), "capacity_rps": capacity,
            "levels": [asdict(r) for r in rows]}


@contextmanager
def live_daemon(args: argparse.Namespace, admission: bool, state_dir: str) -> Iterator[BenchOptions]:
    """The daemon, tuner off (the knobs stay as given), admission on or off."""
    cmd = [sys.executable, "-P", "-m", "serving.cli", "serve", "--host", "127.0.0.1", "--port", str(args.port),
           "--no-tune", "--state-dir", state_dir, "--knob", f"admission_slack={1.0 if admission else 0.0}",
           *args.daemon_args]
    url = f"http://127.0.0.1:{args.port}"
    with running(cmd, url + "/health", f"{state_dir}.log", "autotuned-serve"):
        yield BenchOptions(url, max_duration_s=args.duration_s + args.drain_s, progress=False)


def live_level(run: BenchRun, slo: SloClass, duration_s: float, level: float, rps: float,
               admission: bool) -> LevelResult:
    """A 429 is a shed request (a miss); one refused on arrival is answered at the client in `answered - sent`,
    one that expired in the queue at its TTFT deadline."""
    end = run.start + duration_s + 1e9
    records, shed_times, no_retry, errors, expired = [], [], 0, 0, 0
    for r in run.results:
        record = r.record(end)
        if r.status == 429:
            record = replace(record, finish_reason="shed", first_token=None, token_times=())
            if r.error_code == "deadline_expired":
                expired += 1
            else:
                shed_times.append(r.answered - r.sent)
            no_retry += r.retry_after is None
        elif r.status != 200 or r.error:
            errors += 1
        records.append(record)
    result = judged(records, slo, duration_s, level, rps, admission)
    p99 = statistics.quantiles(shed_times, n=100, method="inclusive")[98] if len(shed_times) > 1 else \
        (shed_times[0] if shed_times else None)
    return replace(result, shed_answer_p99_s=p99, shed_without_retry_after=no_retry, server_errors=errors,
                   shed_expired=expired)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", action="store_true")
    p.add_argument("--targets", default=CPU_TARGET, help="simulated: 'cpu' and hardware profile names")
    p.add_argument("--workloads", default="chat,chat-long-prompts")
    p.add_argument("--levels", default="1,1.5,2,4", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--duration-s", type=float, default=300.0, help="seconds of arrivals per level")
    p.add_argument("--drain-s", type=float, default=120.0, help="live: how long unfinished requests may run on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity-rps", type=float, help="live: skip the capacity search and use this")
    p.add_argument("--start-qps", type=float, default=2.0)
    p.add_argument("--max-probes", type=int, default=4)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--model", help="live: the daemon's --model (default: the bundled one)")
    p.add_argument("--daemon-args", default="", help="live: more daemon flags, one string")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.daemon_args = args.daemon_args.split() + (["--model", args.model] if args.model else [])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workloads = args.workloads.split(",")
    if args.simulate:
        series = [simulated_series(t, w, args.levels, args.duration_s, args.seed)
                  for t in args.targets.split(",") for w in workloads]
    else:
        series = [live_series(args, w) for w in workloads]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta(), "series": series}, indent=1) + "\n")
    print(markdown(series))


def markdown(series: list[dict[str, Any]]) -> str:
    rows = ["| target | workload | capacity (req/s) | load | goodput off (req/s) | goodput on (req/s) | on / 1.0x off "
            "| shed (of them expired in the queue) | refused on arrival: p99 answer at the client | admitted within SLO "
            "| admitted misses: TTFT / TBT / unfinished |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in series:
        by = {(r["level"], r["admission"]): r for r in s["levels"]}
        base = by.get((1.0, False), {}).get("goodput_rps") or 0.0
        for level in sorted({r["level"] for r in s["levels"]}):
            off, on = by.get((level, False)), by.get((level, True))
            if not (off and on):
                continue
            within = "-" if on["admitted_within_slo"] is None else f"{on['admitted_within_slo']:.1%}"
            ratio = f"{on['goodput_rps'] / base:.2f}x" if base else "-"
            rows.append(f"| {s['target']} | {s['workload']} | {s['capacity_rps']:.3g} | {level:g}x | "
                        f"{off['goodput_rps']:.3f} | {on['goodput_rps']:.3f} | {ratio} | {shed(on)} | {answer(on)} | "
                        f"{within} | {misses(on)} |")
    return "\n".join(rows)


def shed(row: dict[str, Any]) -> str:
    expired = f" ({row['shed_expired']})" if row.get("shed_expired") is not None else ""
    return f"{row['shed']}{expired} of {row['requests']}"


def answer(row: dict[str, Any]) -> str:
    """Where the results file tells refusals on arrival apart from expired requests: their client-side p99."""
    p99 = row.get("shed_answer_p99_s")
    return "-" if p99 is None or row.get("shed_expired") is None else f"{1000 * p99:.0f} ms"


def misses(row: dict[str, Any]) -> str:
    """Why admitted requests missed, where the results file counts it."""
    if "missed_tbt" not in row:
        return "-"
    return f"{row['missed_ttft']} / {row['missed_tbt']} / {row['missed_unfinished']}"


def render_doc(sources: list[Path]) -> str:
    return "\n\n".join(markdown(json.loads(Path(p).read_text())["series"]) for p in sources)


if __name__ == "__main__":
    main()
