"""DataLoader workers are cut from a rank's CPUs core by core (:func:`launcher.base.split.worker_split`), with the
cores as the live machine's sysfs groups them (:func:`launcher.base.siblings.live_cores`), so that two workers
share a core only when there are more workers than cores."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from launcher.base.siblings import live_cores
from launcher.base.split import worker_cpus, worker_split
from launcher.feed.workers import loader_cores


def test_split_numbering_gives_each_worker_whole_cores() -> None:
    cores = [(c, c + 64) for c in range(4)]
    rank = [0, 1, 2, 3, 64, 65, 66, 67]
    assert worker_split(2, [], rank, cores) == [[0, 1, 64, 65], [2, 3, 66, 67]]
    assert worker_split(3, [], rank, cores) == [[0, 1, 64, 65], [2, 66], [3, 67]]
    # More workers than cores: siblings side by side, balanced; more than PUs: one each, round robin.
    assert worker_split(6, [], rank, cores) == [[0, 64], [1, 65], [2], [66], [3], [67]]
    assert worker_split(9, [], rank, cores)[8] == [0]
    # Without cores each CPU is a core: the split in CPU order, as before.
    assert worker_split(2, [], rank) == [[0, 1, 2, 3], [64, 65, 66, 67]]
    assert worker_cpus(1, 2, [], rank, cores) == [2, 3, 66, 67]


def test_the_loader_cpus_come_first_and_foreign_core_members_are_ignored() -> None:
    cores = [(2, 3), (4, 5, 99)]  # 99 is no CPU of the pool
    assert worker_split(2, [2, 3, 4, 5], [0, 1, 2, 3, 4, 5], cores) == [[2, 3], [4, 5]]
    assert worker_split(2, [], [], cores) == [[], []]


@st.composite
def pools(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    cpus = draw(st.lists(st.integers(0, 300), min_size=1, max_size=48, unique=True))
    cuts = sorted(draw(st.sets(st.integers(1, len(cpus)), max_size=len(cpus))) | {len(cpus)})
    shuffled = draw(st.permutations(cpus))
    cores, start = [], 0
    for end in cuts:
        if end > start:
            cores.append(sorted(shuffled[start:end]))
            start = end
    return cores, draw(st.integers(1, 64))


@given(pools())
def test_workers_share_a_core_only_when_they_outnumber_the_cores(case: tuple[list[list[int]], int]) -> None:
    cores, workers = case
    everything = sorted(c for core in cores for c in core)
    got = worker_split(workers, [], everything, cores)
    assert len(got) == workers and all(got)
    core_of = {c: i for i, core in enumerate(cores) for c in core}
    if workers <= len(cores):
        owned = [{core_of[c] for c in cpus} for cpus in got]
        assert all(set(cores[i]) <= set(cpus) for cpus, mine in zip(got, owned, strict=True) for i in mine)
        assert sum(len(o) for o in owned) == len(cores) and set().union(*owned) == set(range(len(cores)))
        assert max(map(len, owned)) - min(map(len, owned)) <= 1
    elif workers <= len(everything):
        assert sorted(c for cpus in got for c in cpus) == everything  # disjoint PUs, every one used
    else:
        assert all(len(cpus) == 1 for cpus in got) and {c for cpus in got for c in cpus} == set(everything)


def _sysfs(tmp_path: Path, siblings: dict[int, str]) -> str:
    for cpu, text in siblings.items():
        topo = tmp_path / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        if text:
            (topo / "thread_siblings_list").write_text(text + "\n")
    return str(tmp_path)


def test_live_cores_read_each_cpu_s_siblings_and_trust_no_nonsense(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "", 3: "zz", 6: "7", 7: "6-7"})
    # 2 has no file and 3 an unreadable one: each alone; 6 names a list without itself: alone; 8 has no directory
    assert live_cores([0, 1, 2, 3, 4, 5, 6, 7, 8], sysfs) == ((0, 4), (1, 5), (2,), (3,), (6,), (7,), (8,))
    assert live_cores([4, 1], sysfs) == ((1,), (4,))  # a core's siblings outside the CPUs asked are not added
    assert loader_cores({"AFFRUN_LOADER_CPUS": "0-1,4-5"}, sysfs) == 2


def test_live_cores_read_the_hex_mask_where_the_kernel_writes_no_list(tmp_path: Path) -> None:
    for cpu in (0, 4):
        topo = tmp_path / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings").write_text("00000000,00000011\n")
    assert live_cores([0, 4], str(tmp_path)) == ((0, 4),)
