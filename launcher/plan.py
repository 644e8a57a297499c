"""The planner: ``Topology`` + ``Request`` -> ``Plan``. Pure: no I/O, no ``os.environ``.

How it decides (also in the README):

1. Candidate cores are the allowed cores (any allowed PU) minus the cores of ``reserve`` (a reserved CPU takes
   its whole core out, siblings included). Only allowed PUs count.
2. Each rank gets a *home* NUMA node: its GPU's node (convention ``rank``: rank *i* -> visible GPU *i*;
   ``closest``: ranks in CPU order, each taking the next GPU homed on its node); a GPU on a CPU-less node (HBM,
   Grace Hopper) or on a node with no usable CPUs takes the nearest node with CPUs by the distance table, with a
   warning; a GPU with no node takes the node holding most of its ``local_cpus``; otherwise, and for ranks
   without GPU, ranks are spread over the nodes with CPUs in proportion to their free cores, in blocks. A node
   with more ranks than cores gives the excess to the nearest node with spare cores: spread ranks move first,
   then ranks placed by distance or ``local_cpus``, and ranks whose GPU is on the node last.
3. ``exclusive``: a node's cores are cut into balanced, contiguous chunks (sizes differ by at most one), in
   L3-group order, one per rank homed there. ``l3`` hands out whole L3 groups. ``numa``/``socket`` give every
   rank of the node (package) the whole node (package). ``map`` takes the user's CPU lists.
4. The last ``loader_cores`` cores of each chunk are kept for DataLoader workers. ``threads`` counts the
   remaining cores (their PUs with ``smt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.cpulist import format_cpulist
from launcher.errors import PlanError
from launcher.topology.model import GPU, Core, Topology
from launcher.untrusted import short

MODES = ("exclusive", "numa", "socket", "l3", "map")
GPU_ORDERS = ("rank", "closest")


@dataclass(frozen=True)
class Request:
    """What the user asks for. Every field has the CLI's default."""

    nproc: int
    mode: str = "exclusive"
    smt: bool = False
    reserve: frozenset[int] = frozenset()
    loader_cores: int = 0
    gpu_order: str = "rank"
    cpu_map: tuple[frozenset[int], ...] | None = None  # mode "map": one CPU set per local rank
    gpus: tuple[int, ...] | None = None  # explicit visible GPU per local rank
    use_gpus: bool = True  # False: plan a CPU-only job even where GPUs exist


@dataclass(frozen=True)
class RankPlan:
    local_rank: int
    cpus: tuple[int, ...]  # every PU the rank may use (compute + loader)
    compute_cores: tuple[tuple[int, ...], ...]  # cores (PU tuples) for OpenMP threads
    loader_cpus: tuple[int, ...]
    gpu: int | None  # visible index (torch.cuda.set_device)
    gpu_pci: str | None
    numa_nodes: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    threads: int
    shared: bool = False  # numa/socket modes: other ranks use the same CPUs
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def compute_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(p for core in self.compute_cores for p in core))

    def to_dict(self) -> dict[str, Any]:
        return {
            "local_rank": self.local_rank,
            "cpus": list(self.cpus),
            "compute_cores": [list(c) for c in self.compute_cores],
            "loader_cpus": list(self.loader_cpus),
            "gpu": self.gpu,
            "gpu_pci": self.gpu_pci,
            "numa_nodes": list(self.numa_nodes),
            "mem_nodes": list(self.mem_nodes),
            "threads": self.threads,
            "shared": self.shared,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankPlan:
        return cls(
            local_rank=int(d["local_rank"]),
            cpus=tuple(int(c) for c in d["cpus"]),
            compute_cores=tuple(tuple(int(p) for p in core) for core in d["compute_cores"]),
            loader_cpus=tuple(int(c) for c in d["loader_cpus"]),
            gpu=None if d["gpu"] is None else int(d["gpu"]),
            gpu_pci=d.get("gpu_pci"),
            numa_nodes=tuple(int(n) for n in d["numa_nodes"]),
            mem_nodes=tuple(int(n) for n in d["mem_nodes"]),
            threads=int(d["threads"]),
            shared=bool(d.get("shared", False)),
            reasons=tuple(d.get("reasons", ())),
            warnings=tuple(d.get("warnings", ())),
        )


@dataclass(frozen=True)
class Plan:
    ranks: tuple[RankPlan, ...]
    mode: str
    smt: bool
    gpu_order: str
    warnings: tuple[str, ...] = field(default=())
    reserved: tuple[int, ...] = field(default=())  # PUs of the cores taken out by --reserve (whole cores)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "smt": self.smt,
            "gpu_order": self.gpu_order,
            "ranks": [r.to_dict() for r in self.ranks],
            "warnings": list(self.warnings),
            "reserved": list(self.reserved),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(
            ranks=tuple(RankPlan.from_dict(r) for r in d["ranks"]),
            mode=str(d["mode"]),
            smt=bool(d["smt"]),
            gpu_order=str(d["gpu_order"]),
            warnings=tuple(d.get("warnings", ())),
            reserved=tuple(int(p) for p in d.get("reserved", ())),
        )


# ---------------------------------------------------------------------------------------------- planning
def _reserved_pus(topo: Topology, req: Request) -> set[int]:
    """A reserved CPU takes its whole core out, even when only a sibling of it is allowed."""
    return {p for c in topo.cores if not req.reserve.isdisjoint(c.pus) for p in c.pus}


def make_plan(topo: Topology, req: Request) -> Plan:
    """Plan ``req.nproc`` local ranks on ``topo``. Raises :class:`PlanError` for impossible requests."""
    _validate(req, topo)
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
            "use fewer ranks, --mode numa, or a larger CPU set"
        )

    by_node: dict[int, list[Core]] = {}
    for core in cores:
        by_node.setdefault(core.numa_node if core.numa_node is not None else -1, []).append(core)
    for node_cores in by_node.values():
        node_cores.sort(key=lambda c: (c.l3 if c.l3 is not None else -1, c.pus[0]))
    node_order = sorted(by_node, key=lambda n: by_node[n][0].pus[0] if n == -1 else min(p for c in by_node[n] for p in c.pus))

    gpu_of, home_of, claim, reasons = _assign_gpus_and_homes(topo, req, by_node, node_order, warnings)
    _spread_homeless(req.nproc, home_of, by_node, node_order)
    if req.mode in ("exclusive", "l3"):
        _fix_overflow(topo, home_of, claim, by_node, warnings)

    visible = topo.visible_gpus()
    ranks: list[RankPlan] = []
    members: dict[int, list[int]] = {}
    for rank in range(req.nproc):
        members.setdefault(home_of[rank], []).append(rank)
    chunks: dict[int, tuple[list[Core], bool, str]] = {}
    for node, ranks_here in members.items():
        node_cores = by_node[node]
        if req.mode == "exclusive":
            for rank, chunk in zip(ranks_here, _balanced_chunks(node_cores, len(ranks_here))):
                chunks[rank] = (chunk, False, f"{len(chunk)} of node {_nname(node)}'s {len(node_cores)} cores, shared by {len(ranks_here)} rank(s)")
        elif req.mode == "l3":
            groups = _l3_groups(node_cores)
            if len(groups) >= len(ranks_here):
                for rank, glist in zip(ranks_here, _balanced_chunks(groups, len(ranks_here))):
                    chunk = [c for g in glist for c in g]
                    chunks[rank] = (chunk, False, f"{len(glist)} whole L3 group(s) of node {_nname(node)}")
            else:
                warnings.append(
                    f"node {_nname(node)}: {len(ranks_here)} ranks but {len(groups)} L3 group(s); splitting cores instead"
                )
                for rank, chunk in zip(ranks_here, _balanced_chunks(node_cores, len(ranks_here))):
                    chunks[rank] = (chunk, False, f"{len(chunk)} cores of node {_nname(node)} (fewer L3 groups than ranks)")
        elif req.mode == "numa":
            for rank in ranks_here:
                chunks[rank] = (node_cores, len(ranks_here) > 1, f"whole node {_nname(node)}, shared by {len(ranks_here)} rank(s)")
        else:  # socket
            pkg = _package_of(node_cores)
            pkg_cores = [c for c in cores if c.package == pkg]
            sharing = [r for r in range(req.nproc) if _package_of(by_node[home_of[r]]) == pkg]
            for rank in ranks_here:
                chunks[rank] = (pkg_cores, len(sharing) > 1, f"whole package L#{pkg}, shared by {len(sharing)} rank(s)")

    shared_counts: dict[tuple[int, ...], int] = {}
    for rank in range(req.nproc):
        chunk, shared, _ = chunks[rank]
        key = tuple(c.pus[0] for c in chunk)
        shared_counts[key] = shared_counts.get(key, 0) + 1
    for rank in range(req.nproc):
        chunk, shared, why = chunks[rank]
        sharers = shared_counts[tuple(c.pus[0] for c in chunk)]
        gpu = gpu_of.get(rank)
        gpu_obj = visible[gpu] if gpu is not None else None
        ranks.append(
            _rank_plan(topo, req, rank, chunk, gpu, gpu_obj, shared, sharers, [*reasons.get(rank, []), why], warnings)
        )
    return Plan(tuple(ranks), req.mode, req.smt, req.gpu_order, tuple(warnings), tuple(sorted(reserved_pus)))


def _validate(req: Request, topo: Topology) -> None:
    if req.nproc < 1:
        raise PlanError(f"--nproc-per-node must be at least 1 (got {req.nproc})")
    if req.nproc > len(topo.allowed) and req.mode not in ("exclusive", "l3"):
        # Checked first: every mode needs at least one CPU per rank, and numa/socket planning of a million ranks
        # would take minutes (or a MemoryError) before failing anywhere else. exclusive and l3 need a whole core
        # per rank: make_plan says so, as fast, before any per-rank work.
        count = str(req.nproc) if req.nproc.bit_length() < 64 else f"a number of {len(str(req.nproc))} digits"
        raise PlanError(f"--nproc-per-node {count}: more ranks than the {len(topo.allowed)} allowed CPU(s) "
                        f"({len(topo.allowed_cores())} whole core(s)) of this machine; every rank needs at least one")
    if req.mode not in MODES:
        raise PlanError(f"unknown mode {short(req.mode)}; choose one of {', '.join(MODES)}")
    if req.gpu_order not in GPU_ORDERS:
        raise PlanError(f"unknown GPU order {short(req.gpu_order)}; choose one of {', '.join(GPU_ORDERS)}")
    if req.loader_cores < 0:
        raise PlanError(f"--loader-cores must be >= 0 (got {req.loader_cores})")
    if req.mode == "map":
        if not req.cpu_map:
            raise PlanError("--mode map needs --map with one CPU list per rank (e.g. '0-7;8-15')")
        if len(req.cpu_map) != req.nproc:
            raise PlanError(f"--map gives {len(req.cpu_map)} CPU list(s) for {req.nproc} ranks")
        empty = [str(rank) for rank, cpus in enumerate(req.cpu_map) if not cpus]
        if empty:
            raise PlanError(f"--map gives rank(s) {','.join(empty)} an empty CPU list")
    if req.gpus is not None and len(req.gpus) != req.nproc:
        raise PlanError(f"--gpus gives {len(req.gpus)} GPU(s) for {req.nproc} ranks")


def _nname(node: int) -> str:
    return "?" if node == -1 else str(node)


def _package_of(cores: Sequence[Core]) -> int:
    counts: dict[int, int] = {}
    for c in cores:
        counts[c.package] = counts.get(c.package, 0) + 1
    return max(counts, key=lambda p: (counts[p], -p))


def _l3_groups(cores: Sequence[Core]) -> list[list[Core]]:
    groups: dict[int, list[Core]] = {}
    for i, c in enumerate(cores):
        groups.setdefault(c.l3 if c.l3 is not None else -1 - i, []).append(c)
    return list(groups.values())


def _balanced_chunks(items: Sequence[Any], k: int) -> list[list[Any]]:
    """Cut ``items`` into ``k`` contiguous chunks whose sizes differ by at most one (larger ones first)."""
    n = len(items)
    base, extra = divmod(n, k)
    out: list[list[Any]] = []
    start = 0
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out


def _nearest(topo: Topology, origin: int, candidates: Sequence[int]) -> int:
    node = topo.node(origin)
    dist = node.distances if node else {}
    return min(candidates, key=lambda n: (dist.get(n, 1 << 20), candidates.index(n)))


# How firmly a rank is tied to its home node; when a node has more ranks than cores, the weakest move first.
CLAIM_SPREAD, CLAIM_NEAR, CLAIM_GPU_NODE = 0, 1, 2


def _gpu_home(
    topo: Topology, gpu: GPU, label: str, by_node: dict[int, list[Core]], node_order: list[int]
) -> tuple[int | None, int, str, str | None]:
    """The GPU's home node, how firm that is (``CLAIM_*``), why, and a warning when the locality is indirect."""
    if gpu.numa_node is not None and gpu.numa_node in by_node:
        return gpu.numa_node, CLAIM_GPU_NODE, f"{label} is on NUMA node {gpu.numa_node}", None
    if gpu.numa_node is not None:
        near = _nearest(topo, gpu.numa_node, [n for n in node_order if n != -1] or node_order)
        node = topo.node(gpu.numa_node)
        if node is None:
            why = "is not in the topology"
        elif not node.cpus:
            why = "has no CPUs"
        else:
            why = "has no usable CPUs (not allowed or reserved)"
        warning = f"{label} is on NUMA node {gpu.numa_node}, which {why}; using the nearest node with CPUs, {_nname(near)}"
        return near, CLAIM_NEAR, f"{label}: node {gpu.numa_node} {why}, nearest node with CPUs is {_nname(near)}", warning
    if gpu.cpus and not gpu.cpus >= topo.online:
        overlap = {n: sum(1 for c in by_node[n] for p in c.pus if p in gpu.cpus) for n in node_order}
        best = max(node_order, key=lambda n: (overlap[n], -node_order.index(n)))
        if overlap[best] > 0:
            return best, CLAIM_NEAR, f"{label} has local CPUs {format_cpulist(gpu.cpus)} (node {_nname(best)})", None
    warning = f"{label} has unknown NUMA locality; its rank is spread like a CPU-only rank"
    return None, CLAIM_SPREAD, f"{label} has unknown locality", warning


def _assign_gpus_and_homes(
    topo: Topology, req: Request, by_node: dict[int, list[Core]], node_order: list[int], warnings: list[str]
) -> tuple[dict[int, int], dict[int, int], dict[int, int], dict[int, list[str]]]:
    """Each rank's visible GPU, home node (ranks without one are spread later), claim on it, and reasons."""
    visible = topo.visible_gpus() if req.use_gpus else ()
    gpu_of: dict[int, int] = {}
    home_of: dict[int, int] = {}
    claim: dict[int, int] = {}
    reasons: dict[int, list[str]] = {}
    if req.gpus is not None:
        for g in req.gpus:
            if g < 0 or g >= len(visible):
                raise PlanError(f"GPU {g} does not exist: {len(visible)} GPU(s) are visible")
    homes: list[int | None] = []
    claims: list[int] = []
    labels: list[str] = []
    gpu_warnings: list[str | None] = []
    for i, gpu in enumerate(visible):
        home, firmness, why, warning = _gpu_home(topo, gpu, f"GPU {i} ({gpu.pci})", by_node, node_order)
        homes.append(home)
        claims.append(firmness)
        labels.append(why)
        gpu_warnings.append(warning)
    _choose_gpus(req, len(visible), homes, claims, labels, node_order, gpu_of, home_of, claim, reasons)
    # Warn only about the GPUs the ranks use, once each.
    warnings.extend(w for g, w in enumerate(gpu_warnings) if w and g in set(gpu_of.values()))
    return gpu_of, home_of, claim, reasons


def _choose_gpus(
    req: Request,
    nvisible: int,
    homes: list[int | None],
    claims: list[int],
    labels: list[str],
    node_order: list[int],
    gpu_of: dict[int, int],
    home_of: dict[int, int],
    claim: dict[int, int],
    reasons: dict[int, list[str]],
) -> None:
    """Fill ``gpu_of``/``home_of``/``claim``/``reasons`` by the GPU order (``rank`` or ``closest``) or ``--gpus``."""
    if req.gpu_order == "closest" and req.gpus is None and nvisible:
        # mpibind / --gpu-bind=closest: ranks follow CPU order; each takes the next GPU local to its node.
        rank = 0
        for node in node_order:
            for g, home in enumerate(homes):
                if home == node and rank < req.nproc:
                    gpu_of[rank], home_of[rank], claim[rank] = g, node, claims[g]
                    reasons[rank] = [f"closest order: {labels[g]}"]
                    rank += 1
        for g, home in enumerate(homes):
            if home is None and rank < req.nproc:
                gpu_of[rank] = g
                reasons[rank] = [labels[g]]
                rank += 1
        for extra in range(rank, req.nproc):
            reasons[extra] = ["no GPU for this rank"]
        return
    for rank in range(req.nproc):
        chosen = req.gpus[rank] if req.gpus is not None else (rank if rank < nvisible else None)
        if chosen is None:
            reasons[rank] = ["no GPU for this rank" if nvisible else "no GPU: CPU-only rank"]
            continue
        gpu_of[rank] = chosen
        reasons[rank] = [labels[chosen]]
        home = homes[chosen]
        if home is not None:
            home_of[rank], claim[rank] = home, claims[chosen]


def _spread_homeless(nproc: int, home_of: dict[int, int], by_node: dict[int, list[Core]], node_order: list[int]) -> None:
    """Give ranks without a home node one, in blocks, in proportion to each node's free cores."""
    homeless = [r for r in range(nproc) if r not in home_of]
    if not homeless:
        return
    used = {n: 0 for n in node_order}
    for n in home_of.values():
        used[n] += 1
    free = {n: max(len(by_node[n]) - used[n], 0) for n in node_order}
    total = sum(free.values())
    if total == 0:
        free = {n: len(by_node[n]) for n in node_order}
        total = sum(free.values())
    k = len(homeless)
    quota = {n: k * free[n] // total for n in node_order}
    remainders = sorted(node_order, key=lambda n: (-(k * free[n] % total), node_order.index(n)))
    for n in remainders[: k - sum(quota.values())]:
        quota[n] += 1
    it = iter(homeless)
    for n in node_order:
        for _ in range(quota[n]):
            home_of[next(it)] = n


def _fix_overflow(
    topo: Topology, home_of: dict[int, int], claim: dict[int, int], by_node: dict[int, list[Core]], warnings: list[str]
) -> None:
    """Move ranks off nodes that have more ranks than cores, to the nearest node with spare cores.

    The ranks with the weakest claim on the node move first (spread ranks, then ranks placed by distance or
    ``local_cpus``, then ranks whose GPU is on the node), the highest rank first among equals.
    """
    count: dict[int, int] = {n: 0 for n in by_node}
    for n in home_of.values():
        count[n] += 1
    for rank in sorted(home_of, key=lambda r: (claim.get(r, CLAIM_SPREAD), -r)):
        node = home_of[rank]
        if count[node] <= len(by_node[node]):
            continue
        spare = [n for n in by_node if count[n] < len(by_node[n])]
        target = _nearest(topo, node, spare)
        count[node] -= 1
        count[target] += 1
        home_of[rank] = target
        warnings.append(
            f"rank {rank}: node {_nname(node)} has {len(by_node[node])} core(s) for more ranks; placed on node {_nname(target)}"
        )


def _rank_plan(
    topo: Topology,
    req: Request,
    rank: int,
    chunk: Sequence[Core],
    gpu: int | None,
    gpu_obj: GPU | None,
    shared: bool,
    sharers: int,
    reasons: list[str],
    plan_warnings: list[str],
) -> RankPlan:
    rank_warnings: list[str] = []
    loader: list[Core] = []
    compute = list(chunk)
    if req.loader_cores:
        if shared:
            rank_warnings.append("--loader-cores is ignored in shared modes (numa, socket)")
        elif req.loader_cores >= len(chunk):
            raise PlanError(
                f"--loader-cores {req.loader_cores} leaves rank {rank} no compute core (it has {len(chunk)} core(s))"
            )
        else:
            loader = compute[-req.loader_cores :]
            compute = compute[: -req.loader_cores]
    units = sum(len(c.pus) for c in compute) if req.smt else len(compute)
    threads = max(1, units // sharers) if shared else units
    cpus = tuple(sorted(p for c in chunk for p in c.pus))
    nodes = tuple(sorted({c.numa_node for c in chunk if c.numa_node is not None}))
    mem_nodes = nodes
    if topo.allowed_mems is not None:
        mem_nodes = tuple(n for n in nodes if n in topo.allowed_mems)
        if nodes and not mem_nodes:
            rank_warnings.append(f"memory of node(s) {','.join(map(str, nodes))} is not allowed by the cpuset; no memory policy")
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
    )


def _plan_map(topo: Topology, req: Request, cores: list[Core], warnings: list[str]) -> Plan:
    assert req.cpu_map is not None
    pu_core: dict[int, Core] = {p: c for c in cores for p in c.pus}
    visible = topo.visible_gpus() if req.use_gpus else ()
    if req.gpus is not None:
        for g in req.gpus:
            if g < 0 or g >= len(visible):
                raise PlanError(f"GPU {g} does not exist: {len(visible)} GPU(s) are visible")
    seen: dict[int, int] = {}
    ranks: list[RankPlan] = []
    for rank, wanted in enumerate(req.cpu_map):
        outside = wanted - set(pu_core)
        if outside:
            reserved = f", reserved {format_cpulist(req.reserve)}" if req.reserve else ""
            raise PlanError(
                f"--map rank {rank}: CPUs {format_cpulist(outside)} are not usable here "
                f"(allowed: {format_cpulist(topo.allowed)}{reserved})"
            )
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
        ranks.append(_rank_plan(topo, req, rank, chunk, gpu, gpu_obj, False, 1, ["explicit --map"], warnings))
    return Plan(tuple(ranks), req.mode, req.smt, req.gpu_order, tuple(warnings), tuple(sorted(_reserved_pus(topo, req))))
