"""What every doctor check shares: the check's type, the questions about the runtimes a process runs
(libgomp, libiomp5/libomp), core counting, and the finding maker. The checks are in
:mod:`launcher.doctor.omp_checks` (process) and :mod:`launcher.doctor.host_checks` (host); the list of those that
run is :mod:`launcher.doctor.checks`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.topology.model import Topology

Check = Callable[[Mapping[str, str], Topology, Facts], list[Finding]]

INTEL_RUNTIMES = ("libiomp5", "libomp")
AFFRUN_FIX = "launch with `affrun torchrun` or `affrun exec`, which set it per rank"


# --------------------------------------------------------------------------- helpers
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
