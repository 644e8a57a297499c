"""Read one process's threads from ``/proc``: allowed CPUs, the CPU each last ran on, CPU time, command line.

Every reader returns ``None`` (or an empty result) when the process or thread has gone: a live job's processes
come and go while it is sampled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from launcher.base.cpulist import parse_cpulist

PROC = "/proc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PF_KTHREAD = 0x00200000  # include/linux/sched.h: a kernel thread (no user memory, no command line)


@dataclass(frozen=True)
class ThreadStat:
    tid: int
    comm: str
    state: str
    ppid: int
    processor: int  # field 39 of stat: the CPU the thread last ran on
    ticks: int  # utime + stime, in clock ticks
    flags: int = 0  # field 9: the kernel's PF_* flags

    @property
    def exited(self) -> bool:
        """A zombie (``Z``: exited, not yet reaped by its parent) or dead (``X``) task: it runs no more."""
        return self.state in ("Z", "X")

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def parse_stat(text: str, tid: int) -> ThreadStat | None:
    """Parse a ``stat`` line; the command name may hold spaces and parentheses, so split after the last ``)``."""
    head, sep, rest = text.rpartition(")")
    if not sep:
        return None
    comm = head.split("(", 1)[1] if "(" in head else head
    fields = rest.split()
    # rest starts at field 3 (state): field N is fields[N - 3]
    try:
        return ThreadStat(tid, comm, fields[0], int(fields[1]), int(fields[36]), int(fields[11]) + int(fields[12]),
                          int(fields[6]))
    except (IndexError, ValueError):
        return None


def thread_stat(pid: int, tid: int, proc: str = PROC) -> ThreadStat | None:
    text = _read(os.path.join(proc, str(pid), "task", str(tid), "stat"))
    return parse_stat(text, tid) if text else None


def allowed_cpus(pid: int, tid: int | None = None, proc: str = PROC) -> frozenset[int] | None:
    """``Cpus_allowed_list`` of a thread (of the main thread with ``tid=None``)."""
    path = (os.path.join(proc, str(pid), "status") if tid is None
            else os.path.join(proc, str(pid), "task", str(tid), "status"))
    text = _read(path)
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            try:
                return parse_cpulist(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def thread_group(pid: int, proc: str = PROC) -> int | None:
    """The process (``Tgid``) that ``pid`` is a thread of: ``pid`` itself for a process, ``None`` when gone.

    ``/proc/TID`` of any thread exists, though ``ls /proc`` does not list it."""
    text = _read(os.path.join(proc, str(pid), "status"))
    for line in (text or "").splitlines():
        if line.startswith("Tgid:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isascii() and value.isdigit() else None
    return None


def thread_ids(pid: int, proc: str = PROC) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(os.path.join(proc, str(pid), "task")) if t.isdigit())
    except OSError:
        return []


def cmdline(pid: int, proc: str = PROC) -> list[str]:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as fh:
            data = fh.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in data.split(b"\0") if part]


def parent_pid(pid: int, proc: str = PROC) -> int | None:
    text = _read(os.path.join(proc, str(pid), "stat"))
    stat = parse_stat(text, pid) if text else None
    return stat.ppid if stat else None


def ancestors(pid: int, proc: str = PROC, limit: int = 32) -> list[tuple[int, str]]:
    """(pid, command line joined with spaces) of the parents of ``pid``, nearest first, up to (not with) init."""
    out: list[tuple[int, str]] = []
    current = pid
    for _ in range(limit):
        parent = parent_pid(current, proc)
        if parent is None or parent <= 1:
            break
        out.append((parent, " ".join(cmdline(parent, proc))))
        current = parent
    return out


def threads_union(pid: int, proc: str = PROC) -> frozenset[int]:
    """The union of the masks of all threads of ``pid`` (what the process spans even when one thread is pinned)."""
    out: set[int] = set()
    for tid in thread_ids(pid, proc):
        cpus = allowed_cpus(pid, tid, proc)
        if cpus:
            out |= cpus
    return frozenset(out)
