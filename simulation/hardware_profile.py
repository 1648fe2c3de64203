"""A hardware profile: one GPU, one model shape and a tensor-parallel degree, with the published
figures its step-time model is calibrated on and checked against (configs/hardware_profiles/*.yaml).

A profile is what the simulator needs to price steps on hardware this project cannot run: the
spec-sheet roofline (peak bf16 FLOP/s, HBM bandwidth, memory), the shares of it that real kernels
achieve, the model's shape, the per-step and per-sequence host overheads of the engine, and the
checks (published end-to-end figures) every profile must stay within 15% of.
simulation/profile_cost_model.py turns it into a step-time model; simulation/profile_checks.py runs its checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from engine.kv_cache.block_manager import BLOCK_SIZE
from telemetry.model_shape import ModelShape

PROFILES_DIR = Path(__file__).resolve().parent.parent / "configs" / "hardware_profiles"
ROLES = ("calibration", "held-out")
MEASURES = ("linear", "decode", "prefill", "allreduce")
# a profile file's `model:` keys for ModelShape's fields (which are the engine's ModelConfig names)
SHAPE_KEYS = {"layers": "num_layers", "hidden": "hidden_size", "intermediate": "intermediate_size",
              "heads": "num_heads", "kv_heads": "num_kv_heads", "head_dim": "head_dim", "vocab": "vocab_size"}


@dataclass(frozen=True)
class AllReduce:
    """One all-reduce among `tp` GPUs: latency + bytes / bandwidth."""

    tp: int
    latency_us: float
    bandwidth_gbs: float


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: float                  # dense bf16, spec sheet
    hbm_tbs: float                      # HBM bandwidth, spec sheet
    memory_gb: float
    weight_bandwidth_fraction: float    # share of HBM bandwidth achieved streaming the weights
    compute_fraction: float             # share of peak achieved by the linear layers' GEMMs
    roofline_knee: float                # p in (memory^p + compute^p)^(1/p); large = plain max
    layer_overhead_us: float            # per layer and step: the small ops around the GEMMs
    attention_bandwidth_fraction: float  # share of HBM bandwidth achieved reading the KV cache
    attention_compute_fraction: float   # share of peak achieved by prefill attention
    gemm_tile_tokens: int = 128         # GEMM row tile: 136 tokens cost like 256 once compute-bound
    allreduce: tuple[AllReduce, ...] = ()

    def allreduce_for(self, tp: int) -> AllReduce:
        for entry in self.allreduce:
            if entry.tp == tp:
                return entry
        raise ValueError(f"{self.name} has no all-reduce figures for TP{tp}")


@dataclass(frozen=True)
class ProfileModel:
    """The profiled model: its shape and how its weights sit in HBM."""

    name: str
    shape: ModelShape
    parameter_bytes: float              # every weight, embeddings included (what sits in HBM)
    dtype: str = "bf16"
    bytes_per_param: int = 2

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """K and V of one token, all layers, on one GPU."""
        return self.shape.kv_values_per_token(tp) * self.bytes_per_param


@dataclass(frozen=True)
class Overheads:
    step_us: float                      # host time per step the GPU does not hide (scheduling, launch)
    sequence_us: float                  # per sequence in the step (bookkeeping, sampling)
    gpu_memory_utilization: float = 0.9   # vLLM's default share of GPU memory it may use
    activation_reserve_gb: float = 2.0  # per GPU: activations, CUDA graphs, NCCL/cuBLAS buffers


@dataclass(frozen=True)
class Measure:
    """What a check predicts: `linear` (the linear layers of one step, LM head and communication
    excluded, as Vidur profiles them), a whole `decode` or `prefill` step, or one `allreduce`."""

    kind: str
    tokens: int = 0                     # linear, prefill
    batch: int = 0                      # decode: sequences
    context: int = 0                    # decode: tokens already cached per sequence; prefill: before the chunk
    bytes: int = 0                      # allreduce
    tp: int | None = None               # evaluate at another TP degree (same GPU and calibration)


@dataclass(frozen=True)
class Check:
    name: str
    role: str                           # calibration (a figure the profile was tuned on) or held-out
    source: str
    measure: Measure
    expected: float                     # ms, or the ratio measure / over when `over` is given
    over: Measure | None = None


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    hardware: Hardware
    model: ProfileModel
    tp: int
    overheads: Overheads
    checks: tuple[Check, ...] = ()
    block_size: int = BLOCK_SIZE
    sources: tuple[str, ...] = ()

    def kv_blocks(self, tp: int | None = None) -> int:
        """KV pool per GPU, as vLLM sizes it: memory x utilization - weights - activations, in blocks."""
        tp = tp or self.tp
        usable = (self.hardware.memory_gb * 1e9 * self.overheads.gpu_memory_utilization
                  - self.model.parameter_bytes / tp - self.overheads.activation_reserve_gb * 1e9)
        return max(0, int(usable // (self.model.kv_bytes_per_token(tp) * self.block_size)))

    @property
    def summary(self) -> str:
        return f"{self.hardware.name} x{self.tp}, {self.model.name} {self.model.dtype} TP{self.tp}"


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str) -> HardwareProfile:
    """A shipped profile by name; ValueError lists the valid names."""
    names = profile_names()
    if name not in names:
        raise ValueError(f"unknown hardware profile {name!r}: expected one of {', '.join(names)}")
    return read_profile(PROFILES_DIR / f"{name}.yaml")


def read_profile(path: str | Path) -> HardwareProfile:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
        return parse_profile(data, path.stem)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read hardware profile {path}: {e}") from e


def parse_profile(data: Any, name: str) -> HardwareProfile:
    where = f"hardware profile {name}"
    data = _mapping(data, where)
    hw = dict(_mapping(data.get("hardware"), f"{where}: hardware"))
    hw["allreduce"] = tuple(_build(AllReduce, a, f"{where}: hardware.allreduce") for a in hw.get("allreduce") or ())
    profile = HardwareProfile(
        name=str(data.get("name", name)),
        description=str(data.get("description", "")),
        hardware=_build(Hardware, hw, f"{where}: hardware"),
        model=_profile_model(data.get("model"), f"{where}: model"),
        tp=int(data.get("tp", 1)),
        overheads=_build(Overheads, data.get("overheads"), f"{where}: overheads"),
        checks=tuple(_check(c, where) for c in data.get("checks") or ()),
        block_size=int(data.get("block_size", 16)),
        sources=tuple(str(s) for s in data.get("sources") or ()),
    )
    unknown = set(data) - {f.name for f in fields(HardwareProfile)}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    validate(profile)
    return profile


def validate(p: HardwareProfile) -> None:
    where = f"hardware profile {p.name}"
    hw, m, o = p.hardware, p.model.shape, p.overheads
    fractions = (hw.weight_bandwidth_fraction, hw.compute_fraction, hw.attention_bandwidth_fraction,
                 hw.attention_compute_fraction, o.gpu_memory_utilization)
    if not all(0 < f <= 1 for f in fractions):
        raise ValueError(f"{where}: achieved fractions and gpu_memory_utilization must be in (0, 1]")
    if not (hw.peak_tflops > 0 and hw.hbm_tbs > 0 and hw.memory_gb > 0 and hw.roofline_knee >= 1
            and hw.layer_overhead_us >= 0 and hw.gemm_tile_tokens >= 1):
        raise ValueError(f"{where}: peak, bandwidth and memory must be > 0, roofline_knee >= 1, "
                         f"layer_overhead_us >= 0, gemm_tile_tokens >= 1")
    if min(m.num_layers, m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads, m.head_dim,
           m.vocab_size) < 1 or m.num_heads % m.num_kv_heads:
        raise ValueError(f"{where}: model dimensions must be >= 1 and heads a multiple of kv_heads")
    if p.tp < 1 or m.num_heads % p.tp or (p.tp > 1 and not any(a.tp == p.tp for a in hw.allreduce)):
        raise ValueError(f"{where}: tp must divide the heads, and TP > 1 needs the GPU's all-reduce figures")
    if o.step_us < 0 or o.sequence_us < 0 or o.activation_reserve_gb < 0:
        raise ValueError(f"{where}: overheads must be >= 0")
    if p.kv_blocks() < 1:
        raise ValueError(f"{where}: the weights leave no memory for a KV cache")
    for check in p.checks:
        if check.role not in ROLES:
            raise ValueError(f"{where}: check {check.name}: role must be one of {', '.join(ROLES)}")
        for measure in (check.measure, check.over):
            if measure is not None and measure.kind not in MEASURES:
                raise ValueError(f"{where}: check {check.name}: kind must be one of {', '.join(MEASURES)}")


def _check(data: Any, where: str) -> Check:
    data = dict(_mapping(data, f"{where}: check"))
    name = str(data.get("name", "?"))
    here = f"{where}: check {name}"
    ratio = "over" in data
    key = "expected_ratio" if ratio else "expected_ms"
    if key not in data:
        raise ValueError(f"{here}: needs {key}")
    over = _build(Measure, data.pop("over"), here) if ratio else None
    measure = _build(Measure, data.pop("measure", None), here)
    expected = float(data.pop(key))
    if not (expected > 0 and math.isfinite(expected)):
        raise ValueError(f"{here}: {key} must be > 0")
    return _build(Check, data | {"measure": measure, "over": over, "expected": expected}, here)


def _profile_model(data: Any, where: str) -> ProfileModel:
    """The file's flat `model:` mapping: the shape's keys (SHAPE_KEYS) and the rest of ProfileModel."""
    data = dict(_mapping(data, where))
    allowed = set(SHAPE_KEYS) | {f.name for f in fields(ProfileModel)} - {"shape"}
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(allowed))})")
    missing = [k for k in SHAPE_KEYS if k not in data]
    if missing:
        raise ValueError(f"{where}: needs {', '.join(missing)}")
    shape = _build(ModelShape, {field: data.pop(k) for k, field in SHAPE_KEYS.items()}, where)
    return _build(ProfileModel, data | {"shape": shape}, where)


def _build(cls: type, data: Any, where: str) -> Any:
    data = _mapping(data, where)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(known))})")
    types = get_type_hints(cls)
    try:
        return cls(**{k: _coerce(v, types[k]) for k, v in data.items()})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _coerce(value: Any, kind: Any) -> Any:
    """YAML reads 16.06e9 as a string (its floats need a sign in the exponent): numbers by field type."""
    if kind is float and isinstance(value, (str, int)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, str):
        return int(value)
    return value


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    return data
