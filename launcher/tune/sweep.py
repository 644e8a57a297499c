"""Every process of a trial, found and stopped, whatever the script did to its session, group or environment:
tune as a child subreaper, SIGTERM then SIGKILL to the trial's group, then a sweep by ancestry, start time and
marker variable. docs/tune.md ("Every process of a trial") says why."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from launcher.base import procfs
from launcher.base.procfs import ThreadStat

MARKER = "AFFRUN_TUNE_TRIAL"  # in every process of a trial that keeps its environment
GRACE = 5.0
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
Member = tuple[int, int]  # (pid, start time in clock ticks since boot): one process, never a later one of its pid


def boot_ticks() -> int:
    """Now, in the clock of /proc's start times (clock ticks since boot), one tick early."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * procfs.CLOCK_TICKS) - 1


def descendants(root: int, table: dict[int, ThreadStat] | None = None, since: int = 0) -> set[Member]:
    """Every descendant of ``root`` (zombies included) started at ``since`` or later."""
    table = procfs.processes() if table is None else table
    return {(pid, table[pid].start) for pid in procfs.descendants(root, table) if table[pid].start >= since}


def marked(marker: str) -> set[Member]:
    """The processes whose environment (as they started) holds ``MARKER=marker``, or a value that begins with
    ``marker`` when it ends with ``-`` (the markers of every trial of a session)."""
    needle = f"{MARKER}={marker}".encode()
    whole = not marker.endswith("-")
    out: set[Member] = set()
    for pid in procfs.pids():
        try:
            entries = procfs.environ_entries(pid) if pid != os.getpid() else []
        except OSError:
            continue
        found = needle in entries if whole else any(e.startswith(needle) for e in entries)
        p = procfs.process_stat(pid) if found else None
        if p is not None:
            out.add((pid, p.start))
    return out


def alive(members: set[Member]) -> set[Member]:
    """The members still running as the same process (same start time; a zombie counts as gone)."""
    out = set()
    for pid, start in members:
        p = procfs.process_stat(pid)
        if p is not None and p.start == start and p.state not in ("Z", "X"):
            out.add((pid, start))
    return out


def _prctl(option: int, arg: object) -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    return int(libc.prctl(ctypes.c_int(option), arg, zero, zero, zero))


@contextmanager
def subreaping() -> Iterator[bool]:
    """This process as a child subreaper for the ``with`` block (yields whether it is one); its state before is
    restored after."""
    import ctypes

    state = ctypes.c_int(0)
    before = _prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(state)) == 0 and state.value != 0
    on = before or _prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1)) == 0
    try:
        yield on
    finally:
        if on and not before:
            _prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(0))


def reap(since: int, table: dict[int, ThreadStat] | None = None, keep: int = 0) -> None:
    """Wait for this process's zombie children started at ``since`` or later (orphans re-parented to it), but
    ``keep`` (a child whose status its owner still reads)."""
    me = os.getpid()
    for pid, p in (procfs.processes() if table is None else table).items():
        if p.ppid == me and p.state == "Z" and p.start >= since and pid != keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def watch(job: int, family: set[Member], since: int, subreaper: bool) -> None:
    """The sweep's part of each poll of a running trial: reap the orphans re-parented to tune that have exited;
    without the subreaper, note the job's descendants instead, from the whole of /proc."""
    kids = procfs.children() if subreaper else None
    if kids is None:
        table = procfs.processes()
        family.update(descendants(job, table))
        reap(since, table, keep=job)
        return
    for pid in kids:
        p = procfs.process_stat(pid) if pid != job else None
        if p is not None and p.state == "Z" and p.start >= since:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def kill(member: Member) -> None:
    """SIGKILL the process and its process group (never tune's own), by pidfd where the kernel has them: a pid
    reused meanwhile is never hit."""
    pid, start = member
    p = procfs.process_stat(pid)
    if p is None or p.start != start:
        return
    if p.sid != os.getsid(0) and p.pgid > 1:
        try:
            os.killpg(p.pgid, signal.SIGKILL)
        except OSError:
            pass
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = -1
    try:
        again = procfs.process_stat(pid)
        if again is None or again.start != start:
            return
        if fd >= 0:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def sweep(marker: str, family: set[Member], since: int) -> int:
    """Kill every process of the trial (``family``, the marked, tune's descendants started since ``since``) until
    none is left, at most :data:`GRACE` seconds; reap the zombies. Returns how many survived (0)."""
    deadline = time.monotonic() + GRACE

    def found() -> set[Member]:
        table = procfs.processes()
        reap(since, table)
        return alive(family | marked(marker) | descendants(os.getpid(), table, since))

    left = found()
    while left and time.monotonic() < deadline:
        for member in left:
            kill(member)
        time.sleep(0.02)  # a process that forks and exits every 0.1 s is found again before it does
        left = alive(left) | found()
    reap(since)
    return len(left)


def stop(proc: subprocess.Popen[bytes] | None, marker: str, family: set[Member], since: int) -> int:
    """Stop the trial whose job is ``proc`` (the leader of its process group; ``None`` when starting it failed):
    SIGTERM to the group, SIGKILL after :data:`GRACE` seconds, then :func:`sweep`. Returns how many of its
    processes survived (0)."""
    if proc is None:
        return sweep(marker, family, since)
    if proc.poll() is None:  # not reaped: its pid is still the job's, not a stranger's that reuses it
        family.update(descendants(proc.pid))
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)  # what is left of the group (a rank's workers, a stray child)
    return sweep(marker, family, since)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:  # the group is gone
        pass
