"""Text and JSON output of ``affrun doctor``: one finding per line, the live job as a table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.doctor.findings import Finding, worst_first
from launcher.doctor.live import JobAudit, ProcessRecord


def finding_line(f: Finding) -> str:
    """``SEVERITY id [subject]: what is wrong -- why: ... -- fix: ...`` on one line."""
    where = f" [{f.subject}]" if f.subject else ""
    return f"{f.severity:<7} {f.id}{where}: {f.message} -- why: {f.why} -- fix: {f.fix}"


def findings_text(findings: Sequence[Finding]) -> str:
    if not findings:
        return "no findings"
    return "\n".join(finding_line(f) for f in worst_first(findings))


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}


def environment_json(findings: Sequence[Finding], context: dict[str, Any]) -> dict[str, Any]:
    """The documented ``affrun doctor --json`` contract: ``findings`` first, then what was audited."""
    return {"findings": [f.to_json() for f in worst_first(findings)], "summary": summary(findings), **context}


def job_json(audit: JobAudit) -> dict[str, Any]:
    data = audit.to_json()
    data["findings"] = [f.to_json() for f in worst_first(audit.findings)]
    data["summary"] = summary(audit.findings)
    return {"findings": data.pop("findings"), **data}


def _seen(counts: dict[int, int]) -> str:
    return format_cpulist(counts) or "-"


def _runtimes_line(p: ProcessRecord) -> str:
    if not p.runtimes:
        return "none"
    parts = []
    for r in p.runtimes:
        detail = f", {r.detail}" if r.detail else ""
        parts.append(f"{r.name} ({r.threads} threads from {r.threads_from}{detail})")
    return ", ".join(parts)


def job_text(audit: JobAudit) -> str:
    threads = sum(len(p.threads) for p in audit.processes)
    lines = [
        f"job {audit.pid}: {len(audit.processes)} process(es), {threads} thread(s), {audit.samples} samples over "
        f"{audit.duration:.2f} s (every {audit.interval:g} s); machine CPUs {format_cpulist(audit.machine_cpus)}",
        "",
    ]
    for p in audit.processes:
        owner = f", owns CPUs {format_cpulist(p.owned)}" if p.role == "rank" else ""
        rank = f" of rank {p.rank}" if p.role == "child" and p.rank is not None else ""
        gone = " (exited)" if not p.alive else ""
        lines.append(f"{p.role}{rank} pid {p.pid} ({p.comm}){owner}{gone}: {' '.join(p.cmdline)[:100]}")
        lines.append(f"  runtimes: {_runtimes_line(p)}")
        if p.feed is not None:
            f = p.feed
            lines.append(f"  feed: {f.batches} batches in {f.seconds:.1f} s, {f.batches_per_s:.1f} batches/s, data wait "
                         f"{100 * f.data_wait_fraction:.1f}% ({f.loaders} DataLoader(s), workers "
                         f"{','.join(map(str, f.num_workers)) or '-'}: {f.workers_source})")
    lines.append("")
    header = f"{'PID':>7} {'TID':>7} {'ROLE':<8} {'COMM':<16} {'ALLOWED':<12} {'LAST':>4} {'SEEN':<12} " \
             f"{'MIGR/S':>6} {'CPU%':>6}"
    lines.append(header)
    for p in audit.processes:
        for t in sorted(p.threads.values(), key=lambda t: t.tid):
            lines.append(
                f"{p.pid:>7} {t.tid:>7} {p.role:<8} {t.comm[:16]:<16} {format_cpulist(t.allowed):<12} "
                f"{t.last_cpu:>4} {_seen(t.seen):<12} {t.migrations_per_s(audit.duration):>6.1f} "
                f"{t.cpu_percent(audit.duration):>6.1f}"
            )
    lines.append("")
    if audit.gpus.available:
        lines.append(f"GPUs ({audit.gpus.reason}):")
        for g in audit.gpus.gpus:
            mean = g.mean_utilisation
            used = f"job pids {', '.join(map(str, sorted(g.pids)))}" if g.pids else "not used by the job"
            lines.append(f"  gpu {g.index} {g.pci} {g.name}: utilisation "
                         f"{'?' if mean is None else f'{mean:.0f}%'} mean, {g.memory_used_mib} MiB, {used}")
    else:
        lines.append(f"GPUs: {audit.gpus.reason}")
    lines.append("")
    lines.append(findings_text(audit.findings))
    return "\n".join(lines)
