"""The planner: ``Topology`` + ``Request`` -> ``Plan``. Pure.

How it decides, step by step: docs/how-it-decides.md; the facts and their sources: docs/planner.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.base.choices import GPU_ORDERS, MODES, GpuOrder, Mode
from launcher.base.cpulist import format_cpulist
from launcher.base.errors import Opt, PlanError
from launcher.plan.comm import keep_comm_cores
from launcher.plan.geometry import balanced_chunks, layout_of, nname, package_of
from launcher.plan.homes import assign_homes, usable_gpus
from launcher.plan.kinds import kind_roles, plan_kinds, priority_chunks
from launcher.plan.memory import rank_memory_nodes
from launcher.plan.nics import choose_nics
from launcher.plan.priority import choose_main_cores, priority_cpus, priority_first
from launcher.plan.record import Plan, RankPlan
from launcher.plan.request import Request, validate_request
from launcher.plan.spill import Spill, spill_cores
from launcher.topology.kinds import CoreKinds
from launcher.topology.model import GPU, Core, Topology

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "GPU_ORDERS", "MODES", "GpuOrder", "Mode", "Plan", "RankPlan", "Request", "make_plan", "quota_threads",
    "validate_request",
]

def _reserved_pus(topo: Topology, req: Request) -> set[int]:
    """A reserved CPU takes its whole core out, even when only a sibling of it is allowed."""
    return {p for c in topo.cores if not req.reserve.isdisjoint(c.pus) for p in c.pus}


def make_plan(topo: Topology, req: Request) -> Plan:
    """Plan ``req.nproc`` local ranks on ``topo``. Raises :class:`PlanError` for impossible requests."""
    validate_request(req, topo)
    warnings: list[str] = list(topo.warnings)
    reserved_cores = 0
    cores: list[Core] = []
    reserved_pus = _reserved_pus(topo, req)
    for core in topo.allowed_cores():
        if reserved_pus and not reserved_pus.isdisjoint(core.pus):
            reserved_cores += 1
            continue
        cores.append(core)
    missing = req.reserve - topo.online - topo.offline
    if missing:
        warnings.append(f"--reserve names CPUs {format_cpulist(missing)}, which this machine does not have")
    if not cores:
        detail = f" after reserving {reserved_cores} core(s)" if reserved_cores else ""
        raise PlanError(f"no usable CPU{detail}: allowed CPUs are {format_cpulist(topo.allowed) or 'none'}")
    if req.mode == "map":
        return _plan_map(topo, req, cores, warnings)
    if req.nproc > len(cores) and req.mode in ("exclusive", "l3"):
        raise PlanError(
            f"{req.nproc} ranks but only {len(cores)} whole core(s) are available "
            f"(allowed CPUs {format_cpulist(topo.allowed)}{', reserved ' + format_cpulist(req.reserve) if req.reserve else ''}); "
            "use fewer ranks, ", Opt("mode", "numa"), ", or a larger CPU set"
        )

    layout = layout_of(topo, cores, req.mode in ("exclusive", "l3"))
    homes, home_warnings = assign_homes(req, layout)
    warnings += home_warnings
    members: dict[int, list[int]] = {}
    for rank in range(req.nproc):
        members.setdefault(homes.home_of[rank], []).append(rank)
    chunks = _cut_chunks(req, cores, layout.by_node, members, homes.home_of, warnings, plan_kinds(topo),
                         priority_cpus(topo, req))
    spills = {} if req.spill == "none" else spill_cores(layout, members, chunks)

    shared_counts: dict[tuple[int, ...], int] = {}
    for rank in range(req.nproc):
        key = tuple(c.pus[0] for c in chunks[rank][0])
        shared_counts[key] = shared_counts.get(key, 0) + 1
    visible = topo.visible_gpus()
    ranks: list[RankPlan] = []
    for rank in range(req.nproc):
        chunk, shared, why = chunks[rank]
        sharers = shared_counts[tuple(c.pus[0] for c in chunk)]
        gpu = homes.gpu_of.get(rank)
        gpu_obj = visible[gpu] if gpu is not None else None
        reasons = [*homes.reasons.get(rank, []), why]
        ranks.append(
            _rank_plan(topo, req, rank, chunk, spills.get(rank), gpu, gpu_obj, shared, sharers, reasons, warnings)
        )
    return Plan(req.mode, req.smt, req.gpu_order, req.spill, _finish_ranks(topo, req, ranks, warnings), tuple(warnings),
                tuple(sorted(reserved_pus)))


def _cut_chunks(
    req: Request,
    cores: list[Core],
    by_node: dict[int, list[Core]],
    members: dict[int, list[int]],
    home_of: dict[int, int],
    warnings: list[str],
    kinds: CoreKinds | None = None,
    priority: frozenset[int] = frozenset(),
) -> dict[int, tuple[list[Core], bool, str]]:
    """Rank -> (its home chunk of cores, whether other ranks share it, why), by mode (docs/how-it-decides.md, step 3);
    ``priority``: the priority CPUs a node shares out equally among its ranks (``--main-thread priority``)."""
    chunks: dict[int, tuple[list[Core], bool, str]] = {}
    for node, ranks_here in members.items():
        node_cores = by_node[node]
        if req.mode == "exclusive":
            for rank, chunk in zip(ranks_here, priority_chunks(node_cores, kinds, len(ranks_here), priority)):
                chunks[rank] = (chunk, False, f"{len(chunk)} of node {nname(node)}'s {len(node_cores)} cores (split among {len(ranks_here)} rank(s))")
        elif req.mode == "l3":
            groups = _l3_groups(node_cores)
            if len(groups) >= len(ranks_here):
                for rank, glist in zip(ranks_here, balanced_chunks(groups, len(ranks_here))):
                    chunk = [c for g in glist for c in g]
                    chunks[rank] = (chunk, False, f"{len(glist)} whole L3 group(s) of node {nname(node)}")
            else:
                warnings.append(
                    f"node {nname(node)}: {len(ranks_here)} ranks but {len(groups)} L3 group(s); splitting cores instead"
                )
                for rank, chunk in zip(ranks_here, priority_chunks(node_cores, kinds, len(ranks_here), priority)):
                    chunks[rank] = (chunk, False, f"{len(chunk)} cores of node {nname(node)} (fewer L3 groups than ranks)")
        elif req.mode == "numa":
            for rank in ranks_here:
                chunks[rank] = (node_cores, len(ranks_here) > 1, f"whole node {nname(node)}, shared by {len(ranks_here)} rank(s)")
        else:  # socket
            pkg = package_of(node_cores)
            pkg_cores = [c for c in cores if c.package == pkg]
            sharing = [r for r in range(req.nproc) if package_of(by_node[home_of[r]]) == pkg]
            for rank in ranks_here:
                chunks[rank] = (pkg_cores, len(sharing) > 1, f"whole package L#{pkg}, shared by {len(sharing)} rank(s)")
    return chunks


def quota_threads(topo: Topology, ranks: int) -> int | None:
    """The most threads each of ``ranks`` local ranks may run under the CPU quota: quota // ranks, at least 1;
    ``None`` when there is no quota below the allowed CPUs (the planner's and ``affrun doctor``'s cap)."""
    quota = topo.cpu_quota
    if quota is None or quota >= len(topo.allowed):
        return None
    return max(1, int(quota // max(ranks, 1)))


def _finish_ranks(topo: Topology, req: Request, ranks: list[RankPlan], warnings: list[str]) -> tuple[RankPlan, ...]:
    """Each rank's main core, comm cores and NIC; and under a CPU quota below the allowed CPUs, each rank's threads
    capped so that ranks x threads fits the quota."""
    ranks = [replace(r, **c) for r, c in zip(ranks, choose_main_cores(topo, req, ranks, warnings))]
    ranks = [replace(r, **c) for r, c in zip(ranks, keep_comm_cores(topo, ranks, req.comm_cores, req.smt, warnings))]
    nics, no_nic = choose_nics(topo, [(r.gpu_pci, r.numa_nodes) for r in ranks])
    warnings.extend(f"rank {ranks[i].local_rank}: {w}" for i, w in no_nic.items())
    ranks = [replace(r, nic=c, warnings=(*r.warnings, no_nic[i]) if i in no_nic else r.warnings)
             for i, (r, c) in enumerate(zip(ranks, nics))]
    quota = topo.cpu_quota
    cap = quota_threads(topo, len(ranks))
    if quota is None or cap is None:
        return tuple(ranks)
    wanted = sum(r.threads for r in ranks)
    if wanted <= quota:
        return tuple(ranks)
    where = f" ({topo.cpu_quota_source})" if topo.cpu_quota_source else ""
    fits = "" if cap * len(ranks) <= quota else "; even 1 thread per rank exceeds it, expect throttling"
    warnings.append(
        f"CPU quota of {quota:g} CPUs{where} is below the {len(topo.allowed)} allowed CPUs: threads capped at {cap} "
        f"per rank ({len(ranks)} ranks x {cap} = {len(ranks) * cap}, was {wanted}){fits}"
    )
    return tuple(r if r.threads <= cap else replace(r, threads=cap) for r in ranks)


def _l3_groups(cores: Sequence[Core]) -> list[list[Core]]:
    groups: dict[int, list[Core]] = {}
    for i, c in enumerate(cores):
        groups.setdefault(c.l3 if c.l3 is not None else -1 - i, []).append(c)
    return list(groups.values())


def _rank_plan(
    topo: Topology,
    req: Request,
    rank: int,
    chunk: Sequence[Core],
    spill: Spill | None,
    gpu: int | None,
    gpu_obj: GPU | None,
    shared: bool,
    sharers: int,
    reasons: list[str],
    plan_warnings: list[str],
) -> RankPlan:
    rank_warnings: list[str] = []
    loader: list[Core] = []
    chunk = priority_first(chunk, priority_cpus(topo, req))
    compute = list(chunk)
    asked = 0
    if req.loader_cores:
        if shared:
            rank_warnings.append("--loader-cores is ignored in shared modes (numa, socket)")
        elif req.loader_cores >= len(chunk):
            raise PlanError(Opt("loader_cores", req.loader_cores),
                            f" leaves rank {rank} no compute core (it has {len(chunk)} core(s))")
        else:
            asked = req.loader_cores
            loader = compute[-req.loader_cores :]
            compute = compute[: -req.loader_cores]
    kinds = plan_kinds(topo)
    idle: set[int] = set()
    if kinds is not None:
        roles = kind_roles(chunk, kinds, req.spill, asked)
        compute, loader = roles.compute, roles.loader
        idle = {p for c in roles.idle for p in c.pus}
        reasons = [*reasons, roles.reason]
        if roles.warning:
            rank_warnings.append(roles.warning)
    spilled = list(spill.cores) if spill else []
    if spill:
        role = "compute" if req.spill == "compute" else "loader"
        (compute if role == "compute" else loader).extend(spilled)
        reasons = [*reasons, f"{len(spilled)} {role} core(s) of node(s) {','.join(map(nname, spill.nodes)) or '?'}, "
                   "which host no rank"]
    units = sum(len(c.pus) for c in compute) if req.smt else len(compute)
    threads = max(1, units // sharers) if shared else units
    cpus = tuple(sorted(p for c in (*chunk, *spilled) for p in c.pus if p not in idle))
    nodes = tuple(sorted({c.numa_node for c in chunk if c.numa_node is not None and c.pus[0] not in idle}))
    mem_nodes = rank_memory_nodes(topo, nodes, rank_warnings)
    plan_warnings.extend(f"rank {rank}: {w}" for w in rank_warnings)
    return RankPlan(
        local_rank=rank,
        cpus=cpus,
        compute_cores=tuple(c.pus for c in compute),
        loader_cpus=tuple(sorted(p for c in loader for p in c.pus)),
        gpu=gpu,
        gpu_pci=gpu_obj.pci if gpu_obj else None,
        numa_nodes=nodes,
        mem_nodes=mem_nodes,
        threads=threads,
        shared=shared,
        reasons=tuple(reasons),
        warnings=tuple(rank_warnings),
        spill_cpus=tuple(sorted(p for c in spilled for p in c.pus)),
        spill_nodes=spill.nodes if spill else (),
    )


def _plan_map(topo: Topology, req: Request, cores: list[Core], warnings: list[str]) -> Plan:
    assert req.cpu_map is not None
    pu_core: dict[int, Core] = {p: c for c in cores for p in c.pus}
    visible = usable_gpus(topo, req)
    seen: dict[int, int] = {}
    ranks: list[RankPlan] = []
    for rank, wanted in enumerate(req.cpu_map):
        outside = wanted - set(pu_core)
        if outside:
            reserved = f", reserved {format_cpulist(req.reserve)}" if req.reserve else ""
            raise PlanError(Opt("cpu_map"), f" rank {rank}: CPUs {format_cpulist(outside)} are not usable here "
                            f"(allowed: {format_cpulist(topo.allowed)}{reserved})")
        for p in wanted:
            if p in seen:
                warnings.append(f"--map: CPU {p} is given to ranks {seen[p]} and {rank}")
            seen.setdefault(p, rank)
        chunk_cores: dict[int, list[int]] = {}
        for p in sorted(wanted):
            chunk_cores.setdefault(pu_core[p].pus[0], []).append(p)
        chunk = [
            Core(pu_core[first].os_index, tuple(pus), pu_core[first].package, pu_core[first].numa_node, pu_core[first].l3)
            for first, pus in sorted(chunk_cores.items())
        ]
        gpu = req.gpus[rank] if req.gpus is not None else (rank if rank < len(visible) else None)
        gpu_obj = visible[gpu] if gpu is not None else None
        ranks.append(_rank_plan(topo, req, rank, chunk, None, gpu, gpu_obj, False, 1, ["explicit --map"], warnings))
    return Plan(req.mode, req.smt, req.gpu_order, "none", _finish_ranks(topo, req, ranks, warnings), tuple(warnings),
                tuple(sorted(_reserved_pus(topo, req))))
