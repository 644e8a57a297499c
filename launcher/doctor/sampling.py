"""``affrun doctor --pid PID``'s sampling: read a running job from ``/proc`` into the records of
:mod:`launcher.doctor.live`, then analyse them there.

:func:`sample_job` reads ``/proc`` every ``interval`` seconds for ``duration`` seconds: each thread's allowed CPUs
and the CPU it last ran on (``stat`` field 39), its CPU time, and each process's libraries and environment. A
change of CPU between two samples counts as a migration, so the rate is a lower bound.
"""

from __future__ import annotations

import os
import time
from typing import Any

from launcher.context.runtimes import read_environ, runtimes_from_paths
from launcher.doctor import procfs
from launcher.doctor.gpu import GpuSampler
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles, job_findings
from launcher.errors import AffrunError


def _tree(root: Any) -> list[Any]:
    import psutil

    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _new_record(pid: int, proc: str) -> ProcessRecord | None:
    stat = procfs.thread_stat(pid, pid, proc)
    if stat is None:
        return None
    try:
        environ = read_environ(pid, proc)
    except OSError:
        environ = {}
    record = ProcessRecord(pid, stat.ppid, stat.comm, procfs.cmdline(pid, proc), environ)
    record.launcher_mask = procfs.threads_union(stat.ppid, proc) if stat.ppid > 0 else frozenset()
    return record


def _sample_process(record: ProcessRecord, proc: str) -> None:
    tids = procfs.thread_ids(record.pid, proc)
    if not tids:
        record.alive = False
        return
    for tid in tids:
        stat = procfs.thread_stat(record.pid, tid, proc)
        if stat is None:
            continue
        allowed = procfs.allowed_cpus(record.pid, tid, proc)
        thread = record.threads.get(tid)
        if thread is None:
            thread = record.threads[tid] = ThreadRecord(tid, stat.comm, allowed or frozenset(), stat.processor)
        thread.update(stat, allowed)


def _read_libraries(record: ProcessRecord, proc: str) -> None:
    from launcher.context.runtimes import mapped_libraries

    try:
        record.libraries = mapped_libraries(record.pid, proc)
    except OSError:
        return  # gone, or not ours: keep what was read before


def sample_job(pid: int, duration: float = 2.0, interval: float = 0.05, proc: str = "/proc") -> JobAudit:
    """Sample the process ``pid`` and its descendants; raise :class:`AffrunError` if it does not exist."""
    import psutil

    if duration < 0 or interval <= 0:
        raise AffrunError("--duration must be >= 0 and --interval > 0")
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise AffrunError(f"--pid {pid}: no such process") from None
    except psutil.AccessDenied:
        raise AffrunError(f"--pid {pid}: permission denied") from None
    if not os.access(os.path.join(proc, str(pid), "maps"), os.R_OK):
        raise AffrunError(f"--pid {pid}: cannot read {proc}/{pid}/maps (run as the job's user or root)")
    records: dict[int, ProcessRecord] = {}
    gpus = GpuSampler()
    start = time.monotonic()
    samples = 0
    while True:
        seen: set[int] = set()
        for p in _tree(root):
            record = records.get(p.pid)
            if record is None:
                record = _new_record(p.pid, proc)
                if record is None:
                    continue
                records[p.pid] = record
                _read_libraries(record, proc)
            seen.add(p.pid)
            _sample_process(record, proc)
        for gone in set(records) - seen:
            records[gone].alive = False
        gpus.sample(set(records))
        samples += 1
        elapsed = time.monotonic() - start
        if elapsed >= duration:
            break
        time.sleep(min(interval, max(duration - elapsed, 0.0)))
    elapsed = time.monotonic() - start
    if not records:
        raise AffrunError(f"--pid {pid}: the process ended before it could be read")
    from launcher.feed.figures import read_live

    for record in records.values():
        if record.alive:
            _read_libraries(record, proc)  # libraries loaded during the sample (import torch) count too
            record.feed = read_live(record.pid, record.environ, proc)  # --feed-report's figures so far
    ordered = sorted(records.values(), key=lambda r: r.pid)
    from launcher.doctor.facts import machine_cpus
    from launcher.topology import load_topology

    topo = load_topology()
    audit = JobAudit(pid, elapsed, interval, samples, ordered, gpus.report(), machine_cpus(topo, live=True))
    assign_roles(audit)
    for record in ordered:
        cpus = len(record.mask) or len(audit.machine_cpus)
        record.runtimes = runtimes_from_paths(record.libraries, record.environ, cpus)
    audit.findings = job_findings(audit, topo, ancestors_of=lambda p: procfs.ancestors(p, proc))
    return audit
