"""The variables affrun manages, by name, and affrun's own ``AFFRUN_*`` variables of a rank, written from the
rank's fields. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.plan.record import RankPlan
    from launcher.plan.threads import PoolName

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# The pools beyond OpenMP that a process sizes from its environment when it first uses them (docs/threads.md):
# BLIS, numexpr, OpenCV's parallel_for, Rayon (HF tokenizers). A rank's are sized by its thread plan, a DataLoader
# worker's to the CPUs it has (launcher.plan.threads).
POOL_VARIABLES = ("BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS")
# The pools that read their count as digits alone: OpenCV refuses " 1" (cv2.error at its first parallel call) and
# Rayon ignores it, starting a thread per CPU; the others skip spaces as C's strtol and Python's int() do.
DIGITS_ONLY_VARIABLES = ("OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS")
# The pool of a thread plan (launcher.plan.threads.POOL_NAMES) each variable sizes: MKL's threads are OpenMP's;
# OpenBLAS's own threads and BLIS's are started by the thread that loads them and inherit its mask.
POOL_OF: dict[str, PoolName] = {
    "OMP_NUM_THREADS": "openmp", "MKL_NUM_THREADS": "openmp", "OPENBLAS_NUM_THREADS": "blas",
    "BLIS_NUM_THREADS": "blas", "NUMEXPR_NUM_THREADS": "numexpr", "OPENCV_FOR_THREADS_NUM": "opencv",
    "RAYON_NUM_THREADS": "rayon"}
# The main thread's home when it has one of its own (--main-thread compute|priority); empty: the rank's whole set.
MAIN_VARIABLE = "AFFRUN_MAIN_CPUS"
# The pool and thread variables whose value in the rank is the user's, kept by the env policy (comma-separated
# names), and that policy: a worker never raises a user's value, and under keep leaves it as it is.
USER_POOLS_VARIABLE = "AFFRUN_USER_POOLS"
POLICY_VARIABLE = "AFFRUN_ENV_POLICY"
# What affrun patches inside the rank (--rank-hooks auto|none): the startup hook reads it.
HOOKS_VARIABLE = "AFFRUN_RANK_HOOKS"
# The variables that make an OpenMP runtime bind threads: libgomp binds the main thread when it loads (at
# `import torch`) if any of the first three is set; libiomp5/libomp read all four at their first parallel region.
PLACE_VARIABLES = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")  # also read by libgomp
BINDING_VARIABLES = (*PLACE_VARIABLES, "KMP_AFFINITY")
# The NIC variables --nic-env exports (docs/nics.md): UCX's device list (ucx), Cray MPICH's NIC policy (mpich).
NIC_VARIABLES = ("UCX_NET_DEVICES", "MPICH_OFI_NIC_POLICY")
# The variables whose user values the env policy judges, and the only ones a plan's environment may set or unset
# (ParentPlan.user_env): torchrun overwrites OMP_NUM_THREADS, and a bound parent leaves its own values behind.
# NCCL's proxy threads' CPUs (NCCL >= 2.28.3, src/proxy.cc): set to a rank's comm cores (--comm-cores).
COMM_VARIABLE = "NCCL_PROXY_CPUSET"
USER_VARIABLES = (*THREAD_VARIABLES, *POOL_VARIABLES, *BINDING_VARIABLES, *NIC_VARIABLES, COMM_VARIABLE)
# The rank's NIC (launcher.plan.nics): mlx5_0:1 (an RDMA device and port) or eth0 (an interface); empty: none.
NIC_VARIABLE = "AFFRUN_NIC"
# Written by every binding: the local rank, and the identity of the plan it came from (launcher.bind.wire.identity):
# a process is "already bound" only when it carries the identity of the plan it reads (launcher.context.run_role).
BOUND_VARIABLE = "AFFRUN_LOCAL_RANK"
PLAN_ID_VARIABLE = "AFFRUN_PLAN_ID"
# Written by an ``affrun exec`` sub-job (launcher.context.local_rank.enclosing_rank): the launcher's rank it
# consumed, as ``LOCAL_RANK=1/2``, so that an ``affrun exec`` inside the sub-job knows those variables as well.
SUBJOB_VARIABLE = "AFFRUN_SUBJOB_OF"


def affrun_variables(rank: RankPlan, local_world_size: int, bind: str, *, policy: str = "safe",
                     hooks: str = "auto", user_pools: Sequence[str] = ()) -> dict[str, str]:
    """``AFFRUN_LOCAL_RANK``, ``AFFRUN_CPUS``... of ``rank``: what :func:`launcher.bind.readback.current_binding`
    reads back in the training process, and what the rank's hooks read: its main core, the counts whose value is
    the user's (``user_pools``), the env policy and ``--rank-hooks``."""
    return {
        BOUND_VARIABLE: str(rank.local_rank),
        "AFFRUN_LOCAL_WORLD_SIZE": str(local_world_size),
        "AFFRUN_CPUS": format_cpulist(rank.cpus),
        "AFFRUN_COMPUTE_CPUS": format_cpulist(rank.compute_cpus),
        "AFFRUN_LOADER_CPUS": format_cpulist(rank.loader_cpus),
        "AFFRUN_COMM_CPUS": format_cpulist(rank.comm_cpus),
        "AFFRUN_NUMA_NODES": ",".join(map(str, rank.numa_nodes)),
        "AFFRUN_MEM_NODES": ",".join(map(str, rank.mem_nodes)),
        "AFFRUN_GPU": "" if rank.gpu is None else str(rank.gpu),
        "AFFRUN_GPU_PCI": rank.gpu_pci or "",
        NIC_VARIABLE: rank.nic_device or "",
        "AFFRUN_THREADS": str(rank.threads),
        "AFFRUN_OMP_BIND": bind,
        MAIN_VARIABLE: format_cpulist(rank.main_cpus),
        USER_POOLS_VARIABLE: ",".join(user_pools),
        POLICY_VARIABLE: policy,
        HOOKS_VARIABLE: hooks,
    }


def user_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The user's own values of the variables affrun manages, as the env policy judges them: what a planning
    parent snapshots before a launcher (torchrun sets ``OMP_NUM_THREADS``) or a binding changes them."""
    return {name: environ[name] for name in USER_VARIABLES if name in environ}
