"""What competes with a live job for its CPUs over the sample: its cgroups' CPU quota (:class:`ThrottleWatch`)
and the busy processes outside it (:class:`NeighbourWatch`). docs/doctor.md ("Throttling", "Busy processes")."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from launcher.base import procfs
from launcher.base.cpulist import format_cpulist
from launcher.topology.cgroup import CpuCgroup, CpuStat, cpu_cgroups, find_cpu_quota, read_cpu_stat


def spread(share: float, allowed: frozenset[int], cpus: frozenset[int]) -> float:
    """The part of ``share`` (CPUs' worth of time) spent on ``cpus``, spread evenly over the mask ``allowed``."""
    return share * len(allowed & cpus) / len(allowed) if allowed else 0.0


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


MAX_PROCESSES = 16384  # pids read a pass; more are left out
BUSY_SHARE = 0.05  # of a CPU over the sample
KEPT = 32  # the busiest neighbours kept


@dataclass(frozen=True)
class Neighbour:
    pid: int
    comm: str
    cpu_share: float  # CPUs' worth of time over the sample (a process of several busy threads may use more than 1)
    allowed: frozenset[int]  # its main thread's mask

    def share_on(self, cpus: frozenset[int]) -> float:
        return spread(self.cpu_share, self.allowed, cpus)

    def text(self) -> str:
        return f"pid {self.pid} ({self.comm}, {100 * self.cpu_share:.0f}% of a CPU on CPUs {format_cpulist(self.allowed)})"

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "comm": self.comm, "cpu_share": round(self.cpu_share, 3),
                "allowed": format_cpulist(self.allowed)}


def _ticks(proc: str) -> dict[int, tuple[int, str]]:
    """pid -> (CPU time in clock ticks, name) of every process but zombies, at most :data:`MAX_PROCESSES`."""
    return {pid: (s.ticks, s.comm) for pid, s in procfs.processes(proc, MAX_PROCESSES, exited=False).items()}


class NeighbourWatch:
    """Two passes over ``/proc``: :meth:`finish` returns the busy processes that are not ``job`` or ``mine``."""

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._start = time.monotonic()
        self._first = _ticks(proc)

    def finish(self, job: Iterable[int], mine: Iterable[int]) -> list[Neighbour]:
        seconds = time.monotonic() - self._start
        if seconds <= 0:
            return []
        skip = {*job, *mine}
        busy: list[tuple[float, int, str]] = []
        for pid, (ticks, comm) in _ticks(self._proc).items():
            known = pid in self._first
            start = self._first[pid][0] if known else 0  # a process born during the sample counts from zero
            if pid in skip or (not known and len(self._first) >= MAX_PROCESSES) or ticks < start:
                continue  # of the job; not read at the start (the pass was full); a pid given to a new process
            share = (ticks - start) / procfs.CLOCK_TICKS / seconds
            if share >= BUSY_SHARE:
                busy.append((share, pid, comm))
        found = []
        for share, pid, comm in sorted(busy, key=lambda b: (-b[0], b[1]))[:KEPT]:  # the busiest: one read each
            allowed = procfs.allowed_cpus(pid, None, self._proc)
            if allowed:
                found.append(Neighbour(pid, comm, share, allowed))
        return found
