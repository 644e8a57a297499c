"""The loop thread's wait for a CPU, for the meter: its run-queue delay over the time between two readings
(docs/tune.md, "How it works")."""

from __future__ import annotations

import threading

from launcher.base.schedstat import thread_schedstat


class CpuWait:
    """The share of the time since :meth:`start` that the thread which called it waited on a run queue;
    :attr:`fraction` is ``None`` until a second reading, and where ``schedstat`` cannot be read."""

    __slots__ = ("_proc", "_start", "_tid", "fraction")

    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._tid = 0  # the thread that started it: a later reading from another thread is still this one's
        self._start: tuple[float, int] | None = None
        self.fraction: float | None = None

    def start(self, now: float) -> None:
        """In the loop's thread, at its first batch (``now``: ``time.perf_counter()``)."""
        tid = threading.get_native_id()
        sched = thread_schedstat("self", tid, self._proc)
        if sched is not None:
            self._tid, self._start = tid, (now, sched[1])

    def read(self, now: float) -> float | None:
        """The share so far; the last share where the thread has ended or no time has passed."""
        if self._start is None:
            return self.fraction
        since, delay0 = self._start
        sched = thread_schedstat("self", self._tid, self._proc)
        if sched is not None and now > since:
            self.fraction = min(max((sched[1] - delay0) / 1e9 / (now - since), 0.0), 1.0)
        return self.fraction
