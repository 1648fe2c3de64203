"""Speculative decoding in the simulator: how often a decode has a draft, and how much of it survives.

No tokens exist in a simulated run, so the drafter is a stand-in: a decode finds a proposal with the
workload's `match_rate` (prompt lookup finds an earlier occurrence of the last tokens), and a verified
draft keeps its j-th token, given the ones before it, with the measured chance at position j after a
request's run that held (its previous verification kept all it drafted) or broke: runs of kept drafts
as the live ones, long where the output copies its input (the run-length model of the live estimate,
engine/speculation/acceptance.py). Past the measured positions the last one's chance holds; without
measured positions, every token is kept with `acceptance` (a geometric run). The real speculator
then picks each step's lengths with the real pricing (policies/draft_lengths.py), so the simulator
shows where the choice pays on each hardware profile. The parameters come from live runs
(configs/speculation.yaml, each with the results file it was read from)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPECULATION_FILE = ROOT / "configs" / "speculation.yaml"


@dataclass(frozen=True)
class SpeculationModel:
    match_rate: float        # share of decode steps at which the drafter has a proposal
    acceptance: float        # chance each drafted token is kept, given those before it were (geometric)
    held: tuple[float, ...] = ()     # per drafted position: that chance after a run that held
    broken: tuple[float, ...] = ()   # and after one that broke (or a request's first)

    def __post_init__(self) -> None:
        chances = (self.match_rate, self.acceptance, *self.held, *self.broken)
        if not all(0 <= p <= 1 for p in chances):
            raise ValueError(f"match rate and chances must be in [0, 1], got {chances}")

    def chance(self, held: bool, position: int) -> float:
        """The chance drafted token `position` (from 1) is kept, given the ones before it were."""
        chances = self.held if held else self.broken
        if not chances:
            return self.acceptance
        return chances[min(position, len(chances)) - 1]


def workload_speculation(workload: str, path: Path = SPECULATION_FILE) -> SpeculationModel:
    """The measured model configs/speculation.yaml gives a workload preset (its `default` where it names
    none), read from the results file it names."""
    config = yaml.safe_load(path.read_text())
    measured = json.loads((ROOT / config["source"]).read_text())["workloads"]
    names = config["workloads"]
    entry = measured[names.get(workload, names["default"])]
    hazards = entry.get("hazards", {})
    return SpeculationModel(float(entry["match_rate"]), float(entry["acceptance"]),
                            tuple(hazards.get("held", ())), tuple(hazards.get("broken", ())))


class SimulatedDrafter:
    """The speculator's drafter in a simulated run: placeholder tokens, with the model's match rate; and
    each verification's kept count drawn from its chances, by whether the request's last run held."""

    name = "simulated"

    def __init__(self, model: SpeculationModel, seed: int = 0) -> None:
        self.model = model
        self._rng = random.Random(seed)
        self._held: dict[str, bool] = {}

    def propose(self, request_id: str, prompt: Sequence[int], output: Sequence[int], k: int) -> list[int]:
        if k <= 0 or self._rng.random() >= self.model.match_rate:
            return []
        return [0] * k

    def kept(self, request_id: str, drafted: int) -> int:
        held = self._held.get(request_id, False)
        kept = 0
        while kept < drafted and self._rng.random() < self.model.chance(held, kept + 1):
            kept += 1
        self._held[request_id] = kept >= drafted
        return kept

    def forget(self, request_id: str) -> None:
        self._held.pop(request_id, None)
