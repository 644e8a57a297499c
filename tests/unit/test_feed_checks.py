"""feed-starved: the threshold, and the cause named from what doctor saw of the rank (pure, no process)."""

from __future__ import annotations

from dataclasses import replace

from launcher.doctor.job_checks import feed_finding
from launcher.feed.figures import FeedFigures, figures_of
from launcher.feed.verdict import FED_BUSY, STARVED_WAIT

RANK = frozenset(range(8))


def figures(wait: float, workers: tuple[int, ...] = (2,)) -> FeedFigures:
    return FeedFigures(0, 500, 50.0, 10.0, wait, len(workers), workers, "script", False, 42, "node")


def why(wait: float, loader: frozenset[int] = frozenset(), masks: tuple[frozenset[int], ...] = (), omp: int = 1,
        workers: tuple[int, ...] = (2,)) -> str:
    found = feed_finding("rank 0 (pid 42)", figures(wait, workers), RANK, loader, masks, omp)
    assert len(found) == 1 and found[0].id == "feed-starved" and found[0].subject == "rank 0 (pid 42)"
    assert "affrun tune" in found[0].fix and f"{100 * wait:.0f}%" in found[0].message
    return found[0].why


def test_a_fed_rank_and_a_rank_without_figures_have_no_finding() -> None:
    assert feed_finding("r", figures(STARVED_WAIT - 0.01), RANK, frozenset(), (), 1) == []
    assert feed_finding("r", None, RANK, frozenset(), (), 1) == []


def test_a_loop_that_waited_for_a_cpu_or_fed_its_gpu_is_not_starved_by_data() -> None:
    """The same rule as every verdict: the data wait counts the main thread's own wait for a CPU inside next(), so
    40% of data wait with 52% of CPU wait is a CPU starvation (it said "waited for data 40%" beside the verdict's
    "likely starved-of-cpu"); a GPU busy 80% is fed whatever the loader waited."""
    starved = figures(0.40)
    assert feed_finding("r", replace(starved, cpu_wait_fraction=0.52), RANK, frozenset(), (), 1) == []
    assert feed_finding("r", replace(starved, gpu_busy_fraction=FED_BUSY), RANK, frozenset(), (), 1) == []
    assert len(feed_finding("r", replace(starved, cpu_wait_fraction=0.05), RANK, frozenset(), (), 1)) == 1


def test_the_causes_doctor_can_see() -> None:
    assert "workers on one core" in why(0.5, masks=(frozenset({3}), frozenset({3})))
    compete = why(0.5, masks=(RANK, RANK), omp=8)
    assert "compete with the OpenMP team" in compete and "0-7" in compete
    assert "too few workers for the loader CPUs: 1 worker(s) for 2" in why(
        0.5, loader=frozenset({6, 7}), masks=(frozenset({6, 7}),), workers=(1,))
    assert "num_workers=0" in why(0.9, workers=(0,))
    assert "more slowly" in why(0.3, loader=frozenset({6, 7}), masks=(frozenset({6}), frozenset({7})),
                                workers=(2,))


def test_figures_from_untrusted_json() -> None:
    good = {"rank": 1, "batches": 3, "seconds": 1.5, "batches_per_s": 2.0, "data_wait_fraction": 0.25, "loaders": 1,
            "num_workers": [2], "workers_source": "asked", "final": True, "pid": 7, "host": "h"}
    assert figures_of(good) == FeedFigures(1, 3, 1.5, 2.0, 0.25, 1, (2,), "asked", True, 7, "h")
    for key, bad in (("rank", -1), ("data_wait_fraction", 1.5), ("num_workers", [True]), ("workers_source", "x"),
                     ("final", 1), ("seconds", "1"), ("batches", True)):
        assert figures_of({**good, key: bad}) is None, key
    assert figures_of([good]) is None


def test_one_worker_per_loader_core_is_not_too_few_on_smt() -> None:
    """affrun's own default (one worker per loader core, launcher.feed.workers) is not a cause on an SMT machine,
    where 2 loader cores are 4 loader CPUs."""
    loader = frozenset({4, 5, 6, 7})
    found = feed_finding("r", figures(0.5), RANK, loader, (loader, loader), 1, loader_cores=2)
    assert "too few workers" not in found[0].why
    fewer = feed_finding("r", figures(0.5, (1,)), RANK, loader, (loader,), 1, loader_cores=2)
    assert "1 worker(s) for 2 loader core(s)" in fewer[0].why
