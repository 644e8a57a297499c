"""Was the CPU mask this process inherited already collapsed onto one CPU before affrun ran?

``affrun exec`` warns and ``affrun doctor`` reports ``inherited-mask-collapsed`` (docs/how-it-decides.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.env.variables import BINDING_VARIABLES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


class Collapse:
    """A one-CPU mask inside a wider cpuset, with several local ranks, and what points at the cause."""

    __slots__ = ("cpuset", "local_ranks", "mask", "parent", "variables")

    def __init__(self, mask: frozenset[int], cpuset: frozenset[int], local_ranks: int, variables: tuple[str, ...],
                 parent: str | None) -> None:
        self.mask = mask
        self.cpuset = cpuset
        self.local_ranks = local_ranks
        self.variables = variables  # "NAME=value" of the binding variables in the environment
        self.parent = parent  # "PID 123 (python3) has libgomp loaded and is bound to CPU 0", when it is so

    def message(self) -> str:
        head = (f"this process may run on CPU {format_cpulist(self.mask)} only, inside a cgroup cpuset of CPUs "
                f"{format_cpulist(self.cpuset)}, with {self.local_ranks} local ranks: the mask it inherited was "
                "collapsed")
        causes = []
        if self.parent:
            causes.append(f"its parent, {self.parent}")
        if self.variables:
            causes.append(f"{', '.join(self.variables)} is set, and an OpenMP runtime loaded with it (torch's libgomp "
                          "at `import torch`, as in torchrun's agent) pins that process and every child to one CPU")
        return f"{head}: {'; '.join(causes)}"

    def fix(self) -> str:
        names = " ".join(v.split("=", 1)[0] for v in self.variables) or "the binding variables"
        return (f"unset {names} where the launcher starts (affrun gives each rank its own values), or launch "
                "with `affrun torchrun`, which imports torch without them")


def judge(
    mask: frozenset[int],
    cpuset: frozenset[int] | None,
    local_ranks: int,
    environ: Mapping[str, str],
    parent: str | None,
) -> Collapse | None:
    """Pure: a :class:`Collapse` when a one-CPU ``mask`` sits in a wider ``cpuset`` with several ranks and a cause
    shows (a binding variable, or a parent on that CPU with an OpenMP runtime); ``None`` otherwise, and for a task
    srun bound on purpose."""
    if len(mask) != 1 or local_ranks < 2 or cpuset is None or not mask < cpuset:
        return None
    from launcher.base.slurm_step import slurm_bound

    if slurm_bound(environ):
        return None
    variables = tuple(f"{n}={environ[n]}" for n in BINDING_VARIABLES if environ.get(n))
    if not variables and parent is None:
        return None
    return Collapse(mask, cpuset, local_ranks, variables, parent)


def parent_openmp(pid: int, mask: frozenset[int], proc: str = "/proc") -> str | None:
    """``"PID N (comm) has libgomp loaded and is bound to CPU C"`` when the parent of this process is on ``mask``
    and has an OpenMP runtime mapped; ``None`` otherwise (or when it cannot be read)."""
    from launcher.base import procfs
    from launcher.context.runtimes import identify, openmp_names

    try:
        if frozenset(os.sched_getaffinity(pid)) != mask:
            return None
        names = openmp_names(row for row, _ in identify(procfs.libraries(pid, proc)))
    except OSError:
        return None
    stat = procfs.process_stat(pid, proc)
    if not names or stat is None:
        return None
    return f"PID {pid} ({stat.comm}), has {', '.join(names)} loaded and is bound to CPU {format_cpulist(mask)}"


def read_collapse(environ: Mapping[str, str], local_ranks: Callable[[], int]) -> Collapse | None:
    """:func:`judge` for this process: its mask, its cgroup cpuset and its parent (``local_ranks`` is asked only
    when the mask is one CPU)."""
    mask = frozenset(os.sched_getaffinity(0))
    if len(mask) != 1:
        return None  # the common case: nothing else is read
    ranks = local_ranks()
    if ranks < 2:
        return None
    from launcher.topology.cgroup import find_cpuset

    cpuset = find_cpuset("/")
    return judge(mask, cpuset.cpus if cpuset else None, ranks, environ, parent_openmp(os.getppid(), mask))
