"""Synthetic serving workloads: phases of arrivals with prompt/output lengths -> a list of RequestSpecs.

A phase is one request stream, or several concurrent streams (each its own arrival process,
lengths and SLO class) merged in arrival order; phases run one after another.

Pure Python + numpy, no HTTP, so the bench client and the simulator replay the same requests.
Every arrival process is a renewal process of unit rate in "operational time" mapped to real
time through the inverse of its integrated rate (time rescaling): a constant rate divides, a
linear ramp solves a quadratic. Gaps and lengths come from separate seeded streams per phase, so
changing qps rescales the same requests instead of drawing new ones (common random numbers for
capacity probes).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import yaml

from engine.slo_class import shipped_slo_classes

PRESETS_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "workloads.yaml")


@dataclass(frozen=True)
class RequestSpec:
    arrival_s: float      # seconds from the start of the run
    prompt_tokens: int
    output_tokens: int    # exact: clients send max_tokens=this with ignore_eos
    phase: str            # name of the workload phase it came from
    slo_class: str | None = None   # the SLO class the request asks for (None: the server's default)
    prefix_group: str | None = None  # its first prefix_tokens are the first tokens of this group's shared text
    prefix_tokens: int = 0           # (a system prompt, or a conversation's history); the rest is its own
    constrained: bool = False        # its output is held to a grammar (a JSON schema: each row costs a mask)
    message: str | None = None       # its own prompt, one chat user message (code-editing) of prompt_tokens
                                     # in the prompt tokenizer's template; None: running text of prompt_tokens


# ---- arrival processes -------------------------------------------------------------------------

ARRIVAL_PROCESSES = ("poisson", "gamma", "fixed", "ramp")


@dataclass(frozen=True)
class ArrivalProcess:
    process: str = "poisson"   # poisson | gamma | fixed | ramp
    burstiness: float = 1.0    # gamma: cv^2 of the gaps (= 1 / shape); 1 is poisson, > 1 burstier
    ramp_from: float = 1.0     # ramp: rate multipliers at the start and the end of the phase
    ramp_to: float = 1.0

    def __post_init__(self) -> None:
        if self.process not in ARRIVAL_PROCESSES:
            raise ValueError(f"unknown arrival process {self.process!r} (known: {', '.join(ARRIVAL_PROCESSES)})")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if not (self.ramp_from > 0 and self.ramp_to > 0):
            raise ValueError(f"ramp rates must be > 0, got from {self.ramp_from} to {self.ramp_to}")

    @property
    def mean_multiplier(self) -> float:
        return (self.ramp_from + self.ramp_to) / 2 if self.process == "ramp" else 1.0

    def unit_gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Gaps of the process at rate 1 (mean 1)."""
        if self.process == "fixed":
            return np.ones(n)
        if self.process == "gamma":
            return rng.gamma(1.0 / self.burstiness, self.burstiness, n)
        return rng.exponential(1.0, n)   # poisson, and ramp (a Poisson process with a varying rate)

    def integrated_rate(self, t: float, rate: float, length_s: float) -> float:
        """Expected arrivals in [0, t) of a phase of `length_s` at base `rate`."""
        if self.process != "ramp":
            return rate * t
        a, b = rate * self.ramp_from, rate * self.ramp_to
        if t <= length_s:
            return a * t + (b - a) * t * t / (2 * length_s)
        return (a + b) * length_s / 2 + b * (t - length_s)

    def to_time(self, s: np.ndarray, rate: float, length_s: float) -> np.ndarray:
        """Inverse of integrated_rate: operational times -> seconds from the phase start."""
        if self.process != "ramp":
            return s / rate
        a, b = rate * self.ramp_from, rate * self.ramp_to
        s_end = (a + b) * length_s / 2
        inside = np.minimum(s, s_end)
        # root of (b-a)/(2L) t^2 + a t - s = 0, written so a == b does not divide by zero
        t = 2 * inside / (a + np.sqrt(a * a + 2 * (b - a) * inside / length_s))
        return np.where(s <= s_end, t, length_s + (s - s_end) / b)   # past the ramp the rate stays at b


# ---- length distributions ----------------------------------------------------------------------

class TokenDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int            # inclusive

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, n)


@dataclass(frozen=True)
class LogNormal:
    """Right-skewed like real chat lengths; `mean` is the mean before clipping to [low, high]."""

    mean: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma ** 2 / 2
        return np.clip(np.rint(rng.lognormal(mu, self.sigma, n)), self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class Independent:
    """Prompt and output lengths drawn independently."""

    prompt: TokenDist
    output: TokenDist

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.prompt.sample(rng, n), self.output.sample(rng, n)


@dataclass(frozen=True)
class Trace:
    """(prompt, output) pairs from a CSV with num_prefill_tokens,num_decode_tokens (Sarathi-Serve's traces)."""

    pairs: tuple[tuple[int, int], ...]
    replay: bool = False          # in file order (cycling) instead of sampled with replacement
    path: str = ""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        table = np.asarray(self.pairs, dtype=np.int64)
        rows = np.arange(n) % len(table) if self.replay else rng.integers(0, len(table), n)
        return table[rows, 0], table[rows, 1]


class Lengths(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]: ...


@runtime_checkable
class MessageLengths(Lengths, Protocol):
    """Lengths whose requests carry their own prompt (loadgen.code_editing): the lengths are the messages'."""

    def sample_messages(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, list[str]]: ...


def sample_lengths(lengths: Lengths, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """(prompt lengths, output lengths, messages): None messages where the lengths have no text of their own."""
    if isinstance(lengths, MessageLengths):
        return lengths.sample_messages(rng, n)
    prompts, outputs = lengths.sample(rng, n)
    return prompts, outputs, [None] * n


def _check_sharing(lengths: Lengths, sharing: Sharing | None) -> None:
    """A request with its own message has no shared prefix to put before it."""
    if sharing is not None and isinstance(lengths, MessageLengths):
        raise ValueError("code-editing lengths carry their own prompts: they take no sharing")


# What the project targets: chat ~200-token prompts and ~115-token answers; summarization long
# prompts (1k-4k) with ~100-token summaries, which shifts the load from decode to prefill.
CHAT = Independent(LogNormal(200, 0.7, 16, 1024), LogNormal(115, 0.6, 8, 512))
SUMMARIZATION = Independent(Uniform(1000, 4000), LogNormal(100, 0.3, 32, 256))
NAMED_LENGTHS: dict[str, Lengths] = {"chat": CHAT, "summarization": SUMMARIZATION}


def read_trace(path: str, replay: bool = False) -> Trace:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ValueError(f"cannot read trace {path}: {e.strerror}") from e
    try:
        pairs = tuple((int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in rows)
    except KeyError as e:
        raise ValueError(f"trace {path}: needs columns num_prefill_tokens,num_decode_tokens") from e
    except (TypeError, ValueError) as e:
        raise ValueError(f"trace {path}: token counts must be integers ({e})") from e
    if not pairs:
        raise ValueError(f"trace {path}: no rows")
    if min(min(p) for p in pairs) < 1:
        raise ValueError(f"trace {path}: token counts must be >= 1")
    return Trace(pairs, replay, path)


# ---- shared prefixes ---------------------------------------------------------------------------

SHARING_KINDS = ("system-prompt", "multi-turn")


@dataclass(frozen=True)
class Sharing:
    """How a stream's prompts share prefixes (prefix caching workloads).

    system-prompt: every prompt starts with the same `tokens`-token system prompt, then its own
    message (the stream's prompt length). multi-turn: `conversations` open at a time, each of
    `turns` (uniform) turns; a request is the next turn of a random open one and resends its whole
    history (earlier messages and replies, each of the stream's lengths) before its new message;
    a conversation whose next turn would pass `max_history` tokens ends early."""

    kind: str
    tokens: int = 500
    turns: tuple[int, int] = (3, 8)
    conversations: int = 8
    max_history: int = 4096

    def __post_init__(self) -> None:
        if self.kind not in SHARING_KINDS:
            raise ValueError(f"unknown sharing kind {self.kind!r} (known: {', '.join(SHARING_KINDS)})")
        low, high = self.turns
        if not (self.tokens >= 1 and 1 <= low <= high and self.conversations >= 1 and self.max_history >= 1):
            raise ValueError(f"sharing needs tokens >= 1, 1 <= turns min <= max, conversations >= 1, got {self}")

    def apply(self, label: str, specs: list[RequestSpec], rng: np.random.Generator) -> list[RequestSpec]:
        if self.kind == "system-prompt":
            return [replace(s, prompt_tokens=self.tokens + s.prompt_tokens, prefix_group=f"{label}/system",
                            prefix_tokens=self.tokens) for s in specs]
        return self._turns(label, specs, rng)

    def _turns(self, label: str, specs: list[RequestSpec], rng: np.random.Generator) -> list[RequestSpec]:
        """Each spec's lengths are its new message and its reply; its prompt is the history plus the message."""
        opened = 0
        open_: list[list[int]] = []         # [conversation id, turns left, history tokens]
        out = []
        for spec in specs:
            while len(open_) < self.conversations:
                open_.append([opened, int(rng.integers(self.turns[0], self.turns[1] + 1)), 0])
                opened += 1
            i = int(rng.integers(len(open_)))
            conv = open_[i]
            if conv[2] and conv[2] + spec.prompt_tokens + spec.output_tokens > self.max_history:
                conv[:] = [opened, int(rng.integers(self.turns[0], self.turns[1] + 1)), 0]
                opened += 1
            prompt = conv[2] + spec.prompt_tokens
            out.append(replace(spec, prompt_tokens=prompt, prefix_group=f"{label}/conversation-{conv[0]}",
                               prefix_tokens=prompt))
            conv[1] -= 1
            conv[2] = prompt + spec.output_tokens
            if conv[1] == 0:
                open_.pop(i)
        return out


# ---- workloads ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stream:
    """One of a phase's concurrent request streams."""

    name: str
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    lengths: Lengths = CHAT
    rate: float = 1.0              # multiplier of the phase's rate
    slo_class: str | None = None   # None: the server's default class
    sharing: Sharing | None = None # shared prompt prefixes (None: every prompt its own)
    constrained: bool = False      # its requests ask for structured output (RequestSpec.constrained)

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"stream {self.name!r}: rate must be > 0, got {self.rate}")
        _check_sharing(self.lengths, self.sharing)


@dataclass(frozen=True)
class Phase:
    name: str
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    lengths: Lengths = CHAT
    share: float | None = None     # share of the run (its duration, or its request count); default 1
    requests: int | None = None    # or: exactly this many requests, whatever the run's size
    rate: float = 1.0              # multiplier of the workload's base qps
    slo_class: str | None = None   # None: the server's default class
    streams: tuple[Stream, ...] = ()   # concurrent streams; when given, arrival/lengths/slo_class/sharing are unused
    sharing: Sharing | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "streams", tuple(self.streams))
        names = [s.name for s in self.streams]
        if len(set(names)) < len(names):
            raise ValueError(f"phase {self.name!r}: stream names must be unique, got {', '.join(names)}")
        if self.share is not None and self.requests is not None:
            raise ValueError(f"phase {self.name!r}: give share or requests, not both")
        if self.share is not None and not self.share > 0:
            raise ValueError(f"phase {self.name!r}: share must be > 0, got {self.share}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"phase {self.name!r}: requests must be >= 1, got {self.requests}")
        if not self.rate > 0:
            raise ValueError(f"phase {self.name!r}: rate must be > 0, got {self.rate}")
        if not self.streams:
            _check_sharing(self.lengths, self.sharing)

    @property
    def weight(self) -> float:
        return 1.0 if self.share is None else self.share

    def labelled_streams(self) -> list[tuple[str, Stream]]:
        """(RequestSpec.phase label, stream): a phase without streams is one stream named after it."""
        if not self.streams:
            return [(self.name, Stream(self.name, self.arrival, self.lengths, 1.0, self.slo_class, self.sharing))]
        return [(f"{self.name}/{s.name}", s) for s in self.streams]


@dataclass(frozen=True)
class Workload:
    name: str
    phases: tuple[Phase, ...]
    qps: float = 1.0               # base rate when generate() gets none

    def __post_init__(self) -> None:
        object.__setattr__(self, "phases", tuple(self.phases))
        if not self.phases:
            raise ValueError(f"workload {self.name!r}: needs at least one phase")
        if not self.qps > 0:
            raise ValueError(f"workload {self.name!r}: qps must be > 0, got {self.qps}")


def generate(workload: Workload, qps: float | None = None, num_requests: int | None = None,
             duration_s: float | None = None, seed: int = 0) -> list[RequestSpec]:
    """The workload's requests, sorted by arrival.

    With num_requests, share-phases split that count and each phase ends at its last arrival;
    with only duration_s, they split the duration and arrive until their end. Phases with a fixed
    `requests` count always send it. With both, the count decides and duration_s cuts off later
    arrivals (a bound on the run, as the bench client's --max-duration-s).
    """
    rate = workload.qps if qps is None else qps
    if not rate > 0:
        raise ValueError(f"qps must be > 0, got {qps}")
    if num_requests is None and duration_s is None:
        raise ValueError("give num_requests or duration_s")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    counts = None if num_requests is None else _split_count(workload.phases, num_requests)
    total_weight = sum(p.weight for p in workload.phases if p.requests is None)
    specs: list[RequestSpec] = []
    start = 0.0
    for i, phase in enumerate(workload.phases):
        streams = phase.labelled_streams()
        # a plain phase keeps its original seeds, so existing workloads replay the same requests
        keys = [[seed, i]] if not phase.streams else [[seed, i, j] for j in range(len(streams))]
        arrival_rngs = [np.random.default_rng(k + [0]) for k in keys]
        length_rngs = [np.random.default_rng(k + [1]) for k in keys]
        rates = [rate * phase.rate * s.rate for _, s in streams]
        if phase.requests is None and counts is None:
            length_s = duration_s * phase.weight / total_weight
            times = [_arrivals_until(s.arrival, g, r, length_s) for (_, s), g, r in zip(streams, arrival_rngs, rates)]
            end = start + length_s
        else:
            n = phase.requests if phase.requests is not None else counts[i]
            times = _arrivals_count([s.arrival for _, s in streams], arrival_rngs, rates, n)
            end = start + max((float(t[-1]) for t in times if len(t)), default=0.0)
        for k, ((label, stream), t, g) in enumerate(zip(streams, times, length_rngs)):
            prompts, outputs, messages = sample_lengths(stream.lengths, g, len(t))
            own = [RequestSpec(start + float(a), int(p), int(o), label, stream.slo_class,
                               constrained=stream.constrained, message=m)
                   for a, p, o, m in zip(t, prompts, outputs, messages)]
            if stream.sharing is not None:   # its own seeded stream: lengths and arrivals stay as without it
                own = stream.sharing.apply(label, own, np.random.default_rng(keys[k] + [2]))
            specs += own
        start = end
    specs.sort(key=lambda s: s.arrival_s)
    if duration_s is not None:
        specs = [s for s in specs if s.arrival_s < duration_s]
    return specs if num_requests is None else specs[:num_requests]


def _split_count(phases: Sequence[Phase], num_requests: int) -> list[int]:
    """Request counts of the share-phases (largest remainder, so they sum exactly)."""
    left = max(0, num_requests - sum(p.requests for p in phases if p.requests is not None))
    shared = [i for i, p in enumerate(phases) if p.requests is None]
    weights = np.array([phases[i].weight for i in shared])
    exact = left * weights / weights.sum() if shared else np.array([])
    counts = np.floor(exact).astype(int)
    for j in np.argsort(-(exact - counts))[: left - counts.sum()]:
        counts[j] += 1
    out = [0] * len(phases)
    for i, c in zip(shared, counts):
        out[i] = int(c)
    return out


def _arrivals_until(process: ArrivalProcess, rng: np.random.Generator, rate: float, length_s: float) -> np.ndarray:
    s_end = process.integrated_rate(length_s, rate, length_s)
    s = np.cumsum(process.unit_gaps(rng, int(s_end + 10 * math.sqrt(s_end) + 10)))
    while s[-1] < s_end:     # rare: draw more gaps
        s = np.concatenate([s, s[-1] + np.cumsum(process.unit_gaps(rng, len(s)))])
    return process.to_time(s[s < s_end], rate, length_s)


def _arrivals_count(processes: Sequence[ArrivalProcess], rngs: Sequence[np.random.Generator],
                    rates: Sequence[float], n: int) -> list[np.ndarray]:
    """Each stream's arrivals among the first n of the streams' superposition.

    A ramp spans the time the n requests take on average. Gaps are drawn in order and only appended,
    so a stream's arrivals do not depend on how many were drawn, nor (but for scale) on the qps.
    """
    if n == 0:
        return [np.empty(0) for _ in processes]
    total = sum(r * p.mean_multiplier for p, r in zip(processes, rates))
    length_s = n / total
    ops = [np.cumsum(p.unit_gaps(g, math.ceil(n * r * p.mean_multiplier / total)))
           for p, g, r in zip(processes, rngs, rates)]
    while True:
        times = [p.to_time(s, r, length_s) for p, s, r in zip(processes, ops, rates)]
        merged = np.concatenate(times)
        cutoff = np.sort(merged)[n - 1] if len(merged) >= n else math.inf
        short = [j for j, t in enumerate(times) if t[-1] <= cutoff]   # may hold arrivals before the cutoff
        if not short:
            break
        for j in short:
            ops[j] = np.concatenate([ops[j], ops[j][-1] + np.cumsum(processes[j].unit_gaps(rngs[j], len(ops[j])))])
    # the first n in arrival order (ties go to the earlier stream); each stream gives a prefix of its arrivals
    first = np.argsort(merged, kind="stable")[:n]
    stream_of = np.repeat(np.arange(len(times)), [len(t) for t in times])
    kept = np.bincount(stream_of[first], minlength=len(times))
    return [t[:k] for t, k in zip(times, kept)]


# ---- configuration -----------------------------------------------------------------------------

def preset_names() -> list[str]:
    return list(_read_yaml(PRESETS_PATH))


def load_workload(name_or_path: str) -> Workload:
    """A preset from configs/workloads.yaml, or a YAML file holding one workload."""
    if os.path.isfile(name_or_path):
        data = _read_yaml(name_or_path)
        name = str(data.get("name", os.path.splitext(os.path.basename(name_or_path))[0]))
        return parse_workload(name, data, os.path.dirname(os.path.abspath(name_or_path)))
    presets = _read_yaml(PRESETS_PATH)
    if name_or_path not in presets:
        raise ValueError(f"unknown workload {name_or_path!r}: not a file nor a preset "
                         f"(known: {', '.join(presets)})")
    return parse_workload(name_or_path, presets[name_or_path], os.path.dirname(PRESETS_PATH))


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top")
    return data


def parse_workload(name: str, data: Any, base_dir: str = ".") -> Workload:
    """A Workload from its YAML mapping; errors are one line naming the workload and phase."""
    where = f"workload {name!r}"
    data = _mapping(data, where, {"name", "qps", "phases"})
    phases = data.get("phases")
    if not isinstance(phases, list) or not phases:
        raise ValueError(f"{where}: 'phases' must be a non-empty list")
    try:
        parsed = tuple(_parse_phase(p, i, base_dir) for i, p in enumerate(phases))
        qps = float(data.get("qps", 1.0))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from e
    return Workload(name, parsed, qps)


def _parse_phase(data: Any, index: int, base_dir: str) -> Phase:
    data = _mapping(data, f"phase {index + 1}",
                    {"name", "share", "requests", "rate", "arrival", "lengths", "slo_class", "streams", "sharing"})
    name = str(data.get("name", f"phase-{index + 1}"))
    try:
        streams = data.get("streams", [])
        if not isinstance(streams, list) or ("streams" in data and not streams):
            raise ValueError("'streams' must be a non-empty list")
        return Phase(name=name, arrival=_parse_arrival(data.get("arrival", "poisson")),
                     lengths=_parse_lengths(data.get("lengths", "chat"), base_dir),
                     share=None if data.get("share") is None else float(data["share"]),
                     requests=None if data.get("requests") is None else int(data["requests"]),
                     rate=float(data.get("rate", 1.0)), slo_class=_slo_class(data.get("slo_class")),
                     streams=tuple(_parse_stream(s, j, data, base_dir) for j, s in enumerate(streams)),
                     sharing=_parse_sharing(data.get("sharing")))
    except (TypeError, ValueError) as e:
        raise ValueError(str(e) if str(e).startswith("phase ") else f"phase {name!r}: {e}") from e


def _parse_stream(data: Any, index: int, phase: Mapping[str, Any], base_dir: str) -> Stream:
    """A stream takes arrival, lengths and slo_class from its phase unless it gives its own."""
    data = _mapping(data, f"stream {index + 1}",
                    {"name", "rate", "arrival", "lengths", "slo_class", "sharing", "constrained"})
    name = str(data.get("name", f"stream-{index + 1}"))
    pick = lambda key, default: data.get(key, phase.get(key, default))  # noqa: E731
    try:
        return Stream(name, _parse_arrival(pick("arrival", "poisson")),
                      _parse_lengths(pick("lengths", "chat"), base_dir),
                      float(data.get("rate", 1.0)), _slo_class(pick("slo_class", None)),
                      _parse_sharing(pick("sharing", None)), bool(data.get("constrained", False)))
    except (TypeError, ValueError) as e:
        raise ValueError(str(e) if str(e).startswith("stream ") else f"stream {name!r}: {e}") from e


def _slo_class(value: Any) -> str | None:
    """A class of configs/slo_classes.yaml, checked here so a typo fails at load time, not mid-run."""
    if value is None:
        return None
    shipped_slo_classes().get(str(value))    # ValueError naming the known classes
    return str(value)


def _parse_sharing(data: Any) -> Sharing | None:
    """{kind: system-prompt, tokens: N} | {kind: multi-turn, turns: [min, max], conversations: K, max_history: T}"""
    if data is None:
        return None
    data = _mapping(data, "sharing", {"kind", "tokens", "turns", "conversations", "max_history"})
    turns = data.get("turns", [3, 8])
    if not (isinstance(turns, list) and len(turns) == 2):
        raise ValueError("sharing turns must be [min, max]")
    return Sharing(str(data.get("kind")), int(data.get("tokens", 500)), (int(turns[0]), int(turns[1])),
                   int(data.get("conversations", 8)), int(data.get("max_history", 4096)))


def _parse_arrival(data: Any) -> ArrivalProcess:
    if isinstance(data, str):
        data = {"process": data}
    data = _mapping(data, "arrival", {"process", "burstiness", "from", "to"})
    return ArrivalProcess(str(data.get("process", "poisson")), float(data.get("burstiness", 1.0)),
                          float(data.get("from", 1.0)), float(data.get("to", 1.0)))


LENGTH_KINDS = ("chat", "summarization", "uniform", "fixed", "lognormal", "trace", "code-editing")


def _parse_lengths(data: Any, base_dir: str) -> Lengths:
    if isinstance(data, str):
        data = {"kind": data}
    data = _mapping(data, "lengths", {"kind", "prompt", "output", "path", "order", "functions", "seed"})
    kind = data.get("kind")
    if kind in NAMED_LENGTHS:
        return NAMED_LENGTHS[kind]
    if kind == "code-editing":
        return _parse_code_editing(data)
    if "functions" in data or "seed" in data:
        raise ValueError(f"functions and seed are code-editing's, not {kind}'s")
    if kind == "trace":
        order = data.get("order", "sample")
        if order not in ("sample", "replay"):
            raise ValueError(f"trace order must be sample or replay, got {order!r}")
        if "path" not in data:
            raise ValueError("a trace needs a path")
        return read_trace(os.path.join(base_dir, str(data["path"])), order == "replay")
    if kind not in LENGTH_KINDS:
        raise ValueError(f"unknown lengths kind {kind!r} (known: {', '.join(LENGTH_KINDS)})")
    if "prompt" not in data or "output" not in data:
        raise ValueError(f"{kind} lengths need prompt and output")
    return Independent(_token_dist(kind, data["prompt"], "prompt"), _token_dist(kind, data["output"], "output"))


def _parse_code_editing(data: Mapping[str, Any]) -> Lengths:
    """{kind: code-editing, functions: N, seed: S}: N stdlib functions (a fixed draw by S), their own lengths."""
    from loadgen.code_editing import code_editing_lengths

    extra = set(data) - {"kind", "functions", "seed"}
    if extra:
        raise ValueError(f"code-editing lengths take functions and seed, not {sorted(extra)[0]!r}")
    return code_editing_lengths(int(data.get("functions", 200)), int(data.get("seed", 0)))


def _token_dist(kind: str, value: Any, what: str) -> TokenDist:
    """fixed: N; uniform: [min, max]; lognormal: {mean, sigma, min, max}."""
    if kind == "fixed":
        dist: TokenDist = Fixed(int(value))
        low = high = dist.value
    elif kind == "uniform":
        if not (isinstance(value, list) and len(value) == 2):
            raise ValueError(f"uniform {what} must be [min, max]")
        low, high = int(value[0]), int(value[1])
        dist = Uniform(low, high)
    else:
        v = _mapping(value, f"lognormal {what}", {"mean", "sigma", "min", "max"})
        if "mean" not in v:
            raise ValueError(f"lognormal {what} needs a mean")
        low, high = int(v.get("min", 1)), int(v.get("max", 1 << 20))
        dist = LogNormal(float(v["mean"]), float(v.get("sigma", 0.5)), low, high)
        if not (dist.mean > 0 and dist.sigma >= 0):
            raise ValueError(f"lognormal {what}: mean must be > 0 and sigma >= 0")
    if not 1 <= low <= high:
        raise ValueError(f"{what} lengths need 1 <= min <= max, got {low}..{high}")
    return dist


def _mapping(data: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(allowed))})")
    return data
