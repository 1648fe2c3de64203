"""Constrained rows are priced in the step: the deadline policy and the simulator add each masked row's
measured time, the live cost model learns that time from the engine's steps, and workloads carry it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.outputs import StepRecord
import yaml

from loadgen.workload import RequestSpec, generate, parse_workload
from policies import Knobs
from policies.deadline import StepTime
from simulation.cost_model import FEATURES, CostModel, StepShape
from simulation.live_cost_model import MIN_GRAMMAR_STEPS, LiveCostModel
from simulation.simulator import Simulator


def cost(grammar_row_s: float = 0.0) -> CostModel:
    # 10 ms a step + 1 ms a token
    return CostModel((0.01, 0.001) + (0.0,) * (len(FEATURES) - 2), kv_blocks=256, block_size=4,
                     grammar_row_s=grammar_row_s)


class Seq:
    def __init__(self, constrained: bool) -> None:
        self.num_computed_tokens, self.num_tokens, self.num_prompt_tokens = 10, 11, 5
        self.last_token_time, self.tbt_target_s, self.scores_prompt = None, 0.1, False
        self.grammar = object() if constrained else None


def test_the_step_time_adds_each_constrained_rows_mask():
    plain, masked = StepTime(cost(0.002)), StepTime(cost(0.002))
    plain.add_decodes([Seq(False)] * 4, 0.0)
    masked.add_decodes([Seq(True)] * 3 + [Seq(False)], 0.0)
    assert masked.seconds() - plain.seconds() == pytest.approx(3 * 0.002)
    constrained, free = Seq(True), Seq(False)
    constrained.num_computed_tokens = free.num_computed_tokens = 0
    # a prompt chunk that reaches its last token samples one masked row; one that stops short samples none
    assert plain.with_chunk(constrained, 11) - plain.with_chunk(free, 11) == pytest.approx(0.002)
    assert plain.with_chunk(constrained, 5) == pytest.approx(plain.with_chunk(free, 5))


def test_a_shape_with_constrained_rows_costs_their_masks():
    shape = StepShape(0, 8, 8, 80, 80, 8)
    assert cost(0.001).predict(replace(shape, grammar_rows=8)) - cost(0.001).predict(shape) == pytest.approx(0.008)


def record(step: int, rows: int, mask_s: float) -> StepRecord:
    return StepRecord(step, 0.0, 0.02, 0, 4, 0, 4, 0, 0, 0.1, 40, 40, 4, 0.0, 0.02, 0.0, 0.0, "deadline", 0,
                      grammar_rows=rows, mask_s=mask_s)


def test_the_live_model_learns_the_mask_time_per_row():
    live = LiveCostModel(cost())
    for i in range(MIN_GRAMMAR_STEPS - 1):
        live.on_step(record(i, 2, 0.004))
    assert live.grammar_row_s() == 0.0                       # too few constrained steps to go by
    for i in range(MIN_GRAMMAR_STEPS):
        live.on_step(record(100 + i, 4, 0.004))
        live.on_step(record(200 + i, 0, 0.0))                # steps without constrained rows say nothing
    assert live.grammar_row_s() == pytest.approx(0.001)
    assert live.current().grammar_row_s == pytest.approx(0.001)


WORKLOAD = """
phases:
  - name: chat
    streams:
      - {name: text, lengths: {kind: fixed, prompt: 64, output: 32}}
      - {name: json, lengths: {kind: fixed, prompt: 64, output: 32}, constrained: true}
"""


def run(specs: list[RequestSpec], grammar_row_s: float):
    sim = Simulator(cost(grammar_row_s), 256, 4, "deadline", Knobs(token_budget=256))
    records, steps = [], []
    sim.finish_listeners.append(records.append)
    sim.step_listeners.append(steps.append)
    sim.submit(specs)
    sim.run()
    return records, steps


def test_the_simulator_runs_constrained_traffic_at_its_price():
    specs = generate(parse_workload("half-constrained", yaml.safe_load(WORKLOAD), "."), qps=4.0, num_requests=40,
                     seed=3)
    assert {s.constrained for s in specs} == {True, False}
    free, free_steps = run(specs, 0.0)
    priced, priced_steps = run(specs, 0.005)
    assert len(free) == len(priced) == 40
    assert sum(s.grammar_rows for s in priced_steps) == sum(s.output_tokens for s in specs if s.constrained)
    assert np.median([g for r in priced for g in r.tbt_s]) > np.median([g for r in free for g in r.tbt_s])
