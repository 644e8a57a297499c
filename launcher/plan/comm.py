"""Cores kept for NCCL's proxy and service threads (``--comm-cores K``). Pure; a part of
:mod:`launcher.plan.planner`. The rule: docs/how-it-decides.md, "Comm cores"; docs/nics.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.base.cpulist import format_cpulist
from launcher.plan.kinds import plan_kinds

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.plan.record import RankPlan
    from launcher.topology.model import Topology

Unit = tuple[int, ...]  # a core, as the PUs of a RankPlan's compute_cores


def keep_comm_cores(topo: Topology, ranks: Sequence[RankPlan], k: int, smt: bool,
                    warnings: list[str]) -> list[dict[str, Any]]:
    """The fields that change in each of ``ranks`` when ``k`` comm cores are taken out of their compute cores
    (``compute_cores``, ``threads``, ``comm_cpus``, ``reasons``, ``warnings``); warnings also go to ``warnings``."""
    if k <= 0:
        return [{} for _ in ranks]
    out: dict[int, dict[str, Any]] = {}
    notes: dict[int, list[str]] = {}
    holders: dict[int, set[int]] = {}  # CPU -> the ranks whose mask holds it
    for rank in ranks:
        for cpu in rank.cpus:
            holders.setdefault(cpu, set()).add(rank.local_rank)
    for members in _overlapping(ranks):
        out.update(_keep_in_group(topo, members, k, smt, notes, holders))
    for rank in ranks:
        texts = notes.get(rank.local_rank, [])
        warnings.extend(f"rank {rank.local_rank}: {text}" for text in texts)
        if texts:
            out[rank.local_rank]["warnings"] = (*rank.warnings, *texts)
    return [out[r.local_rank] for r in ranks]


def _overlapping(ranks: Sequence[RankPlan]) -> list[list[RankPlan]]:
    """The ranks in groups whose compute cores overlap, in rank order: the sharers of ``numa``/``socket``, and
    ``--map`` lists that overlap. Each group keeps its comm cores apart."""
    groups: list[tuple[set[int], list[RankPlan]]] = []
    for rank in ranks:
        mine = {p for core in rank.compute_cores for p in core}
        joined = [g for g in groups if g[0] & mine]
        merged = (mine.union(*(g[0] for g in joined)), [m for g in joined for m in g[1]] + [rank])
        groups = [g for g in groups if all(g is not j for j in joined)] + [merged]
    return [sorted(members, key=lambda r: r.local_rank) for _, members in groups]


def _keep_in_group(topo: Topology, members: list[RankPlan], k: int, smt: bool,
                   notes: dict[int, list[str]], holders: dict[int, set[int]]) -> dict[int, dict[str, Any]]:
    """Comm cores for ranks whose compute cores overlap (one rank, mostly): each keeps ``k`` of its own, in no
    other rank's mask but its sharers' (``holders``: CPU -> ranks), and none computes on another's; if one of
    them would be left no compute core, none keeps any."""
    mains = {p for r in members for p in r.main_cpus}  # every main core stays a compute core of its rank
    taken: set[Unit] = set()
    kept: dict[int, list[Unit]] = {}
    too_few_own = False
    for rank in members:
        free = [c for c in rank.compute_cores if c not in taken and mains.isdisjoint(c)]
        room = len(free) >= k if rank.main_cpus else len(free) > k  # the main core is left to the team
        # a comm core in no other rank's mask, where that rank's threads could run (overlapping --map lists)
        mine = {o.local_rank for o in members} if rank.shared else {rank.local_rank}
        pool = [c for c in free if all(holders[p] <= mine for p in c)]
        too_few_own |= room and len(pool) < k
        chosen = _choose(topo, rank, pool, k, notes) if room and len(pool) >= k else []
        taken.update(chosen)
        kept[rank.local_rank] = chosen
    left = {r.local_rank: tuple(c for c in r.compute_cores if c not in taken) for r in members}
    if any(len(kept[r.local_rank]) < k or not left[r.local_rank] for r in members):
        for rank in members:
            shared = f" (shared by {len(members)} ranks)" if len(members) > 1 else ""
            why = (f"fewer than {k} of its compute cores are in no other rank's CPUs" if too_few_own else
                   f"its {len(rank.compute_cores)} compute core(s){shared} would leave no core for its OpenMP team")
            _warn(notes, rank, f"--comm-cores {k} ignored: {why}")
        return {rank.local_rank: {} for rank in members}
    out = {}
    for rank in members:
        compute = left[rank.local_rank]
        units = team_units(compute, rank.main_cpus, smt)
        threads = max(1, units // len(members)) if rank.shared else units
        comm = tuple(sorted(p for c in kept[rank.local_rank] for p in c))
        reason = f"{len(kept[rank.local_rank])} core(s) kept for NCCL's threads (CPUs {format_cpulist(comm)})"
        out[rank.local_rank] = {"compute_cores": compute, "threads": threads, "comm_cpus": comm,
                                "reasons": (*rank.reasons, reason)}
    return out


def _choose(topo: Topology, rank: RankPlan, pool: list[Unit], k: int, notes: dict[int, list[str]]) -> list[Unit]:
    """The ``k`` cores of ``pool`` a rank keeps: home (not spill) cores local to its GPU, fastest kind first, the
    last ones in core order."""
    spill = set(rank.spill_cpus)
    home = [c for c in pool if spill.isdisjoint(c)] or pool
    near = gpu_local(topo, rank, home)
    local = near or home
    if near == []:
        _warn(notes, rank, f"no core of the rank is local to its GPU {rank.gpu}; its comm cores are its own "
              "last cores")
    kinds = plan_kinds(topo)
    speed = {cpu: i for i, kind in enumerate(kinds.kinds) for cpu in kind.cpus} if kinds else {}
    order = {c: i for i, c in enumerate(local)}
    # fastest kind first, then the last cores of the rank first
    ranked = sorted(local, key=lambda c: (max(speed.get(p, len(speed)) for p in c) if speed else 0, -order[c]))
    chosen = ranked[:k]
    if len(chosen) < k:  # fewer local cores than asked: the rest from its other home cores, then spill, last first
        rest = [c for c in (*reversed(home), *reversed(pool)) if c not in chosen]
        chosen += list(dict.fromkeys(rest))[: k - len(chosen)]
    return sorted(chosen, key=pool.index)


def gpu_local(topo: Topology, rank: RankPlan, cores: Sequence[Unit]) -> list[Unit] | None:
    """The cores of ``cores`` local to the rank's GPU (in its ``local_cpus``, else on its NUMA node), in order;
    ``None`` when the rank has no GPU or its GPU says nothing of where it is."""
    gpu = next((g for g in topo.gpus if rank.gpu_pci is not None and g.pci == rank.gpu_pci), None)
    if gpu is None or not (gpu.cpus or gpu.numa_node is not None):
        return None
    node_of = {p: c.numa_node for c in topo.cores for p in c.pus}
    return [c for c in cores if (set(c) <= gpu.cpus if gpu.cpus and gpu.cpus != topo.online
                                 else gpu.numa_node is not None and node_of.get(c[0]) == gpu.numa_node)]


def team_units(compute: Sequence[Unit], main_cpus: Sequence[int], smt: bool) -> int:
    """The threads ``compute`` takes: its cores, or with ``smt`` its PUs, but the main core counts once (the main
    thread is its team's thread 0, and no other thread of the team shares its core)."""
    if not smt:
        return len(compute)
    return sum(len(c) for c in compute) - max(0, len(set(main_cpus)) - 1)


def _warn(notes: dict[int, list[str]], rank: RankPlan, text: str) -> None:
    notes.setdefault(rank.local_rank, []).append(text)
