"""Spill: the cores of nodes that host no rank go to the nearest ranks, so that no allowed core is idle. Pure; a
part of :mod:`launcher.plan.planner`. The rule: docs/how-it-decides.md, step 4; why: docs/planner.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.plan.geometry import Layout, balanced_chunks
from launcher.topology.model import Core


@dataclass(frozen=True)
class Spill:
    """The spill cores one rank receives, and the NUMA nodes they come from."""

    cores: tuple[Core, ...]
    nodes: tuple[int, ...]


def spill_cores(
    layout: Layout,
    members: dict[int, list[int]],
    chunks: dict[int, tuple[list[Core], bool, str]],
) -> dict[int, Spill]:
    """Rank -> its spill (ranks that receive none are left out). ``members``: home node -> its ranks, in the
    order their chunks were cut; ``chunks``: rank -> (cores, shared, why)."""
    by_node, node_order, pos, pkg = layout.by_node, layout.node_order, layout.pos, layout.pkg
    used = {c.pus[0] for chunk, _, _ in chunks.values() for c in chunk}
    idle = {n: [c for c in by_node[n] if c.pus[0] not in used] for n in node_order}
    idle = {n: cores for n, cores in idle.items() if cores}
    receivers = [n for n in node_order if n in members]
    if not idle or not receivers:
        return {}
    load = {n: 0.0 for n in receivers}
    sources: dict[int, list[int]] = {n: [] for n in receivers}
    for n in node_order:
        if n not in idle:
            continue
        to = min(receivers, key=lambda d: (layout.distance(n, d), pkg[d] != pkg[n], load[d], pos[d]))
        sources[to].append(n)
        load[to] += len(idle[n]) / len(members[to])
    got: dict[int, list[Core]] = {}
    for to, from_nodes in sources.items():
        if not from_nodes:
            continue
        from_nodes.sort(key=lambda n: (layout.distance(to, n), pkg[n] != pkg[to], pos[n]))
        pool = [c for n in from_nodes for c in idle[n]]
        ranks = members[to]
        first_chunk, shared, _ = chunks[ranks[0]]
        if shared:
            key = _key(first_chunk)
            for rank in sorted(r for r, (chunk, _, _) in chunks.items() if _key(chunk) == key):
                got.setdefault(rank, []).extend(pool)
        else:
            for rank, block in zip(ranks, balanced_chunks(pool, len(ranks))):
                if block:
                    got.setdefault(rank, []).extend(block)
    return {
        rank: Spill(tuple(cores), tuple(sorted({c.numa_node for c in cores if c.numa_node is not None})))
        for rank, cores in got.items()
    }


def _key(chunk: list[Core]) -> tuple[int, ...]:
    return tuple(c.pus[0] for c in chunk)
