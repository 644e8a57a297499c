"""Where each rank lives: its visible GPU and its home NUMA node, by GPU order (``rank``: :func:`rank_order`;
``closest``: :func:`launcher.plan.closest.closest_order`). Pure; a part of :mod:`launcher.plan.planner`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import PlanError
from launcher.plan.closest import closest_order
from launcher.plan.geometry import (
    CLAIM_GPU_NODE,
    CLAIM_NEAR,
    CLAIM_SPREAD,
    GpuHome,
    Homes,
    Layout,
    nearest,
    nname,
    proportional,
)
from launcher.plan.request import Request
from launcher.topology.model import GPU, Core, Topology

if TYPE_CHECKING:
    from collections.abc import Sequence


def usable_gpus(topo: Topology, req: Request) -> tuple[GPU, ...]:
    """The visible GPUs the ranks may use (none with ``use_gpus`` off); :class:`PlanError` when ``req.gpus`` names
    one that does not exist."""
    visible = topo.visible_gpus() if req.use_gpus else ()
    for g in req.gpus or ():
        if g < 0 or g >= len(visible):
            raise PlanError(f"GPU {g} does not exist: {len(visible)} GPU(s) are visible")
    return visible


def assign_homes(req: Request, layout: Layout) -> tuple[Homes, list[str]]:
    """Every rank's GPU and home node, by ``req.gpu_order`` or ``req.gpus``, and the warnings; ranks without one
    are spread over the nodes, and (whole-core modes) nodes with more ranks than cores give the excess to the
    nearest node."""
    topo = layout.topo
    gpus = [gpu_home(topo, gpu, f"GPU {i} ({gpu.pci})", layout.by_node, layout.node_order)
            for i, gpu in enumerate(usable_gpus(topo, req))]
    order = closest_order if req.gpu_order == "closest" and req.gpus is None and gpus else rank_order
    homes, warnings = order(req, gpus, layout)
    # Warn only about the GPUs the ranks use, once each.
    used = set(homes.gpu_of.values())
    warnings += [home.warning for g, home in enumerate(gpus) if home.warning and g in used]
    home_of = _spread_homeless(req.nproc, homes.home_of, layout)
    if layout.cap is not None:
        home_of, moved = _fix_overflow(layout, home_of, homes.claim)
        warnings += moved
    return replace(homes, home_of=home_of), warnings


def gpu_home(topo: Topology, gpu: GPU, label: str, by_node: dict[int, list[Core]], node_order: list[int]) -> GpuHome:
    """The GPU's home node, how firm that is, why, and a warning when the locality is indirect. ``by_node``: the
    usable cores of each node (-1: no known node); ``node_order``: its keys in CPU order."""
    if gpu.numa_node is not None and gpu.numa_node in by_node:
        return GpuHome(gpu.numa_node, CLAIM_GPU_NODE, f"{label} is on NUMA node {gpu.numa_node}")
    if gpu.numa_node is not None:
        near = nearest(topo, gpu.numa_node, [n for n in node_order if n != -1] or node_order)
        node = topo.node(gpu.numa_node)
        if node is None:
            why = "is not in the topology"
        elif not node.cpus:
            why = "has no CPUs"
        else:
            why = "has no usable CPUs (not allowed or reserved)"
        warning = f"{label} is on NUMA node {gpu.numa_node}, which {why}; using the nearest node with CPUs, {nname(near)}"
        return GpuHome(near, CLAIM_NEAR, f"{label}: node {gpu.numa_node} {why}, nearest node with CPUs is {nname(near)}",
                       warning)
    if gpu.cpus and not gpu.cpus >= topo.online:
        overlap = {n: sum(1 for c in by_node[n] for p in c.pus if p in gpu.cpus) for n in node_order}
        best = max(node_order, key=lambda n: (overlap[n], -node_order.index(n)))
        if overlap[best] > 0:
            return GpuHome(best, CLAIM_NEAR, f"{label} has local CPUs {format_cpulist(gpu.cpus)} (node {nname(best)})")
    return GpuHome(None, CLAIM_SPREAD, f"{label} has unknown locality",
                   f"{label} has unknown NUMA locality; its rank is spread like a CPU-only rank")


def rank_order(req: Request, gpus: Sequence[GpuHome], layout: Layout) -> tuple[Homes, list[str]]:
    """Rank order, or explicit ``--gpus``: rank i -> visible GPU i (or ``req.gpus[i]``) -> that GPU's node."""
    homes = Homes({}, {}, {}, {})
    for rank in range(req.nproc):
        chosen = req.gpus[rank] if req.gpus is not None else (rank if rank < len(gpus) else None)
        if chosen is None:
            homes.reasons[rank] = ["no GPU for this rank" if gpus else "no GPU: CPU-only rank"]
            continue
        homes.gpu_of[rank] = chosen
        homes.reasons[rank] = [gpus[chosen].why]
        home = gpus[chosen].node
        if home is not None:
            homes.home_of[rank], homes.claim[rank] = home, gpus[chosen].claim
    return homes, []


def _spread_homeless(nproc: int, home_of: dict[int, int], layout: Layout) -> dict[int, int]:
    """``home_of`` with a home for the ranks without one, in blocks, in proportion to each node's free cores."""
    homeless = [r for r in range(nproc) if r not in home_of]
    if not homeless:
        return home_of
    by_node, node_order = layout.by_node, layout.node_order
    used = {n: 0 for n in node_order}
    for n in home_of.values():
        used[n] += 1
    free = {n: max(len(by_node[n]) - used[n], 0) for n in node_order}
    if sum(free.values()) == 0:
        free = {n: len(by_node[n]) for n in node_order}
    quota = proportional(len(homeless), free, node_order)
    it = iter(homeless)
    return {**home_of, **{next(it): n for n in node_order for _ in range(quota[n])}}


def _fix_overflow(layout: Layout, home_of: dict[int, int], claim: dict[int, int]) -> tuple[dict[int, int], list[str]]:
    """``home_of`` with ranks moved off nodes that have more ranks than cores, to the nearest node with spare
    cores (the weakest claim first, then the highest rank), and a warning for each."""
    by_node = layout.by_node
    out = dict(home_of)
    warnings: list[str] = []
    count: dict[int, int] = {n: 0 for n in by_node}
    for n in out.values():
        count[n] += 1
    for rank in sorted(out, key=lambda r: (claim.get(r, CLAIM_SPREAD), -r)):
        node = out[rank]
        if count[node] <= len(by_node[node]):
            continue
        spare = [n for n in by_node if count[n] < len(by_node[n])]
        target = layout.nearest(node, spare)
        count[node] -= 1
        count[target] += 1
        out[rank] = target
        warnings.append(
            f"rank {rank}: node {nname(node)} has {len(by_node[node])} core(s) for more ranks; placed on node {nname(target)}"
        )
    return out, warnings
