"""``affrun doctor --pid``: the records of what was seen of a running job, and each process's role
(:func:`assign_roles`, pure): *rank*, *child* of a rank, *launcher*. docs/doctor.md says how roles are told."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.base import procfs
from launcher.base.cpulist import format_cpulist
from launcher.base.slurm_step import slurm_bound
from launcher.bind.readback import exported_cpus
from launcher.context.runtimes import LoadedRuntime
from launcher.doctor.contention import Neighbour, Throttling
from launcher.doctor.findings import Finding
from launcher.doctor.gpu import GpuReport
from launcher.doctor.rank_fields import binding_problem
from launcher.doctor.run_checks import planned_cpus
from launcher.feed.figures import FeedFigures
from launcher.feed.verdict import Verdict
from launcher.plan.threads import ThreadPlan, WorkerHome


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
    # schedstat at its first and latest sample: (monotonic seconds, ns on a CPU, ns waiting for one)
    sched_first: tuple[float, int, int] | None = None
    sched_last: tuple[float, int, int] | None = None

    def note_sched(self, now: float, run_ns: int, wait_ns: int) -> None:
        if self.sched_first is None:
            self.sched_first = (now, run_ns, wait_ns)
        self.sched_last = (now, run_ns, wait_ns)

    def _sched_delta(self) -> tuple[float, float, float] | None:
        """(seconds, seconds on a CPU, seconds waiting for one) between its first and latest readings."""
        if self.sched_first is None or self.sched_last is None or self.sched_last[0] <= self.sched_first[0]:
            return None
        (t0, r0, w0), (t1, r1, w1) = self.sched_first, self.sched_last
        return t1 - t0, max(0, r1 - r0) / 1e9, max(0, w1 - w0) / 1e9

    def cpu_wait(self) -> float | None:
        """The share of the sample it waited on a run queue for a CPU (``None``: read fewer than twice)."""
        delta = self._sched_delta()
        return None if delta is None else min(1.0, delta[2] / delta[0])

    def cpu_share(self) -> float | None:
        """The CPUs' worth it ran over the sample (schedstat's nanoseconds: finer than ``cpu_percent``'s ticks)."""
        delta = self._sched_delta()
        return None if delta is None else min(1.0, delta[1] / delta[0])

    def demand(self) -> float | None:
        """The CPUs' worth it wanted over the sample: its time on a CPU and waiting for one, over the time."""
        delta = self._sched_delta()
        return None if delta is None else min(1.0, (delta[1] + delta[2]) / delta[0])

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
    seen: tuple[int, int] = (0, 0)  # the first and last sample (0, 1, ...) that found it running
    image: tuple[int, int, int] = (0, 0, 0)  # where its program's code and stack lie (procfs.ThreadStat.image)
    feed: FeedFigures | None = None  # the meter's figures so far (--feed-report)
    # filled by launcher.doctor.thread_homes: where its thread plan comes from ("": none), a rank's plan, and
    # for a DataLoader worker its home in its rank's plan, of how many workers, and how it was matched
    plan_source: str = ""
    plan_problem: str = ""  # why it has no plan though it may carry one: an environment not readable, a bad AFFRUN_CPUS
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
    online: frozenset[int] = frozenset()  # the CPUs online: a binding to any other CPU cannot have been made here
    # what the job could use (launcher.doctor.collapse): the audited process's cgroup cpuset and the online
    # CPUs, said in words; and its parent (pid, command line, mask): the mask the launcher started with
    reference: frozenset[int] = frozenset()
    reference_source: str = ""
    parent: tuple[int, str, frozenset[int]] | None = None
    throttling: list[Throttling] = field(default_factory=list)  # the job's cgroups over the sample
    neighbours: list[Neighbour] = field(default_factory=list)  # busy processes outside the job
    starvation: dict[int, RankStarvation] = field(default_factory=dict)  # by rank pid: launcher.doctor.starvation
    slowed: bool = False  # samples came less often than asked, to keep the sampler's cost bounded (sampling.DUTY)

    def ranks(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "rank"]

    def children_of(self, rank: ProcessRecord) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == "child" and p.rank_pid == rank.pid]


def _pct(value: float | None) -> str:
    return "?" if value is None else f"{100 * value:.0f}%"


@dataclass(frozen=True)
class RankGpu:
    """The GPU a rank uses and how busy it was over the sample (a share, ``None`` when NVML gave no figure)."""

    index: int  # NVML's (PCI bus order)
    pci: str
    busy: float | None
    measured: str  # "process": the rank's own processes' share (nvmlDeviceGetProcessUtilization); "device"
    mapped_by: str  # how the rank was matched to it: "process", "AFFRUN_GPU_PCI", "CUDA_VISIBLE_DEVICES"...

    def text(self) -> str:
        return (f"gpu {self.index} ({self.pci}) {_pct(self.busy)} busy ({'its processes' if self.measured == 'process' else 'the whole device'}; "
                f"matched by {self.mapped_by})")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "pci": self.pci, "busy_fraction": None if self.busy is None else round(self.busy, 3),
                "measured": self.measured, "mapped_by": self.mapped_by}


@dataclass
class RankStarvation:
    main_tid: int | None = None
    main_cpu_percent: float = 0.0
    main_cpu_wait: float | None = None  # the share of the sample the main thread waited on a run queue
    main_ran: frozenset[int] = frozenset()
    main_allowed: frozenset[int] = frozenset()
    demand: float | None = None  # CPUs' worth its threads (its children's too) wanted: on a CPU or waiting
    used: float | None = None  # CPUs' worth they ran
    busy_threads: int = 0  # of them, those that ran at least 5% of a CPU
    supply: frozenset[int] = frozenset()  # the CPUs they may use (the union of their masks)
    used_on_main: float | None = None  # CPUs' worth the job's other threads ran on the main thread's CPUs
    throttling: Throttling | None = None  # its cgroup's
    neighbours: list[Neighbour] = field(default_factory=list)  # busy outside processes that may run on its CPUs
    gpu: RankGpu | None = None
    cause: str | None = None  # launcher.feed.verdict's COLLAPSE, THROTTLED, OVERSUBSCRIBED, NEIGHBOURS
    cause_text: str = ""
    verdict: Verdict | None = None

    def main_line(self) -> str:
        return (f"main thread {self.main_tid}: CPU {self.main_cpu_percent:.0f}%, waited {_pct(self.main_cpu_wait)} "
                f"for a CPU, ran on CPUs {format_cpulist(self.main_ran) or '-'} (allowed "
                f"{format_cpulist(self.main_allowed) or '-'})")

    def supply_line(self) -> str:
        demand = "?" if self.demand is None else f"{self.demand:.1f}"
        used = "?" if self.used is None else f"{self.used:.1f}"
        on_main = "" if self.used_on_main is None else (
            f"; the job's other threads ran {self.used_on_main:.1f} CPUs' worth on the main thread's "
            f"{len(self.main_allowed)} CPU(s)")
        throttled = ""
        if self.throttling is not None and self.throttling.periods:
            t = self.throttling
            throttled = (f"; cgroup throttled in {t.throttled_periods} of {t.periods} quota periods "
                         f"({t.throttled_s:.2f} s)")
        return (f"CPU demand {demand} CPUs (ran {used}; {self.busy_threads} busy thread(s)) on {len(self.supply)} "
                f"CPU(s) {format_cpulist(self.supply) or '-'}{on_main}{throttled}")

    def to_json(self) -> dict[str, Any]:
        return {
            "main_thread": {"tid": self.main_tid, "cpu_percent": round(self.main_cpu_percent, 1),
                            "cpu_wait_fraction": None if self.main_cpu_wait is None else round(self.main_cpu_wait, 3),
                            "ran": format_cpulist(self.main_ran), "allowed": format_cpulist(self.main_allowed)},
            "cpu_demand": None if self.demand is None else round(self.demand, 2),
            "cpu_used": None if self.used is None else round(self.used, 2),
            "busy_threads": self.busy_threads,
            "supply_cpus": format_cpulist(self.supply),
            "job_used_on_main_cpus": None if self.used_on_main is None else round(self.used_on_main, 2),
            "throttling": self.throttling.to_json() if self.throttling else None,
            "neighbours": [n.to_json() for n in self.neighbours],
            "gpu": self.gpu.to_json() if self.gpu else None,
            "cpu_cause": self.cause,
        }

    def verdict_line(self) -> str:
        if self.verdict is None:
            return "verdict: -"
        v = self.verdict
        kind = v.kind + (f" (likely {v.likely}{f', {v.cause}' if v.cause else ''})" if v.likely else
                         f" ({v.cause})" if v.cause else "")
        return f"verdict: {kind}: {v.evidence}" + (f" -- fix: {v.fix}" if v.fix else "")


def _rank_key(p: ProcessRecord) -> tuple[str, int] | None:
    """Which local rank ``p`` is, and by what: a launcher's variable; else affrun's binding (``AFFRUN_LOCAL_RANK``
    with ``AFFRUN_PLAN_ID``), or the rank ``affrun run``'s hook made it."""
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
    """Mark ranks (a process that started ranks of its own is their launcher), their children and the launcher,
    and the CPUs each rank owns."""
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
        r.owned = owned_cpus(r, audit.online)
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


def owned_cpus(rank: ProcessRecord, online: frozenset[int] = frozenset()) -> frozenset[int]:
    """The CPUs a rank was given: ``AFFRUN_CPUS`` (naming only CPUs of ``online``), or its rank's in ``affrun
    run``'s plan; else what its threads and, unless srun bound it, its launcher's threads span."""
    if binding_problem(rank.environ, online) is None and (planned := exported_cpus(rank.environ)):
        return planned
    under_run = planned_cpus(rank)  # affrun run's hook binds in-process: AFFRUN_CPUS is not in /proc's environ
    if under_run:
        return under_run[1]
    own = rank.mask
    if slurm_bound(rank.environ) or not rank.launcher_mask:
        return own
    return own | rank.launcher_mask
