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
# The pools beyond OpenMP that a process sizes from its environment when it first uses them (docs/threads.md).
POOL_VARIABLES = ("BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS")
# The pools that read their count as digits alone: OpenCV refuses " 1" and Rayon ignores it.
DIGITS_ONLY_VARIABLES = ("OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS")
# The pool of a thread plan each variable sizes (MKL's threads are OpenMP's).
POOL_OF: dict[str, PoolName] = {
    "OMP_NUM_THREADS": "openmp", "MKL_NUM_THREADS": "openmp", "OPENBLAS_NUM_THREADS": "blas",
    "BLIS_NUM_THREADS": "blas", "NUMEXPR_NUM_THREADS": "numexpr", "OPENCV_FOR_THREADS_NUM": "opencv",
    "RAYON_NUM_THREADS": "rayon"}
# The main thread's home when it has one of its own (--main-thread compute|priority); empty: the rank's whole set.
MAIN_VARIABLE = "AFFRUN_MAIN_CPUS"
# The pool and thread variables whose value in the rank is the user's (comma-separated names), and the env policy.
USER_POOLS_VARIABLE = "AFFRUN_USER_POOLS"
POLICY_VARIABLE = "AFFRUN_ENV_POLICY"
# What affrun patches inside the rank (--rank-hooks auto|none): the startup hook reads it.
HOOKS_VARIABLE = "AFFRUN_RANK_HOOKS"
# The variables that make an OpenMP runtime bind threads (libgomp reads the first three, at load: docs/runtimes.md).
PLACE_VARIABLES = ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")  # also read by libgomp
BINDING_VARIABLES = (*PLACE_VARIABLES, "KMP_AFFINITY")
# The NIC variables --nic-env exports (docs/nics.md).
NIC_VARIABLES = ("UCX_NET_DEVICES", "MPICH_OFI_NIC_POLICY")
# NCCL's proxy threads' CPUs (NCCL >= 2.28.3): set to a rank's comm cores (--comm-cores).
COMM_VARIABLE = "NCCL_PROXY_CPUSET"
# The variables whose user values the env policy judges, and the only ones a plan's environment may set or unset.
USER_VARIABLES = (*THREAD_VARIABLES, *POOL_VARIABLES, *BINDING_VARIABLES, *NIC_VARIABLES, COMM_VARIABLE)
# The rank's NIC (launcher.plan.nics): mlx5_0:1 (an RDMA device and port) or eth0 (an interface); empty: none.
NIC_VARIABLE = "AFFRUN_NIC"
# Written by every binding: the local rank, and the identity of the plan it came from (launcher.context.run_role).
BOUND_VARIABLE = "AFFRUN_LOCAL_RANK"
PLAN_ID_VARIABLE = "AFFRUN_PLAN_ID"
# Written by an ``affrun exec`` sub-job: the launcher's rank it consumed, as ``LOCAL_RANK=1/2`` (enclosing_rank).
SUBJOB_VARIABLE = "AFFRUN_SUBJOB_OF"


def affrun_variables(rank: RankPlan, local_world_size: int, bind: str, *, policy: str = "safe",
                     hooks: str = "auto", user_pools: Sequence[str] = ()) -> dict[str, str]:
    """``AFFRUN_LOCAL_RANK``, ``AFFRUN_CPUS``... of ``rank``: what the training process reads back
    (:func:`launcher.bind.readback.current_binding`) and what the rank's hooks read."""
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
    """The user's own values of the variables affrun manages: what a planning parent snapshots before a launcher
    or a binding changes them."""
    return {name: environ[name] for name in USER_VARIABLES if name in environ}
