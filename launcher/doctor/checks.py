"""The environment and machine checks that doctor runs, listed here in the order they report: pure functions
of (environ, topology, facts) -> list of findings.

Two groups. *Process* checks (:mod:`launcher.doctor.omp_checks`, :mod:`launcher.doctor.pool_checks`) judge the
environment one rank runs with (thread and pool counts, OpenMP binding variables, ``KMP_*`` against the runtime in
use); ``affrun doctor --pid`` runs them on each rank's real environment and ``launcher.ensure_affinity`` on its
own. *Host* checks (:mod:`launcher.doctor.host_checks`) judge the machine and the launch (numactl, memory policy,
Slurm, GPUs, torchrun's ``--numa-binding``).
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.doctor import host_checks, nic_checks, omp_checks, pool_checks
from launcher.doctor.check_base import Check
from launcher.doctor.facts import Facts
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
    """Every finding for ``environ`` on ``topology``; ``host=False`` runs only the per-process checks."""
    out: list[Finding] = []
    for check in (*PROCESS_CHECKS, *(HOST_CHECKS if host else ())):
        out.extend(check(environ, topology, facts))
    return out
