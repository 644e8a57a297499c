"""``affrun doctor --pid PID``: sample a running job from ``/proc`` into the records of :mod:`launcher.doctor.live`
until ``duration`` has passed or the audited process exits, then judge them. docs/doctor.md says what is read
and what it costs."""

from __future__ import annotations

import os
import select
import time

from launcher.base import procfs
from launcher.base.errors import AffrunError
from launcher.base.schedstat import thread_schedstat
from launcher.base.untrusted import short
from launcher.context.runtimes import runtimes_from_paths
from launcher.doctor.collapse import job_collapse_findings
from launcher.doctor.contention import NeighbourWatch, ThrottleWatch
from launcher.doctor.findings import merge_subjects
from launcher.doctor.gpu import GpuSampler
from launcher.doctor.job_checks import job_findings
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from launcher.doctor.nccl_live import rank_nccl_findings
from launcher.doctor.starvation import judge_ranks, starvation_findings
from launcher.doctor.target_environ import read_target_environ
from launcher.doctor.thread_checks import thread_findings
from launcher.doctor.thread_homes import assign_homes

MAX_SECONDS = 86400.0  # --duration and --interval: a day at most
MIN_INTERVAL = 0.005  # seconds between samples
DUTY = 0.05  # the sampler's CPU time is at most this share of one CPU: a sample that costs more waits longer
SETUP_S = 0.1  # CPU seconds of the first reads of each process (its maps, its environment) the duty leaves out


def _tree(pid: int, start: int, proc: str) -> list[int]:
    """``pid`` (while it is the process that started at ``start``) and its descendants, less this process and its
    own where ``pid`` is an ancestor of it (``--pid $$`` from a shell: the audit is of the job, not the doctor)."""
    table = procfs.processes(proc)
    if pid not in table or table[pid].start != start:
        return []
    tree = [pid, *procfs.descendants(pid, table)]
    me = os.getpid()
    if pid != me and me in tree:
        mine = {me, *procfs.descendants(me, table)}
        tree = [p for p in tree if p not in mine]
    return tree


UNREADABLE = "its environment cannot be read ({}: another user's process, or one that is not dumpable)"


def _new_record(pid: int, proc: str, unions: dict[int, frozenset[int]]) -> ProcessRecord | None:
    """The record of a process first seen; ``unions``: the parents' masks read in this sample, by pid."""
    stat = procfs.thread_stat(pid, pid, proc)
    if stat is None:
        return None
    problem = ""
    try:
        environ = read_target_environ(pid, proc)
    except OSError as exc:
        environ = {}
        if isinstance(exc, PermissionError):
            problem = UNREADABLE.format(exc.strerror or "permission denied")
    record = ProcessRecord(pid, stat.ppid, stat.comm, procfs.cmdline(pid, proc), environ, image=stat.image,
                           plan_problem=problem)
    if stat.ppid > 0 and stat.ppid not in unions:
        unions[stat.ppid] = procfs.threads_union(stat.ppid, proc)
    record.launcher_mask = unions.get(stat.ppid, frozenset())
    return record


def _refresh(record: ProcessRecord, proc: str) -> None:
    """Read the libraries again at the end, and, where the process ran another program during the sample (where
    its code and stack lie changed), that program's command line, environment and name."""
    stat = procfs.thread_stat(record.pid, record.pid, proc)
    if stat is not None and any(stat.image) and stat.image != record.image:
        line = procfs.cmdline(record.pid, proc)
        try:
            record.environ = read_target_environ(record.pid, proc)
        except PermissionError as exc:  # a setuid program: not this user's to read any more
            record.environ, record.plan_problem = {}, UNREADABLE.format(exc.strerror or "permission denied")
        except OSError:
            pass  # it has just exited: keep what was read
        record.cmdline, record.comm, record.image = line or record.cmdline, stat.comm, stat.image
    _read_libraries(record, proc)


def _sample_process(record: ProcessRecord, proc: str) -> None:
    tids = procfs.thread_ids(record.pid, proc)
    if not tids:
        record.alive = False
        return
    for tid in tids:
        stat = procfs.thread_stat(record.pid, tid, proc)
        if stat is None:
            continue
        if tid == record.pid and stat.exited:
            record.alive = False  # a zombie: it has exited, its parent has not reaped it yet
        allowed = procfs.allowed_cpus(record.pid, tid, proc)
        thread = record.threads.get(tid)
        if thread is None:
            thread = record.threads[tid] = ThreadRecord(tid, stat.comm, allowed or frozenset(), stat.processor)
        if not stat.exited:  # an exited thread runs nowhere: its stat keeps the CPU it last ran on, before
            thread.update(stat, allowed)
        sched = thread_schedstat(record.pid, tid, proc)  # its wait for a CPU: one small read more
        if sched is not None:
            thread.note_sched(time.monotonic(), *sched)


def _read_libraries(record: ProcessRecord, proc: str) -> None:
    try:
        record.libraries = procfs.libraries(record.pid, proc)
    except OSError:
        return  # gone, or not ours: keep what was read before


def _target(pid: int, proc: str) -> procfs.ThreadStat:
    """Refuse a ``pid`` that is not a process of a job: a thread of another process, a kernel thread."""
    group = procfs.thread_group(pid, proc)
    stat = procfs.thread_stat(pid, pid, proc)
    if group is None or (group == pid and stat is None):
        raise AffrunError(f"--pid {pid}: no such process")
    if group != pid:
        raise AffrunError(f"--pid {pid} is a thread of process {group}, not a process: give --pid {group}")
    assert stat is not None
    if stat.kernel_thread:
        raise AffrunError(f"--pid {pid} is a kernel thread ({short(stat.comm, 40)}), not a job: give the pid of a "
                          "training process or of its launcher")
    return stat


def _readable(pid: int, proc: str) -> None:
    """Refuse a process whose environment or memory maps this user may not open (a zombie's fails with ESRCH:
    reported as exited)."""
    for name in ("environ", "maps"):
        path = os.path.join(proc, str(pid), name)
        try:
            os.close(os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            raise AffrunError(f"--pid {pid}: no such process") from None
        except PermissionError as exc:
            raise AffrunError(f"--pid {pid}: cannot read {path} ({exc.strerror or 'refused'}): run as the job's user "
                              "or root") from None
        except OSError:
            return  # ESRCH: a zombie, whose memory is gone: it is reported as exited


def _exit_watch(pid: int, proc: str) -> int | None:
    """A pidfd of ``pid``: readable once the process exits (Linux 5.3); ``None`` where there is none."""
    if proc != "/proc" or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _pause(seconds: float, pid: int, pidfd: int | None, proc: str) -> None:
    """Wait ``seconds``, or less: until the process ``pid`` exits (through its pidfd, else every 0.1 s)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if pidfd is not None:
            select.select([pidfd], [], [], left)
            return
        time.sleep(min(left, 0.1))
        stat = procfs.thread_stat(pid, pid, proc)
        if stat is None or stat.exited:
            return


def sample_job(pid: int, duration: float = 2.0, interval: float = 0.05, proc: str = "/proc") -> JobAudit:
    """Sample the process ``pid`` and its descendants for ``duration`` seconds (checked by the caller), or until
    ``pid`` exits. :class:`AffrunError` when ``pid`` is not a process that can be read (gone, a thread, a kernel
    thread, another user's)."""
    root = _target(pid, proc)
    _readable(pid, proc)
    records: dict[int, ProcessRecord] = {}
    gpus = GpuSampler()
    throttle = ThrottleWatch(proc)
    neighbours = NeighbourWatch(proc)
    pidfd = _exit_watch(pid, proc)
    start, spent = time.monotonic(), time.process_time()
    samples, slowed = 0, False
    try:
        while True:
            seen: set[int] = set()
            unions: dict[int, frozenset[int]] = {}
            for p in _tree(pid, root.start, proc):
                record = records.get(p)
                if record is None:
                    record = _new_record(p, proc, unions)
                    if record is None:
                        continue
                    records[p] = record
                    record.seen = (samples, samples)
                    _read_libraries(record, proc)
                    throttle.add(p)
                seen.add(p)
                _sample_process(record, proc)
                if record.alive:  # the samples that found it running (DataLoaders one after another: thread_homes)
                    record.seen = (record.seen[0], samples)
            for gone in set(records) - seen:
                records[gone].alive = False
            gpus.sample(set(records))
            samples += 1
            elapsed = time.monotonic() - start
            if elapsed >= duration or pid not in records or not records[pid].alive:
                break  # the time is up, or the job has ended: what was seen is the report
            # the sampler's CPU time stays within DUTY of one CPU, whatever the interval (docs/doctor.md)
            wait = max(interval, (time.process_time() - spent - SETUP_S) / DUTY - elapsed)
            slowed = slowed or wait > interval
            _pause(min(wait, duration - elapsed), pid, pidfd, proc)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    elapsed = time.monotonic() - start
    if not records:
        raise AffrunError(f"--pid {pid}: the process ended before it could be read")
    throttling = throttle.finish()
    busy = neighbours.finish(records, _mine())
    from launcher.feed.figures import read_live

    for record in records.values():
        if record.alive:
            _refresh(record, proc)  # libraries loaded during the sample (import torch) count too
            record.feed = read_live(record.pid, record.environ, proc)  # --feed-report's figures so far
    ordered = sorted(records.values(), key=lambda r: r.pid)
    from launcher.doctor.facts import machine_cpus
    from launcher.topology import load_topology

    topo = load_topology()
    audit = JobAudit(pid, elapsed, interval, samples, ordered, gpus.report(), machine_cpus(topo, live=True),
                     online=topo.online, throttling=throttling, neighbours=busy, slowed=slowed)
    _reference(audit, records[pid], proc)
    assign_roles(audit)
    for record in ordered:
        cpus = len(record.mask) or len(audit.machine_cpus)
        record.runtimes = runtimes_from_paths(record.libraries, record.environ, cpus)
    assign_homes(audit)

    def ancestors(p: int) -> list[tuple[int, str]]:
        return procfs.ancestors(p, proc)

    audit.findings = job_findings(audit, topo, ancestors_of=ancestors)
    audit.starvation = judge_ranks(audit)
    audit.findings = merge_subjects([*audit.findings, *rank_nccl_findings(audit, audit.ranks(), topo),
                                     *thread_findings(audit, ancestors), *job_collapse_findings(audit, topo, ancestors(pid)),
                                     *starvation_findings(audit, audit.starvation)])
    return audit


def _mine() -> set[int]:
    """This process and its children: the doctor is not a neighbour of the job it audits."""
    return {os.getpid(), *procfs.descendants(os.getpid(), procfs.processes())}


def _reference(audit: JobAudit, root: ProcessRecord, proc: str) -> None:
    """What the job could use: the audited process's cgroup cpuset within the online CPUs (else the online CPUs),
    and its parent's mask, the mask the launcher started from."""
    from launcher.topology.cgroup import find_cpuset

    cpuset = find_cpuset(os.path.dirname(os.path.normpath(proc)) or "/", str(root.pid))
    online = audit.online
    if cpuset is not None and cpuset.cpus & online:
        audit.reference = cpuset.cpus & online
        audit.reference_source = f"its cgroup cpuset, {cpuset.description}, within the online CPUs"
    else:
        audit.reference, audit.reference_source = online, "the online CPUs"
    if root.ppid > 0:  # its mask was read with the first sample (ProcessRecord.launcher_mask)
        audit.parent = (root.ppid, " ".join(procfs.cmdline(root.ppid, proc)), root.launcher_mask)
