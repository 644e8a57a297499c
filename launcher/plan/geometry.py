"""The planner's geometry, shared by its parts: the machine's :class:`Layout`, node names and distances,
packages, proportional shares and contiguous chunks, and the GPU orders' records (:class:`GpuHome`, :class:`Homes`).
Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.split import balanced_slices
from launcher.topology.model import Core, Topology

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import TypeVar

    T = TypeVar("T")

# How firmly a rank is tied to its home node; when a node has more ranks than cores, the weakest move first.
CLAIM_SPREAD, CLAIM_NEAR, CLAIM_GPU_NODE = 0, 1, 2


FAR = 1 << 20  # the distance of a node the table does not name


@dataclass(frozen=True)
class Layout:
    """The machine as the planner cuts it, built once per plan (:func:`layout_of`): ``by_node`` holds the usable
    cores of each node (-1: cores of no known node) in L3-group then CPU order, ``node_order`` its keys in CPU
    order, ``pos`` each node's place in it, ``pkg`` its package; ``cap`` its cores, in the whole-core modes only
    (``exclusive``, ``l3``: a node takes no more ranks than cores), else ``None``."""

    topo: Topology
    by_node: dict[int, list[Core]]
    node_order: list[int]
    pos: dict[int, int]
    pkg: dict[int, int]
    cap: dict[int, int] | None

    def distance(self, a: int, b: int) -> int:
        return distance(self.topo, a, b)

    def nearest(self, origin: int, candidates: Sequence[int]) -> int:
        return nearest(self.topo, origin, candidates)


def layout_of(topo: Topology, cores: Iterable[Core], whole_cores: bool) -> Layout:
    """The :class:`Layout` of ``cores`` (the usable ones) on ``topo``."""
    by_node: dict[int, list[Core]] = {}
    for core in cores:
        by_node.setdefault(core.numa_node if core.numa_node is not None else -1, []).append(core)
    for node_cores in by_node.values():
        node_cores.sort(key=lambda c: (c.l3 if c.l3 is not None else -1, c.pus[0]))
    order = sorted(by_node, key=lambda n: min(p for c in by_node[n] for p in c.pus) if n != -1 else by_node[n][0].pus[0])
    return Layout(topo, by_node, order, {n: i for i, n in enumerate(order)},
                  {n: package_of(by_node[n]) for n in order},
                  {n: len(by_node[n]) for n in order} if whole_cores else None)


@dataclass(frozen=True)
class GpuHome:
    """Where a GPU's rank lives: its home ``node`` (``None``: unknown, the rank is spread like a CPU-only one), how
    firm that is (``CLAIM_*``), why, and a warning when the locality is indirect."""

    node: int | None
    claim: int
    why: str
    warning: str | None = None


@dataclass(frozen=True)
class Homes:
    """What a GPU order gives the ranks: each rank's visible GPU, home node and claim on it (ranks without a home
    are spread later), and reasons."""

    gpu_of: dict[int, int]
    home_of: dict[int, int]
    claim: dict[int, int]
    reasons: dict[int, list[str]]


def nname(node: int) -> str:
    return "?" if node == -1 else str(node)


def package_of(cores: Sequence[Core]) -> int:
    """The package holding most of ``cores`` (the lowest on a tie)."""
    counts: dict[int, int] = {}
    for c in cores:
        counts[c.package] = counts.get(c.package, 0) + 1
    return max(counts, key=lambda p: (counts[p], -p))


def distance(topo: Topology, a: int, b: int) -> int:
    node = topo.node(a)
    return node.distances.get(b, FAR) if node else FAR


def nearest(topo: Topology, origin: int, candidates: Sequence[int]) -> int:
    """The candidate nearest to ``origin`` by the distance table; the first candidate on a tie."""
    return min(candidates, key=lambda n: (distance(topo, origin, n), candidates.index(n)))


def proportional(k: int, weights: dict[int, int], order: Sequence[int]) -> dict[int, int]:
    """Share ``k`` among ``order`` in proportion to ``weights``: floors, then the largest remainders (ties to the
    earlier key). No key gets more than ``ceil(k * w / total)``."""
    total = sum(weights[n] for n in order)
    if total == 0:
        return {n: 0 for n in order}
    share = {n: k * weights[n] // total for n in order}
    by_remainder = sorted(order, key=lambda n: (-(k * weights[n] % total), order.index(n)))
    for n in by_remainder[: k - sum(share.values())]:
        share[n] += 1
    return share


def balanced_chunks(items: Sequence[T], k: int) -> list[list[T]]:
    """Cut ``items`` into ``k`` contiguous chunks whose sizes differ by at most one (larger ones first)."""
    return [list(items[part]) for part in balanced_slices(len(items), k)]
