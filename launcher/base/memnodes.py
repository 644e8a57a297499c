"""A rank's memory nodes (the nodes its memory policy names) in the one normal form that the planner writes
(:func:`memory_nodes`) and that every rank checks its plan against (:func:`memory_nodes_fault`), so that the two
agree by construction. Imports nothing: a rank imports this module (docs/design.md §11)."""

from __future__ import annotations


def memory_nodes(numa_nodes: tuple[int, ...], stand_ins: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """The normal form: the sorted union of each node's stand-ins, one entry per node.

    ``stand_ins[n]`` is ``(n,)`` for a node whose memory the rank may use (also when ``n`` is missing), ``()``
    for one whose memory it may not, and, for a memory-less node, the nodes with memory that stand in for it
    (never a memory-less node, so never ``n`` itself). A stand-in may be another of the rank's own nodes, and
    several nodes may share one (an initiator table can make two memory nodes equally near)."""
    return tuple(sorted({m for n in numa_nodes for m in stand_ins.get(n, (n,))}))


def memory_nodes_fault(numa_nodes: tuple[int, ...], mem_nodes: tuple[int, ...]) -> str:
    """Why ``mem_nodes`` is not :func:`memory_nodes` of ``numa_nodes`` for any stand-ins; ``""`` when it is.

    The stand-ins that would explain it: a node in ``mem_nodes`` uses its own memory, and every other node of the
    rank (memory-less, or its memory forbidden) may stand in with all of the foreign nodes. When even those do
    not give ``mem_nodes`` back, no planner could have written it."""
    own = set(mem_nodes)
    foreign = tuple(m for m in mem_nodes if m not in numa_nodes)
    witness = {n: (n,) if n in own else foreign for n in numa_nodes}
    if memory_nodes(numa_nodes, witness) == tuple(mem_nodes):
        return ""
    if len(own) != len(mem_nodes):
        return "lists a node twice"
    if list(mem_nodes) != sorted(own):
        return "is not in increasing order"
    return f"names node(s) {','.join(map(str, sorted(foreign)))}, which stand in for none of its numa_nodes"
