"""The balanced split: ``n`` items cut into ``k`` contiguous parts whose sizes differ by at most one, and a rank's CPUs
cut among its DataLoader workers, core by core (:func:`worker_cpus`). Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


def balanced_sizes(n: int, k: int) -> list[int]:
    """``k`` sizes that add up to ``n`` and differ by at most one, the larger first."""
    base, extra = divmod(n, k)
    return [base + 1] * extra + [base] * (k - extra)


def contiguous(sizes: list[int]) -> list[slice]:
    """The slices that cut a sequence into consecutive parts of ``sizes``, in order."""
    out: list[slice] = []
    start = 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def balanced_slices(n: int, k: int) -> list[slice]:
    """The ``k`` contiguous slices of ``n`` items whose sizes differ by at most one, the larger first."""
    return contiguous(balanced_sizes(n, k))


def core_order(pool: list[int], cores: Iterable[Iterable[int]] = ()) -> list[tuple[int, ...]]:
    """``pool`` as its cores: the PUs of each of ``cores`` that are in ``pool`` (sorted), then every CPU of
    ``pool`` that no core names, on its own; ordered by first CPU. A CPU is in one group only."""
    inside, seen = set(pool), set[int]()
    groups: list[tuple[int, ...]] = []
    for core in cores:
        group = tuple(sorted(c for c in set(core) & inside if c not in seen))
        if group:
            groups.append(group)
            seen.update(group)
    groups.extend((c,) for c in pool if c not in seen)
    return sorted(groups)


def worker_split(num_workers: int, loader: Iterable[int], rank: Iterable[int],
                 cores: Iterable[Iterable[int]] = ()) -> list[list[int]]:
    """Each of ``num_workers`` DataLoader workers' CPUs, cut from the loader CPUs, else the rank's: balanced shares
    of whole cores (``cores``: the PU groups; none given, each CPU is one), of PUs in core order when workers
    outnumber the cores, one PU each, round robin, when they outnumber the PUs."""
    pool = sorted(set(loader)) or sorted(set(rank))
    if not pool or num_workers < 1:
        return [[] for _ in range(num_workers)]
    units = core_order(pool, cores)
    if num_workers <= len(units):
        return [sorted(c for unit in units[part] for c in unit) for part in balanced_slices(len(units), num_workers)]
    order = [c for unit in units for c in unit]
    if num_workers >= len(order):
        return [[order[k % len(order)]] for k in range(num_workers)]
    return [sorted(order[part]) for part in balanced_slices(len(order), num_workers)]


def worker_cpus(worker_id: int, num_workers: int, loader: Iterable[int], rank: Iterable[int],
                cores: Iterable[Iterable[int]] = ()) -> list[int]:
    """The CPUs of DataLoader worker ``worker_id`` of ``num_workers``: its part of :func:`worker_split`."""
    return worker_split(num_workers, loader, rank, cores)[worker_id]
