"""How well a shipped hardware profile predicts the engine on the hardware it describes: the engine's
step times on a grid of step shapes, measured, next to the profile's prediction of the same shapes.

The profile (configs/hardware_profiles/NAME.yaml) is the simulator's model of a GPU we normally
cannot run; on a lent GPU this checks it. The engine is built from a preset's random weights
(`llama-3.1-8b`: Llama-3.1-8B's shape in bf16, no download), the calibration grid is drawn
(simulation.calibrate.grid, up to --max-tokens per step, stratified so decode-only, prefill-only
and mixed steps each get about a third of the --points; the grid's largest step is 128 decodes +
a 1024-token chunk, so a prefill chunk of --max-tokens is measured first as well) and each point is measured as
`autotuned-serve calibrate` measures it (simulation.calibrate.measure: the model runner's whole
step, input preparation and sampling included, median of --repeats after one untimed run,
synchronized on CUDA). The profile's ProfileCostModel.predict prices the measured StepShape.

Printed: one row per point (prefill tokens, decode sequences and their context, measured ms,
profile ms, relative error = (profile - measured) / measured, so + means the profile is slower
than the engine), then the median |error| overall, over decode-only steps and over steps that
carry a prefill chunk (target: <= 15%), the median measured/profile ratio (a uniform speed
difference) and, where there are enough points, the holdout MAPE of a cost model fitted on the same
measurements (what `autotuned-serve calibrate` would make of them). A profile whose model shape
or dtype is not the engine's is compared anyway, with a warning.

On a lent H100 (Llama-3.1-8B dummy weights; about 2 minutes, --time-limit-s caps the measuring):

    python benchmarks/gpu_profile_check.py --device cuda --model llama-3.1-8b --dtype bf16 --profile h100-llama3.1-8b --json OUT.json

On a CPU (a smoke test of the script: the errors are those of a CPU against an H100's model):

    python benchmarks/gpu_profile_check.py --device cpu --model tiny --profile h100-llama3.1-8b --points 12 --repeats 1

The --json file is rewritten after every point (complete: false until the end), so a run cut off
by a time limit still leaves what it measured.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import results_file
import engine  # noqa: F401  (before torch: it sets torch's OpenMP threads to sleep between ops)
import torch

from engine import EngineConfig, LLMEngine
from simulation.calibrate import CHUNKS, DECODE_CONTEXTS, GridPoint, engine_meta, grid, measure
from simulation.cost_model import StepShape, fit_cost_model
from simulation.hardware_profile import HardwareProfile, load_profile
from simulation.profile_cost_model import ProfileCostModel
from telemetry.model_shape import ModelShape

log = logging.getLogger(__name__)

TARGET = 0.15                 # median |relative error| the profile should stay within
MIN_FIT_POINTS = 10           # fewer: no cost model is fitted (7 features, a quarter held out)
HOLDOUT_FRACTION = 0.25


@dataclass(frozen=True)
class Row:
    """One measured step and the profile's prediction of it."""

    prefill_tokens: int
    chunk_context: int        # tokens cached before the prefill chunk
    decodes: int
    decode_context: int       # tokens cached per decoding sequence
    measured_ms: float
    profile_ms: float
    error: float              # (profile - measured) / measured
    terms_ms: dict[str, float]  # the profile's prediction by term (they add up to profile_ms)

    @property
    def kind(self) -> str:
        if not self.prefill_tokens:
            return "decode"
        return "prefill" if not self.decodes else "mixed"


def relative_error(measured_s: float, predicted_s: float) -> float:
    """(predicted - measured) / measured: + where the profile is slower than the engine."""
    return (predicted_s - measured_s) / measured_s


def profile_terms_ms(model: ProfileCostModel, shape: StepShape) -> dict[str, float]:
    """ProfileCostModel.predict's sum, term by term (ms), to see which term an error comes from."""
    t, tokens = model.terms, shape.num_prefill_tokens + shape.num_decode_tokens
    terms = {"overhead": t.step_s + t.sequence_s * shape.num_seqs, "linear": t.linear_s(tokens),
             "lm_head": t.head_s(shape.num_sampled), "kv_read": t.kv_token_s * shape.context_tokens,
             "attention": t.pair_s * shape.attended_pairs, "allreduce": t.communication_s(tokens)}
    return {k: round(1e3 * model.speed * v, 4) for k, v in terms.items()}


def stratified(points: list[GridPoint], num_points: int) -> list[GridPoint]:
    """Decode-only, prefill-only and mixed points in turn (each kind in the grid's random order), so a
    short run has all three: the grid alone is mostly mixed steps (few decode-only shapes exist)."""
    kinds = ([p for p in points if not p.chunk], [p for p in points if not p.decodes],
             [p for p in points if p.chunk and p.decodes])
    out: list[GridPoint] = []
    for i in range(max(map(len, kinds), default=0)):
        out += [k[i] for k in kinds if i < len(k)]
    return out[:num_points]


def draw_points(num_points: int, max_tokens: int, block_size: int, max_len: int, seed: int,
                max_kv_blocks: int | None = None) -> list[GridPoint]:
    """`num_points` of the grid, stratified; first, where `max_tokens` is above the grid's largest chunk
    (1024) and the model's length admits it, one prefill chunk of `max_tokens` tokens (the 2048-token
    step is a figure the H100 profiles were calibrated on)."""
    every = grid(max_kv_blocks or 1 << 40, block_size, max_tokens, 1 << 30, seed, max_len)
    largest = GridPoint(0, DECODE_CONTEXTS[0], max_tokens, 0)
    extra = [largest] if (max_tokens > max(CHUNKS) and max_tokens <= max_len
                          and largest.kv_blocks(block_size) <= (max_kv_blocks or 1 << 40)) else []
    return extra + stratified(every, num_points)


def blocks_needed(points: list[GridPoint], block_size: int) -> int:
    return max((p.kv_blocks(block_size) for p in points), default=1)


def compare(engine: LLMEngine, profile: ProfileCostModel, points: list[GridPoint], repeats: int,
            retakes: int = 0, time_limit_s: float | None = None,
            on_row: Callable[[Row], None] | None = None) -> tuple[list[Row], list[StepShape], list[float]]:
    """Measure each point (until `time_limit_s` of measuring has passed) and price it with `profile`.
    Returns the rows and the measured shapes and seconds (for a fit)."""
    rows, shapes, seconds = [], [], []
    start = time.monotonic()
    for point in points:
        if time_limit_s is not None and time.monotonic() - start > time_limit_s:
            break
        shape, t = measure(engine, point, repeats, retakes)
        predicted = profile.predict(shape)
        row = Row(point.chunk, point.chunk_context, point.decodes, point.decode_context if point.decodes else 0,
                  1e3 * t, 1e3 * predicted, relative_error(t, predicted), profile_terms_ms(profile, shape))
        rows.append(row)
        shapes.append(shape)
        seconds.append(t)
        if on_row:
            on_row(row)
    return rows, shapes, seconds


def summarize(rows: list[Row]) -> dict[str, Any]:
    """Median |error| overall, over decode-only steps and over steps with a prefill chunk; the median
    measured/profile ratio, and the median |error| left once the profile is scaled by it."""
    def median_abs(subset: list[Row]) -> float | None:
        return statistics.median(abs(r.error) for r in subset) if subset else None

    decode = [r for r in rows if r.kind == "decode"]
    prefill = [r for r in rows if r.kind != "decode"]
    out: dict[str, Any] = {"points": len(rows), "decode_points": len(decode), "prefill_points": len(prefill),
                           "median_abs_error": median_abs(rows), "median_abs_error_decode": median_abs(decode),
                           "median_abs_error_prefill": median_abs(prefill),
                           "mean_abs_error": statistics.fmean(abs(r.error) for r in rows) if rows else None,
                           "max_abs_error": max((abs(r.error) for r in rows), default=None),
                           "median_error": statistics.median(r.error for r in rows) if rows else None}
    if rows:
        ratio = statistics.median(r.measured_ms / r.profile_ms for r in rows)
        out["median_measured_over_profile"] = ratio
        out["median_abs_error_scaled"] = statistics.median(
            abs(relative_error(r.measured_ms, r.profile_ms * ratio)) for r in rows)
    out["within_target"] = out["median_abs_error"] is not None and out["median_abs_error"] <= TARGET
    return out


def mismatches(profile: HardwareProfile, engine: LLMEngine, device_name: str) -> list[str]:
    """What differs between the profile's model and hardware and the engine's."""
    warnings = []
    ours, theirs = ModelShape.of(engine.model_config), profile.model.shape
    if ours != theirs:
        diff = ", ".join(f"{k} {getattr(ours, k)} (profile {getattr(theirs, k)})" for k in asdict(ours)
                         if getattr(ours, k) != getattr(theirs, k))
        warnings.append(f"the engine's model {engine.model_config.name} is not the profile's "
                        f"{profile.model.name}: {diff}")
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    if {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype) != profile.model.dtype:
        warnings.append(f"the engine runs {dtype}, the profile {profile.model.dtype}")
    gpu = profile.hardware.name.split("-")[0]          # "H100" of "H100-SXM-80GB"
    if gpu.lower() not in device_name.lower():
        warnings.append(f"the device is {device_name}, the profile's {profile.hardware.name}")
    if profile.tp != 1:
        warnings.append(f"the profile is TP{profile.tp}, the engine runs on one device")
    return warnings


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device).index or 0)
    return results_file.machine()["cpu_model"]


def fit_own(engine: LLMEngine, shapes: list[StepShape], seconds: list[float], seed: int) -> dict[str, Any] | None:
    """A cost model fitted on the same measurements, as calibrate() fits one (without its live steps)."""
    if len(shapes) < MIN_FIT_POINTS:
        return None
    try:
        model = fit_cost_model(shapes, seconds, HOLDOUT_FRACTION, seed, **engine_meta(engine))
    except ValueError as e:
        log.warning("no cost model fitted: %s", e)
        return None
    return {"fit_mape": model.fit_mape, "holdout_mape": model.holdout_mape, "num_samples": model.num_samples,
            "coefficients": model.coefficients}


def format_row(row: Row) -> str:
    chunk = f"{row.prefill_tokens}+{row.chunk_context}" if row.prefill_tokens else "-"
    decodes = f"{row.decodes}x{row.decode_context}" if row.decodes else "-"
    return (f"{row.kind:>7} {chunk:>10} {decodes:>9} {row.measured_ms:11.2f} {row.profile_ms:10.2f} "
            f"{100 * row.error:+8.1f}%")


HEADER = f"{'kind':>7} {'prefill':>10} {'decodes':>9} {'measured ms':>11} {'profile ms':>10} {'error':>9}"


def format_summary(summary: dict[str, Any], own: dict[str, Any] | None) -> list[str]:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    lines = [f"median |error|: {pct(summary['median_abs_error'])} over {summary['points']} steps "
             f"(target <= {100 * TARGET:.0f}%: {'met' if summary['within_target'] else 'NOT met'})",
             f"  decode-only: {pct(summary['median_abs_error_decode'])} over {summary['decode_points']}; "
             f"with a prefill chunk: {pct(summary['median_abs_error_prefill'])} over {summary['prefill_points']}",
             f"  mean |error| {pct(summary['mean_abs_error'])}, max {pct(summary['max_abs_error'])}, "
             f"median signed {pct(summary['median_error'])}"]
    if summary.get("median_measured_over_profile") is not None:
        lines.append(f"  measured / profile (median): {summary['median_measured_over_profile']:.3f}; "
                     f"the profile scaled by it: median |error| {pct(summary['median_abs_error_scaled'])}")
    if own:
        lines.append(f"our own cost model fitted on these steps: holdout MAPE {pct(own['holdout_mape'])}, "
                     f"fit MAPE {pct(own['fit_mape'])} ({own['num_samples']} fitted)")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="a preset (random weights) or a checkpoint")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--profile", default="h100-llama3.1-8b", help="configs/hardware_profiles/NAME.yaml")
    p.add_argument("--points", type=int, default=40, help="grid points measured (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point, median (default 3)")
    p.add_argument("--retakes", type=int, default=0,
                   help="re-measure a point while other processes load the CPU, up to this often (default 0)")
    p.add_argument("--max-tokens", type=int, default=2048, help="largest step in tokens (default 2048)")
    p.add_argument("--kv-blocks", type=int, default=None,
                   help="KV pool in blocks (default: what the largest drawn point needs; points above it are not drawn)")
    p.add_argument("--time-limit-s", type=float, default=90.0,
                   help="stop measuring new points after this long (default 90; 0: no limit)")
    p.add_argument("--json", default=None, help="results file (with meta), rewritten after every point")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.points < 1 or args.repeats < 1 or args.retakes < 0 or args.max_tokens < 1:
        p.error("--points, --repeats and --max-tokens must be >= 1, --retakes >= 0")
    return args


def build_engine(args: argparse.Namespace, num_kv_blocks: int) -> LLMEngine:
    return LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, device=args.device, num_kv_blocks=num_kv_blocks,
                                  max_token_budget=max(8192, args.max_tokens), seed=args.seed))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    profile = load_profile(args.profile)
    cost = ProfileCostModel(profile)
    started = time.monotonic()
    # the grid is drawn before the engine exists (the pool is sized to it), so the model's length limit
    # is read from the preset or, for a checkpoint, taken from the engine's default cap
    from engine.llm_engine import DEFAULT_MAX_MODEL_LEN
    from engine.model_config import PRESETS
    preset = PRESETS.get((args.model or "").removeprefix("dummy:"))
    max_len = min(DEFAULT_MAX_MODEL_LEN, preset.max_position_embeddings if preset else DEFAULT_MAX_MODEL_LEN)
    block_size = EngineConfig().block_size
    points = draw_points(args.points, args.max_tokens, block_size, max_len, args.seed, args.kv_blocks)
    engine = build_engine(args, args.kv_blocks or blocks_needed(points, block_size))
    build_s = time.monotonic() - started
    name = device_name(args.device)
    warnings = mismatches(profile, engine, name)
    print(f"profile {profile.name} ({profile.summary}) against {engine.model_config.name} "
          f"{str(engine.runner.dtype).removeprefix('torch.')} on {args.device} ({name}); "
          f"{len(points)} points, {args.repeats} repeats; engine built in {build_s:.1f} s", flush=True)
    for w in warnings:
        print(f"WARNING: {w}", flush=True)
    print(HEADER, flush=True)

    results: dict[str, Any] = {"profile": profile.name, "profile_summary": profile.summary,
                               "model": engine.model_config.name, "dtype": str(engine.runner.dtype),
                               "device": args.device, "device_name": name, "warnings": warnings,
                               "args": vars(args), "kv_blocks": engine.block_manager.num_blocks,
                               "engine_build_s": round(build_s, 2), "points_drawn": len(points),
                               "complete": False, "rows": []}

    def on_row(row: Row) -> None:
        print(format_row(row), flush=True)
        results["rows"].append(asdict(row) | {"kind": row.kind})
        if args.json:
            results_file.write(args.json, results)

    measuring = time.monotonic()
    rows, shapes, seconds = compare(engine, cost, points, args.repeats, args.retakes,
                                    args.time_limit_s or None, on_row)
    summary = summarize(rows)
    own = fit_own(engine, shapes, seconds, args.seed)
    results |= {"summary": summary, "own_cost_model": own, "measure_s": round(time.monotonic() - measuring, 2),
                "total_s": round(time.monotonic() - started, 2), "complete": True}
    if len(rows) < len(points):
        print(f"time limit: {len(rows)} of {len(points)} points measured", flush=True)
    for line in format_summary(summary, own):
        print(line)
    if warnings:
        print(f"({len(warnings)} warning(s) above: the comparison is not like for like)")
    if args.json:
        results_file.write(args.json, results)
        print(f"wrote {args.json}")
    return results


if __name__ == "__main__":
    main()
    sys.exit(0)


def render_doc(sources: list) -> str:
    """docs/gpu.md's summary of one comparison: median |error| overall and by kind, the 2048-token prefill."""
    data = results_file.read(sources[0])
    s, own = data["summary"], data["own_cost_model"]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    rows = [("all steps", s["points"], s["median_abs_error"]),
            ("decode-only", s["decode_points"], s["median_abs_error_decode"]),
            ("with a prefill chunk", s["prefill_points"], s["median_abs_error_prefill"])]
    lines = [f"{data['model']} ({data['dtype']}) on {data['device_name']} against profile {data['profile']}.", "",
             "| steps | points | median \\|error\\| |", "|---|---:|---:|"]
    lines += [f"| {name} | {n} | {pct(error)} |" for name, n, error in rows]
    big = next((r for r in data["rows"] if r["prefill_tokens"] == 2048 and not r["decodes"]), None)
    lines += ["", f"Measured / profile, median: {s['median_measured_over_profile']:.2f}x; our own cost model fitted "
              f"on the same steps: holdout MAPE {pct(own['holdout_mape'])}."]
    if big is not None:
        lines[-1] += (f" The 2048-token prefill: {big['measured_ms']:.1f} ms measured, {big['profile_ms']:.1f} ms "
                      f"in the profile ({pct(big['error'])}).")
    return "\n".join(lines)
