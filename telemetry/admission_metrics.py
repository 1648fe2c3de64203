"""Prometheus series of admission (engine/scheduling/admission.py): what overload shed, by class and
reason, and how well the TTFT it predicts at admission matches the TTFT then observed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

P = "autotuned:"
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class AdmissionMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        labels, r = ["model_name"], registry
        self._model = model_name
        self.shed = Counter(P + "requests_shed", "Requests answered 429 by admission, by SLO class and reason "
                            "(predicted_ttft: refused on arrival; expired: ended in the queue past its TTFT "
                            "deadline; queue_full: max_waiting reached).", labels + ["slo_class", "reason"],
                            registry=r)
        self.predicted = Histogram(P + "admission_predicted_ttft_seconds", "TTFT admission predicted for the "
                                   "requests it admitted whose first token then came.", labels,
                                   buckets=TTFT_BUCKETS, registry=r)
        self.ratio = Histogram(P + "admission_ttft_ratio", "Observed / predicted TTFT of admitted requests.",
                               labels, buckets=RATIO_BUCKETS, registry=r)
        self.correction = Gauge(P + "admission_ttft_correction", "The factor admission's predictions are scaled "
                                "by, learned from observed TTFTs (their 90th percentile over predicted).", labels,
                                registry=r)

    def on_shed(self, slo_class: str, reason: str) -> None:
        self.shed.labels(self._model, slo_class, reason).inc()

    def on_observed(self, predicted: float, observed: float, correction: float) -> None:
        self.predicted.labels(self._model).observe(predicted)
        self.ratio.labels(self._model).observe(observed / predicted if predicted > 0 else RATIO_BUCKETS[-1])
        self.correction.labels(self._model).set(correction)
