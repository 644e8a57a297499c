"""The findings ``collapse`` (a rank's children all on one CPU of the rank's) and ``job-collapsed`` (the whole
job on fewer CPUs than it could use, with the cause). Pure. docs/doctor.md ("The whole job")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.base.cpulist import format_cpulist
from launcher.base.slurm_step import slurm_bound
from launcher.bind.readback import exported_cpus
from launcher.context.local_rank import SOURCES
from launcher.context.runtimes import openmp_names
from launcher.doctor.binder_evidence import pinning_ancestor
from launcher.doctor.findings import Finding, Severity
from launcher.doctor.live import JobAudit, ProcessRecord
from launcher.doctor.main_place import pinning_variables
from launcher.doctor.run_checks import planned_cpus
from launcher.env.variables import BINDING_VARIABLES
from launcher.topology.model import Topology

LISTED = 6  # processes named in the message; more are counted
# a rank whose local rank an MPI launcher or srun set: that launcher binds its ranks on purpose (mpirun --bind-to)
MPI_SOURCES = tuple(rank for rank, _ in SOURCES if rank != "LOCAL_RANK")


@dataclass(frozen=True)
class Cause:
    """Why the launcher runs on its narrow mask: in words, the fix, and the variables to unset."""

    what: str
    fix: str
    env_fix: Mapping[str, str | None] = field(default_factory=dict)


def _subtree(audit: JobAudit, top: ProcessRecord) -> list[ProcessRecord]:
    """``top`` and the job's processes below it."""
    below: dict[int, list[ProcessRecord]] = {}
    for p in audit.processes:
        below.setdefault(p.ppid, []).append(p)
    out, todo, seen = [], [top], {top.pid}
    while todo:
        p = todo.pop(0)
        out.append(p)
        for c in below.get(p.pid, []):
            if c.pid not in seen:
                seen.add(c.pid)
                todo.append(c)
    return out


def span_of(processes: Sequence[ProcessRecord]) -> frozenset[int]:
    """The CPUs any of their threads may use (the union of every mask seen last)."""
    return frozenset(c for p in processes for t in p.threads.values() for c in t.allowed)


def one_core(cpus: frozenset[int], topology: Topology) -> bool:
    return any(cpus <= frozenset(core.pus) for core in topology.cores) or len(cpus) == 1


def _planned(p: ProcessRecord) -> bool:
    """Narrowed on purpose: affrun's binding (``affrun exec --cpus``), srun's, or an MPI launcher's (it set the
    local rank: ``mpirun --bind-to``)."""
    env = p.environ
    return bool(exported_cpus(env) or planned_cpus(p) or slurm_bound(env) or any(env.get(n) for n in MPI_SOURCES))


def _one_of_several(p: ProcessRecord) -> bool:
    """A rank among others of its node (torchrun, accelerate, DeepSpeed set ``LOCAL_WORLD_SIZE``): binding each is
    its launcher's plan, not a collapse, even where the audit starts at it."""
    return p.role == "rank" and p.environ.get("LOCAL_WORLD_SIZE", "1").strip() not in ("", "0", "1")


def collapse_point(audit: JobAudit) -> tuple[ProcessRecord, list[ProcessRecord], frozenset[int]] | None:
    """The topmost launcher of the job (never a rank) whose processes all run on fewer CPUs than the reference,
    with those processes and their CPUs; ``None`` when there is none."""
    root = next((p for p in audit.processes if p.pid == audit.pid), None)
    if root is None or not audit.reference:
        return None
    for top in _subtree(audit, root):
        if top.role != "launcher" and (top is not root or _one_of_several(top)):
            continue
        group = _subtree(audit, top)
        span = span_of(group)
        if span and audit.reference - span and not _planned(top):
            return top, group, span
    return None


def confined(audit: JobAudit) -> frozenset[int] | None:
    """The CPUs of the collapsed part of the job (:func:`collapse_point`), or ``None``."""
    found = collapse_point(audit)
    return found[2] if found else None


def _runtime_words(p: ProcessRecord, names: Sequence[str]) -> str:
    runtimes = openmp_names(p.runtimes)
    if "KMP_AFFINITY" in names:
        if "libomp" in runtimes:
            return "LLVM libomp binds the main thread when it starts (measured: at `import torch`)"
        return "libiomp5 binds the main thread at its first parallel region"
    if "libgomp" in runtimes:
        return "libgomp binds the thread that loads it (`import torch`) to the first place"
    return "the OpenMP runtime binds the main thread to the first place at its first parallel region"


def _parent(audit: JobAudit, top: ProcessRecord) -> tuple[int, str, frozenset[int]] | None:
    """The parent of ``top``: a process of the job, or the audited process's own parent (``JobAudit.parent``)."""
    if top.pid == audit.pid:
        return audit.parent
    up = next((p for p in audit.processes if p.pid == top.ppid), None)
    return (up.pid, " ".join(up.cmdline), up.mask) if up is not None else None


def cause_of(audit: JobAudit, top: ProcessRecord, span: frozenset[int], chain: Sequence[tuple[int, str]]) -> Cause:
    """What pinned the launcher ``top``: its parent on the mask already, a binding variable its OpenMP runtime
    read, else a binder around it (``chain``: its ancestors, nearest first)."""
    parent = _parent(audit, top)
    variables = pinning_variables(top.environ, openmp_names(top.runtimes))
    if parent is not None and parent[2] and parent[2] <= span:
        where = f"its parent, pid {parent[0]} ({parent[1][:80]}), runs on CPUs {format_cpulist(parent[2])} too"
        tool = pinning_ancestor(chain)
        return Cause(f"the launcher started on that mask: {where}" + (f"; {tool.what}" if tool else ""),
                     "find what pinned the parent (a taskset or numactl --physcpubind in the job script, a "
                     "launcher that imported torch with OMP_PROC_BIND/OMP_PLACES set) and drop it, or run the job "
                     "with `affrun torchrun` from a shell that is not pinned")
    if variables:
        names = [n for n, _ in variables]
        said = " ".join(f"{n}={v[:40]}" for n, v in variables)
        return Cause(f"{said} in the launcher's environment: {_runtime_words(top, names)}, and every process "
                     "started afterwards inherits that one place",
                     f"unset {' '.join(names)} where the launcher starts (set them per rank, or let affrun do it): "
                     "launch with `affrun torchrun`, which imports torch without them and gives each rank CPUs of "
                     "its own", {n: None for n in names})
    tool = pinning_ancestor(chain)
    return Cause((tool.what if tool else "no binding variable explains it: a taskset, numactl --physcpubind or "
                  "sched_setaffinity around the launcher (taskset and numactl exec their command and leave no "
                  "trace)"),
                 "drop the taskset / numactl --physcpubind around the launcher, or widen it to the CPUs the job "
                 "may use; `affrun torchrun` then gives each rank CPUs of its own")


def _named(processes: Sequence[ProcessRecord]) -> str:
    shown = ", ".join(p.label() for p in processes[:LISTED])
    more = len(processes) - LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def collapse_findings(audit: JobAudit, rank: ProcessRecord) -> list[Finding]:
    """``collapse``: the rank's children are all confined to one CPU while the rank owns several, and no plan put
    them there (affrun's loader CPUs, the one CPU the thread plan gives every worker)."""
    children = [c for c in audit.children_of(rank) if c.threads]
    union = span_of(children)
    if not children or len(rank.owned) < 2 or len(union) != 1:
        return []
    loader = exported_cpus(rank.environ, "AFFRUN_LOADER_CPUS")
    plan = rank.thread_plan
    if (loader and union <= loader) or (plan is not None and plan.workers
                                        and union == {c for w in plan.workers for c in w.cpus}):
        return []
    cpu = next(iter(union))
    names = sorted({c.comm for c in children})
    main_too = rank.main_mask == union
    causes = [f"{n}={rank.environ[n]}" for n in BINDING_VARIABLES if rank.environ.get(n)]
    return [Finding(
        "collapse", "error",
        f"the rank owns CPUs {format_cpulist(rank.owned)}, but its {len(children)} child process(es) "
        f"({', '.join(names)}: pids {', '.join(str(c.pid) for c in children)}) are all confined to CPU {cpu}"
        + (" together with its main thread" if main_too else "")
        + (f" ({' '.join(causes)})" if causes else ""),
        "the workers inherited the one-CPU mask of the main thread, which the OpenMP runtime pinned at startup: "
        "data loading runs on one core and the GPU waits, without any error",
        "unset " + (", ".join(n.split("=")[0] for n in causes) if causes else "the OpenMP binding variables")
        + " and launch with `affrun torchrun` / `affrun exec` (one place per rank), or pass "
        "worker_init_fn=launcher.torch.worker_init_fn to the DataLoader",
        rank.label(),
    )]


def job_collapse_findings(audit: JobAudit, topology: Topology, chain: Sequence[tuple[int, str]]) -> list[Finding]:
    """``job-collapsed`` (its severity: docs/doctor.md). ``chain``: the audited process's ancestors, nearest
    first."""
    found = collapse_point(audit)
    if found is None:
        return []
    top, group, span = found
    above = [p for p in audit.processes if p.pid != top.pid and top in _subtree(audit, p)]
    above.sort(key=lambda p: -len(_subtree(audit, p)))  # nearest first: the smallest subtree
    cause = cause_of(audit, top, span, [(p.pid, " ".join(p.cmdline)) for p in above][::-1] + list(chain))
    alive = [p for p in group if p.threads]
    narrow = one_core(span, topology)
    severity: Severity = ("error" if len(alive) > 1 else "warning") if narrow else "info"
    demand = [d for p in alive for t in p.threads.values() if (d := t.demand()) is not None]
    wanted = f"; its threads wanted {sum(demand):.1f} CPUs' worth of time over the sample" if demand else ""
    return [Finding(
        "job-collapsed", severity,
        f"the whole job runs on CPUs {format_cpulist(span)} while it could use CPUs "
        f"{format_cpulist(audit.reference)} ({audit.reference_source}): {len(alive)} process(es), "
        f"{_named(alive)}{wanted}. Cause: {cause.what}",
        "every rank, DataLoader worker and thread of the job inherited the launcher's mask: they share "
        f"{len(span)} CPU(s) while CPUs {format_cpulist(audit.reference - span)} stay idle, and the GPU waits "
        "without any error",
        cause.fix, top.label(), cause.env_fix)]
