"""Pure batch-formation policies: (scheduler view, knobs) -> batch plan. No torch, no I/O."""

from policies.knobs import Knobs
from policies.plan import BatchPlan, ScheduledChunk
from policies.registry import DEFAULT_POLICY, POLICIES, get_policy
from policies.view import SchedulerView, SequenceState

__all__ = ["Knobs", "BatchPlan", "ScheduledChunk", "DEFAULT_POLICY", "POLICIES", "get_policy", "SchedulerView", "SequenceState"]
