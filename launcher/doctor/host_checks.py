"""Host checks: the machine and the launch (numactl, memory policy, Slurm, GPUs, CPU quotas, other binders,
torchrun's ``--numa-binding``)."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.slurm_step import srun_inherits_cpus_per_task, version_text
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.env.omp_syntax import thread_count
from launcher.plan.planner import quota_threads
from launcher.topology.model import Topology


def check_inherited_mask(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """This process starts on a parent's collapsed one-CPU mask (launcher.context.inherited_mask)."""
    collapse = facts.inherited_collapse
    if collapse is None:
        return []
    return [Finding(
        "inherited-mask-collapsed", "error", collapse.message(),
        f"all {collapse.local_ranks} local ranks start on that CPU: a launcher that plans over this mask sees one "
        "CPU (affrun refuses to put two ranks on it), and one that does not plan runs every rank, thread and "
        "DataLoader worker there", collapse.fix())]


def check_double_binding(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    under_affrun = bool(environ.get("AFFRUN_CPUS") or environ.get("AFFRUN_RUN"))
    out = [Finding(
        "double-binding", "error", f"{binder.source} while affrun binds the ranks",
        f"{binder.tool} and affrun both set the rank's CPUs: the last one wins and the other's OpenMP settings no "
        "longer match the mask", binder.fix,
        env_fix={binder.variable: None} if binder.variable else {})
        for binder in (facts.other_binders if under_affrun else ())]
    if not facts.numa_binding:
        return out
    return [*out, Finding(
        "double-binding", "error",
        f"{facts.numa_binding}" + (" while affrun bound this rank" if under_affrun else ""),
        "torchrun's --numa-binding and affrun both set the rank's CPUs: the last one wins and the other's "
        "OpenMP settings no longer match the mask (affrun torchrun refuses --numa-binding, exit 2)",
        "use one binder: drop --numa-binding (unset PET_NUMA_BINDING) and launch with `affrun torchrun`, or use "
        "plain torchrun --numa-binding without affrun", env_fix={"PET_NUMA_BINDING": None}
        if environ.get("PET_NUMA_BINDING") else {})]


def check_srun_cpus_per_task(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    per_task = environ.get("SLURM_CPUS_PER_TASK")
    if not per_task or environ.get("SRUN_CPUS_PER_TASK") or not facts.slurm_version:
        return []
    if srun_inherits_cpus_per_task(facts.slurm_version):
        return []
    return [Finding(
        "srun-cpus-per-task", "warning",
        f"SLURM_CPUS_PER_TASK={per_task} is set but SRUN_CPUS_PER_TASK is not, on Slurm {version_text(facts.slurm_version)}",
        "from 22.05.0 until 23.02.5, srun does not inherit the job's --cpus-per-task: each task of an srun step "
        "gets 1 CPU and all its threads share it",
        f"export SRUN_CPUS_PER_TASK={per_task} before srun (or pass srun -c {per_task})",
        env_fix={"SRUN_CPUS_PER_TASK": per_task})]


def check_numactl(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    if not facts.host_probed or facts.numactl:
        return []
    multi = len(topology.cpu_nodes()) > 1
    return [Finding(
        "numactl-missing", "warning" if multi else "info", "numactl is not installed (not on PATH)",
        "affrun binds CPUs with sched_setaffinity and sets the memory policy with set_mempolicy without it, but "
        "torchrun --numa-binding dies without numactl, and generated job scripts that call numactl fail"
        + ("" if multi else "; this machine has one NUMA node, so memory placement is not at stake"),
        "install it: apt-get install numactl (dnf/yum install numactl)")]


def check_membind(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    if not facts.host_probed or not facts.membind_error:
        return []
    multi = len(topology.cpu_nodes()) > 1
    return [Finding(
        "membind-blocked", "warning" if multi else "info",
        f"the memory policy is blocked here: {facts.membind_error}",
        "numactl --membind exits before the program starts, and affrun falls back from membind to preferred to "
        "none, so a rank's memory may land on a remote NUMA node"
        + ("" if multi else "; this machine has one NUMA node, so nothing is lost"),
        "allow it in the container (docker run --cap-add SYS_NICE, or a seccomp profile that permits "
        "set_mempolicy/mbind), or accept --mem-policy none")]


def check_gpu_numa(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    unknown = [g for g in topology.gpus if g.numa_node is None]
    if not unknown:
        return []
    multi = len(topology.cpu_nodes()) > 1
    everywhere = [g for g in unknown if not g.cpus or g.cpus >= topology.online]
    names = ", ".join(g.pci for g in unknown)
    return [Finding(
        "gpu-numa-unknown", "warning" if multi and everywhere else "info",
        f"GPU(s) {names} report numa_node=-1" + (" and local_cpulist spans every CPU" if everywhere else ""),
        "nothing can tell which CPUs are close to these GPUs (affrun, torchrun --numa-binding, NVIDIA's "
        "gpu_affinity); affrun falls back to local_cpulist, then spreads ranks over the NUMA nodes"
        + ("" if multi else "; with one NUMA node every CPU is equally close"),
        "nothing to fix on a VM that hides locality; on a multi-NUMA machine give the mapping yourself with "
        "affrun --map 'CPUS;CPUS;...' or --gpus")]


def check_cuda_device_order(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    nvidia = [g.pci for g in topology.gpus if g.vendor == "nvidia"]
    models = {facts.gpu_device_ids[p] for p in nvidia if p in facts.gpu_device_ids}
    order = environ.get("CUDA_DEVICE_ORDER", "")
    if len(models) < 2 or order == "PCI_BUS_ID":
        return []
    return [Finding(
        "cuda-device-order", "warning",
        f"CUDA_DEVICE_ORDER is {order or 'unset (FASTEST_FIRST)'} on a machine with {len(models)} GPU models "
        f"(PCI device ids {', '.join(sorted(models))})",
        "CUDA then numbers the fastest GPU first, unlike nvidia-smi, NVML and affrun (PCI bus order): rank i is "
        "bound to the CPUs of a different GPU than cuda:i",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID", env_fix={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})]


def check_cpu_quota(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    """A CFS quota (cgroup cpu.max or cpu.cfs_quota_us) below the allowed CPUs: the mask does not show it."""
    quota = topology.cpu_quota
    ranks = max(facts.local_size, 1)
    per_rank = quota_threads(topology, ranks)
    if quota is None or per_rank is None:
        return []
    value = environ.get("OMP_NUM_THREADS")
    threads = thread_count(value) if value is not None else None
    over = threads is not None and threads * ranks > quota
    now = (f"; OMP_NUM_THREADS={threads} × {ranks} rank(s) = {threads * ranks} threads" if threads is not None
           else "; OMP_NUM_THREADS is " + ("unset" if value is None else "not a number")
           + ", so each runtime starts one thread per allowed CPU")
    return [Finding(
        "cpu-quota", "error" if over or threads is None else "warning",
        f"a CPU quota of {quota:g} CPUs ({topology.cpu_quota_source}) is below the {len(topology.allowed)} allowed "
        f"CPUs{now}",
        "the quota does not show in the affinity mask or os.cpu_count(); threads beyond it are throttled, each "
        "period the cgroup stops once its quota of CPU time is spent, which stalls every thread of the job",
        f"export OMP_NUM_THREADS={per_rank} ({ranks} rank(s) in {quota:g} CPUs), or launch with affrun, which caps "
        "OMP_NUM_THREADS to the quota", env_fix={"OMP_NUM_THREADS": str(per_rank)})]
