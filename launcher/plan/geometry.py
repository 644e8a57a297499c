"""The planner's geometry, shared by its parts (:mod:`launcher.plan.homes`, :mod:`launcher.plan.closest`,
:mod:`launcher.plan.spill`): node names and distances, packages, proportional shares and contiguous chunks, and
the :class:`Homes` record that the GPU orders fill. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.topology.model import Core, Topology

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import TypeVar

    T = TypeVar("T")

# How firmly a rank is tied to its home node; when a node has more ranks than cores, the weakest move first.
CLAIM_SPREAD, CLAIM_NEAR, CLAIM_GPU_NODE = 0, 1, 2


FAR = 1 << 20  # the distance of a node the table does not name


@dataclass
class Homes:
    """Each rank's visible GPU, home node and claim on it (ranks without a home are spread later), and reasons."""

    gpu_of: dict[int, int] = field(default_factory=dict)
    home_of: dict[int, int] = field(default_factory=dict)
    claim: dict[int, int] = field(default_factory=dict)
    reasons: dict[int, list[str]] = field(default_factory=dict)


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
    base, extra = divmod(len(items), k)
    out: list[list[T]] = []
    start = 0
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append(list(items[start : start + size]))
        start += size
    return out
