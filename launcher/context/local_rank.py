"""Find this process's local rank and the number of local ranks from the launcher's variables. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.untrusted import ascii_int, clip

if TYPE_CHECKING:
    from collections.abc import Mapping

# (rank variable, size variable) in the order they are looked up.
SOURCES: tuple[tuple[str, str], ...] = (
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
)


class LocalRank:
    """A process's local rank, its node's local ranks, and where the rank came from."""

    __slots__ = ("rank", "size", "source")

    def __init__(self, rank: int, size: int, source: str) -> None:
        self.rank = rank
        self.size = size
        self.source = source  # which variable gave the rank, or "--local-rank"

    def __repr__(self) -> str:
        return f"LocalRank({self.rank}, {self.size}, {self.source!r})"


class LocalRankError(ValueError):
    pass


def _int(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    number = ascii_int(value.strip())
    if number is None:
        raise LocalRankError(f"{name}={clip(value)!r} is not an integer")
    return number


def _no_slurm_count(environ: Mapping[str, str]) -> str:
    """Why no Slurm variable gave this node's task count: none is set, or those set list no entry for the node."""
    given = [name for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if name in environ]
    if not given:
        return "SLURM_LOCALID is set but no SLURM_STEP_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE"
    shown = ", ".join(f"{name}={clip(environ[name], 40)!r}" for name in given)
    node = clip(environ.get("SLURM_NODEID", "0"), 20)
    return f"SLURM_LOCALID is set but {shown} lists no task count for SLURM_NODEID={node}"


def detect_local_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """The first launcher whose rank variable is set wins; ``None`` when none is."""
    for rank_var, size_var in SOURCES:
        if rank_var not in environ:
            continue
        rank = _int(environ, rank_var)
        if rank_var == "SLURM_LOCALID":
            from launcher.base.slurm_step import tasks_on_node

            try:
                found = tasks_on_node(environ)
            except ValueError as exc:  # set but malformed: said so, never as "not set"
                raise LocalRankError(f"SLURM_LOCALID is set but {exc}") from None
            if found is None:
                raise LocalRankError(_no_slurm_count(environ))
            size = found
        elif size_var in environ:
            size = _int(environ, size_var)
        else:
            raise LocalRankError(f"{rank_var} is set but {size_var} is not: pass --nproc-per-node")
        size_source = "SLURM_STEP_TASKS_PER_NODE/SLURM_NTASKS_PER_NODE" if rank_var == "SLURM_LOCALID" else size_var
        if size < 1:
            raise LocalRankError(f"{size_source} gives {size} local ranks ({rank_var}={rank}): expected at least 1")
        if not 0 <= rank < size:
            raise LocalRankError(f"{rank_var}={rank} is outside 0..{size - 1} ({size_source} gives {size} local ranks)")
        return LocalRank(rank, size, rank_var)
    return None


def subjob_mark(detected: LocalRank) -> str:
    """How a sub-job records the launcher's rank it consumed (``AFFRUN_SUBJOB_OF``): ``LOCAL_RANK=1/2``."""
    return f"{detected.source}={detected.rank}/{detected.size}"


def enclosing_rank(environ: Mapping[str, str], detected: LocalRank) -> bool:
    """Whether the launcher's rank variables (``detected``) are those of an affrun rank this process runs inside
    (its ``AFFRUN_PLAN_ID`` binding's rank and size, or those a sub-job of it consumed): docs/launchers.md,
    "Nested launchers"."""
    from launcher.env.variables import BOUND_VARIABLE, PLAN_ID_VARIABLE, SUBJOB_VARIABLE

    if not environ.get(PLAN_ID_VARIABLE):
        return False
    return (environ.get(BOUND_VARIABLE) == str(detected.rank) and environ.get("AFFRUN_LOCAL_WORLD_SIZE") == str(detected.size)) \
        or environ.get(SUBJOB_VARIABLE) == subjob_mark(detected)


# (global rank variable, world size variable) of the launchers that start one process per rank.
GLOBAL_SOURCES: dict[str, tuple[str, str]] = {
    "SLURM_LOCALID": ("SLURM_PROCID", "SLURM_NTASKS"),
    "OMPI_COMM_WORLD_LOCAL_RANK": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    "MPI_LOCALRANKID": ("PMI_RANK", "PMI_SIZE"),
    "PMI_LOCAL_RANK": ("PMI_RANK", "PMI_SIZE"),
}


def torch_distributed_env(environ: Mapping[str, str], local: LocalRank) -> dict[str, str]:
    """``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``RANK`` and ``WORLD_SIZE`` for ``torch.distributed``'s ``env://``,
    from the launcher that started this process (srun, mpirun). Only variables that are not set are returned."""
    out = {"LOCAL_RANK": str(local.rank), "LOCAL_WORLD_SIZE": str(local.size)}
    names = GLOBAL_SOURCES.get(local.source)
    if names:
        rank_var, size_var = names
        size = environ.get(size_var) or (environ.get("SLURM_STEP_NUM_TASKS") if rank_var == "SLURM_PROCID" else None)
        if environ.get(rank_var) and size:
            out["RANK"], out["WORLD_SIZE"] = environ[rank_var], size
    return {k: v for k, v in out.items() if k not in environ}


# By rank variable, the variables that tell one task of a launcher from another, or from a later run's (a new srun
# step, mpirun job or torchrun worker), even where the local rank number is the same.
TASK_IDENTITY: dict[str, tuple[str, ...]] = {
    "LOCAL_RANK": ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                   "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE"),
    "SLURM_LOCALID": ("SLURM_LOCALID", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID",
                      "SLURM_TASK_PID"),
    "OMPI_COMM_WORLD_LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_NAMESPACE",
                                   "PMIX_RANK", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"),
    "MPI_LOCALRANKID": ("MPI_LOCALRANKID", "PMI_RANK", "PMI_FD", "PMI_PORT", "PMI_ID", "PMI_JOBID"),
    "PMI_LOCAL_RANK": ("PMI_LOCAL_RANK", "PMI_RANK", "PMIX_NAMESPACE", "PMIX_RANK", "PALS_APID"),
}


def task_identity(environ: Mapping[str, str]) -> dict[str, str]:
    """The identity variables (:data:`TASK_IDENTITY`) of every rank variable set in ``environ``, with their values:
    what ``affrun run`` records of the task it runs in."""
    out: dict[str, str] = {}
    for rank_var, names in TASK_IDENTITY.items():
        if rank_var in environ:
            out.update({name: environ[name] for name in names if name in environ})
    return out


def same_task(environ: Mapping[str, str], recorded: Mapping[str, str]) -> tuple[str, ...]:
    """The rank variables of ``environ`` that still describe the task ``recorded`` (:func:`task_identity`) was
    taken in: set there too, and every one of their identity variables equal, or unset in both."""
    return tuple(rank_var for rank_var, names in TASK_IDENTITY.items()
                 if rank_var in environ and rank_var in recorded
                 and all(environ.get(name) == recorded.get(name) for name in names))
