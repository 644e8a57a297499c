"""The balanced split: ``n`` items cut into ``k`` contiguous parts whose sizes differ by at most one. Pure; the
planner cuts cores with it and a DataLoader worker (:mod:`launcher.torch`) its CPUs, so it imports nothing."""

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
