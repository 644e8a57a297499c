"""DataLoader helpers: give each worker CPUs of its own.

``DataLoader(..., worker_init_fn=launcher.torch.worker_init_fn)`` pins worker *k* of *W* to the rank's loader
CPUs (``--loader-cores``), or, when none are reserved, to the *k*-th of *W* disjoint slices of the rank's CPUs.
Under ``affrun`` the CPUs come from the rank's binding (:func:`launcher.bind.readback.current_binding`); elsewhere from
the CPUs the parent process's threads span. torch is imported only when a worker starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from launcher.bind.readback import current_binding


def worker_cpus(worker_id: int, num_workers: int, loader: Sequence[int], rank: Sequence[int]) -> list[int]:
    """The CPUs for worker ``worker_id`` of ``num_workers``. Pure.

    With loader CPUs: worker k gets loader CPU k (round robin) when workers outnumber them, else a disjoint
    slice of them. Without: a disjoint slice of the rank's CPUs (round robin when workers outnumber CPUs).
    """
    pool = sorted(loader) if loader else sorted(rank)
    if not pool:
        return []
    if num_workers >= len(pool):
        return [pool[worker_id % len(pool)]]
    base, extra = divmod(len(pool), num_workers)
    start = worker_id * base + min(worker_id, extra)
    size = base + (1 if worker_id < extra else 0)
    return pool[start : start + size]


def _parent_cpus() -> list[int]:
    """Outside affrun: the CPUs the parent process spans, as the union of its threads' masks.

    A parent whose main thread was pinned to one CPU at ``import torch`` (the collapse) still has OpenMP
    threads on the other CPUs; when even that union is one CPU, fall back to the cgroup's cpuset.
    """
    cpus: set[int] = set(os.sched_getaffinity(0))
    task_dir = f"/proc/{os.getppid()}/task"
    try:
        for tid in os.listdir(task_dir):
            try:
                cpus |= os.sched_getaffinity(int(tid))
            except OSError:
                continue
    except OSError:
        pass
    if len(cpus) <= 1:
        from launcher.topology._files import read_cpulist
        from launcher.topology.cgroup import find_cpuset

        cpuset = find_cpuset("/")
        online = read_cpulist("/sys/devices/system/cpu/online")
        if cpuset is not None and online is not None:
            cpus |= set(cpuset.cpus & online)
    return sorted(cpus)


def worker_init_fn(worker_id: int) -> None:
    """Pin this DataLoader worker to its own CPUs (use as ``DataLoader(worker_init_fn=...)``)."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    num_workers = info.num_workers if info is not None else 1
    try:
        binding = current_binding()
    except ValueError:  # malformed AFFRUN_* variables: treat the process as not started by affrun
        binding = None
    loader = sorted(binding.loader_cpus) if binding else []
    rank = sorted(binding.cpus) if binding else _parent_cpus()
    cpus = worker_cpus(worker_id, num_workers, loader, rank)
    if cpus:
        os.sched_setaffinity(0, cpus)


def chain_worker_init_fn(user_fn: Callable[[int], None] | None) -> Callable[[int], None]:
    """``worker_init_fn`` that pins first, then calls ``user_fn`` (for scripts that already have one)."""

    def init(worker_id: int) -> None:
        worker_init_fn(worker_id)
        if user_fn is not None:
            user_fn(worker_id)

    return init


def loader_workers() -> int:
    """The DataLoader workers affrun gives this rank: ``--loader-workers N``, else one per loader core of the rank
    (``--loader-cores``; 0 without). Use as ``DataLoader(..., num_workers=launcher.torch.loader_workers())``: under
    ``affrun tune`` each trial then tries its own count (the meter records that the script asked)."""
    import sys

    from launcher.feed.meter import ALIAS, FEED_VARIABLE
    from launcher.feed.workers import suggested_workers

    if ALIAS not in sys.modules and os.environ.get(FEED_VARIABLE):
        import torch.utils.data.dataloader  # noqa: F401  (the startup hook's meter is installed at this import)
    live = sys.modules.get(ALIAS)  # the rank's meter, installed by the startup hook under --feed-report
    if live is not None and hasattr(live, "asked"):
        return int(live.asked())
    return suggested_workers(os.environ)
