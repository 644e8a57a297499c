"""Is each rank of a live job starved, and by what: its main thread's wait for a CPU and its cause, its supply,
its GPU, judged by :func:`launcher.feed.verdict.judge` as the meter and ``affrun tune`` judge them; the findings
``cpu-starved`` and ``cpu-throttled``. Pure. docs/doctor.md ("Starved by what")."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.cpulist import format_cpulist
from launcher.base.pci import pci_address
from launcher.base.untrusted import ascii_uint
from launcher.doctor.collapse import confined
from launcher.doctor.contention import BUSY_SHARE, spread
from launcher.doctor.findings import Finding, Severity
from launcher.doctor.gpu import GpuUsage
from launcher.doctor.live import JobAudit, ProcessRecord, RankGpu, RankStarvation
from launcher.feed import verdict as v

BUSY_PERCENT = 5.0  # a thread that ran at least this share of a CPU over the sample is busy
THROTTLED_SHARE = 0.05  # cpu-throttled: the share of the sample (or of its quota periods) held back


def rank_gpu(audit: JobAudit, rank: ProcessRecord) -> tuple[GpuUsage, str] | None:
    """The GPU ``rank`` uses, and how that was told: NVML lists the rank or a child on it; else ``AFFRUN_GPU_PCI``;
    else ``CUDA_VISIBLE_DEVICES``'s entry at its local rank (an index or a UUID)."""
    gpus = audit.gpus.gpus
    if not audit.gpus.available or not gpus:
        return None
    own = {rank.pid, *(c.pid for c in audit.children_of(rank))}
    for gpu in gpus:
        if gpu.pids & own:
            return gpu, "its process on the GPU (NVML)"
    pci = rank.environ.get("AFFRUN_GPU_PCI", "")
    if pci:
        found = next((g for g in gpus if pci_address(g.pci) == pci_address(pci.strip()) is not None), None)
        if found is not None:
            return found, "AFFRUN_GPU_PCI"
    local = rank.rank if rank.rank is not None else 0 if len(audit.ranks()) == 1 else None  # a lone process: 0
    if local is None:
        return None
    visible = rank.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in visible.split(",")] if visible is not None else None
    entry = (entries[local] if entries is not None and local < len(entries)
             else str(local) if entries is None else "")
    index = ascii_uint(entry)
    if index is not None:
        found = next((g for g in gpus if g.index == index), None)
        how = "CUDA_VISIBLE_DEVICES and its local rank" if entries is not None else "its local rank"
        return (found, how + " (CUDA's order, NVML's under CUDA_DEVICE_ORDER=PCI_BUS_ID)") if found else None
    found = next((g for g in gpus if entry and g.uuid == entry), None)
    return (found, "CUDA_VISIBLE_DEVICES (a UUID) and its local rank") if found else None


def _gpu_of(audit: JobAudit, rank: ProcessRecord) -> RankGpu | None:
    mapped = rank_gpu(audit, rank)
    if mapped is None:
        return None
    gpu, how = mapped
    own = {rank.pid, *(c.pid for c in audit.children_of(rank))}
    per_process = [gpu.process_mean(pid) for pid in own if gpu.process_mean(pid) is not None]
    if per_process:
        busy: float | None = min(100.0, sum(x for x in per_process if x is not None)) / 100
        return RankGpu(gpu.index, gpu.pci, busy, "process", how)
    if gpu.others and not gpu.pids & own:  # NVML lists this namespace's processes on it, none of the rank's
        return RankGpu(gpu.index, gpu.pci, 0.0, "process", how + "; NVML lists none of its processes there")
    mean = gpu.mean_utilisation
    return RankGpu(gpu.index, gpu.pci, None if mean is None else mean / 100, "device", how)


def _cause(audit: JobAudit, s: RankStarvation, collapsed: frozenset[int] | None) -> tuple[str, str]:
    """What keeps the main thread from a CPU, in :mod:`launcher.feed.verdict`'s order, and the evidence."""
    cpus = s.main_allowed
    if collapsed is not None:
        return v.COLLAPSE, (f"every process of the job runs on CPUs {format_cpulist(collapsed)} of "
                            f"{format_cpulist(audit.reference)} (job-collapsed)")
    t = s.throttling
    if t is not None and t.fraction >= v.STARVED_WAIT / 2:
        return v.THROTTLED, (f"its cgroup ran out of its CPU quota in {t.throttled_periods} of {t.periods} periods "
                             f"({t.throttled_s:.2f} s throttled; quota {t.quota or 'unknown'})")
    own = s.used_on_main or 0.0
    ran = min(1.0, s.main_cpu_percent / 100)
    outside = max(0.0, len(cpus) - ran - own)  # what neither the main thread nor the rest of the job ran there
    where = f"{len(cpus)} CPU(s) {format_cpulist(cpus)}"
    if own >= outside:
        return v.OVERSUBSCRIBED, (f"the job's other threads ran {own:.1f} CPUs' worth on the main thread's {where}, "
                                  f"more than the {outside:.1f} left to anything else")
    said = (f"the job ran {own:.1f} CPUs' worth besides the main thread on its {where}; {outside:.1f} went to "
            "something outside it")
    if s.neighbours:
        return v.NEIGHBOURS, f"{said}: busy processes outside the job may run there: " + "; ".join(
            n.text() for n in s.neighbours[:3])
    return v.NEIGHBOURS, f"{said} (short-lived processes, the host)"


def rank_starvation(audit: JobAudit, rank: ProcessRecord, collapsed: frozenset[int] | None) -> RankStarvation:
    seconds = audit.duration
    mine = [t for p in (rank, *audit.children_of(rank)) for t in p.threads.values()]
    demands = [d for t in mine if (d := t.demand()) is not None]
    shares = [d for t in mine if (d := t.cpu_share()) is not None]
    main = rank.threads.get(rank.pid)
    s = RankStarvation(
        demand=sum(demands) if demands else None,
        used=sum(shares) if shares else None,
        busy_threads=sum(1 for t in mine if t.cpu_percent(seconds) >= BUSY_PERCENT),
        supply=frozenset(c for t in mine for c in t.allowed),
        throttling=next((t for t in audit.throttling if rank.pid in t.pids), None),
        gpu=_gpu_of(audit, rank),
    )
    if main is not None:
        s.main_tid, s.main_cpu_percent, s.main_cpu_wait = main.tid, main.cpu_percent(seconds), main.cpu_wait()
        s.main_ran, s.main_allowed = frozenset(main.ran), main.allowed
        everyone = [t for p in audit.processes for t in p.threads.values()]
        if main.cpu_share() is not None:
            s.used_on_main = sum(spread(t.cpu_share() or 0.0, t.allowed, main.allowed) for t in everyone if t is not main)
        near = [n for n in audit.neighbours if n.share_on(main.allowed) >= BUSY_SHARE]
        s.neighbours = sorted(near, key=lambda n: (-n.share_on(main.allowed), n.pid))
    if s.main_cpu_wait is not None and s.main_cpu_wait >= v.STARVED_WAIT:
        s.cause, s.cause_text = _cause(audit, s, collapsed)
    t = s.throttling
    s.verdict = v.judge(v.Signals(
        gpu_busy=s.gpu.busy if s.gpu else None,
        data_wait=rank.feed.data_wait_fraction if rank.feed and rank.feed.batches else None,
        cpu_wait=s.main_cpu_wait,
        throttled=t.fraction if t is not None and t.periods else None,
        cpu_cause=s.cause, cause_text=s.cause_text))
    return s


def judge_ranks(audit: JobAudit) -> dict[int, RankStarvation]:
    """Every rank's :class:`RankStarvation`, by pid."""
    collapsed = confined(audit)
    return {r.pid: rank_starvation(audit, r, collapsed) for r in audit.ranks()}


def starvation_findings(audit: JobAudit, judged: Mapping[int, RankStarvation]) -> list[Finding]:
    """``cpu-starved`` for each rank whose main thread waited for a CPU, ``cpu-throttled`` for each cgroup of the
    job throttled at least :data:`THROTTLED_SHARE` of the sample."""
    out: list[Finding] = []
    for rank in audit.ranks():
        s = judged.get(rank.pid)
        if s is None or s.cause is None or s.main_cpu_wait is None:
            continue
        severity: Severity = "info" if s.cause == v.NEIGHBOURS else "warning"
        out.append(Finding(
            "cpu-starved", severity,
            f"the main thread ({s.main_tid}) waited {100 * s.main_cpu_wait:.0f}% of the sample for a CPU and ran "
            f"{s.main_cpu_percent:.0f}% of a CPU, on CPUs {format_cpulist(s.main_allowed)} ({s.cause}: "
            f"{s.cause_text})",
            "the main thread launches the GPU's kernels and feeds the loop: every millisecond it waits on a run "
            "queue the GPU waits too, and the loop's data wait counts it as waiting for data",
            v.CPU_FIXES[s.cause], rank.label()))
    for t in audit.throttling:
        if t.throttled_periods and t.fraction >= THROTTLED_SHARE:
            out.append(Finding(
                "cpu-throttled", "warning",
                f"the job's cgroup {t.cgroup} (pids {', '.join(map(str, sorted(t.pids)[:8]))}"
                f"{' ...' if len(t.pids) > 8 else ''}) ran out of its CPU quota in {t.throttled_periods} of "
                f"{t.periods} periods and was throttled {t.throttled_s:.2f} s in {t.seconds:.1f} s"
                + (f"; quota {t.quota}" if t.quota else ""),
                "the CFS quota (a Kubernetes CPU limit) stops every thread of the cgroup until the next period, "
                "the main thread too, whatever the affinity masks allow: the masks do not show it",
                v.CPU_FIXES[v.THROTTLED]))
    return out

