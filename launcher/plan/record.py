"""The records a plan is and travels in, from the planner to every rank: :class:`Plan` (of :class:`RankPlan`)
and :class:`Handoff`, what ``AFFRUN_PLAN`` carries (docs/json.md). Written and read back by
:mod:`launcher.base.records`; no ``from __future__ import annotations``: the reader takes each field's type as it is."""

from dataclasses import dataclass
from typing import Annotated, Literal

from launcher.base.choices import (
    AppliedMemPolicy,
    EnvPolicy,
    GpuOrder,
    MemBackend,
    Mode,
    NicDistance,
    NicKind,
    OmpBind,
    RankHooks,
    SpillChoice,
)
from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID
from launcher.base.records import Range

CpuId = Annotated[int, Range(0, MAX_CPU_ID)]
NodeId = Annotated[int, Range(0, MAX_NODE_ID)]
SCHEMA: Literal[1] = 1  # AFFRUN_PLAN's "schema": raised when a rank could misread a plan of the version before


@dataclass(frozen=True)
class NicChoice:
    """The NIC a rank is given: ``port`` is the RDMA port (None for an interface); ``device``: ``mlx5_0:1`` for an
    RDMA port, ``eth0`` for an interface, ``AFFRUN_NIC``'s and ``UCX_NET_DEVICES``'s spelling."""

    name: str
    port: Annotated[int, Range(0, 1 << 16)] | None
    device: str
    pci: str
    kind: NicKind
    distance: NicDistance
    rate_gbps: float | None = None


@dataclass(frozen=True)
class RankPlan:
    """One rank of a plan: its CPUs and their roles, its GPU, NUMA and memory nodes, NIC and thread count."""

    local_rank: CpuId
    cpus: tuple[CpuId, ...]  # every PU the rank may use (compute + loader + comm)
    compute_cores: tuple[tuple[CpuId, ...], ...]  # cores (PU tuples) for OpenMP threads
    loader_cpus: tuple[CpuId, ...]
    gpu: Annotated[int, Range(0, (1 << 16) - 1)] | None  # visible index (torch.cuda.set_device)
    gpu_pci: str | None
    numa_nodes: tuple[NodeId, ...]
    mem_nodes: tuple[NodeId, ...]
    threads: Annotated[int, Range(1, MAX_CPU_ID + 1)]
    shared: bool = False  # numa/socket modes: other ranks use the same CPUs
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    spill_cpus: tuple[CpuId, ...] = ()  # PUs of cpus that come from nodes hosting no rank (loader or compute)
    spill_nodes: tuple[NodeId, ...] = ()  # the nodes they come from
    nic: NicChoice | None = None  # the nearest NIC (launcher.plan.nics)
    comm_cpus: tuple[CpuId, ...] = ()  # PUs of cpus kept for NCCL's threads (--comm-cores): no compute, no loader
    main_cpus: tuple[CpuId, ...] = ()  # PUs of the main thread's core, one of compute_cores (--main-thread); ()

    @property
    def compute_cpus(self) -> tuple[int, ...]:
        return tuple(sorted(p for core in self.compute_cores for p in core))

    @property
    def nic_device(self) -> str | None:
        return self.nic.device if self.nic else None


@dataclass(frozen=True)
class Plan:
    """Every local rank of a job, and what shaped them (``affrun plan --json``)."""

    mode: Mode
    smt: bool
    gpu_order: GpuOrder
    spill: SpillChoice  # what the cores of nodes without ranks became: loader | compute | none
    ranks: tuple[RankPlan, ...]
    warnings: tuple[str, ...] = ()
    reserved: tuple[CpuId, ...] = ()  # PUs of the cores taken out by --reserve (whole cores)


@dataclass(frozen=True)
class RankEnv:
    """A rank's variables as its parent's env policy decided them: the OpenMP/BLAS and pool ones it sets (only
    variables affrun manages), those it unsets, its notes, and which counts among them are the user's values."""

    set: dict[str, str]
    unset: tuple[str, ...]
    notes: tuple[str, ...]
    user_pools: tuple[str, ...] = ()


@dataclass(frozen=True)
class Handoff:
    """``AFFRUN_PLAN``: the plan, how its ranks apply it, the user's own values of the variables affrun sets
    (before a launcher changed them) and one :class:`RankEnv` per rank."""

    schema: Literal[1]
    plan: Plan
    bind: OmpBind
    env_policy: EnvPolicy
    mem_policy: AppliedMemPolicy  # resolved: never "auto"
    mem_backend: MemBackend
    user_env: dict[str, str]
    verbose: bool
    rank_hooks: RankHooks
    env: tuple[RankEnv, ...]
