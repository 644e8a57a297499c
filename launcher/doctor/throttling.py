"""How long a live job's cgroups were throttled by their CPU quota during the sample (``cpu.stat``).

:class:`ThrottleWatch` finds each process's cgroups of the cpu controller once, when the sampler first sees it
(:func:`launcher.topology.cgroup.cpu_cgroups`: v2 and v1, its own and every parent up to the mount, since a parent's
quota throttles its children), reads their counters then and once more at the end. A cgroup throttled by a
parent's quota counts nothing itself: the level that counted most is the one reported.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from launcher.topology.cgroup import CpuCgroup, CpuStat, cpu_cgroups, find_cpu_quota, read_cpu_stat


@dataclass
class Throttling:
    """One cgroup of the job over the sample: the processes in it, and the throttling counters' growth."""

    cgroup: str  # "cgroup /sys/fs/cgroup/cpu/job" (the level that counted the most throttling)
    pids: list[int]
    seconds: float  # between the two readings
    periods: int = 0  # quota periods in which the cgroup had runnable tasks
    throttled_periods: int = 0  # of those, the periods in which the quota ran out
    throttled_s: float = 0.0  # time throttled, as the kernel sums it (v1 before Linux 6.18: over the CPUs)
    quota: str = ""  # the quota, as launcher.topology.cgroup.find_cpu_quota reads it ("" when none)

    @property
    def fraction(self) -> float:
        """The share of the sample its tasks were held back: the time throttled over the time, or the share of
        the periods in which the quota ran out, whichever is larger (1 at most)."""
        by_time = self.throttled_s / self.seconds if self.seconds > 0 else 0.0
        by_periods = self.throttled_periods / self.periods if self.periods > 0 else 0.0
        return min(1.0, max(by_time, by_periods))

    def to_json(self) -> dict[str, object]:
        return {"cgroup": self.cgroup, "pids": sorted(self.pids), "seconds": round(self.seconds, 3),
                "periods": self.periods, "throttled_periods": self.throttled_periods,
                "throttled_s": round(self.throttled_s, 3), "throttled_fraction": round(self.fraction, 3),
                "quota": self.quota or None}


@dataclass
class _Group:
    levels: list[CpuCgroup]
    first: list[CpuStat | None]
    started: float
    quota: str
    pids: list[int] = field(default_factory=list)


class ThrottleWatch:
    """The cgroups of a job's processes, read when each is first seen and at :meth:`finish`. Never raises."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._root = os.path.dirname(os.path.normpath(proc)) or "/"
        self._groups: dict[str, _Group] = {}  # the text of /proc/PID/cgroup -> its cgroups

    def add(self, pid: int) -> None:
        """A process first seen: one read of its ``cgroup`` file; its cgroups' counters when they are new."""
        try:
            with open(os.path.join(self._proc, str(pid), "cgroup"), "rb") as fh:
                key = fh.read(65536).decode("utf-8", "surrogateescape")
        except OSError:
            return
        group = self._groups.get(key)
        if group is None:
            levels = cpu_cgroups(self._root, str(pid))
            quota = find_cpu_quota(self._root, str(pid))
            group = self._groups[key] = _Group(levels, [read_cpu_stat(g, self._root) for g in levels],
                                               time.monotonic(), f"{quota.cpus:g} CPUs ({quota.source})" if quota else "")
        group.pids.append(pid)

    def finish(self) -> list[Throttling]:
        """The growth of each cgroup's counters since it was first read, at the level that counted the most."""
        out = []
        now = time.monotonic()
        for group in self._groups.values():
            best: Throttling | None = None
            for level, first in zip(group.levels, group.first):
                last = read_cpu_stat(level, self._root)
                if first is None or last is None:
                    continue
                found = Throttling(level.shown, group.pids, now - group.started, max(0, last.periods - first.periods),
                                   max(0, last.throttled_periods - first.throttled_periods),
                                   max(0, last.throttled_ns - first.throttled_ns) / 1e9)
                if best is None or (found.throttled_periods, found.throttled_s) > (best.throttled_periods,
                                                                                   best.throttled_s):
                    best = found
            if best is not None:
                best.quota = group.quota
                out.append(best)
        return out
