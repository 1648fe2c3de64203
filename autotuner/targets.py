"""The two things the controller can tune: the simulator (it advances the virtual clock itself) and
the live engine (real time passes while it sleeps)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from engine.llm_engine import LLMEngine
from simulation.simulator import Simulator
from policies import Knobs
from telemetry.window import Arrival, TelemetryWindow, WindowSummary


@dataclass(frozen=True)
class ConfigurationChange:
    """A configuration the controller applied that differs from the one the engine held."""
    at_s: float
    policy: str
    knobs: Knobs


class SimulatedTarget:
    def __init__(self, sim: Simulator, telemetry: TelemetryWindow) -> None:
        self.sim, self.telemetry = sim, telemetry
        self.changes: list[ConfigurationChange] = []     # simulated time: when a tuned run left its start
        sim.step_listeners.append(telemetry.on_step)
        sim.finish_listeners.append(telemetry.on_finish)
        sim.arrival_listeners.append(lambda r: telemetry.on_arrival(
            Arrival(r.arrival_time, r.num_prompt_tokens, r.params.max_tokens)))

    def now(self) -> float:
        return self.sim.now

    def wait(self, seconds: float) -> None:
        self.sim.run_until(self.sim.now + seconds)

    def window(self, seconds: float) -> WindowSummary:
        return self.telemetry.window(seconds, now=self.sim.now)

    def knobs(self) -> Knobs:
        return self.sim.scheduler.latest_knobs

    def policy(self) -> str:
        return self.sim.scheduler.latest_policy

    def apply(self, policy: str, knobs: Knobs) -> None:
        if (policy, knobs) != (self.policy(), self.knobs()):
            self.changes.append(ConfigurationChange(self.sim.now, policy, knobs))
        self.sim.scheduler.set_policy(policy)
        self.sim.scheduler.set_knobs(knobs)


class EngineTarget:
    """Knob changes go through the engine's validation and land at its next step boundary; the
    controller's thread never touches anything else of the engine."""

    def __init__(self, engine: LLMEngine, telemetry: TelemetryWindow, stop: threading.Event) -> None:
        self.engine, self.telemetry, self.stop = engine, telemetry, stop

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise InterruptedError("tuner stopping")

    def window(self, seconds: float) -> WindowSummary:
        return self.telemetry.window(seconds)

    def knobs(self) -> Knobs:
        return self.engine.scheduler.latest_knobs

    def policy(self) -> str:
        return self.engine.scheduler.latest_policy

    def apply(self, policy: str, knobs: Knobs) -> None:
        self.engine.check_knobs(knobs)
        if policy != self.engine.scheduler.policy.name:
            self.engine.set_policy(policy)
        self.engine.scheduler.set_knobs(knobs)
