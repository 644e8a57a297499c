"""Where CPU-less memory is local: the kernel's HMAT initiator links (Linux 5.10+), read as hwloc reads them.

``node<M>/access1/initiators/node<N>`` says that node N holds the best CPU initiators of memory node M.
``access0`` names the best initiators of any kind, and that may be a generic initiator (a GPU or NIC node without
CPUs), so hwloc reads ``access1`` and, only where it is absent, ``access0`` (``read_node_initiators`` in
``hwloc/topology-linux.c``). A node's memory is then local to its own CPUs plus the CPUs of its initiators. A node
whose initiators give no CPU (none listed, or only generic initiators) gets no locality from them: hwloc then
falls back to the distance table, and so does the planner.
"""

from __future__ import annotations

import os

from launcher.topology._files import numbered_entries
from launcher.topology.fsroot import isdir


def node_initiators(node_dir: str, node: int) -> tuple[int, ...] | None:
    """The initiator node ids of ``node`` (itself left out), from ``access1``, else ``access0``; ``None`` when
    neither directory exists."""
    for access in ("access1", "access0"):
        path = os.path.join(node_dir, access, "initiators")
        if isdir(path):
            return tuple(n for n in numbered_entries(path, "node") if n != node)
    return None


def local_cpus(
    node: int, own: frozenset[int], initiators: tuple[int, ...] | None, cpus_of: dict[int, frozenset[int]]
) -> frozenset[int] | None:
    """The CPUs ``node``'s memory is local to by its initiators (its own CPUs included); ``None`` without
    initiator information or when the initiators hold no CPU (initiators that are not nodes are ignored)."""
    if not initiators:
        return None
    found = frozenset().union(*(cpus_of.get(i, frozenset()) for i in initiators))
    return (found | own) if found else None
