"""The balanced split (:mod:`launcher.base.split`) is the one cut of the planner's chunks and of a DataLoader
worker's CPUs, and the one message of a CPU id above the limit (:func:`launcher.base.cpulist.cpu_error`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from launcher.base.cpulist import cpu_error, parse_cpulist
from launcher.base.split import balanced_slices
from launcher.plan.geometry import balanced_chunks
from launcher.torch import worker_cpus


@given(st.integers(0, 200), st.integers(1, 40))
def test_the_parts_cover_the_items_in_order_and_differ_by_at_most_one(n: int, k: int) -> None:
    parts = balanced_chunks(list(range(n)), k)
    assert [i for part in parts for i in part] == list(range(n))
    sizes = [len(p) for p in parts]
    assert len(sizes) == k and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    assert [list(range(n))[s] for s in balanced_slices(n, k)] == parts


@given(st.lists(st.integers(0, 500), min_size=1, max_size=60, unique=True), st.integers(1, 80))
def test_a_worker_gets_its_part_of_the_rank_cpus(cpus: list[int], workers: int) -> None:
    got = [worker_cpus(w, workers, [], cpus) for w in range(workers)]
    if workers >= len(cpus):  # round robin, one CPU each
        assert got == [[sorted(cpus)[w % len(cpus)]] for w in range(workers)]
    else:
        assert got == balanced_chunks(sorted(cpus), workers)


def test_cpu_error_names_an_id_above_the_limit_and_else_the_callers_word() -> None:
    for text, want in (("0-3,zz", "not a cpu list"), ("99999999", "cpu id 99999999 is above 65535, the largest "
                                                       "affrun accepts")):
        try:
            parse_cpulist(text)
        except ValueError as exc:
            assert cpu_error(exc, "not a cpu list") == want
            assert cpu_error(exc, "bad", "--cpus: {}") == ("bad" if want == "not a cpu list" else f"--cpus: {want}")
