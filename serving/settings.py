"""Daemon settings: YAML file (configs/*.yaml) overridden by command-line flags.

Each default is defined once, by the dataclass that uses the value (EngineConfig, ApiConfig,
DaemonConfig, Knobs); a setting here reads it from there. Every setting is a flag and a YAML field,
and docs/configuration.md and configs/default.yaml are rendered from these fields
(serving/config_reference.py; tests/test_settings.py checks both are current).
A bad file gives one line naming the field; every field has a default, so no file is needed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import MISSING, dataclass, field
from typing import Any

import yaml

from serving.api_server import ApiConfig
from serving.chat_plan import AUTO, REASONING_PARSERS, TOOL_CALL_PARSERS, ChatParsers
from serving.auth import AuthConfig, AuthError, Key, load_keys_file, merge_keys, parse_keys
from serving.daemon_config import DaemonConfig
from engine.engine_config import EngineConfig
from engine.sampler import LOGPROBS_MODES
from engine.llm_engine import DEFAULT_MAX_MODEL_LEN
from engine.slo_class import CONFIG as SHIPPED_SLO_CLASSES, SloClass, SloClasses
from policies import POLICIES, Knobs, get_policy
from policies.knobs import DAEMON_KNOBS

WEIGHTS_HELP = ("auto: a GGUF's quantized weights stay as stored and steps up to a measured size run on them "
                "with the CPU kernels; quantized: the same, or an error where it cannot; dense: dequantize at "
                "load (fp32/bf16)")


class SettingsError(ValueError):
    pass


def default_of(owner: type, name: str) -> Any:
    """The default `owner` (a dataclass) gives its field `name`: the one definition of that value."""
    f = next(f for f in dataclasses.fields(owner) if f.name == name)
    return f.default if f.default is not MISSING else f.default_factory()


def setting(help: str, *, default: Any = None, factory: Any = None, choices: tuple[str, ...] = ()) -> Any:
    """A setting no other dataclass takes: its default is defined here."""
    metadata = {"help": help, "choices": choices, "owner": None}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def owned(owner: type, name: str, help: str, choices: tuple[str, ...] = ()) -> Any:
    """A setting passed on to `owner`'s field `name`, whose default is defined there."""
    return field(default=default_of(owner, name), metadata={"help": help, "choices": choices, "owner": owner})


@dataclass
class Settings:
    model: str | None = owned(EngineConfig, "model", "a .gguf file, a Hugging Face model directory, a Hugging "
                              "Face repo id in the local cache (owner/name[:FILE.gguf], never downloaded) or a "
                              "preset; null: the bundled SmolLM2-135M-Instruct")
    dtype: str = owned(EngineConfig, "dtype", "auto: bf16 where the hardware runs it fast (fp32 under the "
                       "quantized CPU kernels), else fp32", ("auto", "bf16", "fp32"))
    weights: str = owned(EngineConfig, "weights", WEIGHTS_HELP, ("auto", "quantized", "dense"))
    kernel_activations: str = owned(EngineConfig, "kernel_activations", "the quantized kernels' activations: "
                                    "int16, or int8 as llama.cpp (faster steps of several rows on AVX-512 VNNI; "
                                    "greedy tokens leave fp32's sooner)", ("int16", "int8"))
    device: str = owned(EngineConfig, "device", "cpu, cuda or cuda:N")
    kv_cache_memory_mb: float = owned(EngineConfig, "kv_cache_memory_mb", "KV pool size in MiB on the CPU, "
                                      "unless num_kv_blocks is set")
    gpu_memory_utilization: float = owned(EngineConfig, "gpu_memory_utilization", "on CUDA, the share of the "
                                          "GPU's memory for weights, activations and the KV pool, which takes "
                                          "what the others leave (unless num_kv_blocks is set)")
    cuda_graphs: bool = owned(EngineConfig, "cuda_graphs", "on CUDA, replay CUDA graphs captured at start-up for "
                              "decode-only steps of up to 256 sequences")
    kv_cache_dtype: str = owned(EngineConfig, "kv_cache_dtype", "how K/V are stored; auto: fp16 for an fp32 "
                                "model on the CPU kernels, else the model's dtype", ("auto", "fp32", "fp16", "bf16"))
    num_kv_blocks: int | None = owned(EngineConfig, "num_kv_blocks", "KV pool size in blocks; null: from "
                                      "kv_cache_memory_mb")
    block_size: int = owned(EngineConfig, "block_size", "tokens per KV block (and per prefix-cache key)")
    max_model_len: int | None = owned(EngineConfig, "max_model_len", "longest prompt plus output a request may "
                                      "have; null: the model's own limit, capped at "
                                      f"{DEFAULT_MAX_MODEL_LEN}")
    max_token_budget: int = owned(EngineConfig, "max_token_budget", "top of the token-budget range the knobs may "
                                  "take at run time (the warm-up is sized for it)")
    prefix_caching: bool = owned(EngineConfig, "enable_prefix_caching", "reuse the KV blocks of prompt prefixes "
                                 "already in the pool")
    jump_forward: bool = owned(EngineConfig, "jump_forward", "a constrained request's grammar-forced tokens "
                               "(a schema's keys and punctuation) join its output at once, computed as one chunk, "
                               "instead of one decode step each")
    hybrid_kv_cache: bool = owned(EngineConfig, "hybrid_kv_cache", "a model with sliding-window layers (Gemma 3) "
                                  "gives their KV pages back as each request's window passes; false: every layer "
                                  "keeps every block")
    logprobs_mode: str = owned(EngineConfig, "logprobs_mode", "the distribution logprobs report: raw (the model's "
                               "logits, as vLLM by default) or processed (after logit_bias and penalties, before "
                               "temperature)", LOGPROBS_MODES)
    policy: str = owned(EngineConfig, "policy", "scheduling policy (`autotuned-serve policies` lists them); "
                        "deadline sizes each step to the running requests' TBT slack", tuple(POLICIES))
    knobs: dict[str, Any] = setting("knob values overriding their defaults (`autotuned-serve policies` lists each "
                                    "knob, its range and default)", factory=dict)
    slo: dict[str, float] = setting("the default SLO class's targets (ttft_s, tbt_s); keys left out keep "
                                    "slo_classes' values", factory=dict)
    slo_classes: str = setting("YAML file of the SLO classes requests may name", default=str(SHIPPED_SLO_CLASSES))
    host: str = owned(DaemonConfig, "host", "bind address; any other than loopback needs a client key (api_key "
                      "or api_keys_file)")
    port: int = owned(DaemonConfig, "port", "port")
    api_key: str | list[str] | None = owned(ApiConfig, "api_key", "client API key, or a list of them (repeat "
                                            "the flag): once any client key is set, /v1, /tokenize and "
                                            "/detokenize need `Authorization: Bearer KEY`, and so does /admin "
                                            "unless admin_api_key is set (null: AUTOTUNED_SERVE_API_KEY, several "
                                            "comma-separated)")
    api_keys_file: str | None = setting("YAML file of more client keys, each naming an optional tenant and SLO "
                                        "class: `{keys: [{key: ..., tenant: team-a, slo_class: batch}]}`; a "
                                        "tenant's requests share prefix-cache blocks only with each other, and "
                                        "take its slo_class unless they name one")
    admin_api_key: str | None = setting("the key that alone opens /admin (a client key there: 403); null: "
                                        "AUTOTUNED_SERVE_ADMIN_API_KEY, and when that is unset too any client key "
                                        "opens /admin")
    protect_metrics: bool = setting("/metrics needs a client key or the admin key", default=False)
    allowed_origins: list[str] = setting("browser origins allowed by CORS (`*`: any; repeat the flag for several); "
                                         "none: no CORS headers", factory=list)
    max_waiting: int = owned(ApiConfig, "max_waiting", "queued requests beyond this are answered 429 with "
                             "Retry-After")
    max_body_bytes: int = owned(ApiConfig, "max_body_bytes", "largest request body accepted")
    default_max_tokens: int = owned(ApiConfig, "default_max_tokens", "max_tokens of a request that names none")
    tool_call_parser: str = setting("the format the model writes tool calls in: auto (read off its chat "
                                    "template), none (tools refused), or one by name", default=AUTO,
                                    choices=TOOL_CALL_PARSERS)
    reasoning_parser: str = setting("how a reply's reasoning is split off into reasoning_content: auto (where "
                                    "the chat template writes <think> blocks), none, or think (<think>...</think>)",
                                    default=AUTO, choices=REASONING_PARSERS)
    grace_s: float = owned(DaemonConfig, "grace_s", "on SIGTERM, how long in-flight requests may finish")
    engine_stall_s: float = owned(ApiConfig, "engine_stall_s", "a step running longer is the engine's death: open "
                                  "requests end with an error and the daemon exits 3 (0: never)")
    tune: bool = owned(DaemonConfig, "tune", "run the online tuner beside the engine")
    calibrate: bool = owned(DaemonConfig, "calibrate", "where no cost model describes this model/dtype/machine, "
                            "calibrate at start-up (else scale the shipped one by live step times)")
    calibration_budget_s: float = owned(DaemonConfig, "calibration_budget_s", "wall time the start-up calibration "
                                        "may take: fewer grid points for a slower model")
    state_dir: str = owned(DaemonConfig, "state_dir", "tuner studies, decisions and calibrated cost models")
    peak_flops: float | None = owned(DaemonConfig, "peak_flops", "the device's peak FLOP/s for MFU; null: "
                                     "probed at start-up")
    peak_bandwidth: float | None = owned(DaemonConfig, "peak_bandwidth", "the device's peak memory bandwidth "
                                         "(B/s) for MBU; null: probed at start-up")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(model=self.model, dtype=self.dtype, weights=self.weights, device=self.device,
                            kernel_activations=self.kernel_activations, block_size=self.block_size,
                            kv_cache_memory_mb=self.kv_cache_memory_mb, num_kv_blocks=self.num_kv_blocks,
                            gpu_memory_utilization=self.gpu_memory_utilization, cuda_graphs=self.cuda_graphs,
                            kv_cache_dtype=self.kv_cache_dtype,
                            max_model_len=self.max_model_len, policy=self.policy, knobs=self.knob_values(),
                            max_token_budget=self.max_token_budget, enable_prefix_caching=self.prefix_caching,
                            jump_forward=self.jump_forward,
                            hybrid_kv_cache=self.hybrid_kv_cache, logprobs_mode=self.logprobs_mode)

    def knob_values(self) -> Knobs:
        try:
            return Knobs(**(DAEMON_KNOBS | self.knobs))
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

    def daemon_config(self, served_model_name: str, **extra: Any) -> DaemonConfig:
        """The daemon's configuration; `extra`: DaemonConfig fields that are no setting (a replica's name)."""
        return DaemonConfig(self.engine_config(), self.api_config(served_model_name), self.host, self.port,
                            self.grace_s, self.slo_values(), self.peak_flops, self.peak_bandwidth, tune=self.tune,
                            state_dir=self.state_dir, calibrate=self.calibrate,
                            calibration_budget_s=self.calibration_budget_s, auth=self.auth_config(), **extra)

    def api_config(self, served_model_name: str) -> ApiConfig:
        return ApiConfig(served_model_name=served_model_name, max_waiting=self.max_waiting,
                         max_body_bytes=self.max_body_bytes, default_max_tokens=self.default_max_tokens,
                         api_key=next((k.key for k in self.auth_config().client_keys), None),
                         slo_classes=self.slo_class_values(), engine_stall_s=self.engine_stall_s or None,
                         chat_parsers=ChatParsers(self.tool_call_parser, self.reasoning_parser))

    def client_keys(self) -> list[str]:
        """`api_key`'s keys, else AUTOTUNED_SERVE_API_KEY's (comma-separated)."""
        try:
            return (parse_keys(self.api_key) or
                    parse_keys(os.environ.get("AUTOTUNED_SERVE_API_KEY"), comma_separated=True))
        except AuthError as e:
            raise SettingsError(f"api_key: {e}") from e

    def auth_config(self) -> AuthConfig:
        """The client keys (api_key's and api_keys_file's), the admin key, /metrics' guard and CORS."""
        try:
            keys = [Key(k) for k in self.client_keys()]
            if self.api_keys_file:
                keys += load_keys_file(self.api_keys_file)
            admin = self.admin_api_key or os.environ.get("AUTOTUNED_SERVE_ADMIN_API_KEY", "").strip() or None
            return AuthConfig(merge_keys(keys), admin, self.protect_metrics, tuple(self.allowed_origins))
        except AuthError as e:
            raise SettingsError(str(e)) from e

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
        classes = self.slo_class_values()
        self._check_auth(classes)
        for name in ("port", "max_waiting", "block_size", "max_token_budget", "max_model_len", "num_kv_blocks",
                     "max_body_bytes", "default_max_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise SettingsError(f"{name} must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise SettingsError("gpu_memory_utilization must be in (0, 1]")
        if self.engine_stall_s < 0:
            raise SettingsError("engine_stall_s must be 0 (off) or positive")
        if not self.calibration_budget_s > 0:
            raise SettingsError("calibration_budget_s must be positive (--no-calibrate skips the calibration)")
        return self

    def _check_auth(self, classes: SloClasses) -> None:
        if any(not isinstance(o, str) or not o for o in self.allowed_origins):
            raise SettingsError("allowed_origins must be a list of origins (https://host[:port]) or `*`")
        auth = self.auth_config()
        for key in auth.client_keys:
            try:
                classes.get(key.tenant.slo_class)
            except ValueError as e:
                raise SettingsError(f"api_keys_file: {e}") from e
        if self.protect_metrics and not auth.enabled:
            raise SettingsError("protect_metrics needs a client key (api_key, api_keys_file) or admin_api_key")

    def _check_device(self) -> None:
        import re

        import torch

        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise SettingsError(f"device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise SettingsError(f"device {self.device}: CUDA is not available on this machine")


_TYPES = {f.name: f.type for f in dataclasses.fields(Settings)}
KNOB_FLAGS = ("token_budget", "max_num_seqs")   # knobs with a flag of their own (vLLM's names); any: --knob
SLO_FLAGS = ("ttft_s", "tbt_s")                 # the default class's targets: --slo-ttft-s, --slo-tbt-s


def flags(f: dataclasses.Field) -> list[str]:
    """The command-line flags that set field `f`: --no-NAME for a setting on by default."""
    if f.name == "knobs":
        return [f"--{k.replace('_', '-')}" for k in KNOB_FLAGS] + ["--knob NAME=VALUE"]
    if f.name == "slo":
        return [f"--slo-{k.replace('_', '-')}" for k in SLO_FLAGS]
    name = f.name.replace("_", "-")
    return [f"--no-{name}" if f.default is True else f"--{name}"]


def value_type(f: dataclasses.Field) -> type:
    """What a flag's text is parsed as: the field's type, without None."""
    base = next(part.strip() for part in str(f.type).split("|") if part.strip() != "None")
    return {"int": int, "float": float, "str": str, "bool": bool, "list[str]": str}[base]


def repeatable(f: dataclasses.Field) -> bool:
    """A list setting: its flag may be given several times."""
    return "list[" in str(f.type)


def load_settings(path: str | None, overrides: dict[str, Any]) -> Settings:
    """The file's settings (none: the defaults) with `overrides` on top; `knobs` and `slo` overrides
    change only the keys they name."""
    values: dict[str, Any] = {}
    if path:
        values = _read_yaml(path)
    for key, value in overrides.items():
        if isinstance(value, dict):
            values[key] = {**values.get(key, {}), **value}
        elif value is not None:
            values[key] = value
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
    checks = {"str": str, "int": int, "float": (int, float), "bool": bool, "dict": dict, "list": list}
    bases = [part.strip().split("[")[0] for part in annotation.split("|")]
    if isinstance(value, bool) and "bool" not in bases:
        return False
    return any(isinstance(value, checks[b]) for b in bases if b in checks)
