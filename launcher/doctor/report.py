"""Text and JSON output of ``affrun doctor``: one finding per line, the live job as a table (at most
:data:`THREAD_LINES` thread lines a process). Every text line passes through
:func:`launcher.base.untrusted.shown`; JSON keeps the exact values (docs/json.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.doctor.collapse import span_of
from launcher.doctor.findings import Finding, worst_first
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord
from launcher.doctor.thread_homes import thread_summary
from launcher.topology.model import Topology

THREAD_LINES = 24  # per process; JSON lists every thread
WORKERS_SHOWN = 8  # worker homes spelled out on a rank's homes line; more are summed up


def finding_line(f: Finding) -> str:
    """``SEVERITY id [subject]: what is wrong -- why: ... -- fix: ...`` on one line, :func:`shown`."""
    where = f" [{f.subject}]" if f.subject else ""
    return shown(f"{f.severity:<7} {f.id}{where}: {f.message} -- why: {f.why} -- fix: {f.fix}")


def findings_lines(findings: Sequence[Finding]) -> list[str]:
    """One line per finding, worst first (a finding echoes values as they were found: each line is shown)."""
    if not findings:
        return ["no findings"]
    return [finding_line(f) for f in worst_first(findings)]


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}


def environment_json(findings: Sequence[Finding], context: dict[str, Any]) -> dict[str, Any]:
    """The documented ``affrun doctor --json`` contract: ``findings`` first, then what was audited."""
    return {"findings": [f.to_json() for f in worst_first(findings)], "summary": summary(findings), **context}


def job_json(audit: JobAudit) -> dict[str, Any]:
    """The documented ``affrun doctor --pid --json`` contract: ``findings`` first; every thread is listed."""
    return environment_json(audit.findings, {
        "pid": audit.pid,
        "duration_s": round(audit.duration, 3),
        "interval_s": audit.interval,
        "slowed": audit.slowed,
        "samples": audit.samples,
        "machine_cpus": format_cpulist(audit.machine_cpus),
        "reference_cpus": format_cpulist(audit.reference),
        "reference_source": audit.reference_source,
        "job_cpus": format_cpulist(span_of(audit.processes)),
        "cpu_demand": _demand(audit),
        "throttling": [t.to_json() for t in audit.throttling],
        "neighbours": [n.to_json() for n in audit.neighbours],
        "processes": [_process_json(p, audit) for p in audit.processes],
        "gpus": audit.gpus.to_json(),
    })


def _demand(audit: JobAudit) -> float | None:
    """The CPUs' worth of time every thread of the job wanted over the sample (on a CPU or waiting for one)."""
    found = [d for p in audit.processes for t in p.threads.values() if (d := t.demand()) is not None]
    return round(sum(found), 2) if found else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _worker_json(p: ProcessRecord) -> dict[str, Any] | None:
    if p.worker is None:
        return None
    return {**p.worker.to_dict(), "of": p.workers_seen, "matched_by": p.worker_matched_by}


def _process_json(p: ProcessRecord, audit: JobAudit) -> dict[str, Any]:
    seconds = audit.duration
    judged = audit.starvation.get(p.pid) if p.role == "rank" else None
    return {
        "pid": p.pid,
        "ppid": p.ppid,
        "comm": p.comm,
        "role": p.role,
        "rank": p.rank,
        "rank_pid": p.rank_pid,
        "owned_cpus": format_cpulist(p.owned) if p.role == "rank" else None,
        "cmdline": p.cmdline,
        "alive": p.alive,
        "feed": p.feed.to_json() if p.feed else None,
        "supply": judged.to_json() if judged else None,
        "verdict": judged.verdict.to_json() if judged and judged.verdict else None,
        "runtimes": [r.to_json() for r in p.runtimes],
        "plan_source": p.plan_source or None,
        "plan_problem": p.plan_problem or None,
        "thread_plan": {**p.thread_plan.to_dict(), "workers_seen": p.workers_seen} if p.thread_plan else None,
        "worker": _worker_json(p),
        "thread_summary": thread_summary(p),
        "threads": [
            {
                "tid": t.tid,
                "comm": t.comm,
                "role": t.role,
                "identified_by": t.identified_by,
                "home": None if t.home is None else format_cpulist(t.home),
                "verdict": t.verdict,
                "allowed": format_cpulist(t.allowed),
                "first_allowed": format_cpulist(t.first_allowed),
                "ran": format_cpulist(t.ran),
                "strayed_to": format_cpulist(t.strayed_to),
                "last_cpu": t.last_cpu,
                "cpus_seen": {str(c): n for c, n in sorted(t.seen.items())},
                "migrations": t.migrations,
                "migrations_per_s": round(t.migrations_per_s(seconds), 2),
                "cpu_percent": round(t.cpu_percent(seconds), 1),
                "cpu_wait_fraction": _round(t.cpu_wait()),
                "cpu_demand": _round(t.demand()),
                "samples": t.samples,
            }
            for t in sorted(p.threads.values(), key=lambda t: t.tid)
        ],
    }


def _runtimes_line(p: ProcessRecord) -> str:
    if not p.runtimes:
        return "none"
    parts = []
    for r in p.runtimes:
        detail = f", {r.detail}" if r.detail else ""
        parts.append(f"{r.name} ({r.threads} threads from {r.threads_from}{detail})")
    return ", ".join(parts)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items())


def _plan_lines(p: ProcessRecord, planned: set[int]) -> list[str]:
    """What the process's threads are judged against, said once (``planned``: the pids of ranks with a plan)."""
    told = thread_summary(p)
    tally = f"{told['threads']} thread(s): {_counts(told['verdicts'])}"
    if p.thread_plan is not None:
        plan = p.thread_plan
        homes = " · ".join(f"{h.role} {format_cpulist(h.cpus)}" + (f" ×{h.threads}" if h.threads > 1 else "")
                           for h in plan.homes())
        workers = (" · workers " + " | ".join(format_cpulist(w.cpus) for w in plan.workers)
                   if 0 < len(plan.workers) <= WORKERS_SHOWN else
                   f" · {len(plan.workers)} workers on CPUs {format_cpulist({c for w in plan.workers for c in w.cpus})}"
                   if plan.workers else "")
        return [f"  threads: plan from {p.plan_source}, {p.workers_seen} DataLoader worker(s) seen; {tally}",
                f"  homes: {homes}{workers}"]
    if p.worker is not None:
        return [f"  threads: DataLoader worker {p.worker.index} of {p.workers_seen} (matched by "
                f"{p.worker_matched_by}), home CPUs {format_cpulist(p.worker.cpus)}, pools of {p.worker.pools}; "
                f"{tally}"]
    if p.role == "child" and p.rank_pid in planned:
        return [f"  threads: not a DataLoader or multiprocessing worker: its rank's thread plan has no home for it; "
                f"{told['threads']} thread(s)"]
    why = p.plan_problem or "no AFFRUN_* variables, no affrun run plan"
    return [f"  threads: no thread plan ({why}): roles only, no homes; {told['threads']} thread(s)"]


def _shown_threads(p: ProcessRecord, seconds: float) -> tuple[list[ThreadRecord], list[ThreadRecord]]:
    """The threads of ``p`` given a line (strayed first, then the main thread, then the busiest) and the rest."""
    order = sorted(p.threads.values(), key=lambda t: (t.verdict != "strayed", t.tid != p.pid,
                                                      -t.cpu_percent(seconds), t.tid))
    return order[:THREAD_LINES], order[THREAD_LINES:]


def _thread_lines(p: ProcessRecord, seconds: float) -> list[str]:
    shown_, rest = _shown_threads(p, seconds)
    lines = []
    for t in sorted(shown_, key=lambda t: t.tid):
        verdict = t.verdict if t.verdict != "unplanned" else "-"
        lines.append(
            f"{p.pid:>7} {t.tid:>7} {t.role:<10} {t.comm[:16]:<16} {format_cpulist(t.allowed):<12} "
            f"{format_cpulist(t.ran) or '-':<12} {format_cpulist(t.home or ()) or '-':<12} {verdict:<8} "
            f"{t.migrations_per_s(seconds):>6.1f} {t.cpu_percent(seconds):>6.1f} {_wait(t.cpu_wait()):>6}"
        )
    if rest:
        groups: dict[str, int] = {}
        for t in rest:
            key = f"{t.role} {t.verdict}" if t.verdict != "unplanned" else t.role
            groups[key] = groups.get(key, 0) + 1
        lines.append(f"{p.pid:>7} {'':>7} ... {len(rest):,} more thread(s): "
                     + ", ".join(f"{n:,} {key}" for key, n in sorted(groups.items(), key=lambda kv: -kv[1])))
    return lines


def _wait(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _supply_lines(audit: JobAudit, p: ProcessRecord) -> list[str]:
    """A rank's main thread, its CPU demand against its CPUs, its GPU and its verdict."""
    judged = audit.starvation.get(p.pid) if p.role == "rank" else None
    if judged is None:
        return []
    lines = [f"  {judged.main_line()}", f"  {judged.supply_line()}"]
    if judged.gpu is not None:
        lines.append(f"  GPU: {judged.gpu.text()}")
    if judged.neighbours:
        lines.append("  busy outside the job on its CPUs: " + "; ".join(n.text() for n in judged.neighbours[:3]))
    return [*lines, f"  {judged.verdict_line()}"]


_SLOWED = " asked, less often to keep the sampler under 5% of a CPU"


def job_text(audit: JobAudit) -> str:
    """The live report: each process with its thread plan, then a line per thread (at most
    :data:`THREAD_LINES` per process, the rest counted by role and verdict), the GPUs and the findings."""
    threads = sum(len(p.threads) for p in audit.processes)
    ended = any(p.pid == audit.pid and not p.alive for p in audit.processes)
    planned = {r.pid for r in audit.ranks() if r.thread_plan is not None}
    lines = [
        f"job {audit.pid}: {len(audit.processes)} process(es), {threads} thread(s), {audit.samples} samples over "
        f"{audit.duration:.2f} s (every {audit.interval:g} s{_SLOWED if audit.slowed else ''}); machine CPUs {format_cpulist(audit.machine_cpus)}"
        + ("; the job exited, which ended the sample" if ended else ""),
        f"the job runs on CPUs {format_cpulist(span_of(audit.processes)) or '-'} of the CPUs it could use, "
        f"{format_cpulist(audit.reference) or '-'} ({audit.reference_source or 'unknown'}); its threads wanted "
        f"{'?' if (d := _demand(audit)) is None else f'{d:.1f}'} CPUs' worth of time",
        "",
    ]
    for p in audit.processes:
        owner = f", owns CPUs {format_cpulist(p.owned)}" if p.role == "rank" else ""
        rank = f" of rank {p.rank}" if p.role == "child" and p.rank is not None else ""
        gone = " (exited)" if not p.alive else ""
        lines.append(f"{p.role}{rank} pid {p.pid} ({p.comm}){owner}{gone}: {' '.join(p.cmdline)[:100]}")
        lines.append(f"  runtimes: {_runtimes_line(p)}")
        lines.extend(_plan_lines(p, planned))
        if p.feed is not None:
            f = p.feed
            meter = "".join((f", cpu wait {100 * f.cpu_wait_fraction:.1f}%" if f.cpu_wait_fraction is not None else "",
                             f", gpu busy {100 * f.gpu_busy_fraction:.0f}%" if f.gpu_busy_fraction is not None else "",
                             f", the meter's verdict {f.verdict}" if f.verdict else ""))
            lines.append(f"  feed: {f.batches} batches in {f.seconds:.1f} s, {f.batches_per_s:.1f} batches/s, data wait "
                         f"{100 * f.data_wait_fraction:.1f}%{meter} ({f.loaders} DataLoader(s), workers "
                         f"{','.join(map(str, f.num_workers)) or '-'}: {f.workers_source})")
        lines.extend(_supply_lines(audit, p))
    lines.append("")
    lines.append(f"{'PID':>7} {'TID':>7} {'ROLE':<10} {'COMM':<16} {'ALLOWED':<12} {'RAN':<12} {'HOME':<12} "
                 f"{'VERDICT':<8} {'MIGR/S':>6} {'CPU%':>6} {'WAIT%':>6}")
    for p in audit.processes:
        lines.extend(_thread_lines(p, audit.duration))
    lines.append("")
    if audit.gpus.available:
        lines.append(f"GPUs ({audit.gpus.reason}):")
        for g in audit.gpus.gpus:
            mean = g.mean_utilisation
            used = f"job pids {', '.join(map(str, sorted(g.pids)))}" if g.pids else "not used by the job"
            procs = ", ".join(f"pid {pid} {m:.0f}%" for pid in sorted(g.processes)
                              if (m := g.process_mean(pid)) is not None)
            per = f"; per process: {procs}" if procs else f"; per process: {g.per_process}" if g.per_process else ""
            lines.append(f"  gpu {g.index} {g.pci} {g.name}: utilisation "
                         f"{'?' if mean is None else f'{mean:.0f}%'} mean, {g.memory_used_mib} MiB, {used}{per}")
    else:
        lines.append(f"GPUs: {audit.gpus.reason}")
    lines.append("")
    lines.extend(findings_lines(audit.findings))
    return "\n".join(shown(line) for line in lines)


def cpu_json(topo: Topology) -> dict[str, Any] | None:
    """``affrun doctor --json``'s ``cpu``: the CPU's identity, and the core kinds beside its binding flags."""
    if topo.cpu is None:
        return None
    return {**topo.cpu.to_json(), "core_kinds": [k.name for k in topo.kinds().kinds]}


def cpu_text(topo: Topology) -> str:
    """The doctor's ``cpu:`` line: identity, binding flags, and the core kinds (``one kind`` when homogeneous)."""
    kinds = topo.kinds().kinds
    kinds_text = f"core kinds {', '.join(k.name for k in kinds)}" if len(kinds) > 1 else "one core kind"
    return f"cpu: {topo.cpu.line() if topo.cpu else 'unknown'}; {kinds_text}"
