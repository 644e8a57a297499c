"""Each rank's main core (``--main-thread compute|priority``): the core its main thread lives on, thread 0 of its
OpenMP team. Pure; a part of :mod:`launcher.plan.planner`, applied before the comm cores are kept.
The rule: docs/how-it-decides.md, "Main cores"; why: docs/threads.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.base.cpulist import format_cpulist
from launcher.plan.comm import Unit, gpu_local, team_units
from launcher.plan.kinds import plan_kinds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.plan.record import RankPlan
    from launcher.plan.request import Request
    from launcher.topology.model import Core, Topology
    from launcher.topology.priority import PriorityCores

_STAYS = "its main thread stays on the rank's whole set"


def priority_cpus(topo: Topology, req: Request) -> frozenset[int]:
    """The priority CPUs the chunk cut shares out among a node's ranks: empty unless ``--main-thread priority``."""
    return topo.priority_cores().cpus if req.main_thread == "priority" else frozenset()


def priority_first(chunk: Sequence[Core], priority: frozenset[int]) -> list[Core]:
    """``chunk`` with its priority cores first (stable), so that ``--loader-cores`` (the last cores) leaves them
    to compute; ``chunk`` as it is without any."""
    if not priority:
        return list(chunk)
    return sorted(chunk, key=lambda c: not set(c.pus) <= priority)


def choose_main_cores(topo: Topology, req: Request, ranks: Sequence[RankPlan],
                      warnings: list[str]) -> list[dict[str, Any]]:
    """The fields that change in each of ``ranks``: ``main_cpus``, ``reasons`` and with ``--smt`` ``threads``; or
    ``warnings`` for a rank that gets no main core. Warnings also go to ``warnings``, prefixed with the rank."""
    if req.main_thread == "none":
        return [{} for _ in ranks]
    prio = topo.priority_cores()
    if req.main_thread == "priority" and not prio.cpus:
        warnings.append(f"--main-thread priority: this machine has no priority core ({prio.why_none or 'none found'}); "
                        f"every rank's main thread stays on its whole set")
        return [{} for _ in ranks]
    kinds = plan_kinds(topo)
    speed = {cpu: i for i, kind in enumerate(kinds.kinds) for cpu in kind.cpus} if kinds else {}
    given: set[int] = set()
    out: list[dict[str, Any]] = []
    for rank in ranks:
        free = [c for c in rank.compute_cores if given.isdisjoint(c)]
        if req.main_thread == "compute":
            core = min(free, key=lambda c: (max(speed.get(p, len(speed)) for p in c), free.index(c))) if free else None
            why = "its first compute core"
            missing = (f"--main-thread compute: no compute core of its own is left (its {len(rank.compute_cores)} "
                       f"compute core(s) are the main cores of ranks before it); {_STAYS}")
        else:
            core = _priority_core(topo, rank, free, prio)
            why = "a priority core" + (" local to its GPU" if core and gpu_local(topo, rank, [core]) else "")
            missing = f"--main-thread priority: no priority core of its own ({_why_none(topo, rank, ranks, prio)}); {_STAYS}"
        if core is None:
            warnings.append(f"rank {rank.local_rank}: {missing}")
            out.append({"warnings": (*rank.warnings, missing)})
            continue
        given.update(core)
        main = tuple(sorted(core))
        fields: dict[str, Any] = {"main_cpus": main,
                                  "reasons": (*rank.reasons, f"main thread on CPU(s) {format_cpulist(main)}, {why}")}
        if req.smt:
            fields["threads"] = max(1, min(rank.threads, team_units(rank.compute_cores, main, True)))
        out.append(fields)
    return out


def _priority_core(topo: Topology, rank: RankPlan, free: list[Unit], prio: PriorityCores) -> Unit | None:
    """The rank's best free priority core among its home (not spill) compute cores, GPU-local ones first."""
    spill = set(rank.spill_cpus)
    home = [c for c in free if spill.isdisjoint(c) and set(c) <= prio.cpus]
    if not home:
        return None
    pool = gpu_local(topo, rank, home) or home
    best = {cpu: i for i, cpu in enumerate(prio.order)}
    return min(pool, key=lambda c: (min(best.get(p, len(best)) for p in c), pool.index(c)))


def _why_none(topo: Topology, rank: RankPlan, ranks: Sequence[RankPlan], prio: PriorityCores) -> str:
    """Why ``rank`` got no priority core: its node has none, fewer than its ranks, or none left in its cores."""
    nodes = set(rank.numa_nodes)
    named = f"node {','.join(map(str, sorted(nodes))) or '?'}"
    have = sum(1 for c in topo.allowed_cores() if c.numa_node in nodes and set(c.pus) <= prio.cpus)
    sharing = sum(1 for r in ranks if nodes & set(r.numa_nodes))
    if not have:
        return f"{named} has none"
    if have < sharing:
        return f"{named} has {have} for its {sharing} ranks"
    return f"none of its compute cores is a priority core left by the ranks before it ({named} has {have})"
