"""Shared pieces of the benchmark scripts: the machine description and the prompt builder.

The scripts import this module by name, which works because Python puts a script's own folder
first on sys.path when it runs `python benchmarks/NAME.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

import results_file
import engine  # noqa: F401  (before torch: it sets torch's OpenMP threads to sleep between ops)
import torch

from telemetry.other_load import OtherLoad  # noqa: F401  (re-exported for the scripts)

T = TypeVar("T")

# Plain English prose (written for this repository) that prompts are cut from.
PASSAGE = """\
The harbour town woke slowly on winter mornings. Long before the sun cleared the hills, the bakers \
had lit their ovens, and the smell of bread drifted down the narrow streets towards the water, where \
the fishing boats rocked against the quay. The fishermen talked in low voices as they loaded their \
nets, comparing the weather of the past week with what the old barometer outside the harbour office \
promised for the next. Most of them had learned the trade from their fathers, and a few from their \
mothers, who had kept the accounts, mended the sails and known the price of every fish on the coast.

By eight o'clock the market square was full. Farmers from the valley brought potatoes, cabbages and \
apples stored since the autumn; a woman from the next village sold honey in glass jars with hand-written \
labels; and the schoolchildren, late as always, ran between the stalls with their satchels bouncing on \
their backs. The church clock, which had not kept good time for as long as anyone could remember, struck \
nine at a quarter past eight, and nobody paid it any attention.

The town had not always been so quiet. A century earlier it had been a busy port, sending timber, wool \
and salted fish to cities across the sea, and the grand houses along the upper road still showed the \
wealth that trade had brought. When the railway arrived, however, the merchants moved their business to \
the larger harbour in the south, where the new steamships could dock at any tide. The warehouses by the \
river were left empty, their windows broken and their doors nailed shut, until a group of young artists \
rented them for almost nothing and turned them into studios, workshops and a small theatre.

Visitors came in the summer to walk along the cliffs, to watch the seabirds nesting on the rocks, and to \
eat fried fish on the harbour wall while the gulls waited for their share. In the evenings they gathered \
in the old inn, where the landlord told stories about smugglers, shipwrecks and a lighthouse keeper who \
had once kept the lamp burning for three days through a storm with nothing but candles and a mirror. \
Whether any of these stories were true did not seem to matter; people listened, laughed, and came back \
the following year to hear them again.

Scientists from the university also visited, though for different reasons. The bay was home to an \
unusual mixture of warm and cold currents, and the water held species of plankton found nowhere else \
along that coast. Every spring a small team set up their instruments on a borrowed boat, measuring \
temperature, salinity and the slow movement of the tides, and every autumn they published a report that \
almost nobody in the town read. Still, the fishermen were glad of the company, and more than once the \
scientists' careful measurements had warned them of a storm that the old barometer had failed to predict.
"""


@dataclass(frozen=True)
class MachineInfo:
    nproc: int
    cpu_model: str
    torch_version: str
    torch_threads: int
    python: str
    load_avg_1m: float      # other work on the machine distorts every number; check it is near 0

    @staticmethod
    def collect() -> MachineInfo:
        return MachineInfo(os.cpu_count() or 0, cpu_model(), torch.__version__, torch.get_num_threads(),
                           platform.python_version(), os.getloadavg()[0])

    def as_dict(self) -> dict:
        return asdict(self)


def wait_until_idle(max_wait_s: float, threshold: float = 0.05, window_s: float = 2.0) -> float:
    """Wait (at most max_wait_s) for a window in which other processes use < threshold of the CPU."""
    deadline = time.monotonic() + max_wait_s
    while True:
        probe = OtherLoad()
        time.sleep(window_s)
        share = probe.share()
        if share < threshold or time.monotonic() >= deadline:
            return share
        print(f"waiting for an idle machine: other processes use {100 * share:.0f}% of the CPU", flush=True)


def retry_contended(run: Callable[[], T], wait_idle_s: float, max_other: float, retries: int,
                    share: Callable[[T], float] = lambda r: r.other_cpu_share) -> T:
    """Run after waiting for an idle CPU; run again (up to `retries` times) while other processes
    used more than `max_other` of the CPU during the run. The last result is kept either way."""
    for attempt in range(retries + 1):
        wait_until_idle(wait_idle_s)
        result = run()
        if share(result) <= max_other or attempt == retries:
            return result
        print(f"other processes used {100 * share(result):.0f}% of the CPU during that run; running it again",
              flush=True)
    raise AssertionError("unreachable")


def add_contention_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait-idle", type=float, default=120.0,
                        help="before each measurement, wait up to this many seconds for other processes to "
                             "leave the CPU idle (default 120)")
    parser.add_argument("--max-other-cpu", type=float, default=0.05,
                        help="a measurement during which other processes used more than this share of the "
                             "CPU is taken again (default 0.05)")
    parser.add_argument("--retries", type=int, default=3,
                        help="most re-takes of one contended measurement (default 3)")


def cpu_model() -> str:
    """The 'Model name' line of lscpu (falls back to platform.processor())."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def build_prompts(encode, count: int, length: int, jitter: int, seed: int = 0) -> list[list[int]]:
    """`count` token-id prompts of `length` +- `jitter` tokens, each a different window of PASSAGE.

    The passage is repeated until it is long enough for the longest window; each window starts at a
    random offset, so prompts differ but are all real English text.
    """
    rng = random.Random(seed)
    lengths = [max(1, length + rng.randint(-jitter, jitter)) for _ in range(count)]
    stream = encode(PASSAGE)
    while len(stream) < 2 * max(lengths):
        stream += encode("\n\n" + PASSAGE)
    prompts = []
    for n in lengths:
        start = rng.randint(0, len(stream) - n)
        prompts.append(stream[start:start + n])
    return prompts


def peer_env() -> dict[str, str]:
    """This process's environment without the OMP_WAIT_POLICY=PASSIVE that importing `engine` sets: a peer
    server started with it (llama.cpp) puts its OpenMP threads to sleep between ops (decode at a quarter of
    its speed)."""
    return {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}


def emit_summary(summary: dict, path: str | None) -> None:
    """Print the JSON summary, and also write it to `path` when given, with results_file's `meta`
    (machine, commit, date, command) so a figure quoted from it can be traced."""
    print(json.dumps(summary, indent=2))
    if path:
        results_file.write(path, summary)


def replay_open_loop(engine, specs: list, prompts: list[list[int]]) -> tuple[list, list]:
    """Open loop in real time on an in-process engine: each spec's prompt token ids arrive on its
    schedule whatever the engine is doing; returns the finished requests' and the steps' records."""
    from collections import deque

    from engine import SamplingParams

    records, steps = [], []
    engine.finish_listeners.append(records.append)
    engine.step_listeners.append(steps.append)
    pending = deque(zip(specs, prompts))
    start = time.monotonic()
    try:
        while pending or engine.has_unfinished():
            now = time.monotonic()
            while pending and start + pending[0][0].arrival_s <= now:
                spec, ids = pending.popleft()
                engine.add_request(ids, SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True),
                                   arrival_time=start + spec.arrival_s)
            if engine.has_unfinished():
                engine.step()
            elif pending:
                time.sleep(max(0.0, start + pending[0][0].arrival_s - time.monotonic()))
    finally:
        engine.finish_listeners.remove(records.append)
        engine.step_listeners.remove(steps.append)
    return records, steps
