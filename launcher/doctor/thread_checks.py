"""``affrun doctor --pid``: each thread against its home (``thread-strayed``, ``mask-changed-after-start``,
``pool-oversubscribed``, ``main-off-priority``). docs/doctor.md ("Every thread's home")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.doctor.binder_evidence import likely_binders
from launcher.doctor.findings import Finding
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord
from launcher.doctor.thread_homes import all_places, pool_union
from launcher.env.omp_syntax import thread_count
from launcher.env.variables import HOOKS_VARIABLE, POOL_OF, USER_POOLS_VARIABLE
from launcher.plan.threads import ThreadPlan

Ancestors = Callable[[int], list[tuple[int, str]]]
BUSY_PERCENT = 5.0  # a thread is busy when it used at least this share of one CPU over the sample
LISTED = 5  # threads named in one finding; the rest are counted


def _cpus(cpus: frozenset[int] | set[int] | Sequence[int]) -> str:
    return format_cpulist(cpus) or "none"


def _thread(t: ThreadRecord) -> str:
    return f"tid {t.tid} ({t.comm}, {t.role})"


def _listed(items: Sequence[str]) -> str:
    more = len(items) - LISTED
    return "; ".join(items[:LISTED]) + (f"; and {more} more" if more > 0 else "")


def worker_name(p: ProcessRecord) -> str:
    return f"DataLoader worker {p.worker.index} of {p.workers_seen} (pid {p.pid})" if p.worker else f"pid {p.pid}"


def _items(rank: ProcessRecord, p: ProcessRecord, threads: Sequence[ThreadRecord], verb: str,
           cpus_of: Callable[[ThreadRecord], frozenset[int]], home: bool = True) -> list[str]:
    """The rank's own threads one by one; a worker's together (a worker's threads share one home)."""
    def outside(t: ThreadRecord) -> str:
        return f", outside its home {_cpus(t.home or ())}" if home and t.home is not None else ""

    if p is rank:
        return [f"{_thread(t)} {verb} CPUs {_cpus(cpus_of(t))}{outside(t)}" for t in threads]
    where = frozenset().union(*(cpus_of(t) for t in threads))
    return [f"{worker_name(p)}: {len(threads)} of its {len(p.threads)} thread(s) ({', '.join(sorted({t.comm for t in threads}))}) "
            f"{verb} CPUs {_cpus(where)}{outside(threads[0])}"]


def _planned(audit: JobAudit) -> list[tuple[ProcessRecord, ThreadPlan, list[ProcessRecord]]]:
    out = []
    for rank in audit.ranks():
        if rank.thread_plan is not None:
            workers = sorted((c for c in audit.children_of(rank) if c.worker is not None), key=lambda c: c.pid)
            out.append((rank, rank.thread_plan, workers))
    return out


def thread_findings(audit: JobAudit, ancestors_of: Ancestors | None = None) -> list[Finding]:
    """Every thread finding of every rank that carries a thread plan, its DataLoader workers' included: at most
    one of each id a rank, which lists the rank's threads and each worker's."""
    out: list[Finding] = []
    for rank, plan, workers in _planned(audit):
        chain = ancestors_of(rank.pid) if ancestors_of else []
        procs = [rank, *workers]
        out.extend(strayed_findings(rank, plan, procs))
        out.extend(mask_findings(rank, plan, procs, chain))
        out.extend(busy_pool_findings(audit, rank, plan, procs))
        out.extend(main_findings(rank, plan))
    return out


_STRAY_FIXES = {
    "worker": "pin each DataLoader worker to its home: keep --rank-hooks auto, or pass "
              "worker_init_fn=launcher.torch.worker_init_fn to the DataLoader",
    "pin_memory": "keep --rank-hooks auto, which moves the pin-memory thread to its home when the DataLoader "
                  "starts it",
    "omp": "let affrun's OMP_PLACES and OMP_PROC_BIND place the OpenMP team (leave them unset in the job; "
           "--env-policy safe)",
    "nccl_proxy": "keep cores for NCCL: --comm-cores 1 sets NCCL_PROXY_CPUSET (NCCL 2.28.3 and later)",
}
_STRAY_OTHER = ("find what moved the other threads (mask-changed-after-start names a binder when the evidence "
                "does): a thread a library starts inherits its caller's mask")


def strayed_findings(rank: ProcessRecord, plan: ThreadPlan, procs: Sequence[ProcessRecord]) -> list[Finding]:
    """The threads of the rank and its workers (``procs``) that ran outside their homes (a rank's main thread with
    a core of its own is ``main-off-priority``'s)."""
    strays = {p.pid: [t for t in sorted(p.threads.values(), key=lambda t: t.tid) if t.verdict == "strayed"
                      and not (p is rank and t.tid == rank.pid and plan.main.pinned)] for p in procs}
    every = [t for ts in strays.values() for t in ts]
    if not every:
        return []
    beyond = frozenset().union(*(t.strayed_to for t in every)) - rank.owned
    fixes = list(dict.fromkeys(_STRAY_FIXES.get(t.role, _STRAY_OTHER) for t in every))
    items = [item for p in procs if strays[p.pid]
             for item in _items(rank, p, strays[p.pid], "ran on", lambda t: t.strayed_to)]
    return [Finding(
        "thread-strayed", "error" if beyond else "warning",
        f"{len(every)} thread(s) ran outside their homes in the thread plan (from {rank.plan_source}): "
        f"{_listed(items)}"
        + (f"; CPUs {_cpus(beyond)} are not the rank's" if beyond else ""),
        "a thread off its home takes CPU time from the threads that live there (the OpenMP team, another "
        "DataLoader worker, NCCL's proxy thread); off the rank's CPUs it competes with another rank, and the "
        "slowest rank sets the pace of every collective",
        "; ".join(fixes),
        rank.label(),
    )]


def explained_masks(rank: ProcessRecord, plan: ThreadPlan, p: ProcessRecord) -> set[frozenset[int]]:
    """The masks affrun or the rank's OpenMP runtime set: the rank's CPUs, each home of its plan, each place."""
    masks = {rank.owned, *(frozenset(h.cpus) for h in plan.homes()), *all_places(rank.environ)}
    if p is not rank and p.worker is not None:
        masks.add(frozenset(p.worker.cpus))
    return masks


def _explained(t: ThreadRecord, masks: set[frozenset[int]], rank: ProcessRecord, plan: ThreadPlan,
               p: ProcessRecord) -> bool:
    if not t.allowed or t.allowed in masks:
        return True
    if t.role == "nccl_proxy":  # NCCL narrows its threads to its caller's mask and the GPU's CPUs
        proxy = rank.environ.get("NCCL_PROXY_CPUSET", "")
        try:
            return t.allowed <= rank.owned or t.allowed == parse_cpulist(proxy)
        except ValueError:
            return t.allowed <= rank.owned
    if p is not rank:  # worker_init_fn and the worker hook split the workers' CPUs, whatever the worker count
        return t.allowed <= frozenset(c for w in plan.workers for c in w.cpus)
    return False


def mask_findings(rank: ProcessRecord, plan: ThreadPlan, procs: Sequence[ProcessRecord],
                  chain: Sequence[tuple[int, str]]) -> list[Finding]:
    """Threads of the rank and its workers whose mask nothing of affrun's explains, and who may have set it."""
    masks = {p.pid: explained_masks(rank, plan, p) for p in procs}
    odd = {p.pid: [t for t in sorted(p.threads.values(), key=lambda t: t.tid)
                   if not _explained(t, masks[p.pid], rank, plan, p)] for p in procs}
    every = [t for ts in odd.values() for t in ts]
    if not every:
        return []
    beyond = frozenset().union(*(t.allowed for t in every)) - rank.owned
    off_home = any(t.home is not None and not t.allowed <= t.home for t in every)

    def mask(t: ThreadRecord) -> frozenset[int]:
        return t.allowed

    items = [item for p in procs if odd[p.pid] for item in _items(rank, p, odd[p.pid], "may run on", mask, False)]
    moved = [t for t in every if t.first_allowed != t.allowed]
    binders = list({b.what: b for p in procs if odd[p.pid] for b in likely_binders(p, chain)}.values())
    named = "; ".join(b.what for b in binders) if binders else (
        "no binder was identified: something in the process called sched_setaffinity (the script, or a library "
        "it loaded: os.sched_setaffinity, psutil's cpu_affinity, taskset -p from outside)")
    fixes = [b.fix for b in binders] or [
        "find the call that sets the mask and remove it, or keep it within the rank's CPUs "
        f"({_cpus(rank.owned)}); affrun's variables say where each thread belongs (docs/threads.md)"]
    env_fix = {k: v for b in binders for k, v in b.env_fix.items()}
    return [Finding(
        "mask-changed-after-start", "error" if beyond else "warning" if off_home else "info",
        f"{len(every)} thread(s) have a CPU mask that is neither what affrun applied (CPUs {_cpus(rank.owned)}, the "
        f"thread plan's homes) nor one of the rank's OpenMP places: {_listed(items)}"
        + (f"; CPUs {_cpus(beyond)} are not the rank's" if beyond else "")
        + (f"; {len(moved)} of them changed while sampled" if moved else "") + f". Likely binder: {named}",
        "two binders on one rank fight: the last to set a mask wins, and threads started after it inherit its "
        "choice; a mask wider than the rank's lets its threads run on another rank's cores",
        "; ".join(dict.fromkeys(fixes)),
        rank.label(),
        env_fix,
    )]


def _busy(ts: Sequence[ThreadRecord], seconds: float, cpus: int) -> list[ThreadRecord]:
    """The threads that used at least :data:`BUSY_PERCENT` of a CPU, or a quarter of their share of the ``cpus``
    when more ran there than that allows (docs/doctor.md)."""
    ran = [t for t in ts if t.cpu_percent(seconds) > 0]
    floor = min(BUSY_PERCENT, 25.0 * max(cpus, 1) / max(len(ran), 1))
    return [t for t in ran if t.cpu_percent(seconds) >= floor]


def _user_pools(environ: dict[str, str]) -> list[str]:
    return [n.strip() for n in environ.get(USER_POOLS_VARIABLE, "").split(",") if n.strip() in POOL_OF]


WORKER_HELPERS = 2  # multiprocessing's feeder and resource sharer threads in a worker (docs/doctor.md)


def _pool_groups(rank: ProcessRecord, plan: ThreadPlan, p: ProcessRecord) -> list[
        tuple[str, list[ThreadRecord], frozenset[int], int]]:
    """(what, threads, home CPUs, busy threads beyond them that are no pool's) of each pool of ``p`` whose
    threads can be counted."""
    others = [t for t in p.threads.values() if t.tid != p.pid]
    if p is not rank:
        return [("threads besides its main one (its pools: OpenMP, BLAS, OpenCV, Rayon...; told apart by none; "
                 f"{WORKER_HELPERS} of them may be multiprocessing's feeder and resource sharer threads)",
                 others, frozenset(p.worker.cpus) if p.worker else frozenset(), WORKER_HELPERS)]
    by_role = {r: [t for t in others if t.role == r] for r in ("omp", "interop")}
    return [("its OpenMP team's threads", by_role["omp"], frozenset(plan.omp.cpus), 0),
            ("torch's inter-op threads", by_role["interop"], frozenset(plan.interop.cpus), 0),
            ("threads not told apart (counted against the union of its pool homes)",
             [t for t in others if t.role in ("torch", "unknown")], pool_union(plan), 0)]


def busy_pool_findings(audit: JobAudit, rank: ProcessRecord, plan: ThreadPlan,
                       procs: Sequence[ProcessRecord]) -> list[Finding]:
    """More busy threads of one pool (besides the main thread, thread 0 of every pool) than the pool's CPUs, in
    the rank or in any of its workers."""
    items: list[str] = []
    busiest, smallest = 0, 0
    in_worker = False
    for p in procs:
        for what, threads, home, helpers in _pool_groups(rank, plan, p):
            busy = sorted(_busy(threads, audit.duration, len(home)), key=lambda t: t.tid)
            if not home or len(busy) <= len(home) + helpers:
                continue
            busiest, smallest = max(busiest, len(busy)), min(smallest or len(home), len(home))
            in_worker = in_worker or p is not rank
            names = ", ".join(f"{t.tid} {t.comm} {t.cpu_percent(audit.duration):.0f}%" for t in busy[:LISTED])
            where = "" if p is rank else f"{worker_name(p)}: "
            items.append(f"{where}{len(busy)} busy {what} on {len(home)} CPU(s) ({_cpus(home)}): tids {names}"
                         + (f" and {len(busy) - LISTED} more" if len(busy) > LISTED else ""))
    if not items:
        return []
    users = [f"{n}={rank.environ[n]}" for n in _user_pools(rank.environ)
             if n in rank.environ and (thread_count(rank.environ[n]) or 0) > smallest]
    fix = ("size every pool inside a DataLoader worker to its CPUs: keep --rank-hooks auto, or in worker_init_fn "
           "call torch.set_num_threads(len(os.sched_getaffinity(0))) and cv2.setNumThreads(1)" if in_worker else
           "size each pool to its home's CPUs: do not raise affrun's thread counts, and start no more threads of "
           "one pool than its home holds (torch.set_num_interop_threads, your own thread pools)")
    if users:
        fix = f"lower or unset your {', '.join(users)} (AFFRUN_USER_POOLS names them as yours); then " + fix
    return [Finding(
        "pool-oversubscribed", "warning",
        f"a pool ran more busy threads than its CPUs (up to {busiest}): {_listed(items)}"
        + (f"; your {', '.join(users)} (AFFRUN_USER_POOLS) may ask for them" if users else ""),
        "more busy threads than CPUs take turns on them: each waits for the others, and a parallel region ends "
        "with its slowest thread (4 DataLoader workers per GPU on 64 cores started 2,048 OpenCV threads and "
        "loaded about 4x slower: open-mmlab/mmdetection #6867)",
        fix,
        rank.label(),
    )]


def main_findings(rank: ProcessRecord, plan: ThreadPlan) -> list[Finding]:
    """A rank with ``AFFRUN_MAIN_CPUS`` whose main thread ran, or may run, off that core."""
    main = rank.threads.get(rank.pid)
    if not plan.main.pinned or main is None:
        return []
    own = frozenset(plan.main.cpus)
    ran = frozenset(main.ran) - own
    may = main.allowed - own
    if not ran and not may:
        return []
    where = f"ran on CPUs {_cpus(ran)}" if ran else f"may run on CPUs {_cpus(may)} (its mask is {_cpus(main.allowed)})"
    hooks = rank.environ.get(HOOKS_VARIABLE, "")
    fix = (f"drop --rank-hooks none (the rank's hook pins the main thread at start), or pin it first thing in the "
           f"script: os.sched_setaffinity(0, {{{', '.join(map(str, sorted(own)))}}}) in the main thread"
           if hooks == "none" else
           "the rank's hook pins the main thread at start: something moved it later (mask-changed-after-start "
           f"names what when the evidence does); remove that call, or pin it again: os.sched_setaffinity(0, "
           f"{{{', '.join(map(str, sorted(own)))}}}) in the main thread")
    return [Finding(
        "main-off-priority", "warning",
        f"the main thread (tid {main.tid}) has CPUs {_cpus(own)} of its own (AFFRUN_MAIN_CPUS) but {where}",
        "the main thread launches the GPU's kernels: on a core of its own no other thread delays a launch, "
        "elsewhere it waits behind the OpenMP team and the loaders (46.1k against 75.8k tokens/s on a DGX B300 "
        "with the main thread on a priority core: vllm-project/vllm #43775)",
        fix,
        rank.label(),
    )]
