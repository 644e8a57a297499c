"""Where each rank lives: its visible GPU and its home NUMA node. Pure; a part of :mod:`launcher.plan.planner`.

GPU orders:

* ``rank`` (torch's convention): rank *i* uses visible GPU *i* and lives on that GPU's node.
* ``closest`` (mpibind, Slurm's ``--gpu-bind=closest``): ranks follow CPU order (:mod:`launcher.plan.closest`,
  which also fits each node's ranks to its cores, so the overflow fix-up below never moves a closest-order rank).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.errors import PlanError
from launcher.plan.closest import closest_order
from launcher.plan.geometry import CLAIM_GPU_NODE, CLAIM_NEAR, CLAIM_SPREAD, Homes, nearest, nname, proportional
from launcher.topology.model import GPU, Core, Topology

if TYPE_CHECKING:

    from launcher.plan.planner import Request


def assign_homes(
    topo: Topology, req: Request, by_node: dict[int, list[Core]], node_order: list[int], warnings: list[str]
) -> Homes:
    """Every rank's GPU and home node, by ``req.gpu_order`` or ``req.gpus``; ranks without one are spread over
    the nodes, and (whole-core modes) nodes with more ranks than cores give the excess to the nearest node."""
    visible = topo.visible_gpus() if req.use_gpus else ()
    if req.gpus is not None:
        for g in req.gpus:
            if g < 0 or g >= len(visible):
                raise PlanError(f"GPU {g} does not exist: {len(visible)} GPU(s) are visible")
    located = [gpu_home(topo, gpu, f"GPU {i} ({gpu.pci})", by_node, node_order) for i, gpu in enumerate(visible)]
    homes = [h for h, _, _, _ in located]
    claims = [c for _, c, _, _ in located]
    labels = [why for _, _, why, _ in located]
    out = Homes()
    if req.gpu_order == "closest" and req.gpus is None and visible:
        closest_order(topo, req, homes, claims, labels, by_node, node_order, out, warnings)
    else:
        _by_rank(req, len(visible), homes, claims, labels, out)
    # Warn only about the GPUs the ranks use, once each.
    used = set(out.gpu_of.values())
    warnings.extend(w for g, (_, _, _, w) in enumerate(located) if w and g in used)
    _spread_homeless(req.nproc, out.home_of, by_node, node_order)
    if req.mode in ("exclusive", "l3"):
        _fix_overflow(topo, out.home_of, out.claim, by_node, warnings)
    return out


def gpu_home(
    topo: Topology, gpu: GPU, label: str, by_node: dict[int, list[Core]], node_order: list[int]
) -> tuple[int | None, int, str, str | None]:
    """The GPU's home node, how firm that is (``CLAIM_*``), why, and a warning when the locality is indirect.

    ``by_node`` holds the usable cores of each node (-1: cores of no known node), ``node_order`` its keys in CPU
    order. Public: ``affrun show`` draws each GPU where this puts it."""
    if gpu.numa_node is not None and gpu.numa_node in by_node:
        return gpu.numa_node, CLAIM_GPU_NODE, f"{label} is on NUMA node {gpu.numa_node}", None
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
        return near, CLAIM_NEAR, f"{label}: node {gpu.numa_node} {why}, nearest node with CPUs is {nname(near)}", warning
    if gpu.cpus and not gpu.cpus >= topo.online:
        overlap = {n: sum(1 for c in by_node[n] for p in c.pus if p in gpu.cpus) for n in node_order}
        best = max(node_order, key=lambda n: (overlap[n], -node_order.index(n)))
        if overlap[best] > 0:
            return best, CLAIM_NEAR, f"{label} has local CPUs {format_cpulist(gpu.cpus)} (node {nname(best)})", None
    warning = f"{label} has unknown NUMA locality; its rank is spread like a CPU-only rank"
    return None, CLAIM_SPREAD, f"{label} has unknown locality", warning


def _by_rank(req: Request, nvisible: int, homes: list[int | None], claims: list[int], labels: list[str], out: Homes) -> None:
    """Rank order, or explicit ``--gpus``: rank i -> visible GPU i (or ``req.gpus[i]``) -> that GPU's node."""
    for rank in range(req.nproc):
        chosen = req.gpus[rank] if req.gpus is not None else (rank if rank < nvisible else None)
        if chosen is None:
            out.reasons[rank] = ["no GPU for this rank" if nvisible else "no GPU: CPU-only rank"]
            continue
        out.gpu_of[rank] = chosen
        out.reasons[rank] = [labels[chosen]]
        home = homes[chosen]
        if home is not None:
            out.home_of[rank], out.claim[rank] = home, claims[chosen]


def _spread_homeless(nproc: int, home_of: dict[int, int], by_node: dict[int, list[Core]], node_order: list[int]) -> None:
    """Give ranks without a home node one, in blocks, in proportion to each node's free cores."""
    homeless = [r for r in range(nproc) if r not in home_of]
    if not homeless:
        return
    used = {n: 0 for n in node_order}
    for n in home_of.values():
        used[n] += 1
    free = {n: max(len(by_node[n]) - used[n], 0) for n in node_order}
    if sum(free.values()) == 0:
        free = {n: len(by_node[n]) for n in node_order}
    quota = proportional(len(homeless), free, node_order)
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
        target = nearest(topo, node, spare)
        count[node] -= 1
        count[target] += 1
        home_of[rank] = target
        warnings.append(
            f"rank {rank}: node {nname(node)} has {len(by_node[node])} core(s) for more ranks; placed on node {nname(target)}"
        )
