"""Where the tuner keeps what it learned: one Optuna study per regime in SQLite under the state dir
(or in a storage several daemons share), and a JSON-lines log of every decision in the state dir.
Both survive restarts; trials a crash left running are marked failed when the state is opened.

Shared storage (replicas of a cluster, docs/cluster.md): "journal:PATH" is Optuna's JournalStorage
on a file (every write an appended log line under a lock file, so concurrent writers on one file
system, NFS included, are safe), any other URL an RDB (PostgreSQL/MySQL: transactions). Each
daemon tags the trials it asks with its `owner`, so at start-up it fails only its own leftovers,
never a trial another replica is measuring right now."""

from __future__ import annotations

import datetime
import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import StorageInternalError
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from autotuner.background import BackgroundRunner
from autotuner.live_sampler import BackgroundTPE
from autotuner.regime import Regime

log = logging.getLogger(__name__)
STUDY_PREFIX = "regime:"
MATCH_OCTAVES = 0.75      # a workload this close (log2 units) to a known regime's centre reuses its study
STARTUP_TRIALS = 4        # random samples before TPE's; the warm start seeds the study too
# what a storage that is corrupt, locked, gone or on a read-only disk raises
STORAGE_ERRORS = (OSError, sqlite3.Error, SQLAlchemyError, StorageInternalError)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class TunerState:
    def __init__(self, state_dir: str | Path, seed: int | None = None, runner: BackgroundRunner | None = None,
                 storage: str | None = None, owner: str | None = None) -> None:
        """`runner`: where TPE's sampling runs (the daemon's background process); None: in this thread.
        `storage`: a shared Optuna storage (see above); None: SQLite in the state dir. `owner`: this
        daemon's name among those sharing it (None: the storage is its alone)."""
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.storage = open_storage(storage or f"sqlite:///{self.dir / 'tuner.db'}")
        self.decisions_path = self.dir / "decisions.jsonl"
        self.seed, self.runner, self.owner = seed, runner, owner
        self.decision_log_error: str | None = None    # why decisions.jsonl cannot be written, once it could not
        self._lock = threading.Lock()
        self.recovered = self._fail_running_trials()

    def _fail_running_trials(self) -> int:
        """A trial still RUNNING at start-up belongs to a process that died; it measured nothing."""
        count = 0
        for summary in self.storage.get_all_studies():
            study_id = self.storage.get_study_id_from_name(summary.study_name)
            for trial in self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
                if self.owner is not None and trial.user_attrs.get("owner") != self.owner:
                    continue               # another replica's trial, perhaps being measured now
                self.storage.set_trial_user_attr(trial._trial_id, "crashed", True)
                self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
                count += 1
        if count:
            log.warning("tuner: marked %d trial(s) left running by an earlier process as failed", count)
        return count

    def claim(self, trial: optuna.Trial) -> None:
        """Tag a trial this daemon asked for, so a restart of it (and only of it) fails it if left running."""
        if self.owner is not None:
            trial.set_user_attr("owner", self.owner)

    def study_for(self, regime: Regime, signals: tuple[float, ...]) -> tuple[Regime, optuna.Study]:
        """The study of the known regime nearest to `signals` (log2 token ratio, log2 rate, scaled
        hit rate) with the same KV and cache labels when one is within MATCH_OCTAVES, else a new one:
        a workload near a bucket's edge must not split its history between two studies."""
        nearest: tuple[float, Regime] | None = None
        for summary in self.storage.get_all_studies():
            attrs = summary.user_attrs
            if not summary.study_name.startswith(STUDY_PREFIX) or "signals" not in attrs:
                continue
            known = Regime(**attrs["regime"])
            distance = max(abs(a - b) for a, b in zip(attrs["signals"], signals))
            same_labels = (known.kv, known.cache) == (regime.kv, regime.cache)
            if same_labels and distance <= MATCH_OCTAVES and (nearest is None or distance < nearest[0]):
                nearest = (distance, known)
        regime = nearest[1] if nearest else regime
        study = self.study(regime)
        if "signals" not in study.user_attrs:
            study.set_user_attr("signals", list(signals))
        return regime, study

    def study(self, regime: Regime) -> optuna.Study:
        sampler = (BackgroundTPE(self.runner, self.seed, STARTUP_TRIALS) if self.runner
                   else optuna.samplers.TPESampler(seed=self.seed, n_startup_trials=STARTUP_TRIALS))
        study = optuna.create_study(study_name=STUDY_PREFIX + regime.key, storage=self.storage,
                                    direction="maximize", sampler=sampler, load_if_exists=True)
        if "regime" not in study.user_attrs:
            study.set_user_attr("regime", regime.as_dict())
            study.set_user_attr("created_at", now_iso())
        return study

    def study_by_key(self, key: str) -> optuna.Study:
        return optuna.load_study(study_name=STUDY_PREFIX + key, storage=self.storage)

    def regimes(self) -> list[str]:
        return [s.study_name.removeprefix(STUDY_PREFIX) for s in self.storage.get_all_studies()
                if s.study_name.startswith(STUDY_PREFIX)]

    def log_decision(self, entry: dict[str, Any]) -> None:
        """Appended to decisions.jsonl; where the disk refuses (full, read-only), the decision still reaches
        the log and /metrics, and why the file misses it is said once."""
        line = json.dumps({"time": now_iso(), **entry}, default=_jsonable)
        try:
            with self._lock, self.decisions_path.open("a") as f:
                f.write(line + "\n")
        except OSError as e:
            if self.decision_log_error is None:
                log.error("tuner: cannot write %s (%s); decisions go to the log and /metrics only",
                          self.decisions_path, e.strerror or e)
            self.decision_log_error = f"{self.decisions_path}: {e.strerror or e}"


def storage_reason(e: BaseException) -> str:
    """A storage error in one line, from its root cause: Optuna wraps SQLite's "attempt to write a readonly
    database" in a StorageInternalError blaming "invalid data", and SQLAlchemy's errors carry the SQL and
    a link on lines of their own."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}".strip()


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """"journal:PATH": a journal file (file-locked appends); anything else: an RDB URL."""
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    return optuna.storages.RDBStorage(url)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):       # numpy scalars
        return value.item()
    return str(value)
