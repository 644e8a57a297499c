"""The loop thread's wait for a CPU, for the meter: the run-queue delay of the thread that took the first batch (the
second field of ``/proc/self/task/TID/schedstat``, in ns; the kernel fills it with ``CONFIG_SCHED_INFO``), read at
the first batch and at each write of the figures, never per batch, over the time between the two readings.
Standard library only: the meter loads this module into every metered rank. docs/tune.md ("How it works").
"""

from __future__ import annotations

import os
import threading

_READ = os.O_RDONLY | os.O_CLOEXEC


def run_delay_ns(path: str) -> int | None:
    """The run-queue delay in ``path`` (a ``schedstat`` file: ns on the CPU, ns waiting on a run queue, timeslices);
    ``None`` where the file is missing or holds something else."""
    try:
        fd = os.open(path, _READ)
    except OSError:
        return None
    try:
        data = os.read(fd, 256)
    except OSError:
        return None
    finally:
        os.close(fd)
    fields = data.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


class CpuWait:
    """The share of the time since :meth:`start` that the thread which called it waited on a run queue.
    :attr:`fraction` is ``None`` until a second reading, and stays so where ``schedstat`` cannot be read (never 0
    for a figure that was not measured)."""

    __slots__ = ("_path", "_start", "fraction")

    def __init__(self, proc: str = "/proc") -> None:
        self._path = proc  # the thread's schedstat once started
        self._start: tuple[float, int] | None = None
        self.fraction: float | None = None

    def start(self, now: float) -> None:
        """In the loop's thread, at its first batch (``now``: ``time.perf_counter()``). The file is named by the
        thread's id, so a later reading from another thread (the final figures at exit) is still this thread's."""
        path = os.path.join(self._path, "self", "task", str(threading.get_native_id()), "schedstat")
        delay = run_delay_ns(path)
        if delay is not None:
            self._path, self._start = path, (now, delay)

    def read(self, now: float) -> float | None:
        """Read the thread's delay again and return the share so far; the last share where the file is gone (the
        thread has ended) or no time has passed."""
        if self._start is None:
            return self.fraction
        since, delay0 = self._start
        delay = run_delay_ns(self._path)
        if delay is not None and now > since:
            self.fraction = min(max((delay - delay0) / 1e9 / (now - since), 0.0), 1.0)
        return self.fraction
