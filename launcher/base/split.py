"""The balanced split: ``n`` items cut into ``k`` contiguous parts whose sizes differ by at most one. Pure; the
planner cuts cores with it, and :func:`worker_cpus` a rank's CPUs among its DataLoader workers (the thread plan,
``worker_init_fn`` and the rank's worker hook all ask it), so it imports nothing."""

from __future__ import annotations


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


def worker_cpus(worker_id: int, num_workers: int, loader: list[int] | tuple[int, ...],
                rank: list[int] | tuple[int, ...]) -> list[int]:
    """The CPUs for DataLoader worker ``worker_id`` of ``num_workers``.

    With loader CPUs: worker k gets loader CPU k (round robin) when workers outnumber them, else a disjoint
    slice of them. Without: a disjoint slice of the rank's CPUs (round robin when workers outnumber CPUs).
    """
    pool = sorted(loader) if loader else sorted(rank)
    if not pool:
        return []
    if num_workers >= len(pool):
        return [pool[worker_id % len(pool)]]
    return pool[balanced_slices(len(pool), num_workers)[worker_id]]
