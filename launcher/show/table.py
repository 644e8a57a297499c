"""The plan as a table for people (``affrun plan``)."""

from __future__ import annotations

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.plan.planner import Plan
from launcher.topology.model import Topology


def plan_table(topo: Topology, plan: Plan) -> str:
    comm = any(r.comm_cpus for r in plan.ranks)  # the column only where --comm-cores kept some
    headers = ["rank", "cpus", "loader", *(["comm"] if comm else []), "spill", "numa", "gpu", "pci", "nic", "omp",
               "why"]
    rows = []
    for r in plan.ranks:
        rows.append(
            [
                str(r.local_rank),
                format_cpulist(r.cpus),
                format_cpulist(r.loader_cpus) or "-",
                *([format_cpulist(r.comm_cpus) or "-"] if comm else []),
                f"{format_cpulist(r.spill_cpus)} (node {','.join(map(str, r.spill_nodes)) or '?'})" if r.spill_cpus else "-",
                ",".join(map(str, r.numa_nodes)) or "?",
                "-" if r.gpu is None else str(r.gpu),
                r.gpu_pci or "-",
                f"{r.nic.device} ({r.nic.distance})" if r.nic else "-",
                str(r.threads),
                "; ".join(r.reasons),
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    reserved = f", reserved {format_cpulist(plan.reserved)}" if plan.reserved else ""
    lines.append(f"mode {plan.mode}, gpu order {plan.gpu_order}, spill {plan.spill}{reserved}, source {topo.origin}")
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(shown(line) for line in lines)  # the source's path and the warnings echo what was given
