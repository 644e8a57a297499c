"""What the doctor's checks know besides the environment and the topology (:class:`Facts`, plain data), and
:func:`gather_facts`, which finds them on this host. No click or torch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.base.procfs import ancestors, parent_pid, threads_union
from launcher.base.slurm_step import parse_version, slurm_bound
from launcher.bind.readback import exported_cpus
from launcher.context.binders import OtherBinder, other_binders
from launcher.context.inherited_mask import Collapse, read_collapse
from launcher.context.runtimes import OPENMP, identify, openmp_names
from launcher.topology._files import read_text
from launcher.topology.fsroot import within
from launcher.topology.model import Topology


@dataclass(frozen=True)
class Facts:
    """The situation the checks judge. Defaults mean "unknown": the checks that need a fact skip without it."""

    rank_cpus: frozenset[int]  # the CPUs one rank's threads may use
    ranks_sharing: int = 1  # local ranks that share ``rank_cpus`` (1 with a per-rank mask)
    per_rank_mask: bool = False  # each rank has its own process mask (affrun, srun --cpu-bind, taskset per rank)
    local_size: int = 1
    local_size_source: str = "default"
    openmp: tuple[str, ...] = ()  # OpenMP runtimes in use: libgomp, libiomp5, libomp; () when unknown
    openmp_source: str = ""  # where ``openmp`` comes from, for messages
    other_openmp: tuple[str, ...] = ()  # runtimes installed here that other programs may load (intel-openmp)
    intel_openmp_version: str | None = None  # the intel-openmp distribution's version, when installed
    host_probed: bool = False  # numactl/membind below were looked at on the machine being audited
    numactl: str | None = None
    membind_error: str | None = None  # why set_mempolicy(MPOL_BIND) failed; None when it works
    slurm_version: tuple[int, int, int] | None = None  # srun's, as launcher.base.slurm_step.parse_version reads it
    gpu_device_ids: Mapping[str, str] = field(default_factory=dict)  # PCI address -> PCI device id (model)
    numa_binding: str | None = None  # where a torchrun --numa-binding was found
    other_binders: tuple[OtherBinder, ...] = ()  # accelerate's and DeepSpeed's own binders (launcher.context.binders)
    inherited_collapse: Collapse | None = None  # this process's mask is a parent's collapsed one


def rank_view(
    environ: Mapping[str, str],
    process_cpus: frozenset[int],
    machine_cpus: frozenset[int],
    local_size: int,
    in_rank: bool,
) -> tuple[frozenset[int], int, bool]:
    """(CPUs of one rank, ranks sharing them, per-rank mask?) for a process allowed ``process_cpus``:
    ``AFFRUN_CPUS``; a rank's own mask where it is narrower than the machine's; else one mask for every rank."""
    cpus = exported_cpus(environ)
    if cpus:
        return cpus, 1, True
    if in_rank and process_cpus < machine_cpus:
        return process_cpus, 1, True
    return process_cpus, max(local_size, 1), local_size <= 1


_NUMA_FLAG = re.compile(r"--numa[-_]binding(=|\s+)?(\S+)?")


def numa_binding_source(environ: Mapping[str, str], ancestors: Sequence[tuple[int, str]]) -> str | None:
    """Where torchrun's ``--numa-binding`` applies: ``PET_NUMA_BINDING``, or the command line of a torchrun among
    the ``ancestors`` ((pid, command line), nearest first)."""
    value = environ.get("PET_NUMA_BINDING")
    if value:
        return f"PET_NUMA_BINDING={value} (torchrun reads it as --numa-binding)"
    for pid, cmdline in ancestors:
        if ("torchrun" in cmdline or "torch.distributed.run" in cmdline) and _NUMA_FLAG.search(cmdline):
            return f"torchrun --numa-binding in the parent process {pid} ({cmdline[:120]})"
    return None


def torch_openmp() -> tuple[tuple[str, ...], str]:
    """The OpenMP runtime the installed torch bundles, from its ``lib/`` directory (torch is not imported)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return (), ""
    lib_dir = os.path.join(os.path.dirname(spec.origin), "lib")
    try:
        names = sorted(os.listdir(lib_dir))
    except OSError:
        return (), ""
    found = [(row, path) for row, path in identify(os.path.join(lib_dir, n) for n in names) if row.user_api == OPENMP]
    if not found:
        return (), ""
    bundled = [path for _, path in found]
    return openmp_names(row for row, _ in found), f"the installed torch bundles {', '.join(bundled)}"


def preloaded_openmp(environ: Mapping[str, str]) -> tuple[str, ...]:
    value = environ.get("LD_PRELOAD", "")
    return openmp_names(row for row, _ in identify(p for p in re.split(r"[\s:]+", value) if p))


def intel_openmp_version() -> str | None:
    """The installed ``intel-openmp`` distribution's version, from its ``.dist-info`` directory's name."""
    import sys

    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            lowered = name.lower()
            if lowered.startswith("intel_openmp-") and lowered.endswith(".dist-info"):
                return name[len("intel_openmp-"):-len(".dist-info")]
    return None


def membind_error(nodes: Sequence[int]) -> str | None:
    """Try ``set_mempolicy(MPOL_BIND, nodes)`` on this thread and put the default back; why it failed, or None."""
    from launcher.bind.mempolicy import set_mempolicy

    rc = set_mempolicy("membind", tuple(nodes))
    if rc == 0:
        set_mempolicy("default", ())
        return None
    if rc == -1:
        return "no set_mempolicy system call number for this machine"
    return f"set_mempolicy(MPOL_BIND) failed: {os.strerror(rc)}"


def slurm_version() -> tuple[int, int, int] | None:
    srun = shutil.which("srun")
    if srun is None:
        return None
    try:
        done = subprocess.run([srun, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(done.stdout)


def gpu_device_ids(root: str, topology: Topology) -> dict[str, str]:
    out: dict[str, str] = {}
    with within(root):  # an fsroot's links are followed inside it
        for gpu in topology.gpus:
            text = read_text(os.path.join(root, "sys/bus/pci/devices", gpu.pci, "device"))  # bounded, no FIFO
            if text is not None:
                out[gpu.pci] = text
    return out


def launch_cpus(environ: Mapping[str, str], pid: int | None = None, proc: str = "/proc") -> frozenset[int]:
    """The CPUs a process was started with, even after its OpenMP runtime pinned the main thread: the union of its
    threads' masks and, unless srun bound the task, its parent's; else the main thread's mask."""
    me = os.getpid() if pid is None else pid
    cpus = threads_union(me, proc)
    parent = parent_pid(me, proc)
    if parent and parent > 1 and not slurm_bound(environ):
        cpus |= threads_union(parent, proc)
    return cpus or frozenset(os.sched_getaffinity(me))


def machine_cpus(topology: Topology, live: bool) -> frozenset[int]:
    """The CPUs any process here may be given: online ∩ cgroup cpuset (live), else the topology's allowed set."""
    if not live:
        return topology.allowed
    from launcher.topology.cgroup import find_cpuset

    cpuset = find_cpuset("/")
    online = topology.online
    return (cpuset.cpus & online) if cpuset is not None and cpuset.cpus & online else online


def local_size(environ: Mapping[str, str], nproc: int | None, topology: Topology) -> tuple[int, str, bool]:
    """(local ranks, where the number comes from, is this process a rank)."""
    from launcher.context.local_rank import LocalRankError, detect_local_rank

    try:
        detected = detect_local_rank(environ)
    except LocalRankError:
        detected = None
    if nproc is not None:
        return nproc, "--nproc-per-node", detected is not None
    if detected is not None:
        return detected.size, f"{detected.source} (local size {detected.size})", True
    gpus = len(topology.visible_gpus())
    if gpus:
        return gpus, f"one rank per visible GPU ({gpus})", False
    return 1, "a single rank (give --nproc-per-node)", False


def gather_facts(
    environ: Mapping[str, str],
    topology: Topology,
    *,
    live: bool,
    nproc: int | None = None,
    openmp: Sequence[str] | None = None,
    openmp_source: str = "",
    probe_host: bool = True,
    fsroot: str = "/",
    process_cpus: frozenset[int] | None = None,
) -> Facts:
    """The facts for auditing ``environ`` on ``topology``. ``live``: it is this machine (its mask and host probes
    apply). ``openmp``: the runtimes in use (default: the installed torch's and ``LD_PRELOAD``'s). ``probe_host``:
    numactl, the memory policy, Slurm's version. ``process_cpus``: the audited process's CPUs (default: ours)."""
    size, size_source, in_rank = local_size(environ, nproc, topology)
    process_cpus_given = process_cpus
    if process_cpus is None:
        process_cpus = frozenset(os.sched_getaffinity(0)) if live else topology.allowed
    process_cpus = (process_cpus & topology.allowed) or topology.allowed
    cpus, sharing, per_rank = rank_view(environ, process_cpus, machine_cpus(topology, live), size, in_rank)
    if openmp is None:
        runtimes, openmp_source = torch_openmp()
        extra = preloaded_openmp(environ)
        if extra:
            runtimes = tuple(dict.fromkeys((*runtimes, *extra)))
            openmp_source = f"{openmp_source}; LD_PRELOAD adds {', '.join(extra)}".lstrip("; ")
    else:
        runtimes = tuple(openmp)
    version = intel_openmp_version()
    other: tuple[str, ...] = ()
    if openmp is None and version and "libiomp5" not in runtimes:
        other = ("libiomp5",)
    numactl = mem_error = slurm = None
    if probe_host and live:
        numactl = shutil.which("numactl", path=environ.get("PATH"))
        nodes = [n.os_index for n in topology.cpu_nodes()] or [0]
        if topology.allowed_mems is not None:
            nodes = [n for n in nodes if n in topology.allowed_mems] or nodes
        mem_error = membind_error(nodes)
    if probe_host and environ.get("SLURM_CPUS_PER_TASK") and not environ.get("SRUN_CPUS_PER_TASK"):
        slurm = slurm_version()
    chain = ancestors(os.getpid()) if live else []
    return Facts(
        rank_cpus=cpus,
        ranks_sharing=sharing,
        per_rank_mask=per_rank,
        local_size=size,
        local_size_source=size_source,
        openmp=runtimes,
        openmp_source=openmp_source,
        other_openmp=other,
        intel_openmp_version=version,
        host_probed=probe_host and live,
        numactl=numactl,
        membind_error=mem_error,
        slurm_version=slurm,
        gpu_device_ids=gpu_device_ids(fsroot, topology) if (live or fsroot != "/") else {},
        numa_binding=numa_binding_source(environ, chain),
        other_binders=other_binders(environ, chain),
        inherited_collapse=read_collapse(environ, lambda: size) if live and process_cpus_given is None else None,
    )
