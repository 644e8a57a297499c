"""DataLoader helpers: :func:`worker_init_fn` pins each worker to its own CPUs and sizes its pools to them (the one
fit of the rank's hooks, :func:`launcher.bind.rank_hooks.fit_home`); :func:`loader_workers` gives the worker count.
torch is imported only when a worker starts. ``AFFRUN_*`` values that cannot be a binding made here are refused
with one :class:`WorkerCpusWarning` per process (docs/threads.md, "Inherited values"; docs/python-api.md).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

from launcher.base.errors import ConfigError
from launcher.base.siblings import live_cores
from launcher.base.split import worker_cpus
from launcher.base.untrusted import short
from launcher.bind.inherited import cpuset_cpus
from launcher.bind.rank_hooks import fit_home, live_plan

__all__ = ["chain_worker_init_fn", "loader_workers", "worker_cpus", "worker_init_fn"]


def _parent_cpus() -> list[int]:
    """Outside affrun: the CPUs the parent process spans (the union of its threads' masks), or where that is one
    CPU (the collapse), the online CPUs of the cgroup's cpuset."""
    from launcher.base.procfs import threads_union

    cpus = set(os.sched_getaffinity(0)) | threads_union(os.getppid())
    if len(cpus) <= 1:
        from launcher.topology._files import read_cpulist
        from launcher.topology.cgroup import find_cpuset

        cpuset = find_cpuset("/")
        online = read_cpulist("/sys/devices/system/cpu/online")
        if cpuset is not None and online is not None:
            cpus |= set(cpuset.cpus & online)
    return sorted(cpus)


class WorkerCpusWarning(RuntimeWarning):
    """The ``AFFRUN_*`` values cannot be a binding made here: CPUs this machine does not have or does not allow,
    or lists no plan makes."""


_WARNED = False  # this process, or the one it was started from, has said it


def _say_refused(refused: str) -> None:
    global _WARNED
    if not refused or _WARNED:
        return
    _WARNED = True
    warnings.warn(f"launcher.torch.worker_init_fn: {refused}; DataLoader workers share the CPUs this process has. "
                  "The variables come from another machine or job: start this process through affrun here",
                  WorkerCpusWarning, stacklevel=4)


def _home(worker_id: int, workers: int) -> tuple[int, ...]:
    """Worker ``worker_id``'s home in the thread plan of this rank's ``AFFRUN_*`` values; outside affrun, or
    refused (said once), its share of the CPUs the parent process spans."""
    try:
        return live_plan(os.environ, workers, cpuset_cpus()).workers[worker_id].cpus
    except ValueError as exc:
        _say_refused(str(exc))
    except LookupError:  # no AFFRUN_CPUS: not started by affrun
        pass
    cpus = _parent_cpus()
    return tuple(worker_cpus(worker_id, workers, [], cpus, live_cores(cpus)))


def worker_init_fn(worker_id: int) -> None:
    """Pin this DataLoader worker to its own CPUs and size its pools to them (use as
    ``DataLoader(worker_init_fn=...)``); :class:`ConfigError` outside a worker, or for another
    ``worker_id``."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is None:
        raise ConfigError("worker_init_fn: not in a DataLoader worker (torch.utils.data.get_worker_info() is None): "
                          "it would pin the process it runs in; pass it as DataLoader(worker_init_fn=...)")
    num_workers = info.num_workers
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or not 0 <= worker_id < num_workers:
        raise ConfigError(f"worker_init_fn: worker_id={short(worker_id)} is not one of the DataLoader's "
                          f"{num_workers} worker(s) (0-{num_workers - 1})")
    fit_home(_home(worker_id, num_workers), worker_id, "launcher.torch.worker_init_fn")


def chain_worker_init_fn(user_fn: Callable[[int], None] | None) -> Callable[[int], None]:
    """``worker_init_fn`` that pins first, then calls ``user_fn`` (for scripts that already have one)."""

    def init(worker_id: int) -> None:
        worker_init_fn(worker_id)
        if user_fn is not None:
            user_fn(worker_id)

    return init


def _said_at_import() -> None:
    """Say it once, in the process that builds the DataLoader: a forked worker inherits :data:`_WARNED`, and a
    spawned one (or the forkserver), which imports this module while multiprocessing prepares it, stays quiet."""
    global _WARNED
    mp = sys.modules.get("multiprocessing")
    if mp is not None and (getattr(mp.current_process(), "_inheriting", False) or mp.parent_process() is not None):
        _WARNED = True
        return
    if os.environ.get("AFFRUN_CPUS"):
        try:
            live_plan(os.environ, 0, cpuset_cpus())
        except ValueError as exc:
            _say_refused(str(exc))


_said_at_import()


def loader_workers() -> int:
    """The DataLoader workers affrun gives this rank: ``--loader-workers N``, else one per loader core of the rank
    (0 without). Use as ``DataLoader(..., num_workers=launcher.torch.loader_workers())`` (docs/tune.md)."""
    from launcher.feed.meter import ALIAS, FEED_VARIABLE
    from launcher.feed.workers import suggested_workers

    if ALIAS not in sys.modules and os.environ.get(FEED_VARIABLE):
        import torch.utils.data.dataloader  # noqa: F401  (the startup hook's meter is installed at this import)
    live = sys.modules.get(ALIAS)  # the rank's meter, installed by the startup hook under --feed-report
    if live is not None and hasattr(live, "asked"):
        return int(live.asked())
    return suggested_workers(os.environ)
