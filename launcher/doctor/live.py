"""``affrun doctor --pid PID``: what was seen of a running job (the records) and what it means (the analysis).

:mod:`launcher.doctor.sampling` fills the records (:class:`JobAudit`, :class:`ProcessRecord`,
:class:`ThreadRecord`) from ``/proc``; the analysis here (:func:`assign_roles`, :func:`job_findings`) is pure.

Roles: a *rank* is a process with a local-rank variable (``LOCAL_RANK``, ``SLURM_LOCALID``..., or affrun's
``AFFRUN_LOCAL_RANK`` with its plan's identity) whose parent does not carry the same rank and that started no
ranks; without any, the audited process is the one rank. A rank's descendants are its *children* (DataLoader
workers are named ``pt_data_worker``). The rest is the *launcher* (torchrun's agent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.bind.readback import exported_cpus
from launcher.context.binders import other_binders
from launcher.context.runtimes import LoadedRuntime, openmp_names
from launcher.doctor import procfs
from launcher.doctor.checks import check_environment
from launcher.doctor.facts import Facts, intel_openmp_version, numa_binding_source, slurm_bound
from launcher.doctor.feed_checks import feed_finding
from launcher.doctor.findings import Finding, merge_subjects
from launcher.doctor.gpu import GpuReport
from launcher.doctor.host_checks import check_double_binding
from launcher.doctor.run_checks import planned_cpus, unbound_findings
from launcher.env.variables import BINDING_VARIABLES
from launcher.feed.figures import FeedFigures
from launcher.plan.kinds import plan_kinds
from launcher.plan.threads import ThreadPlan, WorkerHome
from launcher.topology.model import Topology


@dataclass
class ThreadRecord:
    tid: int
    comm: str
    allowed: frozenset[int]
    last_cpu: int
    seen: dict[int, int] = field(default_factory=dict)  # CPU -> samples on it
    migrations: int = 0
    samples: int = 0
    first_ticks: int = 0
    last_ticks: int = 0
    ran: dict[int, int] = field(default_factory=dict)  # CPU -> samples that show it ran there (see update)
    first_allowed: frozenset[int] = frozenset()  # its mask at the first sample
    # filled by launcher.doctor.thread_homes: its role, how that was told, its home (None: no plan) and verdict
    role: str = "unknown"
    identified_by: str = ""
    home: frozenset[int] | None = None
    verdict: str = "unplanned"

    def update(self, stat: procfs.ThreadStat, allowed: frozenset[int] | None) -> None:
        """One sample. It *ran* on the CPU it last ran on when its CPU time grew since the last sample, or when
        that CPU is in its mask: a sleeping thread keeps the CPU it ran on before its mask changed (stale)."""
        mask = allowed if allowed is not None else self.allowed
        ticked = self.samples > 0 and stat.ticks > self.last_ticks
        if self.samples and stat.processor != self.last_cpu:
            self.migrations += 1
        if not self.samples:
            self.first_ticks = stat.ticks
            self.first_allowed = mask
        if ticked or not mask or stat.processor in mask:
            self.ran[stat.processor] = self.ran.get(stat.processor, 0) + 1
        self.samples += 1
        self.comm = stat.comm
        self.last_cpu = stat.processor
        self.last_ticks = stat.ticks
        self.seen[stat.processor] = self.seen.get(stat.processor, 0) + 1
        if allowed is not None:
            self.allowed = allowed

    def cpu_percent(self, seconds: float) -> float:
        if seconds <= 0:
            return 0.0
        return 100.0 * (self.last_ticks - self.first_ticks) / procfs.CLOCK_TICKS / seconds

    def migrations_per_s(self, seconds: float) -> float:
        return self.migrations / seconds if seconds > 0 else 0.0

    @property
    def strayed_to(self) -> frozenset[int]:
        """The CPUs it ran on outside its home (empty without a home)."""
        return frozenset(self.ran) - self.home if self.home is not None else frozenset()


@dataclass
class ProcessRecord:
    pid: int
    ppid: int
    comm: str
    cmdline: list[str]
    environ: dict[str, str]
    threads: dict[int, ThreadRecord] = field(default_factory=dict)
    libraries: list[str] = field(default_factory=list)
    runtimes: list[LoadedRuntime] = field(default_factory=list)
    role: str = "other"  # rank | child | launcher | other
    rank: int | None = None  # local rank (ranks and their children)
    rank_pid: int | None = None  # the rank a child belongs to
    owned: frozenset[int] = frozenset()  # ranks: the CPUs it was given
    launcher_mask: frozenset[int] = frozenset()  # ranks: the union of its parent's thread masks, at first sight
    alive: bool = True
    feed: FeedFigures | None = None  # the meter's figures so far (--feed-report)
    # filled by launcher.doctor.thread_homes: where its thread plan comes from ("": none), a rank's plan, and
    # for a DataLoader worker its home in its rank's plan, of how many workers, and how it was matched
    plan_source: str = ""
    thread_plan: ThreadPlan | None = None
    worker: WorkerHome | None = None
    workers_seen: int = 0
    worker_matched_by: str = ""

    @property
    def mask(self) -> frozenset[int]:
        """The union of the masks of its threads."""
        out: set[int] = set()
        for t in self.threads.values():
            out |= t.allowed
        return frozenset(out)

    @property
    def main_mask(self) -> frozenset[int]:
        main = self.threads.get(self.pid)
        return main.allowed if main else self.mask

    def label(self) -> str:
        if self.role == "rank" and self.rank is not None:
            return f"rank {self.rank} (pid {self.pid})"
        return f"{self.role if self.role != 'rank' else 'process'} {self.comm} (pid {self.pid})"


@dataclass
class JobAudit:
    pid: int
    duration: float  # seconds actually sampled
    interval: float
    samples: int
    processes: list[ProcessRecord]
    gpus: GpuReport
    machine_cpus: frozenset[int]
    findings: list[Finding] = field(default_factory=list)

    def ranks(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "rank"]

    def children_of(self, rank: ProcessRecord) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "child" and p.rank_pid == rank.pid]


# --------------------------------------------------------------------------- analysis (pure)
def _rank_key(p: ProcessRecord) -> tuple[str, int] | None:
    """Which local rank ``p`` is, and by what: a launcher's variable (``LOCAL_RANK``, ``SLURM_LOCALID``...); else
    affrun's binding (``AFFRUN_LOCAL_RANK`` with the plan's identity ``AFFRUN_PLAN_ID``, which every binding
    writes: ``affrun exec`` sets no ``LOCAL_RANK`` outside srun and mpirun), or the rank ``affrun run``'s hook
    made it, whose variables are not in ``/proc/PID/environ``."""
    from launcher.base.untrusted import ascii_uint
    from launcher.context.local_rank import LocalRankError, detect_local_rank
    from launcher.env.variables import BOUND_VARIABLE, PLAN_ID_VARIABLE

    try:
        found = detect_local_rank(p.environ)
    except LocalRankError:
        found = None
    if found is not None:
        return found.source, found.rank
    bound = ascii_uint(p.environ.get(BOUND_VARIABLE, "").strip())
    if bound is not None and p.environ.get(PLAN_ID_VARIABLE):
        return BOUND_VARIABLE, bound
    planned = planned_cpus(p)
    return (BOUND_VARIABLE, planned[0]) if planned is not None else None


def assign_roles(audit: JobAudit) -> None:
    """Mark ranks, their children and the launcher, and work out the CPUs each rank owns. A process that started
    ranks of its own (``affrun exec -- torchrun``, whose agent carries the binding its workers inherit) is their
    launcher, not a rank."""
    by_pid = {p.pid: p for p in audit.processes}
    keys = {p.pid: _rank_key(p) for p in audit.processes}
    ranks = [p for p in audit.processes if keys[p.pid] is not None and keys.get(p.ppid) != keys[p.pid]]
    ranks = [r for r in ranks if not any(o is not r and _descends(o, r.pid, by_pid) for o in ranks)]
    if not ranks:
        ranks = [by_pid[audit.pid]] if audit.pid in by_pid else audit.processes[:1]
    rank_pids = {r.pid for r in ranks}
    for r in ranks:
        r.role = "rank"
        key = keys.get(r.pid)
        r.rank = key[1] if key else None
        r.owned = owned_cpus(r)
    for p in audit.processes:
        if p.pid in rank_pids:
            continue
        parent = by_pid.get(p.ppid)
        while parent is not None and parent.pid not in rank_pids:
            parent = by_pid.get(parent.ppid)
        if parent is not None:
            p.role, p.rank_pid, p.rank = "child", parent.pid, parent.rank
    for p in audit.processes:
        if p.role == "other" and any(_descends(r, p.pid, by_pid) for r in ranks):
            p.role = "launcher"


def _descends(p: ProcessRecord, ancestor: int, by_pid: Mapping[int, ProcessRecord]) -> bool:
    current = by_pid.get(p.ppid)
    while current is not None:
        if current.pid == ancestor:
            return True
        current = by_pid.get(current.ppid)
    return False


def owned_cpus(rank: ProcessRecord) -> frozenset[int]:
    """The CPUs a rank was given: ``AFFRUN_CPUS``, or its rank's in the plan of ``affrun run``; else what its
    threads and its launcher's threads span.

    The launcher's mask is left out under Slurm CPU binding, where srun binds each task below its parent's mask.
    """
    planned = exported_cpus(rank.environ)
    if planned:
        return planned
    under_run = planned_cpus(rank)  # affrun run's hook binds in-process: AFFRUN_CPUS is not in /proc's environ
    if under_run:
        return under_run[1]
    own = rank.mask
    if slurm_bound(rank.environ) or not rank.launcher_mask:
        return own
    return own | rank.launcher_mask


def job_findings(audit: JobAudit, topology: Topology, ancestors_of: Any = None) -> list[Finding]:
    """Everything wrong with the sampled job: each rank's environment against its runtimes, then what was seen."""
    ranks = audit.ranks()
    findings: list[Finding] = []
    for rank in ranks:
        sharing = sum(1 for r in ranks if r.owned & rank.owned) or 1
        runtimes = openmp_names(rank.runtimes)
        version = intel_openmp_version() if any(n in ("libiomp5", "libomp") for n in runtimes) else None
        chain = ancestors_of(rank.pid) if ancestors_of else []
        facts = Facts(
            rank_cpus=rank.owned,
            ranks_sharing=sharing,
            per_rank_mask=sharing == 1,
            local_size=len(ranks),
            local_size_source=f"{len(ranks)} rank(s) found under pid {audit.pid}",
            openmp=runtimes,
            openmp_source=f"loaded in pid {rank.pid}" if runtimes else "",
            intel_openmp_version=version,
            numa_binding=numa_binding_source(rank.environ, chain),
            other_binders=other_binders(rank.environ, chain),
        )
        subject = rank.label()
        for f in (*check_environment(rank.environ, topology, facts, host=False),
                  *check_double_binding(rank.environ, topology, facts)):
            findings.append(_with_subject(f, subject))
        findings.extend(collapse_findings(audit, rank))
        findings.extend(migration_findings(audit, rank))
        findings.extend(kind_findings(audit, rank, topology))
        team = max((r.threads or 1 for r in rank.runtimes if r.user_api == "openmp"), default=1)
        loader = exported_cpus(rank.environ, "AFFRUN_LOADER_CPUS")
        loader_cores = len({c.pus for c in topology.cores if not loader.isdisjoint(c.pus)}) or len(loader)
        findings.extend(feed_finding(subject, rank.feed, rank.owned, loader,
                                     [c.mask for c in audit.children_of(rank) if c.threads], team, loader_cores))
    findings.extend(overlap_findings(ranks))
    findings.extend(unbound_findings(audit.processes))
    findings.extend(gpu_findings(audit))
    return merge_subjects(findings)


def _with_subject(f: Finding, subject: str) -> Finding:
    return Finding(f.id, f.severity, f.message, f.why, f.fix, subject, f.env_fix)


def collapse_findings(audit: JobAudit, rank: ProcessRecord) -> list[Finding]:
    """The rank's children are all confined to one CPU while the rank owns several (docs/design.md §2)."""
    children = [c for c in audit.children_of(rank) if c.threads]
    if not children or len(rank.owned) < 2:
        return []
    union: set[int] = set()
    for child in children:
        union |= child.mask
    if len(union) != 1:
        return []
    loader = exported_cpus(rank.environ, "AFFRUN_LOADER_CPUS")
    if loader and union <= loader:
        return []  # affrun --loader-cores planned it
    plan = rank.thread_plan  # the workers' homes (launcher.doctor.thread_homes): off a main core and comm cores
    if plan is not None and plan.workers and union == {c for w in plan.workers for c in w.cpus}:
        return []  # the one CPU the thread plan gives every worker (a small rank with a main core of its own)
    cpu = next(iter(union))
    names = sorted({c.comm for c in children})
    main_too = rank.main_mask == frozenset(union)
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


MIGRATION_RATE = 1.0  # per second, for a busy thread
BUSY_PERCENT = 50.0


def migration_findings(audit: JobAudit, rank: ProcessRecord) -> list[Finding]:
    """Busy threads of an unbound rank (no affrun mask) that moved between CPUs during the sample."""
    if rank.environ.get("AFFRUN_CPUS") or audit.duration <= 0:
        return []
    moving = [
        (p, t)
        for p in (rank, *audit.children_of(rank))
        for t in p.threads.values()
        if len(t.allowed) > 1 and t.cpu_percent(audit.duration) >= BUSY_PERCENT
        and t.migrations_per_s(audit.duration) >= MIGRATION_RATE
    ]
    if not moving:
        return []
    fastest = max(t.migrations_per_s(audit.duration) for _, t in moving)
    return [Finding(
        "thread-migrations", "info",
        f"{len(moving)} busy thread(s) of the rank moved between CPUs (up to {fastest:.1f}/s, sampled every "
        f"{audit.interval:g} s)",
        "unbound threads lose their caches at each move and can land on another rank's cores",
        "bind the rank: launch with `affrun torchrun` / `affrun exec`",
        rank.label(),
    )]


def kind_findings(audit: JobAudit, rank: ProcessRecord, topology: Topology) -> list[Finding]:
    """Busy threads of one rank (its OpenMP team) that ran on two core kinds during the sample (hybrid CPUs)."""
    kinds = plan_kinds(topology)  # the planner's kinds: none where they are priority classes (SST-BF)
    if kinds is None or audit.duration <= 0:
        return []
    on: dict[str, list[int]] = {}
    for t in rank.threads.values():
        if t.seen and t.cpu_percent(audit.duration) >= BUSY_PERCENT:
            cpu = max(t.seen, key=lambda c: (t.seen[c], -c))
            kind = kinds.kind_of(cpu)
            on.setdefault(kind.name if kind else "?", []).append(t.tid)
    if len(on) < 2:
        return []
    fast = kinds.kinds[0]
    where = "; ".join(f"{len(tids)} on {name} CPUs" for name, tids in on.items())
    return [Finding(
        "core-kinds-mixed", "warning",
        f"live: {sum(map(len, on.values()))} busy threads of the rank ran on two core kinds ({where})",
        "an OpenMP parallel region ends when its slowest thread does: the slower cores gate every region",
        f"bind the team to the {fast.name} CPUs ({format_cpulist(fast.cpus & rank.owned) or format_cpulist(fast.cpus)})"
        f" with OMP_NUM_THREADS set to their count: launch with `affrun torchrun` / `affrun exec`",
        rank.label(),
    )]


def overlap_findings(ranks: Sequence[ProcessRecord]) -> list[Finding]:
    out: list[Finding] = []
    for i, a in enumerate(ranks):
        for b in ranks[i + 1 :]:
            shared = a.mask & b.mask
            if not shared:
                continue
            planned = bool(a.environ.get("AFFRUN_CPUS") and b.environ.get("AFFRUN_CPUS"))
            out.append(Finding(
                "rank-overlap", "info" if planned else "warning",
                f"{a.label()} (CPUs {format_cpulist(a.mask)}) and {b.label()} (CPUs {format_cpulist(b.mask)}) share "
                f"CPUs {format_cpulist(shared)}" + (" as affrun planned (--mode numa/socket/map)" if planned else ""),
                "ranks on the same cores compete for them; the slowest rank sets the pace of every collective",
                "give each rank its own cores: launch with `affrun torchrun` / `affrun exec` (--mode exclusive)",
            ))
    return out


LOW_UTILISATION = 20.0


def gpu_findings(audit: JobAudit) -> list[Finding]:
    out: list[Finding] = []
    for gpu in audit.gpus.gpus:
        mean = gpu.mean_utilisation
        if not gpu.pids or mean is None or len(gpu.utilisation) < 5 or mean >= LOW_UTILISATION:
            continue
        out.append(Finding(
            "gpu-low-utilisation", "info",
            f"GPU {gpu.index} ({gpu.pci}) used by pids {', '.join(map(str, sorted(gpu.pids)))} was {mean:.0f}% busy "
            f"on average over {len(gpu.utilisation)} samples",
            "a GPU that waits is often fed too slowly by the CPU side: data loading, a starved or collapsed rank",
            "look at the other findings; check the DataLoader workers' CPUs and the rank's OMP_NUM_THREADS",
        ))
    return out
