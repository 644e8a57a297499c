"""One trial's figures from the feed meter's JSON (``--feed-json``): readings and the window between two. Pure.

A reading is each rank's cumulative figures at the time the rank last wrote them (batches, the loop's seconds,
the seconds it waited for data). The trial's figures are the difference of two readings, one after the warm-up
and one at the end, rank by rank on the rank's own clock (its ``seconds``): the warm-up's batches never count,
and the window is exactly the loop time the batches took. docs/tune.md says why.
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


Reading = dict[int, RankFigures]


def reading(data: Any) -> Reading:
    """The ranks of the meter's JSON list, as :func:`launcher.feed.figures.figures_of` reads them (entries that
    are not a rank's object are left out)."""
    out: Reading = {}
    for found in map(figures_of, data if isinstance(data, list) else []):
        if found is not None:
            out[found.rank] = RankFigures(found.batches, found.seconds, found.data_wait_fraction * found.seconds,
                                          found.loaders, found.num_workers, found.workers_source, found.final)
    return out


def all_started(now: Reading, ranks: int) -> bool:
    """Every one of ``ranks`` ranks has taken a batch."""
    return len(now) >= ranks and all(now[r].batches > 0 for r in now)


def all_advanced(start: Reading, now: Reading, seconds: float) -> bool:
    """Every rank of ``start`` has run ``seconds`` more of its loop in ``now`` (or ended)."""
    return all(r in now and (now[r].seconds - f.seconds >= seconds or now[r].final) for r, f in start.items())


@dataclass(frozen=True)
class Window:
    """The figures between two readings: the job's batches/s (the ranks' summed), data wait (their mean share
    of the window's loop time), and what the ranks' loaders were."""

    batches_per_s: float
    data_wait_fraction: float
    batches: int
    seconds: float
    num_workers: tuple[int, ...]
    workers_source: Source


def window(start: Reading, end: Reading) -> Window | None:
    """The window from ``start`` to ``end`` (``None`` when no rank ran in it)."""
    rate, waited, spent, batches = 0.0, 0.0, 0.0, 0
    for r, last in end.items():
        first = start.get(r, RankFigures(0, 0.0, 0.0, 0, (), "script", False))
        dt = last.seconds - first.seconds
        if dt <= 0:
            continue
        rate += (last.batches - first.batches) / dt
        waited += max(0.0, last.wait_seconds - first.wait_seconds)
        spent += dt
        batches += last.batches - first.batches
    if spent <= 0:
        return None
    sources = {f.workers_source for f in end.values()}
    source: Source = sources.pop() if len(sources) == 1 else "mixed"
    workers = tuple(w for r in sorted(end) for w in end[r].num_workers)
    return Window(rate, min(1.0, waited / spent), batches, spent / max(1, len(end)), workers, source)
