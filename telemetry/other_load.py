"""How much of the machine's CPU other processes used over an interval (Linux /proc).

Any other busy process ruins CPU timings (a descheduled OpenMP thread stalls every parallel
region), so calibration and the benchmarks check it next to each measurement."""

from __future__ import annotations


class OtherLoad:
    """Share of all cores' time used by other processes between construction and share()."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[int, int, int]:
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
            with open("/proc/self/stat") as f:
                own = [int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15]]  # utime stime cutime cstime
        except OSError:                       # not Linux: nothing to tell
            return 0, 0, 0
        return sum(ticks), sum(ticks) - ticks[3] - ticks[4], sum(own)   # total, busy, ours

    def share(self) -> float:
        total, busy, own = (b - a for a, b in zip(self._start, self._sample()))
        return max(0.0, (busy - own) / total) if total else 0.0
