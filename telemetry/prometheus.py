"""Prometheus metrics under vLLM's names with our `autotuned:` prefix, so dashboards port easily."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.outputs import RequestRecord, StepRecord
from engine.scheduling.request import Request
from policies import Knobs
from policies.knobs import KNOB_SPECS
from engine.slo_class import SloClass
from telemetry.admission_metrics import AdmissionMetrics
from telemetry.speculation_metrics import SpeculationMetrics
from telemetry.structured_metrics import StructuredMetrics
from telemetry.window import meets_slo

P = "autotuned:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0,
                   3.0, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MAX_IGNORED_FIELD_LABELS = 100   # clients name the fields: past this many, further names count as "_other"


class PrometheusMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry | None = None, slo: SloClass | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        labels = ["model_name"]
        per_request = labels + ["slo_class"]    # request-level series, split by the request's SLO class
        self._model = model_name
        self._slo = slo or SloClass()                # judges records that carry no class targets
        self.running = Gauge(P + "num_requests_running", "Requests holding KV and being computed.", labels, registry=r)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests queued, not yet admitted.", labels, registry=r)
        self.kv_usage = Gauge(P + "kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).", labels, registry=r)
        self.preemptions = Counter(P + "num_preemptions", "Requests preempted (KV freed, recomputed later).",
                                   labels, registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prefill tokens computed (recompute included).",
                                     labels, registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Output tokens generated (accepted drafted "
                                         "tokens and grammar-forced ones included).", labels, registry=r)
        self.iteration_tokens = Histogram(P + "iteration_tokens_total", "Tokens computed per engine step.",
                                          labels, buckets=TOKEN_BUCKETS, registry=r)
        self.step_tokens = Counter(P + "step_tokens", "Tokens computed, by kind.", labels + ["kind"], registry=r)
        self.step_seconds = Histogram(P + "step_duration_seconds", "Engine step wall time.", labels,
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first token.", per_request,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Gap between consecutive tokens (TBT).",
                             per_request, buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "request_time_per_output_token_seconds", "Mean decode time per output token.",
                              per_request, buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to finish.", per_request,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.finished = Counter(P + "request_success", "Finished requests by reason.",
                                per_request + ["finished_reason"], registry=r)
        self.goodput = Counter(P + "request_goodput", "Finished requests that met their SLO class's TTFT and "
                               "TBT targets.", per_request, registry=r)
        self.prompt_len = Histogram(P + "request_prompt_tokens", "Prompt length of arriving requests.", labels,
                                    buckets=TOKEN_BUCKETS, registry=r)
        self.token_ratio = Gauge(P + "input_output_token_ratio", "EWMA of prompt:output tokens of finished "
                                 "requests.", labels, registry=r)
        self.arrival_rate = Gauge(P + "arrival_rate_rps", "EWMA of the request arrival rate.", labels, registry=r)
        self.mfu = Gauge(P + "model_flops_utilization", "Model FLOP/s over the device peak, last window.", labels,
                         registry=r)
        self.mbu = Gauge(P + "model_bandwidth_utilization", "Model bytes/s over the device peak, last window.",
                         labels, registry=r)
        self.knob = Gauge(P + "knob", "Current scheduler knob values.", labels + ["knob"], registry=r)
        self.knobs_version = Gauge(P + "knobs_version", "Version of the knobs in force.", labels, registry=r)
        self.policy = Gauge(P + "policy_info", "1 for the scheduling policy in force.", labels + ["policy"], registry=r)
        self.cache_queries = Counter(P + "prefix_cache_queries", "Prompt tokens of admitted requests looked up in "
                                     "the prefix cache (first admissions).", labels, registry=r)
        self.cache_hits = Counter(P + "prefix_cache_hits", "Of those, tokens found cached (not recomputed).",
                                  labels, registry=r)
        self.cache_evictions = Counter(P + "prefix_cache_evictions", "Cached KV blocks reused for other content.",
                                       labels, registry=r)
        self.cached_blocks = Gauge(P + "prefix_cache_blocks", "KV blocks holding reusable prefix content.", labels,
                                   registry=r)
        self.hardware = Gauge(P + "device_sample", "Latest device sample (NVML or CPU).", labels + ["metric"],
                              registry=r)
        self.ignored_fields = Counter(P + "ignored_request_fields", "Request fields accepted without effect "
                                      "(outside the served schema, or ignored with a non-default value).",
                                      labels + ["field"], registry=r)
        self.structured = StructuredMetrics(model_name, r)
        self.admission = AdmissionMetrics(model_name, r)
        self.speculation = SpeculationMetrics(model_name, r)
        self._ignored_names: set[str] = set()
        self._ewma_ratio: float | None = None
        self._ewma_rate: float | None = None
        self._last_arrival: float | None = None

    def on_step(self, s: StepRecord) -> None:
        m = self._model
        self.running.labels(m).set(s.num_running)
        self.waiting.labels(m).set(s.num_waiting)
        self.kv_usage.labels(m).set(s.kv_usage)
        self.preemptions.labels(m).inc(s.num_preempted)
        self.prompt_tokens.labels(m).inc(s.num_prefill_tokens)
        self.generation_tokens.labels(m).inc(s.num_sampled + s.forced_tokens + s.kept_draft_tokens)
        self.iteration_tokens.labels(m).observe(s.num_prefill_tokens + s.num_decode_tokens)
        self.step_tokens.labels(m, "prefill").inc(s.num_prefill_tokens)
        self.step_tokens.labels(m, "decode").inc(s.num_decode_tokens)
        self.step_seconds.labels(m).observe(s.duration_s)
        self.cache_queries.labels(m).inc(s.prefix_cache_queries)
        self.cache_hits.labels(m).inc(s.prefix_cache_hits)
        self.cache_evictions.labels(m).inc(s.prefix_cache_evictions)
        self.cached_blocks.labels(m).set(s.prefix_cache_blocks)
        self.structured.on_step(s)
        self.speculation.on_step(s)

    def read_live(self, running, waiting, kv_usage) -> None:
        """Read the engine's state gauges when scraped rather than at each step: a request aborted between
        steps (a client gone) frees its KV with no step after it, and a drained daemon went on showing
        that KV in use."""
        m = self._model
        self.running.labels(m).set_function(running)
        self.waiting.labels(m).set_function(waiting)
        self.kv_usage.labels(m).set_function(kv_usage)

    def on_arrival(self, request: Request) -> None:
        self.prompt_len.labels(self._model).observe(request.num_prompt_tokens)
        self.structured.on_arrival(request)
        t = request.arrival_time
        if self._last_arrival is not None and t > self._last_arrival:
            self._ewma_rate = _ewma(self._ewma_rate, 1.0 / (t - self._last_arrival), 0.1)
            self.arrival_rate.labels(self._model).set(self._ewma_rate)
        self._last_arrival = t

    def count_ignored_field(self, field: str) -> None:
        """One request carried `field` to no effect (serving/request_fields.py)."""
        field = field[:64]
        if field not in self._ignored_names:
            if len(self._ignored_names) >= MAX_IGNORED_FIELD_LABELS:
                field = "_other"
            self._ignored_names.add(field)
        self.ignored_fields.labels(self._model, field).inc()

    def count_tool_call_failure(self, parser: str, count: int = 1) -> None:
        """A reply's tool-call markers whose call did not parse (serving/tool_replies.py)."""
        self.structured.count_tool_call_failure(parser, count)

    def on_finish(self, r: RequestRecord) -> None:
        self.structured.on_finish(r)
        m, c = self._model, r.slo_class
        self.finished.labels(m, c, r.finish_reason).inc()
        goodput = self.goodput.labels(m, c)    # created at 0, so a class with no good request still shows
        if meets_slo(r, self._slo):
            goodput.inc()
        self.e2e.labels(m, c).observe(r.e2e_s)
        if r.ttft_s is not None:
            self.ttft.labels(m, c).observe(r.ttft_s)
        for gap in r.tbt_s:
            self.itl.labels(m, c).observe(gap)
        if r.tpot_s is not None:
            self.tpot.labels(m, c).observe(r.tpot_s)
        if r.num_output_tokens:
            self._ewma_ratio = _ewma(self._ewma_ratio, r.num_prompt_tokens / r.num_output_tokens, 0.1)
            self.token_ratio.labels(m).set(self._ewma_ratio)

    def set_scheduler(self, policy: str, knobs: Knobs) -> None:
        m = self._model
        for name in KNOB_SPECS:
            value = getattr(knobs, name)
            if isinstance(value, (int, float)):
                self.knob.labels(m, name).set(value)
        self.knobs_version.labels(m).set(knobs.version)
        self.policy.clear()
        self.policy.labels(m, policy).set(1)

    def set_utilisation(self, mfu: float | None, mbu: float | None) -> None:
        if mfu is not None:
            self.mfu.labels(self._model).set(mfu)
        if mbu is not None:
            self.mbu.labels(self._model).set(mbu)

    def set_hardware(self, sample: dict[str, float]) -> None:
        for name, value in sample.items():
            self.hardware.labels(self._model, name).set(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _ewma(previous: float | None, value: float, alpha: float) -> float:
    return value if previous is None else (1 - alpha) * previous + alpha * value
