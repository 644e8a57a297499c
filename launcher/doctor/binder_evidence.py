"""``affrun doctor --pid``: who may have changed a thread's mask after start, from what a live process shows
(its libraries, its environment, its ancestors). docs/doctor.md ("mask-changed-after-start")."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.context.binders import other_binders
from launcher.doctor.facts import numa_binding_source
from launcher.doctor.live import ProcessRecord
from launcher.doctor.main_place import pinning_variables
from launcher.doctor.nccl_live import LEAKY, loaded_nccl

TRT_VARIABLE = "TLLM_NUMA_AWARE_WORKER_AFFINITY"
PINNING_TOOLS = ("numactl", "taskset")


@dataclass(frozen=True)
class Binder:
    """One binder the evidence names: what it is and how it sets masks, and the fix."""

    what: str
    fix: str
    env_fix: Mapping[str, str | None] = field(default_factory=dict)


def tensorrt_llm(libraries: Sequence[str], environ: Mapping[str, str]) -> Binder | None:
    """TensorRT-LLM, when one of its libraries is mapped and ``TLLM_NUMA_AWARE_WORKER_AFFINITY`` is not ``0``."""
    path = next((p for p in libraries if "tensorrt_llm" in p.lower()), None)
    if path is None:
        return None
    value = environ.get(TRT_VARIABLE)
    if value == "0":
        return None  # told to leave the mask alone
    how = ("unset: it replaces a mask it finds constrained by all CPUs, or by its GPU's CPUs (NVIDIA/srt-slurm #326)"
           if value is None else f"={value}: it sets its GPU's CPUs from NVML" if value == "1" else f"={value}")
    return Binder(f"TensorRT-LLM is loaded ({path}): its configure_cpu_affinity() sets the mask from inside the "
                  f"process, and {TRT_VARIABLE} is {how}",
                  f"export {TRT_VARIABLE}=0 so that TensorRT-LLM keeps the mask affrun set", {TRT_VARIABLE: "0"})


def pinning_ancestor(chain: Sequence[tuple[int, str]]) -> Binder | None:
    """A ``numactl`` or ``taskset`` in an ancestor's command line (the nearest): it set the mask the process
    started with."""
    for pid, cmdline in chain:
        tool = next((os.path.basename(w) for w in cmdline.split() if os.path.basename(w) in PINNING_TOOLS), None)
        if tool is not None:
            return Binder(f"{tool} in the parent process {pid} ({cmdline[:120]})",
                          f"drop {tool} from the command: affrun binds each rank itself")
    return None


def likely_binders(p: ProcessRecord, chain: Sequence[tuple[int, str]]) -> list[Binder]:
    """Every binder the evidence of ``p`` names (its libraries, its environment, ``chain``: its ancestors)."""
    found = [b for b in (tensorrt_llm(p.libraries, p.environ),) if b is not None]
    found += [Binder(f"{b.tool} ({b.source})", b.fix) for b in other_binders(p.environ, chain)]
    numa = numa_binding_source(p.environ, chain)
    if numa:
        found.append(Binder(numa, "drop torchrun's --numa-binding (unset PET_NUMA_BINDING): affrun binds each rank"))
    nccl = loaded_nccl(p)
    version = nccl.version if nccl else None
    if nccl is not None and version is not None and LEAKY[0] <= version <= LEAKY[1]:
        found.append(Binder(f"NCCL {'.'.join(map(str, version))} ({nccl.path}), which leaks its GPU's CPU mask into the "
                            "thread that creates a communicator (NVIDIA/nccl #2033)",
                            "upgrade NCCL to 2.30 or later (pip install -U nvidia-nccl-cu12)"))
    ancestor = pinning_ancestor(chain)
    if ancestor is not None:
        found.append(ancestor)
    pinning = pinning_variables(p.environ, [r.name for r in p.runtimes])
    return found + [Binder(f"{name}={value[:80]} (the OpenMP runtime binds its threads to it)",
                           f"unset {name}: affrun's OMP_PLACES places the team", {name: None})
                    for name, value in pinning if name in ("KMP_AFFINITY", "GOMP_CPU_AFFINITY")]
