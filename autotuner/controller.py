"""The online controller: ask -> apply knobs for one measurement window -> tell, per workload regime.

One `step()` is one window. The controller reads only telemetry windows and writes only validated
knobs through a TuningTarget, so the same code drives the live engine (on its own thread) and the
simulator (which it advances itself). Safety: exploration stays in a trust region around the
incumbent; a trial whose partial window already badly violates the SLO is aborted and the
incumbent restored; a failure inside a step leaves the engine on the last good knobs.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Protocol

import optuna
from optuna.trial import TrialState

from autotuner.controller_settings import ControllerSettings
from autotuner.failures import TunerFailures
from autotuner.objective import Score, badly_violated, score_window, slo_excess
from autotuner.regime import DriftDetector, Regime, WorkloadContext
from autotuner.search_space import SearchSpace
from autotuner.tuner_state import STORAGE_ERRORS, TunerState, storage_reason
from engine.slo_class import SloClass, SloClasses, shipped_slo_classes
from policies import DEFAULT_POLICY, Knobs, get_policy
from telemetry.window import WindowSummary

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)
MAX_REJECTIONS = 2        # asks outside the trust region before projecting one into it
WINDOW_VALUE_SPREAD = 0.1 # typical spread of one window's value (goodput share) at ~20 requests a window
RECENT_WINDOWS = 4        # a configuration is judged on its latest measurements only
SLO_HEADROOM = 0.15       # within this share of a latency SLO, exploration may not push that latency up
LONGER_STEPS = ("token_budget", "step_headroom", "error_budget")   # raising these lengthens steps or gaps
FASTER_PREFILL = ("token_budget", "step_headroom")                 # lowering these slows prefills
MIN_FINISHED = 5          # finished requests the longest window needs to count at all
SATURATED = 0.95          # a window whose engine was busy this share of it could not have served faster
OVERLOAD_HOLD_S = 300.0   # per regime, how long the warm start's picks are held through overloaded windows


def sizes_steps_by_time(policy: str) -> bool:
    """The policy sizes every step from the cost model and the requests' TBT slack (deadline)."""
    return "step_headroom" in get_policy(policy).knobs


class TuningTarget(Protocol):
    """What the controller reads and changes: the live engine or the simulator."""

    def now(self) -> float: ...
    def wait(self, seconds: float) -> None: ...
    def window(self, seconds: float) -> WindowSummary: ...
    def knobs(self) -> Knobs: ...
    def apply(self, policy: str, knobs: Knobs) -> None: ...   # validated knobs only; raises ValueError


WarmStart = Callable[[Regime, WindowSummary], list[dict[str, Any]]]


class Controller:
    def __init__(self, target: TuningTarget, space: SearchSpace, state: TunerState, slo: SloClass,
                 settings: ControllerSettings, warm_start: WarmStart | None = None,
                 slo_classes: SloClasses | None = None, failures: TunerFailures | None = None) -> None:
        """`failures`: where failures are counted (the tuner service's, which also counts the storage's
        before any controller exists); None: a count of its own."""
        self.target, self.space, self.state, self.slo, self.settings = target, space, state, slo, settings
        classes = slo_classes or shipped_slo_classes()
        self.class_weights = {name: c.weight for name, c in classes.classes.items()}
        self.default_class = classes.default
        self.warm_start = warm_start
        self.drift = DriftDetector()
        self.regime: Regime | None = None
        self.study: optuna.Study | None = None
        self.start = target.now()
        self.last_good = target.knobs()
        # the configured knobs: where live exploration stays near when a regime has no warm start
        self.defaults = space.clamp(asdict(self.last_good) | {"policy": settings.policy})
        self.anchor: dict[str, Any] | None = None      # a second trust-region centre (the defaults), or None
        # the warm start's configurations not measured yet, kept here rather than queued in the study:
        # Optuna hands out queued trials first, and a re-check asked meanwhile would run one of them
        self.picks: list[dict[str, Any]] = []
        self.failures = failures or TunerFailures()
        self.storage_failing: str | None = None        # why the storage failed the latest window, until one works
        self.attainment_held: float | None = None      # exploration paused: the incumbent's recent SLO attainment
        self.paused = False
        self.pinned: Knobs | None = None
        self.windows = 0
        self.violations = 0
        self.exploring_windows = 0
        self.exploring_violations = 0
        self._since_recheck = 0
        self._drift_seen: float | None = None     # when the drift detector last fired
        self._thin_reference = False              # the drift reference was read from too few requests
        self._overload_held_s = 0.0               # this regime's windows discarded as overloaded (seconds)
        self._lock = threading.Lock()
        self.listeners: list[Callable[[dict[str, Any]], None]] = []   # decisions, for metrics and logs

    # -- operator controls (any thread) --
    def pause(self) -> None:
        with self._lock:
            self.paused = True
        self._decide("pause", None, self.target.knobs(), None)

    def resume(self) -> None:
        with self._lock:
            self.paused, self.pinned = False, None
        self._decide("resume", None, self.target.knobs(), None)

    def pin(self, changes: dict[str, Any]) -> Knobs:
        """Hold these knobs (validated now) until resume."""
        knobs = self.target.knobs().replace(**changes)
        with self._lock:
            self.target.apply(self.settings.policy, knobs)
            self.pinned = knobs
        self._decide("pin", None, knobs, None)
        return knobs

    def cold_start(self, budget: int | None) -> None:
        """Before any regime is known: no larger token budget than `budget` (from the cost model and
        the TBT SLO), so the first minute of traffic does not run on steps that break the SLO. A
        policy that sizes each step's time from the SLO itself keeps its budget as a cap."""
        knobs = self.target.knobs()
        if budget is None or knobs.token_budget <= budget or sizes_steps_by_time(self.settings.policy):
            return
        knobs = knobs.replace(token_budget=budget)
        self._apply(self.settings.policy, knobs)
        self.last_good = knobs
        self._decide("cold-start", None, knobs, None)

    # -- the loop --
    def run(self, stop: threading.Event) -> None:
        """Live: one window after another until `stop`; a failing window never stops serving."""
        while not stop.is_set():
            try:
                self.step()
                self.storage_failing = None
            except InterruptedError:
                return                                   # the daemon is stopping
            except STORAGE_ERRORS as e:                  # corrupt, locked, read-only: said once, retried each window
                self.storage_failing = storage_reason(e)
                self.record_failure("storage", self.storage_failing)
                self._restore()
                stop.wait(self.settings.min_window_s)
            except Exception:
                log.exception("tuner: window failed; the engine stays on the last good knobs")
                self._restore()
                stop.wait(self.settings.min_window_s)

    def step(self) -> None:
        observed = self.target.window(self.context_seconds())
        context = WorkloadContext.of(observed)
        if not self._track_regime(context, observed) or self.paused or self.pinned:
            self.target.wait(self.settings.min_window_s)
            return
        incumbent = self.incumbent()
        action = self._next_action(incumbent)
        trial, params = self._ask(incumbent, recheck=action == "recheck")
        self._run_trial(trial, params, action, incumbent)

    # -- regimes --
    def _track_regime(self, context: WorkloadContext, observed: WindowSummary) -> bool:
        signals, now = context.signals(), self.target.now()
        if signals is None or now - self.start < self.settings.context_window_s:
            return False                       # no traffic, or too little history to tell the regime
        if self._drift_seen is not None:
            since = self.target.window(now - self._drift_seen)     # the new workload only
            if not self._filled(since):
                return False
            self._drift_seen = None
            if since.seconds < observed.seconds:
                observed, context = since, WorkloadContext.of(since)
                signals = context.signals() or signals
            self._enter(Regime.of(context), signals, observed)   # the same study again if close to it
            return True
        if self.regime is None:
            if observed.num_finished < self._least_to_enter():
                return False                   # nothing yet for the warm start to simulate
            self._enter(Regime.of(context), signals, observed)
        elif not self._counted(observed):
            pass                               # too few requests to say the workload changed
        elif self._thin_reference:
            self._refine(signals)
        elif self.drift.update(signals):
            self._drift_seen = now
            self._apply(self.settings.policy, self.last_good)   # hold the last good knobs meanwhile
            return False
        return True

    def _least_to_enter(self) -> int:
        """Finished requests a context needs before it names a regime: what the warm start needs."""
        return min(MIN_FINISHED, self.settings.window_requests)

    def _counted(self, observed: WindowSummary) -> bool:
        """Whether a context holds `window_requests` arrivals and half as many finished requests
        (the token ratio's): fewer say nothing about drift (sharegpt4's token ratio read from 1-2
        finished requests moved by four octaves)."""
        n = self.settings.window_requests
        return observed.num_arrivals >= n and observed.num_finished >= n // 2

    def _filled(self, since: WindowSummary) -> bool:
        """Whether the context since a drift tells the new regime: `context_window_s` long, and
        holding `window_requests` arrivals or `max_window_s` long, with requests finished for the
        warm start."""
        s = self.settings
        return (since.seconds >= s.context_window_s and since.num_finished >= self._least_to_enter()
                and (since.num_arrivals >= s.window_requests or since.seconds >= s.max_window_s))

    def _refine(self, signals: tuple[float, ...]) -> None:
        """The regime was entered on a context of fewer than `window_requests` requests (the first
        minute at a low rate): its drift reference and the study's stored signals become the first
        counted context's. A first minute's rate one octave off had the CUSUM fire half an hour later."""
        self.drift.reset(signals)
        self._thin_reference = False
        self.study.set_user_attr("signals", list(signals))

    def _enter(self, regime: Regime, signals: tuple[float, float], observed: WindowSummary) -> None:
        self.drift.reset(signals)
        self._thin_reference = not self._counted(observed)
        previous = self.regime
        self.regime, self.study = self.state.study_for(regime, signals)
        self._since_recheck = 0
        self._decide("drift" if previous else "regime", None, self.target.knobs(), None, observed,
                     previous=previous.key if previous else None)
        self.anchor, self.picks = None, []
        self._overload_held_s = 0.0
        if self.warm_start and not self._completed():   # also back in a regime that measured nothing yet
            for params in self._warm_start_picks(regime, observed):
                self.picks.append(params)
                self._decide("warm-start", None, self._knobs_for(params), None)

    def _warm_start_picks(self, regime: Regime, observed: WindowSummary) -> list[dict[str, Any]]:
        """The warm start's configurations; none when it fails, and then live exploration of this
        regime stays within the trust region around the defaults as well as the incumbent's: with
        no simulation to say where good configurations lie, TPE's random start-up samples had
        walked the live engine to token caps of 480-1600 during a capacity search."""
        try:
            return self.warm_start(regime, observed)
        except InterruptedError:
            raise
        except Exception as e:
            self.anchor = self.defaults
            self.record_failure("warm_start", f"{type(e).__name__}: {e}")
            return []

    def record_failure(self, stage: str, cause: str) -> None:
        """A part of the tuner that failed (stage: warm_start, sample, storage): counted (/metrics,
        `tuner status`), written to the decision log, whose report lists it, and logged as an ERROR
        once per cause (a storage that stays broken fails every window)."""
        new = self.failures.record(stage, cause, self.target.now() - self.start)
        if new:
            log.error("tuner: %s failed: %s%s", stage.replace("_", " "), cause, FAILURE_CONSEQUENCE.get(stage, ""))
        self._decide("failure", None, self.target.knobs(), None, quiet=not new, stage=stage, cause=cause)

    # -- choosing --
    def _completed(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))

    def incumbent(self) -> dict[str, Any]:
        """The configuration to run (`chosen_configuration`); until one met the SLO, the one that
        missed it by least (so the trust region walks towards feasibility), else the knobs at regime
        entry."""
        completed = self._completed()
        best = chosen_configuration(completed, self.space, self.settings.nothing_to_win) \
            or least_violating(completed, self.space)
        return best[0] if best else self.space.clamp(asdict(self.last_good) | {"policy": self.settings.policy})

    def _next_action(self, incumbent: dict[str, Any]) -> str:
        """Explore while the regime is young, then one window in `explore_every`; every other window
        re-measures the incumbent, so its estimate keeps up with noise and slow change. An
        incumbent that serves (nearly) every request within the SLO is not explored away from, not
        even to the warm start's other picks: goodput cannot rise above the offered load, so a live
        trial could only lose requests (on shift-gpu, H100 profile, trust-region trials around such
        incumbents cost 9% of goodput and 7% of windows; on the CPU's mixed-classes, measuring the
        other picks after a first one that served every request cost a third of the goodput). Its
        load dips (`load_dip`: the SLO met with the engine saturated) do not count against it. The
        warm start's picks go first otherwise."""
        completed = self._completed()
        self.attainment_held = None
        if best_configuration(completed, self.space) is None:
            return "trial"                       # nothing safe to re-measure yet
        self.attainment_held = self._nothing_to_win(incumbent)
        if self.attainment_held is not None:
            return "recheck"                     # the warm start's other picks wait for a shortfall
        if self._too_few_requests(incumbent):
            return "recheck"                     # judged by the cost model: the warm start's ranking stands
        if self._queued():
            return "trial"
        exploring = len(completed) < self.settings.explore_trials or self.windows % self.settings.explore_every == 0
        if not exploring or self._since_recheck >= self.settings.recheck_every:
            return "recheck"
        return "trial"

    def _queued(self) -> bool:
        return bool(self.picks) or bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _nothing_to_win(self, incumbent: dict[str, Any]) -> float | None:
        """The incumbent's SLO attainment (`steady_attainment`) when it is at least `nothing_to_win`
        (exploration pauses), else None."""
        mean = steady_attainment(judged_windows(self._measured(incumbent)))
        return mean if mean is not None and mean >= self.settings.nothing_to_win else None

    def _too_few_requests(self, incumbent: dict[str, Any]) -> bool:
        """The incumbent's latest windows finished fewer than half of `min_requests` each on
        average, or arrive too slowly for `min_requests` within `max_window_s` (the windows that
        grow to hold `window_requests`): one window's goodput share then moves by +-0.07 or more on
        noise alone, as much as configurations differ, and live trials chose on noise (the CPU's
        summarization at 0.07 requests/s, ~9 requests a window: tuned 0.80-0.91x the best static).
        The incumbent is held: the first of the warm start's picks that met the SLO, chosen on the
        cost model's prediction; the others are measured only when it misses the SLO."""
        windows = self._recent_windows(incumbent)
        finished = [w["num_finished"] for w in windows if w.get("num_finished") is not None]
        rates = [w["arrival_rate_rps"] for w in windows if w.get("arrival_rate_rps") is not None]
        few = bool(finished) and sum(finished) / len(finished) < self.settings.min_requests // 2
        slow = bool(rates) and sum(rates) / len(rates) * self.settings.max_window_s < self.settings.min_requests
        return few or slow

    def _recent_windows(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """The latest RECENT_WINDOWS measured windows of this configuration."""
        return [t.user_attrs["window"] for t in self._measured(params)[-RECENT_WINDOWS:]]

    def _measured(self, params: dict[str, Any]) -> list[optuna.trial.FrozenTrial]:
        """This configuration's completed trials that recorded a window, in order."""
        return [t for t in self._completed() if "window" in t.user_attrs and self.space.snap(t.params) == params]

    def _ask(self, incumbent: dict[str, Any], recheck: bool) -> tuple[optuna.Trial, dict[str, Any]]:
        dists = self.space.distributions()
        if recheck:
            self.study.enqueue_trial(incumbent, user_attrs={"source": "recheck"})
        elif self.picks:
            self.study.enqueue_trial(self.picks.pop(0), user_attrs={"source": "warm-start"})
        limit = self._slo_limits(incumbent)
        for _ in range(MAX_REJECTIONS):
            trial = self.study.ask(dists)
            params = self.space.snap(trial.params)
            queued = trial.user_attrs.get("source") in ("warm-start", "recheck")
            within = all(self.space.within(params, c, self.settings.trust_radius) for c in self._centres(incumbent))
            if queued or (within and _within_limits(params, limit) == params):
                trial.set_user_attr("source", trial.user_attrs.get("source", "live"))
                self.state.claim(trial)
                return trial, params
            self._fail(trial, "rejected", "outside trust region" if not within else "no SLO headroom")
        for centre in self._centres(incumbent):
            params = self.space.project(params, centre, self.settings.trust_radius)
        projected = _within_limits(params, limit)
        self.study.enqueue_trial(projected, user_attrs={"source": "live"})
        trial = self.study.ask(dists)
        self.state.claim(trial)
        return trial, self.space.snap(trial.params)

    def _centres(self, incumbent: dict[str, Any]) -> list[dict[str, Any]]:
        """The trust regions a live trial must lie in: the incumbent's, and the defaults' when set."""
        return [incumbent] if self.anchor is None else [incumbent, self.anchor]

    def _slo_limits(self, incumbent: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
        """Per knob, (lowest, highest) value worth exploring around the incumbent. A larger token
        budget, step headroom or error budget means longer steps or more long gaps (P99 TBT up); a
        smaller budget or headroom slower prefills (P50 TTFT up). Where the incumbent's recent
        windows already run within SLO_HEADROOM of one bound, a move that can only push that
        latency up would most likely break the SLO, so it is not tried (on the CPU shift, trials
        at headroom 1.04-1.09 beside an incumbent at P99 TBT 0.249 s of 0.25 all broke it)."""
        windows = self._recent_windows(incumbent)
        tbt_near = _near([w["tbt_p99_s"] for w in windows if w.get("tbt_p99_s") is not None], self.slo.tbt_s)
        ttft_near = _near([w["ttft_p50_s"] for w in windows if w.get("ttft_p50_s") is not None], self.slo.ttft_s)
        limits = {}
        for name in LONGER_STEPS:
            if name in incumbent:
                low = incumbent[name] if ttft_near and name in FASTER_PREFILL else None
                limits[name] = (low, incumbent[name] if tbt_near else None)
        return limits

    def _knobs_for(self, params: dict[str, Any]) -> Knobs:
        return self.target.knobs().replace(**{k: v for k, v in params.items() if k != "policy"})

    # -- measuring --
    def context_seconds(self) -> float:
        """How far back the workload context (regime, drift, window sizing) reads: `context_window_s`,
        doubled until it holds `window_requests` arrivals, up to `longest_window_s` and never before
        the controller started. At 0.07 requests/s a fixed 60 s held ~4 arrivals, and the rate read
        from them moved by two octaves between windows and flipped the regime on noise."""
        s = self.settings
        longest = min(s.longest_window_s, max(s.context_window_s, self.target.now() - self.start))
        span = min(s.context_window_s, longest)
        while span < longest and self.target.window(span).num_arrivals < s.window_requests:
            span = min(2 * span, longest)
        return span

    def window_seconds(self, observed: WindowSummary | None = None) -> float:
        """Long enough for `min_requests` finished requests and `min_tbt_samples` token gaps at the
        current rates (so P99 TBT rests on ~10 gaps above it), within [min, max]; where arrivals are
        too slow for `window_requests` within `max_window_s`, long enough for them, up to
        `longest_window_s` (at 0.07 requests/s 120 s held ~9, whose SLO share moved by more on noise
        than configurations differ). The rates are read over the context: at 0.2 requests/s, 10 s
        hold two arrivals or none, and a window sized on none was too short to count (measured on
        the real daemon)."""
        s = self.settings
        observed = observed or self.target.window(self.context_seconds())
        need = s.min_window_s
        if observed.arrival_rate_rps > 0:
            need = max(need, s.min_requests / observed.arrival_rate_rps)
        if observed.output_tokens_per_s > 0:
            need = max(need, s.min_tbt_samples / observed.output_tokens_per_s)
        length = min(s.max_window_s, need)
        if observed.arrival_rate_rps > 0:         # closes on a count at low rates, on time at high ones
            length = max(length, min(s.longest_window_s, s.window_requests / observed.arrival_rate_rps))
        return length

    def _run_trial(self, trial: optuna.Trial, params: dict[str, Any], action: str,
                   incumbent: dict[str, Any]) -> None:
        try:
            knobs = self._knobs_for(params)
            self._apply(params.get("policy", self.settings.policy), knobs)
        except ValueError as e:                    # never applied: outside what the engine accepts
            self._fail(trial, "rejected", str(e))
            return
        self._since_recheck = 0 if action == "recheck" else self._since_recheck + 1
        try:
            window = self._measure(trial, incumbent)
        except BaseException:                        # stopping or failing mid-window: the trial measured nothing
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        if window is None:
            return
        result = self._score(window)
        self._tell(trial, result, window)
        if result.feasible:
            self.last_good = knobs
        self._count(result, exploring=action == "trial")
        held = {} if self.attainment_held is None else {"exploration": "paused", "held_attainment": self.attainment_held}
        self._decide(action, trial.number, knobs, result, window, **held)

    def _tell(self, trial: optuna.Trial, result: Score, window: WindowSummary) -> None:
        for name, value in result.constraints.items():
            trial.set_constraint(name, value)
        trial.set_user_attr("window", _window_dict(window))
        self.study.tell(trial, result.value)

    def _measure(self, trial: optuna.Trial, incumbent: dict[str, Any]) -> WindowSummary | None:
        """Settle, then measure in quarters, aborting early on a bad violation."""
        length = self.window_seconds()
        self.target.wait(self.settings.settle_fraction * length)
        for quarter in range(1, 5):
            self.target.wait(length / 4)
            if self.paused or self.pinned:           # an operator took over mid-window: measure nothing
                return self._fail(trial, "discarded", "paused or pinned by an operator")
            if self._workload_changed():             # a window mixing two workloads; the next step switches regimes
                return self._fail(trial, "discarded", "the workload changed during the window")
            partial = self.target.window(length * quarter / 4)
            if quarter < 4 and self._should_abort(partial) and not self._held(trial, incumbent) \
                    and not self._overloaded(trial, partial):
                # a real (short) measurement: told as such, so a bad incumbent loses its place too
                result = self._score(partial)
                trial.set_user_attr("aborted", True)
                self._tell(trial, result, partial)
                self._count(result, exploring=True)
                self._rollback(incumbent, trial.number, partial)
                return None
        window = self.target.window(length)
        if window.num_finished < self._least_finished(length):
            return self._fail(trial, "discarded", f"{window.num_finished} requests finished in the window")
        if self._overloaded(trial, window):
            self._overload_held_s += length
            reason = f"overloaded: P50 TTFT {window.ttft_p50_s:.2f} s with the engine busy {window.busy_fraction:.0%}"
            self._decide("overload", trial.number, self._knobs_for(self.space.snap(trial.params)), None, window,
                         held=reason)
            return self._fail(trial, "discarded", reason)
        return window

    def _overloaded(self, trial: optuna.Trial, window: WindowSummary) -> bool:
        """A window of the warm start's pick or of the incumbent's re-check that a backlog decided: P50
        TTFT over its bound while the steps kept P99 TBT within its own, and the engine busy all
        along. Such a window measures the load, not the configuration: the pick stays first, the
        incumbent stays, up to OVERLOAD_HOLD_S per regime (one that cannot keep up where another
        could is then judged). Live, a capacity search's first probe (beyond capacity) and its drain
        judged all three picks this way (P50 TTFT 7.5-17.7 s, P99 TBT 0.18-0.23 s of 0.25), and a
        TPE sample measured at a lower rate took their place as the incumbent; at a fixed 1.5
        requests/s (deadline-0.5 start), the incumbent's re-checks were judged and aborted in the
        backlog a violating trial left (P50 TTFT 3.4-5.5 s, P99 TBT 0.21-0.23 s), so TPE went on
        sampling into it."""
        if trial.user_attrs.get("source") not in ("warm-start", "recheck") or self._overload_held_s >= OVERLOAD_HOLD_S:
            return False
        queued = window.ttft_p50_s is not None and window.ttft_p50_s > self.slo.ttft_s
        steps_within = window.tbt_p99_s is None or window.tbt_p99_s <= self.slo.tbt_s
        return queued and steps_within and window.busy_fraction >= SATURATED

    def _held(self, trial: optuna.Trial, incumbent: dict[str, Any]) -> bool:
        """A re-check of an incumbent held because windows are too thin to rank configurations: it
        runs its whole window, there being nothing to roll back to, and a quarter of a thin window
        (1-4 requests at diurnal's rates) is no evidence; aborting on one dethroned the held pick
        late in the day and sent TPE's samples live."""
        return trial.user_attrs.get("source") == "recheck" and self._too_few_requests(incumbent)

    def _least_finished(self, length: float) -> int:
        """Finished requests a window needs to count: half of `min_requests`, or MIN_FINISHED in a
        window already at `max_window_s`. At 0.15 requests/s (the CPU's chat) the longest window
        holds ~18, and discarding it left the controller measuring nothing for hours."""
        if length >= self.settings.max_window_s:
            return min(MIN_FINISHED, self.settings.min_requests // 2)
        return self.settings.min_requests // 2

    def _fail(self, trial: optuna.Trial, kind: str, reason: str) -> None:
        """Tell the study this trial measured nothing: `kind` is rejected (never applied) or
        discarded (applied, but its window does not count), `reason` says why."""
        trial.set_user_attr(kind, reason)
        self.study.tell(trial, state=TrialState.FAIL)
        if kind == "discarded" and trial.user_attrs.get("source") == "warm-start":
            self.picks.insert(0, self.space.snap(trial.params))   # not judged: the cost model's pick stays first

    def _workload_changed(self) -> bool:
        """Whether the context now would trip the drift detector; never on a context too thin to
        feed it (diurnal's thin contexts discarded the warm start's best pick this way)."""
        observed = self.target.window(self.context_seconds())
        signals = WorkloadContext.of(observed).signals()
        return (signals is not None and self._counted(observed) and not self._thin_reference
                and self.drift.would_fire(signals))

    def _should_abort(self, partial: WindowSummary) -> bool:
        """Only while a known-feasible incumbent is there to go back to: under overload every
        configuration misses the SLO, and full windows are what tells them apart."""
        if best_configuration(self._completed(), self.space) is None:
            return False
        return partial.num_finished >= 3 and badly_violated(self._score(partial), self.slo,
                                                              self.settings.abort_factor)

    def _apply(self, policy: str, knobs: Knobs) -> None:
        """Every change the controller makes on its own; never over an operator's pause or pin."""
        with self._lock:
            if not (self.paused or self.pinned):
                self.target.apply(policy, knobs)

    def _rollback(self, incumbent: dict[str, Any], trial_number: int, window: WindowSummary) -> None:
        knobs = self._knobs_for(incumbent)
        self._apply(incumbent.get("policy", self.settings.policy), knobs)
        self.last_good = knobs
        self._decide("abort", trial_number, knobs, self._score(window), window)

    def _restore(self) -> None:
        try:
            self._apply(self.settings.policy, self.last_good)
        except Exception:
            log.exception("tuner: could not restore the last good knobs; leaving the engine as it is")

    def _score(self, window: WindowSummary) -> Score:
        return score_window(window, self.slo, self.class_weights, self.default_class)

    def _count(self, result: Score, exploring: bool) -> None:
        self.windows += 1
        self.violations += not result.feasible
        self.exploring_windows += exploring
        self.exploring_violations += exploring and not result.feasible

    def _decide(self, action: str, trial: int | None, knobs: Knobs, result: Score | None,
                window: WindowSummary | None = None, quiet: bool = False, **extra: Any) -> None:
        """To the decision log, the log and the listeners (/metrics); `quiet`: to the listeners only (the
        same failure again, every window, while a storage stays broken)."""
        entry = {"t": round(self.target.now() - self.start, 3), "regime": self.regime.key if self.regime else None,
                 "action": action, "trial": trial,
                 "knobs": {k: v for k, v in knobs.as_dict().items() if k != "version"},
                 "context": WorkloadContext.of(window).as_dict() if window else None,
                 "window": _window_dict(window) if window else None,
                 "violated": None if result is None else not result.feasible, **extra}
        if not quiet:
            self.state.log_decision(entry)
            log.info("tuner decision %s", entry)
        for listener in self.listeners:
            listener(entry)


FAILURE_CONSEQUENCE = {
    "warm_start": "; exploring only near the configured knobs",
    "storage": "; the engine stays on the last good knobs and the tuner retries every window",
}


def paused_line(attainment: float) -> str:
    """What `tuner status` and the report say while exploration is paused (see _next_action)."""
    return (f"serving {attainment:.1%} of requests within the SLO: within {1 - attainment:.1%} of the best any "
            "configuration can do for this regime (the offered load); exploration paused")


def chosen_configuration(trials: list[optuna.trial.FrozenTrial], space: SearchSpace, serving_all: float
                         ) -> tuple[dict[str, Any], float] | None:
    """The best configuration (`best_configuration`), unless one whose latest windows served at least
    `serving_all` of their requests within the SLO (`nothing_to_win`) is within one window's noise
    (WINDOW_VALUE_SPREAD) of it: goodput cannot rise above the offered load, and among
    configurations that both keep up the goodput share ranks noise. Live, one 21-request window of
    the warm start's pick at 100% within the SLO read 0.71 of the offered requests (the rest still
    running), the pick lost its place to one at 97.7%, exploration reopened, and a TPE sample
    violated the SLO in its window. One serving every request it finishes but far fewer of them
    (falling behind) does not win this way."""
    best = best_configuration(trials, space)
    steady = best_configuration(trials, space, serving_all)
    if best is not None and steady is not None and steady[1] >= best[1] - WINDOW_VALUE_SPREAD:
        return steady
    return best


def best_configuration(trials: list[optuna.trial.FrozenTrial], space: SearchSpace, serving_all: float | None = None
                       ) -> tuple[dict[str, Any], float] | None:
    """The configuration with the best mean value over its measurements (re-checks of the same
    knobs included, so one lucky window does not crown it) among those that meet the SLO on
    average over their windows (and, with `serving_all`, serve at least that share of their
    requests within it on average); None if none does."""
    groups: dict[tuple, list[optuna.trial.FrozenTrial]] = {}
    for t in trials:
        if t.state is TrialState.COMPLETE:
            groups.setdefault(tuple(sorted(space.snap(t.params).items())), []).append(t)
    best: tuple[dict[str, Any], float] | None = None
    for key, measured in groups.items():
        group = judged_windows(sorted(measured, key=lambda t: t.number))
        names = {name for t in group for name in t.constraints}
        if serving_all is not None and (steady_attainment(group) or 0.0) < serving_all:
            continue
        if names and all(sum(t.constraints.get(n, 0.0) for t in group) <= 0 for n in names):   # met on average
            mean = sum(t.value for t in group) / len(group)
            lower = mean - WINDOW_VALUE_SPREAD / math.sqrt(len(group))   # one lucky window does not win
            if best is None or lower > best[1]:
                best = (dict(key), lower)
    return best


def judged_windows(measured: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """What one configuration is judged on (its value, its SLO, its attainment): its latest
    RECENT_WINDOWS measurements (trials in order; the present, not a backlog-free past), leaving out
    its load dips (`load_dip`) unless it was measured in nothing else."""
    return ([t for t in measured if not load_dip(t)] or measured)[-RECENT_WINDOWS:]


def steady_attainment(judged: list[optuna.trial.FrozenTrial]) -> float | None:
    """The mean SLO attainment of a configuration's judged windows; None if none recorded one."""
    shares = [t.user_attrs.get("window", {}).get("slo_attainment") for t in judged]
    shares = [share for share in shares if share is not None]
    return sum(shares) / len(shares) if shares else None


def load_dip(trial: optuna.trial.FrozenTrial) -> bool:
    """A window in which the configuration met the SLO with the engine busy >= SATURATED: the share
    of requests within it fell with the load (a burst, or the machine at capacity), and no
    configuration could have served faster. Live at 1.5 requests/s (~85% of capacity), a burst
    window (1.74 requests/s, 60-88% within the SLO, P50 TTFT and P99 TBT within their bounds)
    pulled the incumbents' attainment under `nothing_to_win`; exploration reopened, and the trials
    it ran near capacity left backlogs that cost minutes of SLO (the prefill-first and deadline-0.5
    starts in docs/results/wrong_start_live_xeon/)."""
    window = trial.user_attrs.get("window", {})
    saturated = (window.get("busy_fraction") or 0.0) >= SATURATED
    return saturated and bool(trial.constraints) and all(v <= 0 for v in trial.constraints.values())


def _near(latencies: list[float], bound: float) -> bool:
    """Measured latencies that average within SLO_HEADROOM of their bound (or over it)."""
    return bool(latencies) and sum(latencies) / len(latencies) >= (1 - SLO_HEADROOM) * bound


def _within_limits(params: dict[str, Any], limits: dict[str, tuple[float | None, float | None]]) -> dict[str, Any]:
    """`params` with each limited knob moved into its [low, high] where those are set."""
    out = dict(params)
    for name, (low, high) in limits.items():     # limits name only knobs of the space, as params do
        if high is not None:
            out[name] = min(out[name], high)
        if low is not None:
            out[name] = max(out[name], low)
    return out


def least_violating(trials: list[optuna.trial.FrozenTrial], space: SearchSpace
                    ) -> tuple[dict[str, Any], float] | None:
    """The measured configuration whose SLO excess, summed over constraints and averaged, is smallest."""
    measured = [t for t in trials if t.state is TrialState.COMPLETE and t.constraints]
    if not measured:
        return None
    best = min(measured, key=lambda t: slo_excess(t.constraints))
    return space.snap(best.params), -slo_excess(best.constraints)


def _window_dict(w: WindowSummary) -> dict[str, float | None]:
    return {"ttft_p50_s": w.ttft_p50_s, "tbt_p99_s": w.tbt_p99_s, "goodput_rps": w.goodput_rps,
            "slo_attainment": w.slo_attainment, "arrival_rate_rps": w.arrival_rate_rps,
            "output_tokens_per_s": w.output_tokens_per_s, "input_output_ratio": w.input_output_ratio,
            "kv_usage_mean": w.kv_usage_mean, "mfu": w.mfu, "mbu": w.mbu, "num_finished": w.num_finished,
            "busy_fraction": w.busy_fraction, "num_waiting_mean": w.num_waiting_mean, "shed_rps": w.shed_rps,
            "num_running_mean": w.num_running_mean, "draft_tokens_per_s": w.draft_tokens_per_s,
            "kept_draft_tokens_per_s": w.kept_draft_tokens_per_s, "draft_acceptance_rate": w.draft_acceptance_rate,
            "draft_tokens_per_verify": w.draft_tokens_per_verify, "draft_tokens_per_decode": w.draft_tokens_per_decode}
