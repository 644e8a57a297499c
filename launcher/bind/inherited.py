"""Whether a rank's binding, as a process inherits it (its ``AFFRUN_*`` values, or its record in an inherited
``AFFRUN_PLAN``), can be true here: the one check behind every reader of them. The rule and why: docs/threads.md
("Inherited values"). Standard library only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import clip

if TYPE_CHECKING:
    from collections.abc import Iterable

    from launcher.plan.threads import RankFields

# How a fault names the CPUs a binding may not have: a process judging itself, or an audit of the online CPUs.
MAY_NOT_RUN = "this process may not run on"
MACHINE_LACKS = "this machine lacks"


def _list(cpus: Iterable[int]) -> str:
    return clip(format_cpulist(cpus), 60)


def binding_fault(fields: RankFields, usable: frozenset[int] | None = None,
                  lacking: str = MAY_NOT_RUN) -> str | None:
    """Why ``fields`` (a rank's CPUs, compute, loader, comm and main CPUs and thread count) cannot be a binding
    affrun made here, in the words of its ``AFFRUN_*`` variables; ``None`` when it can be. With ``usable``, every
    CPU of the rank must be one of those first."""
    cpus = frozenset(fields.cpus)
    compute = frozenset(fields.compute_cpus)
    if not cpus:
        return "AFFRUN_CPUS is empty: a rank has at least one CPU"
    if usable is not None and not cpus <= usable:
        return (f"AFFRUN_CPUS={_list(cpus)} names CPUs {lacking} ({_list(cpus - usable)}): no binding to them was "
                "made here")
    if not compute or not compute <= cpus:
        return f"AFFRUN_COMPUTE_CPUS={_list(compute) or '(empty)'} is not a non-empty part of AFFRUN_CPUS={_list(cpus)}"
    for name, part in (("AFFRUN_LOADER_CPUS", fields.loader_cpus), ("AFFRUN_COMM_CPUS", fields.comm_cpus)):
        if not frozenset(part) <= cpus:
            return f"{name}={_list(part)} names CPUs that are not the rank's (AFFRUN_CPUS={_list(cpus)})"
    if not compute.isdisjoint(fields.loader_cpus):
        return (f"AFFRUN_LOADER_CPUS={_list(fields.loader_cpus)} shares CPUs with "
                f"AFFRUN_COMPUTE_CPUS={_list(compute)}: a plan keeps them apart")
    if not frozenset(fields.main_cpus) <= compute:
        return (f"AFFRUN_MAIN_CPUS={_list(fields.main_cpus)} is not a core of "
                f"AFFRUN_COMPUTE_CPUS={_list(compute)}")
    if fields.threads < 1:
        return f"AFFRUN_THREADS={fields.threads} is no thread count: a rank runs at least one thread"
    if fields.threads > len(compute):
        return (f"AFFRUN_THREADS={fields.threads} is more than the {len(compute)} CPU(s) of "
                f"AFFRUN_COMPUTE_CPUS={_list(compute)}: no pool is larger than the CPUs it runs on")
    return None


def cpuset_cpus() -> frozenset[int] | None:
    """The CPUs a process may be given here, whatever its mask is now: online and in its cgroup's cpuset (``None``:
    unknown)."""
    from launcher.base.errors import AffrunError
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
