"""The doctor's one pipeline, topology -> facts -> checks, and its checks in report order: *process* checks
judge one rank's environment, *host* checks the machine and the launch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.doctor import host_checks, nic_checks, omp_checks, pool_checks
from launcher.doctor.check_base import Check
from launcher.doctor.facts import Facts, gather_facts
from launcher.doctor.findings import Finding
from launcher.topology.model import Topology

PROCESS_CHECKS: tuple[Check, ...] = (
    omp_checks.check_kmp_affinity,
    omp_checks.check_thread_counts,
    pool_checks.check_pool_variables,
    omp_checks.check_binding_values,
    omp_checks.check_collapse_risk,
    omp_checks.check_kmp_ignored,
    omp_checks.check_mixed_runtimes,
    omp_checks.check_core_kinds_mixed,
    nic_checks.check_nccl_hca_prefix,
    nic_checks.check_nic_far,
    nic_checks.check_rank_off_gpu_node,
)
HOST_CHECKS: tuple[Check, ...] = (
    host_checks.check_inherited_mask,
    host_checks.check_double_binding,
    host_checks.check_srun_cpus_per_task,
    host_checks.check_numactl,
    host_checks.check_membind,
    host_checks.check_gpu_numa,
    host_checks.check_cuda_device_order,
    host_checks.check_cpu_quota,
)


def check_environment(
    environ: Mapping[str, str], topology: Topology, facts: Facts, *, host: bool = True
) -> list[Finding]:
    """Every finding for ``environ`` on ``topology``; ``host=False`` runs only the process checks."""
    return [f for check in (*PROCESS_CHECKS, *(HOST_CHECKS if host else ())) for f in check(environ, topology, facts)]


@dataclass(frozen=True)
class Audited:
    """The machine an audit judges: its topology, whether it is this machine, and the root its files are read under."""

    topology: Topology
    live: bool
    fsroot: str = "/"


def audited_machine(fsroot: str | None = None, topology_file: str | None = None, cpus: str | None = None,
                    environ: Mapping[str, str] | None = None, cpu_identity: bool = False,
                    allowed: frozenset[int] | None = None) -> Audited:
    """The machine that ``--fsroot``/``--topology``/``--cpus`` name (``$AFFRUN_FSROOT`` too), else this one, with
    the CPU's identity for ``cpu_identity``. ``allowed`` (``ensure_affinity``'s CPUs): this machine narrowed to
    them, or one flat core per CPU where its topology cannot be read."""
    import os
    from dataclasses import replace

    from launcher.topology import load_topology, tree_root

    if allowed is not None:
        from launcher.base.errors import AffrunError
        from launcher.topology.model import Core

        try:
            topology = load_topology(environ=environ)
        except AffrunError:
            cores = tuple(Core(cpu, (cpu,), 0, None, None) for cpu in sorted(allowed))
            return Audited(Topology((), (), (), cores, allowed, frozenset(), allowed, source="affinity mask"), True)
        if topology.source == "live" and allowed & topology.online:
            topology = replace(topology, allowed=allowed & topology.online)
        return Audited(topology, live=True)
    root = tree_root(fsroot, topology_file, os.environ if environ is None else environ)
    topo = load_topology(fsroot=fsroot, topology_file=topology_file, cpus=cpus, environ=environ,
                         cpu_identity=cpu_identity)
    live = not root and not topology_file
    if cpu_identity and live and topo.cpu is None:
        from launcher.topology.cpu_identity import live_identity_from_py_cpuinfo

        topo = replace(topo, cpu=live_identity_from_py_cpuinfo())
    return Audited(topo, live=live, fsroot=root or "/")


def diagnose(
    environ: Mapping[str, str],
    machine: Audited,
    *,
    nproc: int | None = None,
    openmp: Sequence[str] | None = None,
    openmp_source: str = "",
    probe_host: bool = True,
    process_cpus: frozenset[int] | None = None,
    host: bool = True,
) -> tuple[Facts, list[Finding]]:
    """The facts about ``environ`` on ``machine`` and every finding of the checks (``host=False``: the process
    checks only). The keywords are :func:`launcher.doctor.facts.gather_facts`'s."""
    facts = gather_facts(environ, machine.topology, live=machine.live, nproc=nproc, openmp=openmp,
                         openmp_source=openmp_source, probe_host=probe_host, fsroot=machine.fsroot,
                         process_cpus=process_cpus)
    return facts, check_environment(environ, machine.topology, facts, host=host)
