"""Read one process's threads from ``/proc``: allowed CPUs, the CPU each last ran on, CPU time, command line, and
the files it has mapped (each thread's wait for a CPU: :mod:`launcher.base.schedstat`).

Every reader returns ``None`` (or an empty result) when the process or thread has gone: a live job's processes
come and go while it is sampled. Text is kept exactly: bytes that are not UTF-8 as Python keeps them in a path
(``surrogateescape``: ``\\udcff`` for the byte 0xff), a ``\\r`` as it is; every read is bounded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
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
    # fields 26 to 28, where the program's code starts and ends and its stack starts: a new program (execve) has
    # others (its size; address space randomisation); zeros where this user may not read the process's memory
    image: tuple[int, int, int] = (0, 0, 0)

    @property
    def exited(self) -> bool:
        """A zombie (``Z``: exited, not yet reaped by its parent) or dead (``X``) task: it runs no more."""
        return self.state in ("Z", "X")

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


TEXT_LIMIT = 1 << 20  # stat and status are a few KiB
CMDLINE_LIMIT = 16 << 20  # a command line and its environment fit in the stack's quarter (8 MiB stacks: 2 MiB)
MAPS_LIMIT = 64 << 20  # vm.max_map_count's 65,530 mappings at about 1 KiB each at most
PATH_NEWLINE = "\\012"  # how the kernel writes a newline of a path in maps (seq_file_path escapes only "\\n")
DELETED = " (deleted)"  # what the kernel appends to the path of a file unlinked since it was mapped


def text(data: bytes) -> str:
    """Bytes from ``/proc`` as text, exactly (:mod:`os`'s own rule for paths: bytes not UTF-8 kept as surrogates)."""
    return data.decode("utf-8", "surrogateescape")


def _read_bytes(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def _read(path: str) -> str | None:
    data = _read_bytes(path, TEXT_LIMIT)
    return None if data is None else text(data)


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
                          int(fields[6]), (int(fields[23]), int(fields[24]), int(fields[25])))
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
    data = _read_bytes(os.path.join(proc, str(pid), "cmdline"), CMDLINE_LIMIT)
    return [text(part) for part in (data or b"").split(b"\0") if part]


def parent_pid(pid: int, proc: str = PROC) -> int | None:
    text = _read(os.path.join(proc, str(pid), "stat"))
    stat = parse_stat(text, pid) if text else None
    return stat.ppid if stat else None


def process_stat(pid: int, proc: str = PROC) -> ThreadStat | None:
    """``/proc/PID/stat``: the whole process (its CPU time is all its threads'), ``None`` when gone."""
    text = _read(os.path.join(proc, str(pid), "stat"))
    return parse_stat(text, pid) if text else None


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


@dataclass(frozen=True)
class MappedFile:
    """A file mapped into a process: its ``path`` (the kernel's ``\\012`` made a newline again), whether it was
    unlinked since (``deleted``), and the first mapping's address range, the name of its ``map_files`` entry."""

    path: str
    deleted: bool
    span: str


def mapped_file(pid: int, wanted: Callable[[str], bool], proc: str = PROC) -> MappedFile | None:
    """The first file mapped into ``pid`` whose name (its last path component) is ``wanted``; ``None`` when none
    is, or the process has gone. At most :data:`MAPS_LIMIT` bytes of ``maps`` are read."""
    try:
        with open(os.path.join(proc, str(pid), "maps"), "rb") as fh:
            read = 0
            for raw in fh:
                read += len(raw)
                if read > MAPS_LIMIT:
                    return None
                parts = text(raw).rstrip("\n").split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                path, deleted = parts[5], parts[5].endswith(DELETED)
                path = path[: -len(DELETED)] if deleted else path
                if wanted(os.path.basename(path).replace(PATH_NEWLINE, "\n")):
                    start, _, end = parts[0].partition("-")
                    return MappedFile(path.replace(PATH_NEWLINE, "\n"), deleted, f"{start.lstrip('0') or '0'}-"
                                      f"{end.lstrip('0') or '0'}")
    except OSError:
        return None
    return None
