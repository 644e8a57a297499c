"""What the doctor's checks share: their type, the questions about the runtimes a process runs (libgomp,
libiomp5/libomp), core counting, and one rank's share of its CPUs when no plan gives it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launcher.base.cpulist import format_cpulist
from launcher.bind.readback import exported_cpus
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.plan.planner import quota_threads
from launcher.topology.model import Topology

Check = Callable[[Mapping[str, str], Topology, Facts], list[Finding]]

INTEL_RUNTIMES = ("libiomp5", "libomp")
AFFRUN_FIX = "launch with `affrun torchrun` or `affrun exec`, which set it per rank"


def cores_in(cpus: frozenset[int], topology: Topology) -> int:
    """How many cores have at least one PU in ``cpus`` (each CPU counts as a core when the topology is silent)."""
    cores = {core.pus for core in topology.cores if set(core.pus) & cpus}
    covered = {p for pus in cores for p in pus}
    return len(cores) + len(cpus - covered)


def intel_in_process(facts: Facts) -> bool:
    """libiomp5/libomp runs in the process (or the process's runtime is unknown)."""
    return not facts.openmp or any(r in INTEL_RUNTIMES for r in facts.openmp)


def intel_possible(facts: Facts) -> bool:
    """Some program of this environment may read KMP_*: in the process, or installed (intel-openmp)."""
    return intel_in_process(facts) or any(r in INTEL_RUNTIMES for r in facts.other_openmp)


def gnu_possible(facts: Facts) -> bool:
    return not facts.openmp or "libgomp" in facts.openmp


def gnu_only(facts: Facts) -> bool:
    """The process's only OpenMP runtime is libgomp."""
    return bool(facts.openmp) and not intel_in_process(facts)


def runtime_text(facts: Facts) -> str:
    if not facts.openmp:
        return "the OpenMP runtime in use is unknown"
    names = ", ".join(facts.openmp)
    return f"OpenMP runtime {names}" + (f" ({facts.openmp_source})" if facts.openmp_source else "")


def kmp_readers(facts: Facts) -> str:
    """Who reads KMP_*: the process's libiomp5/libomp, or the installed intel-openmp's other users."""
    if intel_in_process(facts):
        return runtime_text(facts)
    version = f" {facts.intel_openmp_version}" if facts.intel_openmp_version else ""
    return (f"intel-openmp{version} is installed: programs that load libiomp5 (MKL, Intel builds) read it; "
            f"{', '.join(facts.openmp)} ignores it")


@dataclass(frozen=True)
class RankShare:
    """What one rank may run its team and pools on: ``cpus`` (its CPUs without affrun's loader and comm CPUs),
    their ``cores``, how many threads each rank takes (``per_rank``: its share of the cores, under a CPU quota the
    planner's cap), the quota's words for a fix, and ``where``: who owns the CPUs, for messages."""

    cpus: frozenset[int]
    cores: int
    sharing: int
    per_rank: int
    cores_each: int
    under_quota: str
    where: str


def rank_share(environ: Mapping[str, str], topology: Topology, facts: Facts) -> RankShare:
    """The CPUs and the thread count one rank takes when no plan says it (the checks' suggestions)."""
    kept = exported_cpus(environ, "AFFRUN_LOADER_CPUS") | exported_cpus(environ, "AFFRUN_COMM_CPUS")
    cpus = (facts.rank_cpus - kept) or facts.rank_cpus
    n_cores = cores_in(cpus, topology)
    sharing = max(facts.ranks_sharing, 1)
    cores_each = max(1, n_cores // sharing)
    cap = quota_threads(topology, facts.local_size)
    per_rank = cores_each if cap is None else min(cores_each, cap)
    under_quota = (f" (a CPU quota of {topology.cpu_quota:g} CPUs for {max(facts.local_size, 1)} rank(s))"
                   if cap is not None and cap < cores_each else "")
    where = (f"{sharing} local ranks ({facts.local_size_source}) share CPUs {format_cpulist(cpus)}"
             if sharing > 1 else f"the rank owns CPUs {format_cpulist(cpus)}")
    return RankShare(cpus, n_cores, sharing, per_rank, cores_each, under_quota, where)
