"""The thread plan of a rank: a home for every thread of the rank and of each of its DataLoader workers. Pure.
The rules and why: docs/threads.md, "The thread plan".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from launcher.base.cpulist import format_cpulist
from launcher.base.split import worker_split

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence
    from typing import Any


class RankFields(Protocol):
    """A rank's CPU lists, in any collection, and its thread count: a plan's entry (RankPlan), a rank's binding
    read back (TaskBinding) or a live rank's variables (LiveFields)."""

    @property
    def local_rank(self) -> int: ...
    @property
    def cpus(self) -> Collection[int]: ...
    @property
    def compute_cpus(self) -> Collection[int]: ...
    @property
    def loader_cpus(self) -> Collection[int]: ...
    @property
    def comm_cpus(self) -> Collection[int]: ...
    @property
    def main_cpus(self) -> Collection[int]: ...
    @property
    def threads(self) -> int: ...


ThreadRole = Literal["main", "omp", "interop", "pin_memory", "nccl_proxy", "worker"]
# The pools a process sizes (the names its variables and its thread plan use), in the order they are shown.
PoolName = Literal["openmp", "blas", "opencv", "rayon", "numexpr", "interop"]


@dataclass(frozen=True)
class Home:
    """Where the threads of one role may run: ``cpus``; ``threads``: how many the plan sizes (0: not sized by
    affrun, such as NCCL's proxies); ``pinned``: each thread on a place of its own rather than free in ``cpus``."""

    role: ThreadRole
    cpus: tuple[int, ...]
    threads: int
    why: str
    pinned: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "cpus": format_cpulist(self.cpus), "threads": self.threads,
                "pinned": self.pinned, "why": self.why}


@dataclass(frozen=True)
class WorkerHome:
    """DataLoader worker ``index`` of the plan's count: its CPUs, and the size of every pool inside it."""

    index: int
    cpus: tuple[int, ...]
    pools: int

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "cpus": format_cpulist(self.cpus), "pools": self.pools}


@dataclass(frozen=True)
class ThreadPlan:
    """Every home of one rank. ``pools``: each pool of the rank process, by name, and its size."""

    local_rank: int
    main: Home
    omp: Home
    interop: Home
    pin_memory: Home
    nccl_proxy: Home
    workers: tuple[WorkerHome, ...]
    pools: dict[PoolName, int]

    def homes(self) -> tuple[Home, ...]:
        """The rank process's homes, main thread first (workers are processes of their own: :attr:`workers`)."""
        return (self.main, self.omp, self.interop, self.pin_memory, self.nccl_proxy)

    def to_dict(self) -> dict[str, Any]:
        return {"local_rank": self.local_rank, **{h.role: h.to_dict() for h in self.homes()},
                "pools": dict(self.pools), "workers": [w.to_dict() for w in self.workers]}


def _minus(cpus: Sequence[int], taken: Sequence[int]) -> tuple[int, ...]:
    """``cpus`` without ``taken``; all of ``cpus`` when nothing would be left."""
    left = tuple(sorted(set(cpus) - set(taken)))
    return left or tuple(sorted(cpus))


def working_cpus(rank: RankFields) -> tuple[int, ...]:
    """The CPUs the rank computes on: its compute and loader CPUs (else its mask), never a comm core, its own or a
    sharer's (docs/nics.md, "Cores for the communication threads")."""
    comm = set(rank.comm_cpus)
    compute = set(rank.compute_cpus) or set(rank.cpus)
    return tuple(sorted((compute | set(rank.loader_cpus)) - comm)) or tuple(sorted(rank.cpus))


def worker_pool(rank: RankFields) -> tuple[int, ...]:
    """The CPUs a rank's DataLoader workers share out where it has no loader CPUs: :func:`working_cpus` off the
    main core (all of them when that leaves none)."""
    return _minus(working_cpus(rank), tuple(rank.main_cpus))


def thread_plan(rank: RankFields, workers: int, cores: Iterable[Iterable[int]] = ()) -> ThreadPlan:
    """The homes of ``rank``'s threads with ``workers`` DataLoader workers; ``cores``: the machine's PU groups,
    which the workers are cut by (the table: docs/threads.md, "The thread plan")."""
    main_cpus = tuple(sorted(rank.main_cpus))
    compute = tuple(sorted(rank.compute_cpus))
    everything = tuple(sorted(rank.cpus))
    threads = max(1, rank.threads)
    if main_cpus:
        main = Home("main", main_cpus, 1, "a core of its own", pinned=True)
        inherit = min(threads, len(main_cpus))
    else:
        main = Home("main", everything, 1, "the rank's whole set")
        inherit = threads
    team = _minus(compute, main_cpus)
    omp = Home("omp", team, threads - 1, "the OpenMP team beside the main thread (its thread 0)")
    interop = Home("interop", main.cpus, inherit, "torch's inter-op pool: created by the main thread, on its mask")
    loader = tuple(sorted(rank.loader_cpus))
    off = ", off the main thread's core"
    pin = Home("pin_memory", loader or team, 1, "the loader CPUs" if loader else
               "the compute CPUs" + (off if main_cpus and set(team).isdisjoint(main_cpus) else ""))
    comm = tuple(sorted(rank.comm_cpus))
    rest = _minus(everything, main_cpus)
    nccl = Home("nccl_proxy", comm or rest, 0, "NCCL's and torch.distributed's threads: the comm cores" if comm else
                "the rank's CPUs" + (off if main_cpus and set(rest).isdisjoint(main_cpus) else ""))
    homes = tuple(WorkerHome(k, tuple(cpus), len(cpus))
                  for k, cpus in enumerate(worker_split(max(0, workers), loader, worker_pool(rank), cores)))
    pools: dict[PoolName, int] = {"openmp": threads, "blas": inherit, "opencv": inherit, "rayon": inherit,
                                  "numexpr": inherit, "interop": inherit}
    return ThreadPlan(rank.local_rank, main, omp, interop, pin, nccl, homes, pools)
