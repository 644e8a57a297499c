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
# A NIC's kind, its ports' states, its distance from a rank's GPU (nearest first) and the NIC variables a plan
# exports besides AFFRUN_NIC (docs/nics.md).
NicKind = Literal["infiniband", "roce", "ethernet", "ipoib"]
PortState = Literal["active", "down", "init", "armed", "unknown"]
NicDistance = Literal["switch", "host-bridge", "numa-node", "package", "system"]
NicEnv = Literal["none", "ucx", "mpich"]
# Where a rank's main thread lives: its whole set, a compute core or a priority core of its own (docs/threads.md).
MainThread = Literal["none", "compute", "priority"]
# What affrun patches inside a rank: its threads and pools (auto), or only the mask and environment (none).
RankHooks = Literal["auto", "none"]

MODES: tuple[Mode, ...] = get_args(Mode)
GPU_ORDERS: tuple[GpuOrder, ...] = get_args(GpuOrder)
SPILLS: tuple[SpillChoice, ...] = get_args(SpillChoice)
BIND_MODES: tuple[OmpBind, ...] = get_args(OmpBind)
ENV_POLICIES: tuple[EnvPolicy, ...] = get_args(EnvPolicy)
MEM_POLICIES: tuple[MemPolicy, ...] = get_args(MemPolicy)
MEM_BACKENDS: tuple[MemBackend, ...] = get_args(MemBackend)
RDMA_KINDS: tuple[str, ...] = ("infiniband", "roce")  # the NIC kinds that are RDMA devices
NIC_DISTANCES: tuple[NicDistance, ...] = get_args(NicDistance)
NIC_ENVS: tuple[NicEnv, ...] = get_args(NicEnv)
MAIN_THREADS: tuple[MainThread, ...] = get_args(MainThread)
RANK_HOOKS: tuple[RankHooks, ...] = get_args(RankHooks)
