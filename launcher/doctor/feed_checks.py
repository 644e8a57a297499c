"""``feed-starved``: a rank of a live job that waits for its DataLoader more than :data:`STARVED` of its loop's
wall time (the meter's figures, ``--feed-report``), with the likely cause that doctor can see in the samples."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.base.cpulist import format_cpulist
from launcher.doctor.findings import Finding
from launcher.feed.figures import FeedFigures

STARVED = 0.20


def feed_finding(subject: str, feed: FeedFigures | None, owned: frozenset[int], loader: frozenset[int],
                 worker_masks: Sequence[frozenset[int]], omp_threads: int,
                 loader_cores: int | None = None) -> list[Finding]:
    """The finding for one rank: ``owned`` its CPUs, ``loader`` its loader CPUs (``--loader-cores``, in
    ``loader_cores`` cores: one per CPU when not given), ``worker_masks`` the CPU masks of its child processes (the
    DataLoader workers), ``omp_threads`` the size of its OpenMP team. Pure."""
    if feed is None or feed.batches == 0 or feed.data_wait_fraction <= STARVED:
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
