"""``affrun doctor --pid``: every thread's role, its home in the thread plan, and its verdict. Pure.
docs/doctor.md ("Every thread's home") says how each is told."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from launcher.base.siblings import live_cores
from launcher.base.untrusted import printable_ascii
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord
from launcher.doctor.nccl_live import is_nccl_thread
from launcher.doctor.rank_fields import LiveFields, binding_problem, environ_fields, sorted_cpus
from launcher.env.omp_syntax import parse_gomp_cpu_affinity, parse_places
from launcher.plan.threads import ThreadPlan, WorkerHome, thread_plan

LiveRole = Literal["main", "omp", "interop", "pin_memory", "nccl_proxy", "worker", "torch", "unknown"]
LIVE_ROLES: tuple[LiveRole, ...] = ("main", "omp", "interop", "pin_memory", "nccl_proxy", "worker", "torch", "unknown")
Verdict = Literal["home", "strayed", "unplanned"]
VERDICTS: tuple[Verdict, ...] = ("home", "strayed", "unplanned")
# How a role was told: the tid, the thread's name, its mask (an OpenMP place), its process (a worker), or not at all.
IdentifiedBy = Literal["tid", "name", "place", "process", "none"]

# The names torch 2.13 gives its threads (docs/doctor.md, "Every thread's home"); COMM_PREFIXES are homed with NCCL's.
WORKER_NAME = "pt_data_worker"
PIN_MEMORY_NAME = "pt_data_pin"
INTEROP_NAMES = ("PTThreadPool", "pt_thread_pool")
TORCH_PREFIX = "pt_"
COMM_PREFIXES = ("pt_nccl_", "pt_gloo_", "gloo_", "pt_tcpstore")
RUN_SOURCE = "affrun run's plan (AFFRUN_PLAN)"
ENV_SOURCE = "its AFFRUN_* variables"


def run_fields(process: ProcessRecord) -> LiveFields | None:
    """The fields of the rank ``affrun run``'s hook made ``process`` (its variables are not in
    ``/proc/PID/environ``: the hook wrote them in-process); ``None`` when the plan makes it no rank."""
    from launcher.base.errors import AffrunError
    from launcher.bind.wire import PLAN_VARIABLE, read_job
    from launcher.doctor.run_checks import planned_cpus

    planned = planned_cpus(process)
    if planned is None:
        return None
    try:
        record = read_job(process.environ.get(PLAN_VARIABLE) or "").ranks[planned[0]]
    except (AffrunError, IndexError):
        return None
    compute = sorted_cpus(c for core in record.compute_cores for c in core) or sorted_cpus(record.cpus)
    return LiveFields(planned[0], sorted_cpus(record.cpus), compute, sorted_cpus(record.loader_cpus),
                      sorted_cpus(record.comm_cpus), sorted_cpus(record.main_cpus), record.threads)


def team_places(environ: Mapping[str, str]) -> tuple[frozenset[int], ...]:
    """The places an OpenMP runtime binds team threads to: ``OMP_PLACES`` after the first (the main thread's),
    else each CPU of ``GOMP_CPU_AFFINITY``; none without either (or with an abstract name such as ``cores``)."""
    places = parse_places(environ["OMP_PLACES"]) if environ.get("OMP_PLACES") else None
    if places:
        return tuple(places[1:])
    cpus = parse_gomp_cpu_affinity(environ["GOMP_CPU_AFFINITY"]) if environ.get("GOMP_CPU_AFFINITY") else None
    return tuple(frozenset({c}) for c in cpus or ())


def all_places(environ: Mapping[str, str]) -> tuple[frozenset[int], ...]:
    """Every place of ``OMP_PLACES`` (the main thread's too), or of ``GOMP_CPU_AFFINITY``."""
    places = parse_places(environ["OMP_PLACES"]) if environ.get("OMP_PLACES") else None
    return tuple(places) if places else team_places(environ)


def main_name(p: ProcessRecord) -> str:
    """The process's name now: its main thread's (a DataLoader worker renames itself after the fork)."""
    main = p.threads.get(p.pid)
    return main.comm if main is not None else p.comm


def is_worker(p: ProcessRecord, rank: ProcessRecord, by_pid: Mapping[int, ProcessRecord]) -> bool:
    """A DataLoader worker (named ``pt_data_worker``) or a multiprocessing child of ``rank``: spawned
    (``spawn_main``), forked (the rank's command line), or forked by a forkserver (its command line)."""
    if main_name(p) == WORKER_NAME:
        return True
    line = " ".join(p.cmdline)
    if "resource_tracker" in line or "forkserver import main" in line:
        return False  # multiprocessing's helpers: no worker of the plan
    if "spawn_main" in line or (p.cmdline and p.cmdline == rank.cmdline):
        return True
    parent = by_pid.get(p.ppid)
    return parent is not None and "forkserver" in " ".join(parent.cmdline) and p.cmdline == parent.cmdline


def _role(t: ThreadRecord, p: ProcessRecord, places: Sequence[frozenset[int]],
          plan: ThreadPlan | None) -> tuple[LiveRole, IdentifiedBy]:
    if t.tid == p.pid:
        return "main", "tid"
    if is_nccl_thread(t.comm) or (t.comm.startswith(COMM_PREFIXES) and printable_ascii(t.comm)):
        return "nccl_proxy", "name"
    if t.comm == PIN_MEMORY_NAME:
        return "pin_memory", "name"
    if t.comm in INTEROP_NAMES:
        return "interop", "name"
    if t.comm.startswith(TORCH_PREFIX) and printable_ascii(t.comm):  # torch names from literals and numbers
        return "torch", "name"
    team = frozenset(plan.omp.cpus) if plan is not None and plan.omp.cpus != plan.main.cpus else None
    if t.allowed and (t.allowed in places or t.allowed == team):
        return "omp", "place"
    return "unknown", "none"


def pool_union(plan: ThreadPlan) -> frozenset[int]:
    """Where threads not told apart may run: the OpenMP team's home and the main thread's (every pool that
    inherits its mask)."""
    return frozenset(plan.omp.cpus) | frozenset(plan.interop.cpus)


def home_of(role: LiveRole, plan: ThreadPlan) -> frozenset[int]:
    homes: dict[str, tuple[int, ...]] = {h.role: h.cpus for h in plan.homes()}
    return frozenset(homes[role]) if role in homes else pool_union(plan)


def _judge(t: ThreadRecord, home: frozenset[int] | None) -> None:
    t.home = home
    t.verdict = "unplanned" if home is None else "strayed" if set(t.ran) - home else "home"


def loader_sets(workers: Sequence[ProcessRecord]) -> list[list[ProcessRecord]]:
    """The workers by DataLoader, oldest first: workers found running in a common sample are one set (several
    DataLoaders at once count as one); a DataLoader whose workers started after the last set's ended (one per
    epoch) is a set of its own, not more workers of the same one."""
    sets: list[list[ProcessRecord]] = []
    end = -1
    for w in sorted(workers, key=lambda w: (w.seen[0], w.pid)):
        if sets and w.seen[0] <= end:
            sets[-1].append(w)
            end = max(end, w.seen[1])
        else:
            sets.append([w])
            end = w.seen[1]
    return sets


def _match_workers(workers: Sequence[ProcessRecord], homes: Sequence[WorkerHome]) -> dict[int, tuple[WorkerHome, str]]:
    """Each worker of one set its home: the one whose CPUs are its mask, else, for a worker still running, the
    next free one in pid order (workers start in index order; their index is not in ``/proc``). A worker that
    has exited with a mask that is no home's gets none: it is not judged by a home it may never have had."""
    free = list(homes)
    out: dict[int, tuple[WorkerHome, str]] = {}
    for w in workers:
        match = next((h for h in free if frozenset(h.cpus) == w.main_mask), None)
        if match is not None:
            out[w.pid] = (match, "mask")
            free.remove(match)
    for w in workers:
        if w.pid not in out and w.alive and free:
            out[w.pid] = (free.pop(0), "pid order")
    return out


def assign_homes(audit: JobAudit) -> None:
    """Give every sampled thread its role, its home (ranks with a plan and their workers) and its verdict."""
    by_pid = {p.pid: p for p in audit.processes}
    for p in audit.processes:  # first every process as if it had no plan
        places = team_places(p.environ)
        for t in p.threads.values():
            t.role, t.identified_by = _role(t, p, places, None)
            _judge(t, None)
    for rank in audit.ranks():
        children = sorted(audit.children_of(rank), key=lambda c: c.pid)
        workers = [c for c in children if is_worker(c, rank, by_pid)]
        for w in workers:
            for t in w.threads.values():
                t.role, t.identified_by = "worker", "process"
        problem = binding_problem(rank.environ, audit.online)  # a bad AFFRUN_CPUS is no plan to judge against
        fields = environ_fields(rank.environ, rank.rank) if problem is None else None
        source = ENV_SOURCE
        if fields is None:
            fields, source = run_fields(rank), RUN_SOURCE
        if fields is None:
            rank.plan_problem = rank.plan_problem or problem or ""
            continue
        # One DataLoader's workers at a time (loader_sets): the rank's plan counts the latest set's, each set is
        # matched to the homes of a plan of its own count
        sets = loader_sets(workers) or [[]]
        cores = live_cores(fields.cpus)
        plan = thread_plan(fields, len(sets[-1]), cores)
        rank.plan_source, rank.thread_plan, rank.workers_seen = source, plan, len(sets[-1])
        places = team_places(rank.environ)
        for t in rank.threads.values():
            role, t.identified_by = _role(t, rank, places, plan)
            t.role = role
            _judge(t, home_of(role, plan))
        for group in sets:
            homes = plan.workers if group is sets[-1] else thread_plan(fields, len(group), cores).workers
            for pid, (home, how) in _match_workers(group, homes).items():
                w = next(w for w in group if w.pid == pid)
                w.worker, w.workers_seen, w.worker_matched_by, w.plan_source = home, len(group), how, source
                for t in w.threads.values():
                    _judge(t, frozenset(home.cpus))


def thread_summary(p: ProcessRecord) -> dict[str, Any]:
    """How many threads, by verdict and by role (the roles in :data:`LIVE_ROLES` order)."""
    threads = p.threads.values()
    return {"threads": len(p.threads),
            "verdicts": {v: n for v in VERDICTS if (n := sum(1 for t in threads if t.verdict == v))},
            "roles": {r: n for r in LIVE_ROLES if (n := sum(1 for t in threads if t.role == r))}}


def rank_of(audit: JobAudit, p: ProcessRecord) -> ProcessRecord | None:
    """The rank ``p`` is or belongs to."""
    if p.role == "rank":
        return p
    return next((r for r in audit.ranks() if r.pid == p.rank_pid), None) if p.role == "child" else None


def cpu_use(audit: JobAudit) -> dict[int, dict[tuple[int, str, bool], int]]:
    """CPU -> (pid of the rank, thread role, strayed) -> samples that show a thread ran there: the ranks' and
    their children's threads only (what ``affrun show --pid`` draws)."""
    out: dict[int, dict[tuple[int, str, bool], int]] = {}
    for p in audit.processes:
        rank = rank_of(audit, p)
        if rank is None:
            continue
        for t in p.threads.values():
            for cpu, n in t.ran.items():
                key = (rank.pid, t.role, cpu in t.strayed_to)
                cell = out.setdefault(cpu, {})
                cell[key] = cell.get(key, 0) + n
    return out
