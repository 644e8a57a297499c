"""Every enumerated string of affrun's options and plans, in one place: its ``Literal`` type and the tuple of its
values (``get_args`` of the type). The planner, the environment policy, the option table and the rank's reader of
``AFFRUN_PLAN`` all take them from here. No affrun imports."""

from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["exclusive", "numa", "socket", "l3", "map"]
GpuOrder = Literal["rank", "closest"]
SpillChoice = Literal["loader", "compute", "none"]
OmpBind = Literal["rank", "core"]
EnvPolicy = Literal["safe", "override", "keep"]
MemPolicy = Literal["auto", "membind", "preferred", "interleave", "none"]
# The memory policies a plan carries: resolved, never "auto".
AppliedMemPolicy = Literal["membind", "preferred", "interleave", "none"]
MemBackend = Literal["auto", "numactl", "syscall"]
# A NIC's kind: RDMA devices (InfiniBand, RoCE: an RDMA device whose link layer is Ethernet) and socket interfaces
# (Ethernet, IPoIB); its ports' states; how far a NIC is from a rank's GPU, nearest first (docs/nics.md); and
# which NIC variables a plan exports besides AFFRUN_NIC.
NicKind = Literal["infiniband", "roce", "ethernet", "ipoib"]
PortState = Literal["active", "down", "init", "armed", "unknown"]
NicDistance = Literal["switch", "host-bridge", "numa-node", "package", "system"]
NicEnv = Literal["none", "ucx", "mpich"]
# Where a rank's main thread lives (docs/threads.md): none: the rank's whole set (default); compute: a compute core
# of its own; priority: a priority core of its own, near its GPU (found by launcher.topology.priority).
MainThread = Literal["none", "compute", "priority"]
# What affrun patches inside a rank (docs/threads.md): auto: DataLoader workers' pins and pools, the pin-memory
# thread, torch's inter-op pool and the main thread; none: only the mask and the environment.
RankHooks = Literal["auto", "none"]

MODES: tuple[Mode, ...] = get_args(Mode)
GPU_ORDERS: tuple[GpuOrder, ...] = get_args(GpuOrder)
SPILLS: tuple[SpillChoice, ...] = get_args(SpillChoice)
BIND_MODES: tuple[OmpBind, ...] = get_args(OmpBind)
ENV_POLICIES: tuple[EnvPolicy, ...] = get_args(EnvPolicy)
MEM_POLICIES: tuple[MemPolicy, ...] = get_args(MemPolicy)
MEM_BACKENDS: tuple[MemBackend, ...] = get_args(MemBackend)
NIC_KINDS: tuple[NicKind, ...] = get_args(NicKind)
RDMA_KINDS: tuple[str, ...] = ("infiniband", "roce")  # the NIC kinds that are RDMA devices
PORT_STATES: tuple[PortState, ...] = get_args(PortState)
NIC_DISTANCES: tuple[NicDistance, ...] = get_args(NicDistance)
NIC_ENVS: tuple[NicEnv, ...] = get_args(NicEnv)
MAIN_THREADS: tuple[MainThread, ...] = get_args(MainThread)
RANK_HOOKS: tuple[RankHooks, ...] = get_args(RankHooks)
