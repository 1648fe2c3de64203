"""The arithmetic behind each hardware profile's tuned numbers, from the published figures it was
tuned on (configs/hardware_profiles/*.yaml say which figure each number came from). Prints the
derived value next to the one the profile ships, so a changed figure or model shows what to retune.

    python benchmarks/profile_calibration.py

Per GPU: Vidur's linear-layer time of a 7B/8B model at 1 token on 1 and on 8 GPUs,
t(tp) = W / (tp x B) + layers x c, gives the achieved weight bandwidth B and the per-layer
overhead c. Per profile: the linear-layer time at 2048 tokens gives the GEMM rate, one at a middle
token count the roofline knee (solved together). The A100 profile's step overhead is Niyama's
intercept less our GPU time of the same 1-decode step.
"""

from __future__ import annotations

from dataclasses import replace

from scipy.optimize import brentq

from simulation.hardware_profile import HardwareProfile, ProfileModel, load_profile
from simulation.profile_cost_model import StepTerms
from telemetry.model_shape import ModelShape

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


if __name__ == "__main__":
    main()
