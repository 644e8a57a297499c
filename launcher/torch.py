"""DataLoader helpers: give each worker CPUs of its own, and pools that fit them.

``DataLoader(..., worker_init_fn=launcher.torch.worker_init_fn)`` pins worker *k* of *W* to the rank's loader
CPUs (``--loader-cores``), or, when none are reserved, to the *k*-th of *W* disjoint slices of the rank's CPUs (off
the main thread's core), and sizes every pool inside it to those CPUs (:func:`launcher.bind.pools.fit_worker`, what
the rank's own worker hook does: docs/threads.md). Under ``affrun`` the CPUs come from the rank's binding; elsewhere
from the CPUs the parent process's threads span. torch is imported only when a worker starts. ``AFFRUN_*`` CPU lists
that name CPUs this machine lacks or does not allow (variables from another machine) warn once per process, at
import in the process that builds the DataLoader, and its workers use the CPUs that exist (docs/how-it-decides.md).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

from launcher.base.siblings import live_cores
from launcher.base.split import worker_cpus
from launcher.base.untrusted import short
from launcher.bind.pools import fit_worker, say
from launcher.bind.readback import current_binding
from launcher.errors import ConfigError
from launcher.plan.threads import worker_pool

__all__ = ["chain_worker_init_fn", "loader_workers", "worker_cpus", "worker_init_fn"]


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


class WorkerCpusWarning(RuntimeWarning):
    """The ``AFFRUN_*`` CPU lists name CPUs this machine does not have or does not allow."""


_WARNED = False  # this process, or the one it was started from, has said it: once per process, not per worker


def _usable_cpus() -> frozenset[int] | None:
    """The CPUs a process could be given here: online and in this process's cpuset (``None``: unknown)."""
    from launcher.errors import AffrunError
    from launcher.topology._files import read_cpulist
    from launcher.topology.cgroup import find_cpuset

    try:
        online = read_cpulist("/sys/devices/system/cpu/online")
        cpuset = find_cpuset("/") if online is not None else None
    except (AffrunError, OSError):
        return None
    if online is None:
        return None
    return online & cpuset.cpus if cpuset is not None and online & cpuset.cpus else online


def _pools() -> tuple[list[int], list[int], frozenset[int]]:
    """(loader CPUs, rank CPUs off the main core and every comm core, CPUs the ``AFFRUN_*`` lists name that are not usable
    here): the binding's lists as far as they exist here; none of them existing, the CPUs of a process not started
    by affrun. The rank's CPUs are those the thread plan gives its workers (launcher.plan.threads)."""
    try:
        binding = current_binding()
    except ValueError:  # malformed AFFRUN_* variables: treat the process as not started by affrun
        binding = None
    if binding is None:
        return [], _parent_cpus(), frozenset()
    cpus = frozenset(worker_pool(binding))  # the thread plan's: off the main core and every comm core
    usable = _usable_cpus()
    if usable is None:
        return sorted(binding.loader_cpus), sorted(cpus), frozenset()
    foreign = (binding.cpus | binding.loader_cpus) - usable
    loader, rank = sorted(binding.loader_cpus & usable), sorted(cpus & usable)
    return loader, (rank or (_parent_cpus() if not loader else [])), foreign


def _say_foreign(foreign: frozenset[int]) -> None:
    global _WARNED
    if not foreign or _WARNED:
        return
    _WARNED = True
    from launcher.base.cpulist import format_cpulist

    usable = _usable_cpus() or frozenset()
    warnings.warn(f"launcher.torch.worker_init_fn: AFFRUN_CPUS/AFFRUN_LOADER_CPUS name CPU(s) "
                  f"{format_cpulist(foreign)} that this machine does not have or does not allow (usable here: "
                  f"{format_cpulist(usable)}); DataLoader workers are pinned to the CPUs that exist. The variables "
                  "come from another machine or job: start this process through affrun here", WorkerCpusWarning,
                  stacklevel=3)


def worker_init_fn(worker_id: int) -> None:
    """Pin this DataLoader worker to its own CPUs and size its pools to them (use as
    ``DataLoader(worker_init_fn=...)``). Where the rank's hook has fitted the worker already, the same again,
    quietly."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is None:
        raise ConfigError("worker_init_fn: not in a DataLoader worker (torch.utils.data.get_worker_info() is None): "
                          "it would pin the process it runs in; pass it as DataLoader(worker_init_fn=...)")
    num_workers = info.num_workers
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or not 0 <= worker_id < num_workers:
        raise ConfigError(f"worker_init_fn: worker_id={short(worker_id)} is not one of the DataLoader's "
                          f"{num_workers} worker(s) (0-{num_workers - 1})")
    loader, rank, foreign = _pools()
    _say_foreign(foreign)
    cpus = worker_cpus(worker_id, num_workers, loader, rank, live_cores(loader or rank))
    fit = fit_worker(cpus)
    if fit is None:
        return
    if not os.sched_getaffinity(0) <= set(cpus):  # none of them allowed after all (the cpuset moved)
        _say_foreign(frozenset(cpus))
        return
    hooked = getattr(sys.modules.get("torch.utils.data._utils.worker"), "_affrun_fitted", None) == os.getpid()
    if fit.notes and not hooked and worker_id == 0:  # the hook has said them; worker 0 speaks for all
        say(f"launcher.torch.worker_init_fn: {'; '.join(fit.notes)}")


def chain_worker_init_fn(user_fn: Callable[[int], None] | None) -> Callable[[int], None]:
    """``worker_init_fn`` that pins first, then calls ``user_fn`` (for scripts that already have one)."""

    def init(worker_id: int) -> None:
        worker_init_fn(worker_id)
        if user_fn is not None:
            user_fn(worker_id)

    return init


def _said_at_import() -> None:
    """Say it once, in the process that builds the DataLoader (it imports this module to pass worker_init_fn):
    a worker forked from it inherits :data:`_WARNED`; one spawned (or the forkserver) imports this module while
    multiprocessing prepares it, and its parent has said it already."""
    global _WARNED
    mp = sys.modules.get("multiprocessing")
    if mp is not None and (getattr(mp.current_process(), "_inheriting", False) or mp.parent_process() is not None):
        _WARNED = True
        return
    if os.environ.get("AFFRUN_CPUS"):
        _say_foreign(_pools()[2])


_said_at_import()


def loader_workers() -> int:
    """The DataLoader workers affrun gives this rank: ``--loader-workers N``, else one per loader core of the rank
    (``--loader-cores``; 0 without). Use as ``DataLoader(..., num_workers=launcher.torch.loader_workers())``: under
    ``affrun tune`` each trial then tries its own count (the meter records that the script asked)."""
    from launcher.feed.meter import ALIAS, FEED_VARIABLE
    from launcher.feed.workers import suggested_workers

    if ALIAS not in sys.modules and os.environ.get(FEED_VARIABLE):
        import torch.utils.data.dataloader  # noqa: F401  (the startup hook's meter is installed at this import)
    live = sys.modules.get(ALIAS)  # the rank's meter, installed by the startup hook under --feed-report
    if live is not None and hasattr(live, "asked"):
        return int(live.asked())
    return suggested_workers(os.environ)
