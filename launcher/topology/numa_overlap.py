"""A broken NUMA table: node cpusets that overlap. hwloc then ignores the NUMA information and reports one node;
so does affrun, with a warning, whatever the source (sysfs tree, snapshot or XML)."""

from __future__ import annotations

from dataclasses import replace

from launcher.cpulist import format_cpulist
from launcher.topology.model import NumaNode, Topology


def merge_overlapping_nodes(topo: Topology) -> Topology:
    """``topo`` unchanged when no CPU is in two NUMA nodes; else one node (the lowest id) holding every CPU and
    the memory of all, with cores, GPUs and the cpuset's memory nodes pointed at it."""
    seen: dict[int, int] = {}
    overlap: set[int] = set()
    involved: set[int] = set()
    for node in topo.numa_nodes:
        for cpu in node.cpus:
            if cpu in seen:
                overlap.add(cpu)
                involved.update((seen[cpu], node.os_index))
            else:
                seen[cpu] = node.os_index
    if not overlap:
        return topo
    ids = sorted(n.os_index for n in topo.numa_nodes)
    one = ids[0]
    memories = [n.memory_kb for n in topo.numa_nodes if n.memory_kb is not None]
    merged = NumaNode(one, frozenset(seen), {one: 10}, sum(memories) if memories else None)
    warning = (
        f"the NUMA table is broken: CPUs {format_cpulist(overlap)} are in more than one node "
        f"(nodes {format_cpulist(involved)}); planning as if there were one NUMA node, as hwloc does"
    )
    return replace(
        topo,
        numa_nodes=(merged,),
        cores=tuple(replace(c, numa_node=one) if c.numa_node is not None else c for c in topo.cores),
        gpus=tuple(
            replace(g, numa_node=one if g.numa_node is not None else None, memory_node=None) for g in topo.gpus
        ),
        allowed_mems=None if topo.allowed_mems is None else frozenset({one} if topo.allowed_mems else ()),
        warnings=(*topo.warnings, warning),
    )
