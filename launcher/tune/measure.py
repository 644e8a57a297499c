"""One trial's figures from the feed meter's JSON (``--feed-json``): readings (each rank's cumulative figures),
and the window between two, rank by rank on its own loop clock. Pure. docs/tune.md ("One trial")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from launcher.feed.figures import FeedFigures, WorkersSource, figures_of

Source = WorkersSource | Literal["mixed"]  # a window's: "mixed" when its ranks' sources differ
Reading = dict[int, FeedFigures]


def reading(data: Any) -> Reading:
    """The ranks of the meter's JSON list (entries that are not a rank's object are left out)."""
    return {f.rank: f for f in map(figures_of, data if isinstance(data, list) else []) if f is not None}


def all_started(now: Reading, ranks: int) -> bool:
    """Every one of ``ranks`` ranks has taken a batch."""
    return len(now) >= ranks and all(now[r].batches > 0 for r in now)


def all_advanced(start: Reading, now: Reading, seconds: float) -> bool:
    """Every rank of ``start`` has run ``seconds`` more of its loop in ``now`` (or ended)."""
    return all(r in now and (now[r].seconds - f.seconds >= seconds or now[r].final) for r, f in start.items())


@dataclass(frozen=True)
class Window:
    """The figures between two readings: the job's batches/s (its ranks' summed); data wait, CPU wait and GPU busy
    (seconds over loop seconds, all ranks together; ``None`` where a rank did not measure it); the loaders."""

    batches_per_s: float
    data_wait_fraction: float
    batches: int
    seconds: float
    num_workers: tuple[int, ...]
    workers_source: Source
    cpu_wait_fraction: float | None = None
    gpu_busy_fraction: float | None = None


def _totals(f: FeedFigures | None) -> tuple[int, float, float, float | None, float | None]:
    """A rank's batches, loop seconds and the seconds it waited for data, for a CPU and its GPU was busy (``None``:
    not measured); all zero before its first write."""
    if f is None:
        return 0, 0.0, 0.0, 0.0, 0.0
    cpu, gpu = (0.0 if f.seconds <= 0 else None if x is None else x * f.seconds
                for x in (f.cpu_wait_fraction, f.gpu_busy_fraction))
    return f.batches, f.seconds, f.data_wait_fraction * f.seconds, cpu, gpu


def window(start: Reading, end: Reading) -> Window | None:
    """The window from ``start`` to ``end`` (``None`` when no rank ran in it)."""
    rate, waited, spent, batches = 0.0, 0.0, 0.0, 0
    cpu: float | None = 0.0
    busy: float | None = 0.0
    for r, f in end.items():
        b0, s0, w0, c0, g0 = _totals(start.get(r))
        b1, s1, w1, c1, g1 = _totals(f)
        dt = s1 - s0
        if dt <= 0:
            continue
        rate += (b1 - b0) / dt
        waited += max(0.0, w1 - w0)
        spent += dt
        batches += b1 - b0
        cpu = None if cpu is None or c0 is None or c1 is None else cpu + max(0.0, c1 - c0)
        busy = None if busy is None or g0 is None or g1 is None else busy + max(0.0, g1 - g0)
    if spent <= 0:
        return None
    sources = {f.workers_source for f in end.values()}
    source: Source = sources.pop() if len(sources) == 1 else "mixed"
    workers = tuple(w for r in sorted(end) for w in end[r].num_workers)
    return Window(rate, min(1.0, waited / spent), batches, spent / max(1, len(end)), workers, source,
                  None if cpu is None else min(1.0, cpu / spent), None if busy is None else min(1.0, busy / spent))
