"""The scheduler's tunable knobs: one frozen, validated value with a version number.

Every policy reads the same Knobs; each policy names the subset it uses (`Policy.knobs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnobSpec:
    kind: type                       # int, float or str
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    help: str = ""

    def check(self, name: str, value: Any) -> None:
        if self.kind is str:
            if value not in self.choices:
                raise ValueError(f"knob {name}={value!r} must be one of {', '.join(self.choices)} ({self.help})")
            return
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind is int:
            ok_type = ok_type and float(value).is_integer()
        if not ok_type or not self.low <= value <= self.high:
            raise ValueError(f"knob {name}={value!r} must be a{'n integer' if self.kind is int else ' number'} "
                             f"in [{self.low:g}, {self.high:g}] ({self.help})")

    def describe(self) -> str:
        return "|".join(self.choices) if self.kind is str else f"[{self.low:g}, {self.high:g}]"


KNOB_SPECS: dict[str, KnobSpec] = {
    "token_budget": KnobSpec(int, 1, 65536, help="most tokens (decodes + prefill chunks) computed in one step"),
    "max_num_seqs": KnobSpec(int, 1, 4096, help="most requests running (holding KV) at once"),
    "prefill_priority": KnobSpec(float, 0, 1, help="share of the budget prefill chunks may take before waiting "
                                 "decodes: 0 = decodes always first, 1 = prefills first"),
    "max_partial_prefills": KnobSpec(int, 1, 1024, help="most requests part-way through their prefill at once"),
    "long_prefill_token_threshold": KnobSpec(int, 0, 65536, help="largest prefill chunk one request gets per "
                                             "step; 0 = no cap beyond the budget"),
    "kv_admission_watermark": KnobSpec(float, 0, 0.5, help="fraction of KV blocks that must stay free after "
                                       "admitting a request"),
    "new_token_ratio": KnobSpec(float, 0, 1, help="fraction of running requests' remaining output tokens "
                                "whose KV is reserved before admitting more (SGLang's new_token_ratio)"),
    "kv_high_watermark": KnobSpec(float, 0.05, 1, help="KV usage at which prefill-priority turns to decodes first"),
    "kv_low_watermark": KnobSpec(float, 0, 1, help="KV usage below which prefill-priority admits again"),
    "step_headroom": KnobSpec(float, 0.1, 2, help="share of the tightest running decode's TBT slack a step's "
                              "predicted time may fill (deadline policy)"),
    "ttft_pace": KnobSpec(float, 0, 64, help="prefill no faster than this many times the rate the waiting "
                          "prompts' TTFT deadlines need; 0 = as fast as the TBT slack allows (deadline policy)"),
    "error_budget": KnobSpec(float, 0, 1, help="share of the long token gaps the TBT percentile tolerates that "
                             "steps may spend on prompts whose TTFT is at risk (deadline policy)"),
    "admission_slack": KnobSpec(float, 0, 4, help="refuse (429) a request whose predicted TTFT exceeds this many "
                                "times its class's TTFT target; 0 = admit everything the queue bound allows"),
    "speculative_tokens": KnobSpec(int, 0, 16, help="most drafted tokens one decode verifies in a step "
                                   "(speculative decoding); 0 = none"),
    "speculative_mode": KnobSpec(str, choices=("adaptive", "fixed"), help="adaptive: each step drafts only the "
                                 "rows that raise expected tokens per second within the TBT slack; fixed: every "
                                 "decode verifies all its drafter offers"),
    "acceptance_prior": KnobSpec(float, 0, 1, help="chance a drafted token is kept, assumed before any "
                                 "verification has been seen"),
    "acceptance_decay": KnobSpec(float, 0, 0.99, help="weight a past verification keeps per new one in the "
                                 "acceptance estimates"),
    "queue_order": KnobSpec(str, choices=("fcfs", "spf"), help="waiting queue order: first come first served, "
                            "or shortest prompt first"),
}


@dataclass(frozen=True)
class Knobs:
    token_budget: int = 2048        # under the default deadline policy a cap: steps are sized by time
    max_num_seqs: int = 256
    prefill_priority: float = 0.0
    max_partial_prefills: int = 4
    long_prefill_token_threshold: int = 0
    kv_admission_watermark: float = 0.01
    new_token_ratio: float = 0.0
    kv_high_watermark: float = 0.9
    kv_low_watermark: float = 0.7
    queue_order: str = "fcfs"
    step_headroom: float = 0.9
    error_budget: float = 0.5
    ttft_pace: float = 0.0
    admission_slack: float = 0.0     # the daemon serves with 1.0 (DAEMON_KNOBS)
    speculative_tokens: int = 0
    speculative_mode: str = "adaptive"
    acceptance_prior: float = 0.5
    acceptance_decay: float = 0.9
    version: int = 0

    def __post_init__(self) -> None:
        for name, spec in KNOB_SPECS.items():
            spec.check(name, getattr(self, name))
        if self.kv_low_watermark > self.kv_high_watermark:
            raise ValueError(f"kv_low_watermark {self.kv_low_watermark} is above kv_high_watermark "
                             f"{self.kv_high_watermark}")

    def replace(self, **changes: Any) -> "Knobs":
        """A new validated Knobs with the next version number; unknown names are rejected."""
        unknown = set(changes) - set(KNOB_SPECS)
        if unknown:
            raise ValueError(f"unknown knob(s): {', '.join(sorted(unknown))}; known: {', '.join(KNOB_SPECS)}")
        return dataclasses.replace(self, **changes, version=self.version + 1)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# the daemon's knobs where they differ from Knobs(): it sheds what cannot make its SLO (engine/scheduling/
# admission.py) and drafts; the engine as a library and the simulator admit everything and draft nothing
# unless told. The tuner's "shipped defaults" are these (autotuner/search_space.py).
DAEMON_KNOBS: dict[str, Any] = {"admission_slack": 1.0, "speculative_tokens": 8}
