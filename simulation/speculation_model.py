"""Speculative decoding in the simulator: how often a decode has a draft, and how much of it survives.

No tokens exist in a simulated run, so the drafter is a stand-in: a decode finds a proposal with the
workload's `match_rate` (prompt lookup finds an earlier occurrence of the last tokens), and a verified
draft keeps each token with probability `acceptance` until the first rejection (the geometric run
length the live acceptance estimate assumes, engine/speculation/acceptance.py). The real speculator
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
    acceptance: float        # chance each drafted token is kept, given those before it were

    def __post_init__(self) -> None:
        if not (0 <= self.match_rate <= 1 and 0 <= self.acceptance <= 1):
            raise ValueError(f"match_rate and acceptance must be in [0, 1], got {self.match_rate}, {self.acceptance}")


def workload_speculation(workload: str, path: Path = SPECULATION_FILE) -> SpeculationModel:
    """The measured model configs/speculation.yaml gives a workload preset (its `default` where it names
    none), read from the results file it names."""
    config = yaml.safe_load(path.read_text())
    measured = json.loads((ROOT / config["source"]).read_text())["workloads"]
    names = config["workloads"]
    entry = measured[names.get(workload, names["default"])]
    return SpeculationModel(float(entry["match_rate"]), float(entry["acceptance"]))


class SimulatedDrafter:
    """The speculator's drafter in a simulated run: placeholder tokens, with the model's match rate; and
    each verification's kept count drawn from its acceptance."""

    name = "simulated"

    def __init__(self, model: SpeculationModel, seed: int = 0) -> None:
        self.model = model
        self._rng = random.Random(seed)

    def propose(self, request_id: str, prompt: Sequence[int], output: Sequence[int], k: int) -> list[int]:
        if k <= 0 or self._rng.random() >= self.model.match_rate:
            return []
        return [0] * k

    def kept(self, drafted: int) -> int:
        kept = 0
        while kept < drafted and self._rng.random() < self.model.acceptance:
            kept += 1
        return kept

    def forget(self, request_id: str) -> None:
        pass
