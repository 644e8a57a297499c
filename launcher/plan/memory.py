"""A rank's memory nodes: its home nodes, or for a memory-less node the memory that stands in for it. Pure.
Which node stands in, and why: docs/planner.md, "Memory-less CPU nodes".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist

if TYPE_CHECKING:
    from launcher.topology.model import Topology


def rank_memory_nodes(topo: Topology, nodes: tuple[int, ...], rank_warnings: list[str]) -> tuple[int, ...]:
    """The nodes the rank's memory policy names: the sorted union of each home node's stand-ins
    (:func:`stand_ins_of`)."""
    stand_ins = {n: stand_ins_of(topo, n, rank_warnings) for n in nodes}
    forbidden = [n for n in nodes if stand_ins[n] == () and _has_memory(topo, n)]
    out = tuple(sorted({m for n in nodes for m in stand_ins[n]}))
    if forbidden and not out:
        rank_warnings.append(f"memory of node(s) {','.join(map(str, forbidden))} is not allowed by the cpuset; no memory policy")
    return out


def _has_memory(topo: Topology, n: int) -> bool:
    """Whether node ``n`` has memory, or may have (a node the topology does not know, or of unknown size)."""
    node = topo.node(n)
    return node is None or node.memory_kb != 0


def stand_ins_of(topo: Topology, n: int, rank_warnings: list[str]) -> tuple[int, ...]:
    """The memory node ``n`` takes: itself; none when the cpuset forbids its memory; for a memory-less node the
    memory the firmware's initiator table makes local to its CPUs (``NumaNode.local_cpus``), else the nearest node
    with memory (distance table). Warnings say which case it was."""
    allowed = topo.allowed_mems
    node = topo.node(n)
    if node is None or _has_memory(topo, n):
        return (n,) if allowed is None or n in allowed else ()
    local = topo.local_memory_of(n)
    if local:
        cpus = frozenset().union(*(m.local_cpus or () for m in local))
        rank_warnings.append(f"node {n} has no memory; the memory policy uses node "
                             f"{','.join(str(m.os_index) for m in local)}, local to CPUs {format_cpulist(cpus)} "
                             "by the firmware's initiator table")
        return tuple(m.os_index for m in local)
    with_memory = [
        m.os_index for m in topo.numa_nodes
        if m.memory_kb != 0 and (allowed is None or m.os_index in allowed) and m.os_index in node.distances
    ]
    if not with_memory:
        rank_warnings.append(f"node {n} has no memory and the distance table names no usable node with memory; "
                             "no memory policy for it")
        return ()
    target = min(with_memory, key=lambda m: (node.distances[m], m))
    rank_warnings.append(f"node {n} has no memory; the memory policy uses node {target}, the nearest node with "
                         f"memory (distance {node.distances[target]})")
    return (target,)
