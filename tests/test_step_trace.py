"""tests/step_trace.py: a request's logits are compared up to and including the step where its token first differs."""

import torch

from tests.step_trace import TracedStep, errors_while_histories_agree, top2_margin


def step(tokens: dict[int, int], rows: dict[int, list[float]], all_decode: bool = True) -> TracedStep:
    return TracedStep(all_decode, tokens, {i: torch.tensor(r) for i, r in rows.items()})


def test_a_parted_request_is_compared_no_further():
    ref = [step({0: 1, 1: 0}, {0: [0.0, 2.0], 1: [2.0, 1.99]}, all_decode=False),
           step({0: 1, 1: 0}, {0: [0.0, 3.0], 1: [5.0, 0.0]})]
    got = [step({0: 1, 1: 1}, {0: [0.0, 2.0], 1: [1.99, 2.0]}, all_decode=False),   # request 1 flips a near tie
           step({0: 0, 1: 1}, {0: [9.0, 0.0], 1: [0.0, 5.0]})]                        # request 0 really differs
    rows = errors_while_histories_agree(got, ref)
    assert [(r.step, r.prompt, r.same_token) for r in rows] == [(0, 0, True), (0, 1, False), (1, 0, False)]
    assert rows[1].error < 0.01 and not rows[1].all_decode
    assert rows[2].error > 1 and rows[2].all_decode
    assert abs(top2_margin(ref[0].logits[1]) - 0.01) < 1e-6
