"""The one reader of ``/proc`` (a thread's ``schedstat`` aside: :mod:`launcher.base.schedstat`): a process's or
thread's ``stat`` and mask, its command line, environment and mapped files, its ancestors, children and
descendants, and the process table. Every read is bounded; text is kept exactly (bytes that are not UTF-8 as
surrogates). A reader gives ``None`` or nothing for a process or thread that has gone. docs/doctor.md says why.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from launcher.base.cpulist import parse_cpulist

PROC = "/proc"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PF_KTHREAD = 0x00200000  # include/linux/sched.h: a kernel thread
TEXT_LIMIT = 1 << 20  # stat, status, cgroup: a few KiB
ARGS_LIMIT = 16 << 20  # a command line, an environment (the kernel gives both a quarter of the stack at most)
MAPS_LIMIT = 64 << 20  # vm.max_map_count's 65,530 mappings at about 1 KiB each
PATH_NEWLINE = "\\012"  # a newline of a path in maps
DELETED = " (deleted)"  # appended to the path of a file unlinked since it was mapped


@dataclass(frozen=True)
class ThreadStat:
    """A ``stat`` line: fields 2-6, 9, 14+15 (``ticks``), 22 (``start``, clock ticks since boot), 26-28
    (``image``: where the program's code and stack lie, zeros when not readable) and 39 (``processor``)."""

    tid: int
    comm: str
    state: str
    ppid: int
    processor: int
    ticks: int
    flags: int = 0
    image: tuple[int, int, int] = (0, 0, 0)
    pgid: int = 0
    sid: int = 0
    start: int = 0

    @property
    def exited(self) -> bool:
        """A zombie (``Z``) or dead (``X``) task."""
        return self.state in ("Z", "X")

    @property
    def kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def text(data: bytes) -> str:
    """Bytes from ``/proc`` as text, exactly (bytes not UTF-8 kept as surrogates, as :mod:`os` keeps paths)."""
    return data.decode("utf-8", "surrogateescape")


def read_bytes(path: str, limit: int) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def read_text(pid: int | str, name: str, proc: str = PROC) -> str | None:
    """``/proc/PID/NAME`` (``NAME`` may be ``task/TID/stat``), at most :data:`TEXT_LIMIT` of it."""
    data = read_bytes(os.path.join(proc, str(pid), name), TEXT_LIMIT)
    return None if data is None else text(data)


def parse_stat(line: str, tid: int) -> ThreadStat | None:
    """A ``stat`` line; the name may hold spaces and parentheses, so the fields start after the last ``)``."""
    head, sep, rest = line.rpartition(")")
    if not sep:
        return None
    comm = head.split("(", 1)[1] if "(" in head else head
    f = rest.split()  # f[N - 3] is field N
    try:
        return ThreadStat(tid, comm, f[0], int(f[1]), int(f[36]), int(f[11]) + int(f[12]), int(f[6]),
                          (int(f[23]), int(f[24]), int(f[25])), int(f[2]), int(f[3]), int(f[19]))
    except (IndexError, ValueError):
        return None


def thread_stat(pid: int, tid: int, proc: str = PROC) -> ThreadStat | None:
    line = read_text(pid, os.path.join("task", str(tid), "stat"), proc)
    return parse_stat(line, tid) if line else None


def process_stat(pid: int, proc: str = PROC) -> ThreadStat | None:
    """``/proc/PID/stat``: the whole process (its CPU time is all its threads')."""
    line = read_text(pid, "stat", proc)
    return parse_stat(line, pid) if line else None


def parent_pid(pid: int, proc: str = PROC) -> int | None:
    stat = process_stat(pid, proc)
    return stat.ppid if stat else None


def _status(pid: int, tid: int | None, key: str, proc: str) -> str | None:
    lines = read_text(pid, "status" if tid is None else os.path.join("task", str(tid), "status"), proc) or ""
    return next((line.split(":", 1)[1] for line in lines.splitlines() if line.startswith(key)), None)


def allowed_cpus(pid: int, tid: int | None = None, proc: str = PROC) -> frozenset[int] | None:
    """``Cpus_allowed_list`` of a thread (of the main thread with ``tid=None``)."""
    value = _status(pid, tid, "Cpus_allowed_list:", proc)
    try:
        return None if value is None else parse_cpulist(value)
    except ValueError:
        return None


def thread_group(pid: int, proc: str = PROC) -> int | None:
    """The process (``Tgid``) that ``pid`` is a thread of: ``pid`` itself for a process; ``None`` when gone."""
    value = (_status(pid, None, "Tgid:", proc) or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def thread_ids(pid: int | str, proc: str = PROC) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(os.path.join(proc, str(pid), "task")) if t.isdigit())
    except OSError:
        return []


def threads_union(pid: int, proc: str = PROC) -> frozenset[int]:
    """The union of the masks of all threads of ``pid`` (what it spans even when one thread is pinned)."""
    out: set[int] = set()
    for tid in thread_ids(pid, proc):
        out |= allowed_cpus(pid, tid, proc) or set()
    return frozenset(out)


def cmdline(pid: int, proc: str = PROC) -> list[str]:
    data = read_bytes(os.path.join(proc, str(pid), "cmdline"), ARGS_LIMIT)
    return [text(part) for part in (data or b"").split(b"\0") if part]


def environ_entries(pid: int, proc: str = PROC) -> list[bytes]:
    """The ``NAME=value`` entries ``pid`` was started with. Raises ``OSError``: gone, or not this user's to read."""
    with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
        return fh.read(ARGS_LIMIT).split(b"\0")


def environ(pid: int, proc: str = PROC) -> dict[str, str]:
    """:func:`environ_entries` as ``getenv`` finds them (a name given twice has its first value); a byte that is
    not UTF-8 reads as U+FFFD."""
    env: dict[str, str] = {}
    for item in environ_entries(pid, proc):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return env


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


def pids(proc: str = PROC) -> list[int]:
    """Every process this user can see."""
    try:
        return [int(name) for name in os.listdir(proc) if name.isascii() and name.isdigit()]
    except OSError:
        return []


def processes(proc: str = PROC, limit: int | None = None, exited: bool = True) -> dict[int, ThreadStat]:
    """pid -> ``stat`` of every process this user can see (at most ``limit``; zombies unless ``exited`` is
    false)."""
    out: dict[int, ThreadStat] = {}
    for pid in pids(proc):
        if limit is not None and len(out) >= limit:
            break
        stat = process_stat(pid, proc)
        if stat is not None and (exited or not stat.exited):
            out[pid] = stat
    return out


def descendants(root: int, table: Mapping[int, ThreadStat]) -> list[int]:
    """The pids of ``table`` below ``root``, each after its parent; none that started before ``root`` (a pid
    reused). Zombies count."""
    below: dict[int, list[int]] = {}
    for pid, stat in table.items():
        below.setdefault(stat.ppid, []).append(pid)
    top = table.get(root)
    out: list[int] = []
    stack, seen = [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for child in below.get(pid, ()):
            if top is None or table[child].start >= top.start:
                out.append(child)
                stack.append(child)
    return out


def children(pid: int | str = "self", proc: str = PROC) -> list[int] | None:
    """The children of ``pid``, from ``task/*/children`` (``None`` where the kernel has no such file)."""
    out: list[int] = []
    try:
        for tid in os.listdir(os.path.join(proc, str(pid), "task")):
            with open(os.path.join(proc, str(pid), "task", tid, "children"), encoding="ascii") as fh:
                out += [int(word) for word in fh.read().split()]
    except (OSError, ValueError):
        return None
    return out


@dataclass(frozen=True)
class MappedFile:
    """A file mapped into a process: its exact ``path``, whether it was unlinked since (``deleted``), and the
    first mapping's address range (``span``), the name of its ``map_files`` entry."""

    path: str
    deleted: bool
    span: str


def maps(pid: int | str, proc: str = PROC) -> Iterator[MappedFile]:
    """Each file mapping of ``pid`` (``"self"``: this process), in the order of ``maps``, at most
    :data:`MAPS_LIMIT` of it read. Raises ``OSError``: gone, or not this user's to read."""
    with open(os.path.join(proc, str(pid), "maps"), "rb") as fh:
        read = 0
        for raw in fh:
            read += len(raw)
            if read > MAPS_LIMIT:
                return
            parts = text(raw).rstrip("\n").split(None, 5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            path, deleted = parts[5], parts[5].endswith(DELETED)
            path = path[: -len(DELETED)] if deleted else path
            start, _, end = parts[0].partition("-")
            yield MappedFile(path.replace(PATH_NEWLINE, "\n"), deleted,
                             f"{start.lstrip('0') or '0'}-{end.lstrip('0') or '0'}")


def mapped_file(pid: int, wanted: Callable[[str], bool], proc: str = PROC) -> MappedFile | None:
    """The first file mapped into ``pid`` whose name (its last path component) is ``wanted``; ``None`` when none
    is, or the process has gone."""
    try:
        return next((m for m in maps(pid, proc) if wanted(os.path.basename(m.path))), None)
    except OSError:
        return None


def libraries(pid: int | str = "self", proc: str = PROC) -> list[str]:
    """The paths of the shared libraries (``.so`` in the name) mapped into ``pid``, in first-mapped order.
    Raises ``OSError`` as :func:`maps` does."""
    return list(dict.fromkeys(m.path for m in maps(pid, proc) if ".so" in os.path.basename(m.path)))
