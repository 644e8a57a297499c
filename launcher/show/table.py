"""The plan as a table for people (``affrun plan``): the ranks, then each rank's thread plan (docs/threads.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import shown
from launcher.plan.planner import Plan
from launcher.plan.threads import Home, ThreadPlan, thread_plan
from launcher.topology.model import Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


def thread_plans(topo: Topology, plan: Plan) -> list[ThreadPlan]:
    """Each rank's thread plan with one DataLoader worker per loader core, what ``launcher.torch.loader_workers()``
    suggests without ``--loader-workers``: ``affrun plan`` shows them, as a table and as JSON."""
    core_of = {p: core.pus for core in topo.cores for p in core.pus}
    return [thread_plan(r, len({core_of.get(p, (p,)) for p in r.loader_cpus}), {core_of.get(p, (p,)) for p in r.cpus})
            for r in plan.ranks]


def plan_table(topo: Topology, plan: Plan, threads: Sequence[ThreadPlan] | None = None) -> str:
    comm = any(r.comm_cpus for r in plan.ranks)  # the column only where --comm-cores kept some
    main = any(r.main_cpus for r in plan.ranks)  # and where --main-thread gave a main core
    headers = ["rank", "cpus", "loader", *(["comm"] if comm else []), *(["main"] if main else []), "spill", "numa",
               "gpu", "pci", "nic", "omp", "why"]
    rows = [[str(r.local_rank), format_cpulist(r.cpus), format_cpulist(r.loader_cpus) or "-",
             *([format_cpulist(r.comm_cpus) or "-"] if comm else []),
             *([format_cpulist(r.main_cpus) or "-"] if main else []),
             f"{format_cpulist(r.spill_cpus)} (node {','.join(map(str, r.spill_nodes)) or '?'})" if r.spill_cpus else "-",
             ",".join(map(str, r.numa_nodes)) or "?", "-" if r.gpu is None else str(r.gpu), r.gpu_pci or "-",
             f"{r.nic.device} ({r.nic.distance})" if r.nic else "-", str(r.threads), "; ".join(r.reasons)]
            for r in plan.ranks]
    lines = _columns(headers, rows)
    reserved = f", reserved {format_cpulist(plan.reserved)}" if plan.reserved else ""
    lines.append(f"mode {plan.mode}, gpu order {plan.gpu_order}, spill {plan.spill}{reserved}, source {topo.origin}")
    lines += thread_table(plan, thread_plans(topo, plan) if threads is None else threads)
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(shown(line) for line in lines)  # the source's path and the warnings echo what was given


def thread_table(plan: Plan, threads: Sequence[ThreadPlan]) -> list[str]:
    """Every rank's thread plan, one row each: where each thread lives, ``xN`` the threads the plan sizes there
    (``whole``: the rank's whole set), and each DataLoader worker's CPUs and the size of the pools inside it."""
    rows = []
    for rank, tp in zip(plan.ranks, threads):

        def home(h: Home, count: bool = True, whole: tuple[int, ...] = tuple(sorted(rank.cpus))) -> str:
            cpus = "whole" if h.cpus == whole else format_cpulist(h.cpus)
            return f"{cpus} x{h.threads}" if count else cpus

        workers = " ".join(f"{format_cpulist(w.cpus)}/{w.pools}" for w in tp.workers) or "-"
        rows.append([str(tp.local_rank), home(tp.main, False), home(tp.omp), home(tp.interop),
                     home(tp.pin_memory, False), home(tp.nccl_proxy, False), workers])
    title = ("threads (docs/threads.md): omp: the team beside the main thread; xN: threads sized there; whole: the "
             "rank's CPUs; workers: one per loader core, CPUs/pools")
    return ["", title, *_columns(["rank", "main", "omp", "interop", "pin-memory", "nccl", "workers"], rows)]


def _columns(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (headers, *rows)]
