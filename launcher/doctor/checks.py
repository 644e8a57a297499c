"""The environment and machine checks: pure functions of (environ, topology, facts) -> list of findings.

This module is their registry and the helpers they share; the checks are in
:mod:`launcher.doctor.omp_checks` (process) and :mod:`launcher.doctor.host_checks` (host).

Two groups. *Process* checks judge the environment one rank runs with (thread counts, OpenMP binding
variables, ``KMP_*`` against the runtime in use); ``affrun doctor --pid`` runs them on each rank's real
environment and ``launcher.ensure_affinity`` on its own. *Host* checks judge the machine and the launch
(numactl, memory policy, Slurm, GPUs, torchrun's ``--numa-binding``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding, Severity
from launcher.topology.model import Topology

Check = Callable[[Mapping[str, str], Topology, Facts], list[Finding]]
PROCESS_CHECKS: list[Check] = []
HOST_CHECKS: list[Check] = []

INTEL_RUNTIMES = ("libiomp5", "libomp")
AFFRUN_FIX = "launch with `affrun torchrun` or `affrun exec`, which set it per rank"


def process_check(func: Check) -> Check:
    PROCESS_CHECKS.append(func)
    return func


def host_check(func: Check) -> Check:
    HOST_CHECKS.append(func)
    return func


def check_environment(
    environ: Mapping[str, str], topology: Topology, facts: Facts, *, host: bool = True
) -> list[Finding]:
    """Every finding for ``environ`` on ``topology``; ``host=False`` runs only the per-process checks."""
    from launcher.doctor import host_checks, omp_checks  # noqa: F401  (importing them registers their checks)

    out: list[Finding] = []
    for check in (*PROCESS_CHECKS, *(HOST_CHECKS if host else ())):
        out.extend(check(environ, topology, facts))
    return out


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


def make_finding(fid: str, severity: Severity, message: str, why: str, fix: str, **extra: Any) -> Finding:
    return Finding(fid, severity, message, why, fix, **extra)
