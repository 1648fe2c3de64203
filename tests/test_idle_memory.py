"""An idle engine gives back what its steps left behind (engine/idle_memory.py): once per idle spell, from
the engine loop, never between the steps of a busy one."""

from __future__ import annotations

import threading
import time

from engine import SamplingParams
from serving import engine_loop
from serving.engine_loop import EngineLoop
from tests.conftest import make_engine


def serve_one(loop: EngineLoop, prompt: list[int]) -> None:
    done = threading.Event()
    request = loop.engine.make_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    loop.submit(request, lambda out: out.finished and done.set())
    assert done.wait(30)


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_loop_gives_memory_back_once_per_idle_spell(tiny_hf, monkeypatch):
    monkeypatch.setattr(engine_loop, "IDLE_WAIT_S", 0.05)
    engine = make_engine(tiny_hf[0])
    released = []
    engine.release_idle_memory = lambda: released.append(time.monotonic())
    loop = EngineLoop(engine, max_waiting=8)
    loop.start()
    try:
        wait_until(lambda: len(released) == 1)     # what the start-up left behind
        time.sleep(0.3)                            # still idle: not again
        assert len(released) == 1
        serve_one(loop, [5, 6, 7])
        wait_until(lambda: len(released) == 2)
        time.sleep(0.3)
        assert len(released) == 2
        serve_one(loop, [8, 9])
        wait_until(lambda: len(released) == 3)
    finally:
        loop.stop()


def test_the_loop_waits_a_whole_idle_wait_before_giving_back(tiny_hf, monkeypatch):
    """Not between the steps of a request, nor as soon as it is done: the next one may be on its way."""
    monkeypatch.setattr(engine_loop, "IDLE_WAIT_S", 0.3)
    engine = make_engine(tiny_hf[0])
    released, steps = [], []
    engine.release_idle_memory = lambda: released.append((time.monotonic(), len(steps)))
    engine.step_listeners.append(lambda record: steps.append(1))
    loop = EngineLoop(engine, max_waiting=8)
    loop.start()
    try:
        wait_until(lambda: len(released) == 1)     # what the start-up left behind
        finished_at = []
        request = engine.make_request([5, 6, 7], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
        loop.submit(request, lambda out: out.finished and finished_at.append(time.monotonic()))
        wait_until(lambda: len(released) == 2)
        at, steps_then = released[1]
        assert steps_then == len(steps) >= 40 and at - finished_at[0] >= 0.25
    finally:
        loop.stop()


def test_release_idle_memory_drops_the_kernels_scratch():
    """The quantized path's scratch buffers (up to 32 MB of bf16 and 16 MB of fp32 per thread) go; the
    next step that needs one allocates it again and computes the same."""
    from engine.model.checkpoint import bundled_model_path
    engine = make_engine(bundled_model_path(), weights="quantized", quantized_max_rows=1)
    kernels = engine.runner.quantized_path.kernels
    engine.add_request(list(range(100, 140)), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    first = [o.token_ids for o in run(engine)]
    assert vars(kernels._scratch)                # the dense path (steps above 1 row) took a buffer
    engine.release_idle_memory()
    assert not vars(kernels._scratch)
    engine.add_request(list(range(100, 140)), SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    again = [o.token_ids for o in run(engine)]
    assert again == first and vars(kernels._scratch)


def run(engine) -> list:
    finished = []
    while engine.has_unfinished():
        finished += [o for o in engine.step() if o.finished]
    return finished

