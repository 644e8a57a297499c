"""The processes outside a live job that used CPU during its sample: who may take a rank's CPUs from it.

:class:`NeighbourWatch` reads every process's ``/proc/PID/stat`` (its CPU time, all threads) once when the sample
starts and once when it ends: two passes, at most :data:`MAX_PROCESSES` each, never one per sample. A process
that used at least :data:`BUSY_SHARE` of a CPU in between, is not of the job and is not the doctor, is a
neighbour; its mask (``status``) says which CPUs it may take. A process born during the sample counts from zero.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.base import procfs
from launcher.base.cpulist import format_cpulist

MAX_PROCESSES = 16384  # pids read a pass: /proc/PID/stat costs about 10 us; more are left out
BUSY_SHARE = 0.05  # of a CPU over the sample
KEPT = 32  # the busiest neighbours kept


@dataclass(frozen=True)
class Neighbour:
    pid: int
    comm: str
    cpu_share: float  # CPUs' worth of time over the sample (a process of several busy threads may use more than 1)
    allowed: frozenset[int]  # its main thread's mask

    def share_on(self, cpus: frozenset[int]) -> float:
        """The part of its CPU time it may have spent on ``cpus``, its time spread evenly over its mask."""
        if not self.allowed:
            return 0.0
        return self.cpu_share * len(self.allowed & cpus) / len(self.allowed)

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
