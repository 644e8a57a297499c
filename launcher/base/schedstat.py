"""A thread's ``/proc/PID/task/TID/schedstat`` (kernel ``CONFIG_SCHED_INFO``): the ns it ran on a CPU and the ns it
waited on a run queue for one. The one reader, for ``affrun doctor --pid`` and the meter in a rank: one bounded
read, standard library only."""

from __future__ import annotations

import os


def thread_schedstat(pid: int | str, tid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting on a run queue) of thread ``tid`` of ``pid`` (``"self"``: this process); ``None``
    where the thread has gone, the kernel keeps no such file, or it holds something else."""
    try:
        fd = os.open(os.path.join(proc, str(pid), "task", str(tid), "schedstat"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fields = os.read(fd, 256).split()
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(fields) < 2 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    return int(fields[0]), int(fields[1])
