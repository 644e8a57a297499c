"""A broken NUMA table: node cpusets that overlap. hwloc's Linux backend then keeps the nodes in id order and
ignores each node whose CPUs intersect those of the nodes kept before it (its memory included); affrun does the
same, with a warning, for a sysfs tree or an XML (a snapshot is saved after this: one that overlaps is refused).
On a table where every node claims every CPU, one node is left: the machine is planned as one NUMA node."""

from __future__ import annotations

from dataclasses import replace

from launcher.base.cpulist import format_cpulist
from launcher.topology.model import Topology


def merge_overlapping_nodes(topo: Topology) -> Topology:
    """``topo`` unchanged when no CPU is in two NUMA nodes; else without the nodes that overlap earlier ones. Their
    cores and GPUs go to the kept node that holds their CPUs (a GPU: the first such node), or to none."""
    kept: list[int] = []
    dropped: list[int] = []
    claimed: dict[int, int] = {}  # CPU -> the kept node that holds it
    overlap: set[int] = set()
    for node in sorted(topo.numa_nodes, key=lambda n: n.os_index):
        common = node.cpus & claimed.keys()
        if common:
            dropped.append(node.os_index)
            overlap |= common
            continue
        kept.append(node.os_index)
        claimed.update(dict.fromkeys(node.cpus, node.os_index))
    if not dropped:
        return topo
    gone = set(dropped)
    dropped_cpus = {n.os_index: n.cpus for n in topo.numa_nodes if n.os_index in gone}

    def moved(node: int | None) -> int | None:
        if node is None or node not in gone:
            return node
        holders = sorted({claimed[p] for p in dropped_cpus[node] if p in claimed})
        return holders[0] if holders else None

    warning = (
        f"the NUMA table is broken: node(s) {format_cpulist(dropped)} claim CPUs {format_cpulist(overlap)} of "
        f"node(s) {format_cpulist({claimed[p] for p in overlap})}; ignoring them, as hwloc does"
        + ("; planning as one NUMA node" if sum(1 for n in topo.numa_nodes if n.os_index in kept and n.cpus) == 1 else "")
    )
    return replace(
        topo,
        numa_nodes=tuple(
            replace(n, distances={k: v for k, v in n.distances.items() if k not in gone})
            for n in topo.numa_nodes if n.os_index not in gone
        ),
        # A core of an ignored node belongs to the kept node that holds its CPUs, or (as in hwloc) to none.
        cores=tuple(
            replace(c, numa_node=next((claimed[p] for p in c.pus if p in claimed), None)) if c.numa_node in gone else c
            for c in topo.cores
        ),
        gpus=tuple(
            replace(g, numa_node=moved(g.numa_node), memory_node=None if g.memory_node in gone else g.memory_node)
            for g in topo.gpus
        ),
        allowed_mems=None if topo.allowed_mems is None else topo.allowed_mems - gone,
        warnings=(*topo.warnings, warning),
    )
