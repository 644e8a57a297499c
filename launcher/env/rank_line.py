"""The one summary line of a rank, printed by every front end and read back by
:class:`launcher.bind.readback.TaskBinding` (docs/launchers.md)::

    rank 0/2 host n1 cpus 0-15 numa 0 gpu 0 (0000:18:00.0) nic mlx5_0:1 omp 14 loader 14-15 mem membind:0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from launcher.plan.record import RankPlan

# The memory policy in effect for the rank, as the rank line writes it (membind:0, none), exported once applied.
MEM_VARIABLE = "AFFRUN_MEM"


def mem_text(policy: str, nodes: Sequence[int]) -> str:
    """``membind:0,1`` or ``none``, as in the rank line."""
    return f"{policy}:{','.join(map(str, nodes))}" if policy != "none" and nodes else "none"


def rank_summary(local_rank: int, size: int, host: str, cpus: Iterable[int], numa_nodes: Sequence[int],
                 gpu: int | None, gpu_pci: str | None, threads: int, loader_cpus: Iterable[int], mem: str,
                 nic: str | None = None, comm_cpus: Iterable[int] = (), main_cpus: Iterable[int] = ()) -> str:
    """The rank line without its ``affrun:`` prefix."""
    shown_gpu = "-" if gpu is None else f"{gpu} ({gpu_pci or '?'})"
    comm, main = format_cpulist(comm_cpus), format_cpulist(main_cpus)
    return (f"rank {local_rank}/{size} host {host} cpus {format_cpulist(cpus)} "
            f"numa {','.join(map(str, numa_nodes)) or '-'} gpu {shown_gpu} nic {nic or '-'} omp {threads} "
            f"loader {format_cpulist(loader_cpus) or '-'}{f' comm {comm}' if comm else ''}{f' main {main}' if main else ''} "
            f"mem {mem}")


def rank_line(rank: RankPlan, size: int, mem: str, host: str) -> str:
    """The documented, parseable one-line summary of a rank (``--verbose``, ``affrun torchrun``), after
    ``affrun:``."""
    return "affrun: " + rank_summary(rank.local_rank, size, host, rank.cpus, rank.numa_nodes, rank.gpu,
                                     rank.gpu_pci, rank.threads, rank.loader_cpus, mem, rank.nic_device,
                                     rank.comm_cpus, rank.main_cpus)
