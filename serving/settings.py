"""Daemon settings: YAML file (configs/*.yaml) overridden by command-line flags.

A bad file gives one line naming the field; every field has a default, so no file is needed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from serving.api_server import ApiConfig
from engine.engine_config import EngineConfig
from engine.slo_class import CONFIG as SHIPPED_SLO_CLASSES, SloClass, SloClasses
from policies import Knobs, get_policy


class SettingsError(ValueError):
    pass


@dataclass
class Settings:
    model: str | None = None            # None: the bundled SmolLM2-135M-Instruct
    dtype: str = "auto"
    weights: str = "auto"               # auto/quantized: a GGUF's quantized weights stay as stored on the CPU; dense
    device: str = "cpu"
    kv_cache_memory_mb: float = 256.0
    kv_cache_dtype: str = "auto"        # auto: fp16 for an fp32 model on the CPU kernels, else the model dtype
    num_kv_blocks: int | None = None
    block_size: int = 16
    max_model_len: int | None = None
    max_token_budget: int = 8192
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting: int = 256
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 256
    grace_s: float = 30.0
    engine_stall_s: float = 600.0     # a step running longer is the engine's death: the daemon exits (0: never);
                                      # above the longest real step (a whole prompt of a big model on the CPU)
    policy: str = "deadline"          # steps sized to the running requests' TBT slack (policies/deadline.py)
    knobs: dict[str, Any] = field(default_factory=lambda: {"token_budget": 2048})   # a cap: deadline sizes steps by time
    slo: dict[str, float] = field(default_factory=dict)    # the default SLO class's targets (ttft_s, tbt_s)
    slo_classes: str = str(SHIPPED_SLO_CLASSES)            # YAML file of the classes requests may name
    tune: bool = True
    calibrate: bool = True            # at start-up, where no cost model describes this model/dtype/machine
    calibration_budget_s: float = 60.0   # wall time that start-up calibration may take, whatever the model's size
    prefix_caching: bool = True       # reuse the KV blocks of prompt prefixes already computed
    state_dir: str = "state"
    peak_flops: float | None = None
    peak_bandwidth: float | None = None

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=self.model, dtype=self.dtype, weights=self.weights, device=self.device,
                            block_size=self.block_size,
                            kv_cache_memory_mb=self.kv_cache_memory_mb, num_kv_blocks=self.num_kv_blocks,
                            kv_cache_dtype=self.kv_cache_dtype,
                            max_model_len=self.max_model_len, policy=self.policy, knobs=self.knob_values(),
                            max_token_budget=self.max_token_budget, enable_prefix_caching=self.prefix_caching)

    def knob_values(self) -> Knobs:
        try:
            return Knobs(**self.knobs)
        except (TypeError, ValueError) as e:
            raise SettingsError(f"knobs: {e}") from e

    def slo_values(self) -> SloClass:
        try:
            return SloClass(**self.slo)
        except (TypeError, ValueError) as e:   # ValueError: a target <= 0 (SloClass checks its values)
            raise SettingsError(f"slo: {e}") from e

    def slo_class_values(self) -> SloClasses:
        """The classes from `slo_classes`, the default one re-targeted by `slo` where it names targets."""
        try:
            classes = SloClasses.load(self.slo_classes)
            if self.slo:   # keys it leaves out keep the file's targets
                base = classes.get(None)
                classes = classes.with_default_targets(self.slo.get("ttft_s", base.ttft_s),
                                                       self.slo.get("tbt_s", base.tbt_s))
        except (TypeError, ValueError) as e:
            raise SettingsError(f"slo_classes: {str(e).splitlines()[0]}") from e
        return classes

    def api_config(self, served_model_name: str) -> ApiConfig:
        return ApiConfig(served_model_name=served_model_name, max_waiting=self.max_waiting,
                         max_body_bytes=self.max_body_bytes, default_max_tokens=self.default_max_tokens,
                         api_key=self.api_key or os.environ.get("AUTOTUNED_SERVE_API_KEY"),
                         slo_classes=self.slo_class_values(), engine_stall_s=self.engine_stall_s or None)

    def validate(self) -> "Settings":
        try:
            get_policy(self.policy)
            config = self.engine_config()
            config.kv_torch_dtype(config.torch_dtype())
            config.weights_mode()
        except ValueError as e:
            raise SettingsError(str(e)) from e
        self._check_device()
        self.knob_values()
        self.slo_values()
        self.slo_class_values()
        for name in ("port", "max_waiting", "block_size", "max_token_budget"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be positive")
        if self.engine_stall_s < 0:
            raise SettingsError("engine_stall_s must be 0 (off) or positive")
        if not self.calibration_budget_s > 0:
            raise SettingsError("calibration_budget_s must be positive (--no-calibrate skips the calibration)")
        return self

    def _check_device(self) -> None:
        import re

        import torch

        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise SettingsError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise SettingsError(f"device {self.device}: CUDA is not available on this machine")


_TYPES = {f.name: f.type for f in dataclasses.fields(Settings)}


def load_settings(path: str | None, overrides: dict[str, Any]) -> Settings:
    values: dict[str, Any] = {}
    if path:
        values = _read_yaml(path)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values).validate()


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise SettingsError(f"cannot read config {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise SettingsError(f"config {path} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(data, dict):
        raise SettingsError(f"config {path}: expected a mapping of field: value")
    for key, value in data.items():
        if key not in _TYPES:
            raise SettingsError(f"config {path}: unknown field {key!r}")
        if not _type_ok(_TYPES[key], value):
            raise SettingsError(f"config {path}: field {key!r} must be {_TYPES[key]}, got {value!r}")
    return data


def _type_ok(annotation: str, value: Any) -> bool:
    if value is None:
        return "None" in annotation
    checks = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict}
    bases = [part.strip().split("[")[0] for part in annotation.split("|")]
    if isinstance(value, bool) and "bool" not in bases:
        return False
    return any(isinstance(value, checks[b]) for b in bases if b in checks)
