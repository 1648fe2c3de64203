"""Prometheus series of constrained decoding and tool calls: how much traffic is held to a grammar, what the
grammars cost (compiles, per-step masks), what jump-forward saved, and replies whose calls did not parse."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.outputs import RequestRecord, StepRecord
from engine.scheduling.request import Request

P = "autotuned:"
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MASK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class StructuredMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        labels, r = ["model_name"], registry
        self._model = model_name
        self.requests = Counter(P + "constrained_requests", "Requests whose output is held to a grammar, by the "
                                "constraint's kind.", labels + ["kind"], registry=r)
        self.tokens = Counter(P + "constrained_tokens", "Output tokens of constrained requests (forced ones "
                              "included).", labels, registry=r)
        self.compile_seconds = Histogram(P + "grammar_compile_seconds", "Grammar compile time on the compile "
                                         "worker (cache hits not counted).", labels + ["kind"],
                                         buckets=COMPILE_BUCKETS, registry=r)
        self.mask_seconds = Histogram(P + "grammar_mask_seconds", "Time filling a step's grammar masks, steps "
                                      "with constrained rows only.", labels, buckets=MASK_BUCKETS, registry=r)
        self.jump_forward = Counter(P + "jump_forward_tokens", "Tokens a grammar forced, emitted without a "
                                    "decode step each.", labels, registry=r)
        self.tool_parse_failures = Counter(P + "tool_call_parse_failures", "Tool-call markers in replies whose "
                                           "call did not parse (left in the content), by parser.",
                                           labels + ["parser"], registry=r)

    def on_step(self, s: StepRecord) -> None:
        if s.grammar_rows:
            self.mask_seconds.labels(self._model).observe(s.mask_s)
        if s.forced_tokens:
            self.jump_forward.labels(self._model).inc(s.forced_tokens)

    def on_arrival(self, request: Request) -> None:
        if request.grammar is not None:
            self.requests.labels(self._model, request.grammar.compiled.constraint.kind.value).inc()

    def on_finish(self, r: RequestRecord) -> None:
        if r.constrained:
            self.tokens.labels(self._model).inc(r.num_output_tokens)

    def on_compiled(self, kind: str, seconds: float) -> None:
        self.compile_seconds.labels(self._model, kind).observe(seconds)

    def count_tool_call_failure(self, parser: str, count: int = 1) -> None:
        self.tool_parse_failures.labels(self._model, parser).inc(count)
