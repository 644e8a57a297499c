"""``affrun doctor --pid PID``: what the sampled records of a job mean (:func:`job_findings`): each rank's
environment against its runtimes, the collapse, migrations, core kinds, the feed, ranks sharing CPUs, unbound
processes, idle GPUs. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.base.cpulist import format_cpulist
from launcher.bind.readback import exported_cpus
from launcher.context.binders import other_binders
from launcher.context.runtimes import openmp_names
from launcher.doctor.collapse import collapse_findings
from launcher.doctor.diagnose import check_environment
from launcher.doctor.facts import Facts, intel_openmp_version, numa_binding_source
from launcher.doctor.findings import Finding, merge_subjects
from launcher.doctor.host_checks import check_double_binding
from launcher.doctor.live import JobAudit, ProcessRecord
from launcher.doctor.run_checks import unbound_findings
from launcher.feed import verdict as v
from launcher.feed.figures import FeedFigures
from launcher.plan.kinds import plan_kinds
from launcher.topology.model import Topology


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
    """Ranks whose masks share CPUs: info where affrun planned them to share those CPUs (shared modes), an error
    where it gave them disjoint CPUs (something moved a mask after start), a warning where affrun did not plan."""
    out: list[Finding] = []
    for i, a in enumerate(ranks):
        for b in ranks[i + 1 :]:
            shared = a.mask & b.mask
            if not shared:
                continue
            given_a, given_b = exported_cpus(a.environ), exported_cpus(b.environ)
            affrun = bool(given_a and given_b)
            planned = affrun and shared <= given_a & given_b
            said = f"{a.label()} (CPUs {format_cpulist(a.mask)}) and {b.label()} (CPUs {format_cpulist(b.mask)}) share " \
                   f"CPUs {format_cpulist(shared)}"
            if planned:
                said += " as affrun planned (--mode numa/socket/map)"
            elif affrun:
                said += (f", which affrun did not plan: it gave them CPUs {format_cpulist(given_a)} and "
                         f"{format_cpulist(given_b)}, and a mask changed after start")
            out.append(Finding(
                "rank-overlap", "info" if planned else "error" if affrun else "warning", said,
                "ranks on the same cores compete for them; the slowest rank sets the pace of every collective",
                "find what moved the mask (mask-changed-after-start, thread-strayed)" if affrun and not planned else
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


def feed_finding(subject: str, feed: FeedFigures | None, owned: frozenset[int], loader: frozenset[int],
                 worker_masks: Sequence[frozenset[int]], omp_threads: int,
                 loader_cores: int | None = None) -> list[Finding]:
    """``feed-starved`` for one rank the verdict calls starved by data (or likely so): ``owned`` its CPUs,
    ``loader`` its loader CPUs (in ``loader_cores`` cores), ``worker_masks`` its children's masks, ``omp_threads``
    its OpenMP team's size."""
    if feed is None or feed.batches == 0:
        return []
    judged = v.judge(feed.signals())  # the data wait less the main thread's own wait for a CPU, as every verdict
    if v.DATA not in (judged.kind, judged.likely):
        return []
    workers = sum(feed.num_workers)
    union = frozenset().union(*worker_masks) if worker_masks else frozenset()
    compute = owned - loader
    causes: list[str] = []
    pool = loader or owned  # where the workers may run: the loader CPUs, else the rank's
    if worker_masks and len(union) == 1 and len(pool) > 1:
        causes.append(f"workers on one core: its {len(worker_masks)} worker process(es) all run on CPU "
                      f"{format_cpulist(union)} of {format_cpulist(pool)}")
    if worker_masks and union & compute and omp_threads > 1:
        causes.append(f"loader threads compete with the OpenMP team: the workers may run on CPUs "
                      f"{format_cpulist(union & compute)}, where the rank's {omp_threads} OpenMP threads compute")
    cores = len(loader) if loader_cores is None else loader_cores
    if loader and workers < cores:  # affrun's own count is one worker per loader core (launcher.feed.workers)
        causes.append(f"too few workers for the loader CPUs: {workers} worker(s) for {cores} loader core(s) "
                      f"(CPUs {format_cpulist(loader)})")
    elif workers == 0:
        causes.append("no workers: the training process loads every batch itself (num_workers=0)")
    if not causes:
        causes.append(f"its {workers} worker(s) prepare batches more slowly than the loop uses them")
    return [Finding(
        "feed-starved", "warning",
        f"the training loop waited for data {100 * feed.data_wait_fraction:.0f}% of its time "
        f"({feed.batches} batches in {feed.seconds:.1f} s, {feed.batches_per_s:.1f} batches/s so far)",
        "; ".join(causes),
        "measure the splits of loader cores and workers on this script and take the fastest: `affrun tune "
        "[affrun torchrun options] SCRIPT [ARGS...]` (it prints the options to use, e.g. --loader-cores 2 "
        "--loader-workers 4)",
        subject,
    )]
