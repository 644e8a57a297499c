"""What a user may ask the planner for (:class:`Request`), and :func:`validate_request`, which refuses a request
no plan can satisfy before any planning work. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.base.choices import GPU_ORDERS, MAIN_THREADS, MODES, SPILLS, GpuOrder, MainThread, Mode, SpillChoice
from launcher.base.errors import AffrunError, Opt, PlanError, RankCountMismatch

if TYPE_CHECKING:

    from launcher.topology.model import Topology

_CHOICES: dict[str, tuple[str, ...]] = {"mode": MODES, "gpu_order": GPU_ORDERS, "spill": SPILLS,
                                        "main_thread": MAIN_THREADS}


@dataclass(frozen=True)
class Request:
    """What the user asks for. The defaults are the planner's own; :mod:`launcher.options.table` shows them to
    every front end (it reads them from here)."""

    nproc: int
    mode: Mode = "exclusive"
    smt: bool = False
    reserve: frozenset[int] = frozenset()
    loader_cores: int = 0
    gpu_order: GpuOrder = "rank"
    cpu_map: tuple[frozenset[int], ...] | None = None  # mode "map": one CPU set per local rank
    gpus: tuple[int, ...] | None = None  # explicit visible GPU per local rank
    use_gpus: bool = True  # False: plan a CPU-only job even where GPUs exist
    spill: SpillChoice = "loader"  # cores of nodes without ranks: loader | compute | none (left idle)
    comm_cores: int = 0  # cores of each rank kept for NCCL's proxy threads (launcher.plan.comm)
    main_thread: MainThread = "none"  # the main thread's core: none | compute | priority (launcher.plan.priority)


def check_choices(error: type[AffrunError], **values: object) -> None:
    """Raise ``error`` naming the first of ``values`` (``mode``, ``gpu_order``, ``spill``, ``main_thread``) that is
    not one of its choices."""
    for key, value in values.items():
        choices: tuple[str, ...] = _CHOICES[key]
        if value not in choices:
            raise error(Opt(key, value, quoted=True), f": choose one of {', '.join(choices)}")


def check_rank_count(nproc: int) -> None:
    """Raise :class:`PlanError` for a rank count below 1 (the one wording for every front end)."""
    if nproc < 1:
        raise PlanError(Opt("nproc", nproc), " must be at least 1: a job has one local rank or more")


def validate_request(req: Request, topo: Topology | None = None) -> None:
    """Raise :class:`PlanError` for a request that no topology (``topo``: this one) can satisfy: no ranks, an
    unknown mode, order, spill or main thread, a negative loader count, ``map`` mode without CPU lists, or ``--map`` /
    ``--gpus`` lists of another length than the rank count (:class:`RankCountMismatch`)."""
    check_rank_count(req.nproc)
    if topo is not None and req.nproc > len(topo.allowed) and req.mode not in ("exclusive", "l3"):
        # Checked first: planning a million shared ranks takes minutes; make_plan refuses exclusive and l3 as fast.
        raise PlanError(Opt("nproc", req.nproc, quoted=True), f": more ranks than the {len(topo.allowed)} allowed "
                        f"CPU(s) ({len(topo.allowed_cores())} whole core(s)) of this machine; every rank needs at "
                        "least one")
    check_choices(PlanError, mode=req.mode, gpu_order=req.gpu_order, spill=req.spill, main_thread=req.main_thread)
    if req.loader_cores < 0:
        raise PlanError(Opt("loader_cores"), f" must be >= 0 (got {req.loader_cores})")
    if req.comm_cores < 0:
        raise PlanError(Opt("comm_cores"), f" must be >= 0 (got {req.comm_cores})")
    if req.mode == "map":
        if not req.cpu_map:
            raise PlanError(Opt("mode", "map"), " needs ", Opt("cpu_map"),
                            " with one CPU list per rank (e.g. '0-7;8-15')")
        if len(req.cpu_map) != req.nproc:
            raise RankCountMismatch("cpu_map", len(req.cpu_map), req.nproc)
        empty = [str(rank) for rank, cpus in enumerate(req.cpu_map) if not cpus]
        if empty:
            raise PlanError(Opt("cpu_map"), f" gives rank(s) {','.join(empty)} an empty CPU list")
    if req.gpus is not None and len(req.gpus) != req.nproc:
        raise RankCountMismatch("gpus", len(req.gpus), req.nproc)
