"""Text and JSON output of ``affrun doctor``: one finding per line, the live job as a table.

Every line of a text report passes through :func:`launcher.base.untrusted.shown`: the findings and the table echo
environment values, command lines and process names, which may hold a newline or an escape sequence. JSON keeps
the exact values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.doctor.findings import Finding, worst_first
from launcher.doctor.live import JobAudit, ProcessRecord
from launcher.topology.model import Topology


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
    ended = any(p.pid == audit.pid and not p.alive for p in audit.processes)
    lines = [
        f"job {audit.pid}: {len(audit.processes)} process(es), {threads} thread(s), {audit.samples} samples over "
        f"{audit.duration:.2f} s (every {audit.interval:g} s); machine CPUs {format_cpulist(audit.machine_cpus)}"
        + ("; the job exited, which ended the sample" if ended else ""),
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
