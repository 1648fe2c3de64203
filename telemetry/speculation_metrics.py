"""Prometheus series of speculative decoding (engine/speculation/), under vLLM's spec-decode counter names:
how many decodes verified drafts, how many drafted tokens they verified and how many of those the target
model kept. The acceptance rate is accepted / draft tokens and the mean accepted length per draft
accepted / drafts, both as rates of these counters; the histograms show how the load spreads them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from engine.outputs import StepRecord

P = "autotuned:"
STEP_DRAFT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
PER_DRAFT_BUCKETS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)   # speculative_tokens is at most 16


class SpeculationMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        labels, r = ["model_name"], registry
        self._model = model_name
        self.drafts = Counter(P + "spec_decode_num_drafts", "Decodes that verified drafted tokens, once per step "
                              "each (speculative decoding).", labels, registry=r)
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Drafted tokens verified (each one more "
                                    "decode row of its request).", labels, registry=r)
        self.accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens", "Drafted tokens accepted (the target "
                                       "model's own sample at the position agreed), each one output token more.", labels, registry=r)
        self.step_draft_tokens = Histogram(P + "spec_decode_draft_tokens_per_step", "Drafted tokens verified in "
                                           "an engine step, steps that verified any.", labels,
                                           buckets=STEP_DRAFT_BUCKETS, registry=r)
        self.accepted_per_draft = Histogram(P + "spec_decode_accepted_tokens_per_draft", "A step's accepted "
                                            "tokens over its decodes that verified drafts (the step's mean, not "
                                            "each request's), steps that verified any.", labels,
                                            buckets=PER_DRAFT_BUCKETS, registry=r)

    def on_step(self, s: StepRecord) -> None:
        if not s.draft_seqs:
            return
        m = self._model
        self.drafts.labels(m).inc(s.draft_seqs)
        self.draft_tokens.labels(m).inc(s.draft_tokens)
        self.accepted_tokens.labels(m).inc(s.kept_draft_tokens)
        self.step_draft_tokens.labels(m).observe(s.draft_tokens)
        self.accepted_per_draft.labels(m).observe(s.kept_draft_tokens / s.draft_seqs)
