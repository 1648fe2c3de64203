"""The arithmetic behind each hardware profile's tuned numbers, from the published figures it was
tuned on (configs/hardware_profiles/*.yaml say which figure each number came from). Prints the
derived value next to the one the profile ships, so a changed figure or model shows what to retune.

    python benchmarks/profile_calibration.py
    python benchmarks/profile_calibration.py --checks-json docs/results/profile_checks.json

--checks-json also stores every profile's checks (`autotuned-serve profiles --checks`: predicted
against published), which render_checks turns into docs/design/hardware_profiles.md's table.

Per GPU: Vidur's linear-layer time of a 7B/8B model at 1 token on 1 and on 8 GPUs,
t(tp) = W / (tp x B) + layers x c, gives the achieved weight bandwidth B and the per-layer
overhead c. Per profile: the linear-layer time at 2048 tokens gives the GEMM rate, one at a middle
token count the roofline knee (solved together). The A100 profile's step overhead is Niyama's
intercept less our GPU time of the same 1-decode step.
"""

from __future__ import annotations

import argparse
import builtins
import json
import sys
from dataclasses import replace
from pathlib import Path

from scipy.optimize import brentq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulation.hardware_profile import HardwareProfile, ProfileModel, load_profile, profile_names  # noqa: E402
from simulation.profile_checks import run_checks  # noqa: E402
from simulation.profile_cost_model import StepTerms  # noqa: E402
from telemetry.model_shape import ModelShape  # noqa: E402

LLAMA2_7B = ProfileModel("Llama-2-7B", ModelShape(32, 4096, 11008, 32, 32, 128, 32000), 13.5e9)
LLAMA3_8B = ProfileModel("Llama-3-8B", ModelShape(32, 4096, 14336, 32, 8, 128, 128256), 16.06e9)
# GPU -> (profile that carries it, the model Vidur profiled, 1-token linear ms at TP1 and TP8)
TP_SWEEPS = {"H100": ("h100-llama3.1-8b", LLAMA2_7B, 5.6, 1.3),      # vidur h100/Llama-2-7b-hf/mlp.csv
             "A100": ("a100-mistral-7b", LLAMA3_8B, 9.7, 2.1)}       # vidur a100/Meta-Llama-3-8B/mlp.csv
# profile -> (linear ms at 2048 tokens, middle token count, its linear ms): the facts sheet's figures
GEMM_FIGURES = {"h100-llama3.1-8b": (43.7, 256, 9.9), "a100-mistral-7b": (141.8, 128, 13.2),
                "h100-llama3.1-70b-tp4": (113.5, 512, 30.0), "h100-llama3.1-70b-tp8": (63.6, 512, 17.7)}
NIYAMA_B0_MS = 14.936                       # facts: Niyama's intercept, steps <= 512 tokens


def bandwidth_and_layer_overhead(profile: HardwareProfile, model: ProfileModel, tp1_ms: float,
                                 tp8_ms: float) -> tuple[float, float]:
    weights_ms = (tp1_ms - tp8_ms) / (1 - 1 / 8)
    bandwidth = model.shape.linear_params * model.bytes_per_param / (weights_ms * 1e-3)
    return bandwidth / (profile.hardware.hbm_tbs * 1e12), (tp1_ms - weights_ms) * 1e3 / model.shape.num_layers


def linear_ms(profile: HardwareProfile, tokens: int, **hardware) -> float:
    p = replace(profile, hardware=replace(profile.hardware, **hardware))
    return 1e3 * StepTerms.of(p, p.tp).linear_s(tokens)


def compute_and_knee(profile: HardwareProfile, at_2048_ms: float, tokens: int,
                     at_tokens_ms: float) -> tuple[float, float]:
    """Fixed point: the GEMM rate that gives the 2048-token time at this knee, the knee that gives the
    middle time at this rate."""
    fraction, knee = profile.hardware.compute_fraction, profile.hardware.roofline_knee
    for _ in range(50):
        fraction = brentq(lambda f: linear_ms(profile, 2048, compute_fraction=f, roofline_knee=knee) - at_2048_ms,
                          0.05, 1.0)
        def gap(knee: float) -> float:
            return linear_ms(profile, tokens, compute_fraction=fraction, roofline_knee=knee) - at_tokens_ms
        knee = brentq(gap, 1.0, 49.0) if gap(1.0) * gap(49.0) < 0 else 50.0
    return fraction, knee


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checks-json", help="also store every profile's checks here (benchmarks/results_file.py)")
    args = p.parse_args()
    lines: list[str] = []

    def print(line: str) -> None:     # noqa: A001 - printed, and kept for --checks-json
        lines.append(line)
        builtins.print(line)

    sweeps = {}
    for gpu, (name, model, tp1, tp8) in TP_SWEEPS.items():
        profile = load_profile(name)
        fraction, layer_us = bandwidth_and_layer_overhead(profile, model, tp1, tp8)
        sweeps[profile.hardware.name] = (fraction, layer_us)
        print(f"{gpu}: weight_bandwidth_fraction {fraction:.3f} (ships {profile.hardware.weight_bandwidth_fraction}), "
              f"layer_overhead_us {layer_us:.1f} (ships {profile.hardware.layer_overhead_us})")
    for name, (at_2048, tokens, at_tokens) in GEMM_FIGURES.items():
        profile = load_profile(name)
        fraction, layer_us = sweeps[profile.hardware.name]
        profile = replace(profile, hardware=replace(profile.hardware, weight_bandwidth_fraction=fraction,
                                                    layer_overhead_us=layer_us))
        compute, knee = compute_and_knee(profile, at_2048, tokens, at_tokens)
        hw = load_profile(name).hardware
        plain_max = linear_ms(profile, tokens, compute_fraction=compute, roofline_knee=50.0)
        print(f"{name}: compute_fraction {compute:.3f} (ships {hw.compute_fraction}), "
              f"roofline_knee {knee:.2f} (ships {hw.roofline_knee}); a plain max() roofline would predict "
              f"{plain_max:.1f} ms at {tokens} tokens against the published {at_tokens} ms")
    a100 = load_profile("a100-mistral-7b")
    llama3_vocab = replace(a100.model.shape, vocab_size=LLAMA3_8B.shape.vocab_size)   # Niyama fitted Llama-3-8B
    as_llama3 = replace(a100, model=replace(a100.model, shape=llama3_vocab))
    terms = StepTerms.of(as_llama3, 1)
    gpu_ms = 1e3 * (terms.linear_s(1) + terms.head_s(1))
    print(f"a100-mistral-7b: step_us {1e3 * (NIYAMA_B0_MS - gpu_ms):.0f} (ships {a100.overheads.step_us:.0f}): "
          f"Niyama b0 {NIYAMA_B0_MS} ms - GPU time of its 1-decode step {gpu_ms:.2f} ms")
    if args.checks_json:
        from benchmarks import results_file
        results_file.write(args.checks_json, {"arithmetic": lines, "profiles": [
            {"profile": name, "checks": [{"name": r.check.name, "role": r.check.role, "source": r.check.source,
                                          "ratio": r.check.over is not None, "predicted": r.predicted,
                                          "published": r.check.expected, "error": r.error}
                                         for r in run_checks(load_profile(name))]}
            for name in profile_names()]})


def render_checks(sources: list[Path]) -> str:
    """docs/design/hardware_profiles.md's checks table (benchmarks/render_docs.py): one row per check."""
    r = json.loads(Path(sources[0]).read_text())
    lines = ["| profile | check | role | predicted | published | error |", "|---|---|---|---:|---:|---:|"]
    for prof in r["profiles"]:
        for c in prof["checks"]:
            unit, digits = ("x", 3) if c["ratio"] else (" ms", 2)
            lines.append(f"| {prof['profile']} | {c['name']} | {c['role']} | {c['predicted']:.{digits}f}{unit} | "
                         f"{c['published']:g}{unit} | {100 * c['error']:+.1f}% |")
    return "\n".join(lines)


def render_arithmetic(sources: list[Path]) -> str:
    """docs/design/hardware_profiles.md's calibration lines: what the script printed, one item each."""
    return "\n".join(f"- {line}" for line in json.loads(Path(sources[0]).read_text())["arithmetic"])


if __name__ == "__main__":
    main()
