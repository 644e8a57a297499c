"""Plan by core kind (hybrid CPUs: P/E cores, big.LITTLE, Zen 5/5c). Pure; a part of :mod:`launcher.plan.planner`.

The rule: docs/how-it-decides.md, step 3; why: docs/planner.md, "Core kinds".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.split import balanced_sizes, contiguous
from launcher.plan.geometry import balanced_chunks
from launcher.topology.kinds import CoreKind, CoreKinds
from launcher.topology.model import Core, Topology

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.base.choices import SpillChoice


def plan_kinds(topo: Topology) -> CoreKinds | None:
    """The allowed CPUs' kinds, fastest first, when there are two or more; ``None`` on a homogeneous machine, and
    where the kinds are only priority classes (``topo.priority.one_kind``: docs/core-kinds.md)."""
    kinds = topo.kinds()
    return kinds if kinds.hybrid and not topo.priority.one_kind else None


def _rank_of(kinds: CoreKinds) -> dict[int, int]:
    """CPU -> position of its kind, 0 for the fastest."""
    return {cpu: i for i, kind in enumerate(kinds.kinds) for cpu in kind.cpus}


def core_rank(core: Core, ranks: dict[int, int]) -> int:
    """A core's kind position: its slowest PU's (a core whose PUs disagree is as slow as its slowest PU)."""
    return max((ranks.get(p, len(ranks)) for p in core.pus), default=0)


def kind_chunks(cores: Sequence[Core], kinds: CoreKinds | None, k: int) -> list[list[Core]]:
    """``cores`` cut into ``k`` shares: :func:`balanced_chunks` on a homogeneous machine; else each kind cut on its
    own (fastest first) so that each share holds an equal part of each kind."""
    if kinds is None:
        return balanced_chunks(cores, k)
    ranks = _rank_of(kinds)
    groups: dict[int, list[Core]] = {}
    for core in cores:
        groups.setdefault(core_rank(core, ranks), []).append(core)
    return cut_by_class([group for _, group in sorted(groups.items())], k)


def cut_by_class(classes: Sequence[Sequence[Core]], k: int) -> list[list[Core]]:
    """``k`` shares of the cores of ``classes``, each class cut on its own in the order given, so that every share
    holds an equal part of each class (within one core) and the totals stay level."""
    out: list[list[Core]] = [[] for _ in range(k)]
    for group in classes:
        # the larger parts go to the ranks with the fewest cores so far; the parts stay in rank order
        size_of = dict(zip(sorted(range(k), key=lambda r: (len(out[r]), r)), balanced_sizes(len(group), k)))
        for r, part in enumerate(contiguous([size_of[r] for r in range(k)])):
            out[r].extend(group[part])
    return out


@dataclass(frozen=True)
class KindRoles:
    """What a rank does with its home cores, by kind."""

    compute: list[Core]
    loader: list[Core]
    idle: list[Core]  # slower kinds under --spill none: not in the rank at all
    reason: str
    warning: str | None


def plural(count: int, name: str) -> str:
    """``8 P-cores``, ``1 E-core``, ``2 E-cores (3800 MHz)``, ``4 Cortex-X925 cores``."""
    if count == 1:
        return f"1 {name}"
    head, paren, tail = name.partition(" (")
    word = f"{head}s" if head.endswith("core") else f"{head} cores"
    return f"{count} {word}{paren}{tail}"


def _describe(cores: Sequence[Core], kinds: CoreKinds, ranks: dict[int, int]) -> str:
    counts: dict[int, int] = {}
    for core in cores:
        counts[core_rank(core, ranks)] = counts.get(core_rank(core, ranks), 0) + 1
    return " + ".join(plural(n, kinds.kinds[i].name if i < len(kinds.kinds) else "core of no kind")
                      for i, n in sorted(counts.items()))


def kind_roles(chunk: Sequence[Core], kinds: CoreKinds, spill: SpillChoice, loader_cores: int) -> KindRoles:
    """Split a rank's home ``chunk`` by kind. ``loader_cores``: the cores ``--loader-cores`` asks for (0 in the
    shared modes), fewer than ``chunk``."""
    ranks = _rank_of(kinds)
    ordered = sorted(chunk, key=lambda c: core_rank(c, ranks))  # stable: fastest kind first, in chunk order
    asked = ordered[len(ordered) - loader_cores :] if loader_cores else []
    rest = ordered[: len(ordered) - loader_cores]
    fastest = core_rank(rest[0], ranks) if rest else 0
    fast = [c for c in rest if core_rank(c, ranks) == fastest]
    slow = [c for c in rest if core_rank(c, ranks) != fastest]
    if spill == "compute":
        compute, loader, idle = fast + slow, asked, []
    elif spill == "none":
        compute, loader, idle = fast, asked, slow
    else:
        compute, loader, idle = fast, slow + asked, []
    parts = [f"{_describe(compute, kinds, ranks)} compute"]
    if loader:
        parts.append(f"{_describe(loader, kinds, ranks)} load")
    if idle:
        parts.append(f"{_describe(idle, kinds, ranks)} idle (--spill none)")
    warning = None
    if fastest != 0 and fast:
        top = kinds.kinds[0].name
        warning = (f"computes on {plural(len(fast), _name(kinds, fastest))}, slower than the {top}s: its CPUs hold "
                   f"no {top} (ranks outnumber the {top}s, or its share has none)")
    return KindRoles(compute, loader, idle, ", ".join(parts), warning)


def _name(kinds: CoreKinds, pos: int) -> str:
    kind: CoreKind | None = kinds.kinds[pos] if pos < len(kinds.kinds) else None
    return kind.name if kind else "core of no kind"


def priority_chunks(cores: Sequence[Core], kinds: CoreKinds | None, k: int, priority: frozenset[int]) -> list[list[Core]]:
    """:func:`kind_chunks`, with the priority cores among ``cores`` (all of their PUs in ``priority``) shared out
    equally among the ``k`` shares (docs/how-it-decides.md, "Main cores")."""
    plain = kind_chunks(cores, kinds, k)
    special = {c.pus for c in cores if set(c.pus) <= priority}
    counts = [sum(c.pus in special for c in chunk) for chunk in plain]
    if not special or max(counts) - min(counts) <= 1:
        return plain
    first = [c for c in cores if c.pus in special]
    rest = [c for c in cores if c.pus not in special]
    if kinds is None:
        return cut_by_class([first, rest], k)
    ranks = _rank_of(kinds)
    groups: dict[int, list[Core]] = {}
    for core in rest:
        groups.setdefault(core_rank(core, ranks), []).append(core)
    return cut_by_class([first, *(group for _, group in sorted(groups.items()))], k)
