"""The binding a process runs under, read back from the ``AFFRUN_*`` variables that ``affrun exec`` exports: the one
strict reader of them (:func:`read_binding`), for ``current_binding()``, ``launcher.torch``, the rank's hooks and
``affrun doctor``. Standard library only."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.base.untrusted import ascii_uint, short
from launcher.bind.inherited import MAY_NOT_RUN, binding_fault
from launcher.env.rank_line import MEM_VARIABLE, rank_summary
from launcher.env.variables import MAIN_VARIABLE


@dataclass(frozen=True)
class TaskBinding:
    """The plan entry a process runs under, as ``affrun exec`` exported it (``AFFRUN_*`` variables)."""

    local_rank: int
    local_world_size: int
    cpus: frozenset[int]  # the process's CPU mask (compute + loader CPUs)
    compute_cpus: frozenset[int]  # where the OpenMP/BLAS threads run
    loader_cpus: frozenset[int]  # reserved for DataLoader workers (empty: none)
    numa_nodes: tuple[int, ...]
    mem_nodes: tuple[int, ...]
    gpu: int | None  # visible GPU index (as CUDA_VISIBLE_DEVICES numbers it), None: no GPU
    gpu_pci: str | None
    threads: int  # OMP_NUM_THREADS / MKL_NUM_THREADS / OPENBLAS_NUM_THREADS affrun chose
    omp_bind: str
    host: str = field(default_factory=socket.gethostname)
    mem: str = "none"  # the memory policy in effect, as the rank line writes it: membind:0, none
    comm_cpus: frozenset[int] = frozenset()  # kept for NCCL's proxy threads (--comm-cores; empty: none)
    nic: str | None = None  # AFFRUN_NIC: mlx5_0:1, eth0; None: no NIC
    main_cpus: frozenset[int] = frozenset()  # AFFRUN_MAIN_CPUS: the main thread's core (--main-thread; empty: none)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly: CPU sets as cpulist strings."""
        d = asdict(self)
        for name in ("cpus", "compute_cpus", "loader_cpus", "comm_cpus", "main_cpus"):
            d[name] = format_cpulist(d[name])
        d["numa_nodes"] = list(self.numa_nodes)
        d["mem_nodes"] = list(self.mem_nodes)
        return d

    def __str__(self) -> str:
        """The rank line (:mod:`launcher.env.rank_line`), without ``affrun:``."""
        return rank_summary(self.local_rank, self.local_world_size, self.host, self.cpus, self.numa_nodes, self.gpu,
                            self.gpu_pci, self.threads, self.loader_cpus, self.mem, self.nic, self.comm_cpus,
                            self.main_cpus)


def exported_cpus(environ: Mapping[str, str], name: str = "AFFRUN_CPUS") -> frozenset[int]:
    """The CPU set affrun exported in ``name`` (``AFFRUN_CPUS``, ``AFFRUN_LOADER_CPUS``) of some process's
    environment; empty when it is unset or malformed. For audits, which judge what they find rather than fail."""
    try:
        return parse_cpulist(environ.get(name, ""))
    except ValueError:
        return frozenset()


def current_binding(environ: Mapping[str, str] | None = None) -> TaskBinding | None:
    """The binding ``affrun exec`` gave this process (its ``AFFRUN_*`` variables, not the live mask), or ``None`` when
    it was not started through affrun. ``ValueError`` naming the variable for values that cannot be a binding."""
    return read_binding(os.environ if environ is None else environ)


def read_binding(environ: Mapping[str, str], usable: frozenset[int] | None = None,
                 lacking: str = MAY_NOT_RUN) -> TaskBinding | None:
    """The binding ``environ``'s ``AFFRUN_*`` variables describe; ``None`` without ``AFFRUN_CPUS``. ``ValueError``
    naming the variable for a malformed value and for values that cannot be a binding affrun made (with
    ``usable``: on those CPUs; :func:`launcher.bind.inherited.binding_fault`)."""
    binding = _parsed(environ)
    if binding is None:
        return None
    fault = binding_fault(binding, usable, lacking)
    if fault is None and environ.get("AFFRUN_LOCAL_WORLD_SIZE") and binding.local_rank >= binding.local_world_size:
        fault = (f"AFFRUN_LOCAL_RANK={binding.local_rank} is not below "
                 f"AFFRUN_LOCAL_WORLD_SIZE={binding.local_world_size}")
    if fault is not None:
        raise ValueError(fault)
    return binding


def _parsed(env: Mapping[str, str]) -> TaskBinding | None:
    """The variables as they are written, each checked for its form only."""
    if not env.get("AFFRUN_CPUS", "").strip():
        return None

    def cpus(name: str) -> frozenset[int]:
        try:
            return parse_cpulist(env.get(name, ""))
        except ValueError:
            raise ValueError(f"{name}={short(env.get(name))} is not a cpu list") from None

    def ints(name: str) -> tuple[int, ...]:
        values = [ascii_uint(v.strip()) for v in env.get(name, "").split(",") if v.strip()]
        if None in values:
            raise ValueError(f"{name}={short(env.get(name))} is not a list of integers")
        return tuple(v for v in values if v is not None)

    def one(name: str, default: int | None = None) -> int:
        value = env.get(name, "")
        if not value and default is not None:
            return default
        number = ascii_uint(value.strip())
        if number is None:
            raise ValueError(f"{name}={short(value)} is not an integer")
        return number

    all_cpus, loader, comm = cpus("AFFRUN_CPUS"), cpus("AFFRUN_LOADER_CPUS"), cpus("AFFRUN_COMM_CPUS")
    # without AFFRUN_COMPUTE_CPUS (written by affrun since its loader CPUs): the rank's CPUs off the others
    compute = cpus("AFFRUN_COMPUTE_CPUS") if "AFFRUN_COMPUTE_CPUS" in env else all_cpus - loader - comm or all_cpus
    gpu_text = env.get("AFFRUN_GPU", "")
    return TaskBinding(
        local_rank=one("AFFRUN_LOCAL_RANK", 0),
        local_world_size=one("AFFRUN_LOCAL_WORLD_SIZE", 1),
        cpus=all_cpus,
        compute_cpus=compute,
        loader_cpus=loader,
        numa_nodes=ints("AFFRUN_NUMA_NODES"),
        mem_nodes=ints("AFFRUN_MEM_NODES"),
        gpu=one("AFFRUN_GPU") if gpu_text else None,
        gpu_pci=env.get("AFFRUN_GPU_PCI") or None,
        threads=one("AFFRUN_THREADS", len(compute)),
        omp_bind=env.get("AFFRUN_OMP_BIND", "rank"),
        mem=env.get(MEM_VARIABLE) or "none",
        comm_cpus=comm,
        nic=env.get("AFFRUN_NIC") or None,
        main_cpus=cpus(MAIN_VARIABLE),
    )

