"""The daemon's telemetry: the engine's records into the sliding window and the Prometheus metrics,
and the device sampler's readings beside them."""

from __future__ import annotations

from prometheus_client import ProcessCollector

from engine.llm_engine import LLMEngine
from serving.daemon_config import DaemonConfig
from telemetry.device_sampler import DeviceSampler
from telemetry.hardware import DevicePeaks, probe_peaks
from telemetry.model_cost import ModelCost
from telemetry.prometheus import PrometheusMetrics
from telemetry.window import Arrival, TelemetryWindow


class DaemonTelemetry:
    """Wires the engine's records into the sliding window and the Prometheus metrics."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.window = TelemetryWindow(config.slo)
        self.metrics = PrometheusMetrics(config.api.served_model_name, slo=config.slo)
        # process_resident_memory_bytes and process_start_time_seconds: a leak and a restart, for alerts
        ProcessCollector(registry=self.metrics.registry)
        self.sampler: DeviceSampler | None = None
        self._knobs_seen: tuple[str, int] | None = None

    def attach(self, engine: LLMEngine) -> LLMEngine:
        cfg = self.config
        dtype = engine.runner.dtype
        self.window.cost = ModelCost.of_engine(engine)
        self.window.peaks = (DevicePeaks(cfg.peak_flops, cfg.peak_bandwidth, "config")
                             if cfg.peak_flops and cfg.peak_bandwidth else probe_peaks(cfg.engine.device, dtype))
        engine.step_listeners += [self.window.on_step, self.metrics.on_step, lambda r: self._scheduler_changed(engine, r)]
        engine.finish_listeners += [self.window.on_finish, self.metrics.on_finish]
        engine.arrival_listeners += [self.metrics.on_arrival, lambda r: self.window.on_arrival(
            Arrival(r.arrival_time, r.num_prompt_tokens, r.params.max_tokens))]
        engine.grammars.on_compiled.append(self.metrics.structured.on_compiled)
        scheduler = engine.scheduler
        scheduler.admission.on_shed.append(self.metrics.admission.on_shed)
        scheduler.admission.on_observed.append(self.metrics.admission.on_observed)
        self.metrics.read_live(lambda: len(scheduler.running), lambda: len(scheduler.waiting),
                               lambda: scheduler.blocks.usage)
        self.metrics.set_scheduler(engine.scheduler.policy.name, engine.scheduler.knobs)
        self.sampler = DeviceSampler(cfg.engine.device, self._on_sample)
        self.sampler.start()
        return engine

    def _scheduler_changed(self, engine: LLMEngine, record) -> None:
        seen = (record.policy, record.knobs_version)
        if seen != self._knobs_seen:
            self._knobs_seen = seen
            self.metrics.set_scheduler(record.policy, engine.scheduler.knobs)

    def _on_sample(self, sample: dict[str, float]) -> None:
        self.window.hardware = sample
        self.metrics.set_hardware(sample)
        summary = self.window.window(self.config.utilisation_window_s)
        self.metrics.set_utilisation(summary.mfu, summary.mbu)
