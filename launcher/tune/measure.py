"""One trial's figures from the feed meter's JSON (``--feed-json``): readings and the window between two. Pure.

A reading is each rank's cumulative figures at the time the rank last wrote them (batches, the loop's seconds,
the seconds it waited for data, for a CPU, and its GPU was busy). The trial's figures are the difference of two
readings, one after the warm-up and one at the end, rank by rank on the rank's own clock (its ``seconds``): the
warm-up's batches never count, and the window is exactly the loop time the batches took. docs/tune.md says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from launcher.feed.figures import WorkersSource, figures_of

Source = WorkersSource | Literal["mixed"]  # a window's: "mixed" when its ranks' sources differ


@dataclass(frozen=True)
class RankFigures:
    batches: int
    seconds: float
    wait_seconds: float
    loaders: int
    num_workers: tuple[int, ...]
    workers_source: WorkersSource
    final: bool
    cpu_wait_seconds: float | None = None  # None: not measured (no schedstat, an older meter)
    gpu_busy_seconds: float | None = None  # None: no NVML, no GPU


Reading = dict[int, RankFigures]


def reading(data: Any) -> Reading:
    """The ranks of the meter's JSON list, as :func:`launcher.feed.figures.figures_of` reads them (entries that
    are not a rank's object are left out)."""
    out: Reading = {}
    for found in map(figures_of, data if isinstance(data, list) else []):
        if found is not None:
            out[found.rank] = RankFigures(found.batches, found.seconds, found.data_wait_fraction * found.seconds,
                                          found.loaders, found.num_workers, found.workers_source, found.final,
                                          _times(found.cpu_wait_fraction, found.seconds),
                                          _times(found.gpu_busy_fraction, found.seconds))
    return out


def _times(fraction: float | None, seconds: float) -> float | None:
    """A share of the loop's time in seconds (none of a loop that has not run: a rank's first write)."""
    return 0.0 if seconds <= 0 else None if fraction is None else fraction * seconds


def all_started(now: Reading, ranks: int) -> bool:
    """Every one of ``ranks`` ranks has taken a batch."""
    return len(now) >= ranks and all(now[r].batches > 0 for r in now)


def all_advanced(start: Reading, now: Reading, seconds: float) -> bool:
    """Every rank of ``start`` has run ``seconds`` more of its loop in ``now`` (or ended)."""
    return all(r in now and (now[r].seconds - f.seconds >= seconds or now[r].final) for r, f in start.items())


@dataclass(frozen=True)
class Window:
    """The figures between two readings: the job's batches/s (the ranks' summed), data wait, CPU wait and GPU busy
    share (each the ranks' seconds over their loop seconds; ``None`` where a rank did not measure it), and what
    the ranks' loaders were."""

    batches_per_s: float
    data_wait_fraction: float
    batches: int
    seconds: float
    num_workers: tuple[int, ...]
    workers_source: Source
    cpu_wait_fraction: float | None = None
    gpu_busy_fraction: float | None = None


def window(start: Reading, end: Reading) -> Window | None:
    """The window from ``start`` to ``end`` (``None`` when no rank ran in it)."""
    rate, waited, spent, batches = 0.0, 0.0, 0.0, 0
    cpu: float | None = 0.0
    busy: float | None = 0.0
    for r, last in end.items():
        first = start.get(r, RankFigures(0, 0.0, 0.0, 0, (), "script", False, 0.0, 0.0))
        dt = last.seconds - first.seconds
        if dt <= 0:
            continue
        rate += (last.batches - first.batches) / dt
        waited += max(0.0, last.wait_seconds - first.wait_seconds)
        spent += dt
        batches += last.batches - first.batches
        cpu = _added(cpu, first.cpu_wait_seconds, last.cpu_wait_seconds)
        busy = _added(busy, first.gpu_busy_seconds, last.gpu_busy_seconds)
    if spent <= 0:
        return None
    sources = {f.workers_source for f in end.values()}
    source: Source = sources.pop() if len(sources) == 1 else "mixed"
    workers = tuple(w for r in sorted(end) for w in end[r].num_workers)
    return Window(rate, min(1.0, waited / spent), batches, spent / max(1, len(end)), workers, source,
                  None if cpu is None else min(1.0, cpu / spent), None if busy is None else min(1.0, busy / spent))


def _added(total: float | None, first: float | None, last: float | None) -> float | None:
    """``total`` plus one rank's seconds in the window; ``None`` once a rank has not measured them."""
    if total is None or first is None or last is None:
        return None
    return total + max(0.0, last - first)
