"""Every enumerated string of affrun's options and plans, in one place: its ``Literal`` type (for mypy) and the
tuple of its values (at run time). The planner, the environment policy, the option table and the rank's reader of
``AFFRUN_PLAN`` all take them from here.

The ``Literal`` types exist for mypy only: at run time each is ``str``, because ``typing`` costs a rank about 10 ms
(docs/design.md §11); a test holds each type equal to its tuple. No imports: a rank imports this module.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: a rank imports this module (docs/design.md §11)
if TYPE_CHECKING:
    from typing import Literal

    Mode = Literal["exclusive", "numa", "socket", "l3", "map"]
    GpuOrder = Literal["rank", "closest"]
    SpillChoice = Literal["loader", "compute", "none"]
    OmpBind = Literal["rank", "core"]
    EnvPolicy = Literal["safe", "override", "keep"]
    MemPolicy = Literal["auto", "membind", "preferred", "interleave", "none"]
    AppliedMemPolicy = Literal["membind", "preferred", "interleave", "none"]
    MemBackend = Literal["auto", "numactl", "syscall"]
    NicKind = Literal["infiniband", "roce", "ethernet", "ipoib"]
    PortState = Literal["active", "down", "init", "armed", "unknown"]
    NicDistance = Literal["switch", "host-bridge", "numa-node", "package", "system"]
    NicEnv = Literal["none", "ucx", "mpich"]
    MainThread = Literal["none", "compute", "priority"]
    RankHooks = Literal["auto", "none"]
else:
    Mode = GpuOrder = SpillChoice = OmpBind = EnvPolicy = MemPolicy = AppliedMemPolicy = MemBackend = str
    NicKind = PortState = NicDistance = NicEnv = MainThread = RankHooks = str

MODES: tuple[Mode, ...] = ("exclusive", "numa", "socket", "l3", "map")
GPU_ORDERS: tuple[GpuOrder, ...] = ("rank", "closest")
SPILLS: tuple[SpillChoice, ...] = ("loader", "compute", "none")
BIND_MODES: tuple[OmpBind, ...] = ("rank", "core")
ENV_POLICIES: tuple[EnvPolicy, ...] = ("safe", "override", "keep")
MEM_POLICIES: tuple[MemPolicy, ...] = ("auto", "membind", "preferred", "interleave", "none")
# The memory policies a plan carries: resolved, never "auto".
APPLIED_MEM_POLICIES: tuple[AppliedMemPolicy, ...] = ("membind", "preferred", "interleave", "none")
MEM_BACKENDS: tuple[MemBackend, ...] = ("auto", "numactl", "syscall")
# A NIC's kind: RDMA devices (InfiniBand, RoCE: an RDMA device whose link layer is Ethernet) and socket interfaces
# (Ethernet, IPoIB); its ports' states; how far a NIC is from a rank's GPU, nearest first (docs/nics.md); and
# which NIC variables a plan exports besides AFFRUN_NIC.
NIC_KINDS: tuple[NicKind, ...] = ("infiniband", "roce", "ethernet", "ipoib")
RDMA_KINDS: tuple[str, ...] = ("infiniband", "roce")  # the NIC kinds that are RDMA devices
PORT_STATES: tuple[PortState, ...] = ("active", "down", "init", "armed", "unknown")
NIC_DISTANCES: tuple[NicDistance, ...] = ("switch", "host-bridge", "numa-node", "package", "system")
NIC_ENVS: tuple[NicEnv, ...] = ("none", "ucx", "mpich")
# Where a rank's main thread lives (docs/threads.md): none: the rank's whole set (default); compute: a compute core
# of its own; priority: a priority core of its own, near its GPU (found by launcher.topology.priority).
MAIN_THREADS: tuple[MainThread, ...] = ("none", "compute", "priority")
# What affrun patches inside a rank (docs/threads.md): auto: DataLoader workers' pins and pools, the pin-memory
# thread, torch's inter-op pool and the main thread; none: only the mask and the environment.
RANK_HOOKS: tuple[RankHooks, ...] = ("auto", "none")
# Modes whose ranks may share CPUs: every rank of the GPU's NUMA node or package shares them.
SHARED_MODES: tuple[str, ...] = ("numa", "socket")
