"""Plan by core kind (issue 20, part 3): the pure planner on hwloc's hybrid i7-1370P tree (6 P-cores with HT on
PUs 0-11, 8 E-cores on 12-19), read in place from the shared fixtures, with plans derived by hand; and a hypothesis
property over random hybrid machines: no rank's compute set spans two kinds unless ``--spill compute`` is given,
and a rank that computes on a slower kind than the machine's fastest is warned."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from launcher.env.omp_syntax import omp_places
from launcher.errors import PlanError
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology.kinds import CoreKind, CoreKinds
from launcher.topology.model import Topology
from launcher.topology.sysfs import read_sysfs
from tests.plan_cases import SETTINGS, Machine, hybrid_cases

RAPTOR = "20em64t-hybrid-1p6c2t+2ca4co1t"
P = tuple((2 * i, 2 * i + 1) for i in range(6))  # the P-cores' PU pairs
E = tuple((12 + i,) for i in range(8))  # the E-cores


@pytest.fixture(scope="module")
def raptor(hwloc_root) -> Topology:  # type: ignore[no-untyped-def]
    topo = read_sysfs(str(hwloc_root(RAPTOR)), gpus=False)
    assert [sorted(k.cpus) for k in topo.kinds().kinds] == [list(range(12)), list(range(12, 20))]
    return topo


def plan(topo: Topology, nproc: int, **kw: object) -> Plan:
    return make_plan(topo, Request(nproc=nproc, use_gpus=False, **kw))  # type: ignore[arg-type]


def cpus(*cores: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(p for c in cores for p in c))


# ---------------------------------------------------------------------------------------------- hand-derived plans
def test_one_rank_computes_on_the_p_cores_and_loads_on_the_e_cores(raptor: Topology) -> None:
    (r,) = plan(raptor, 1).ranks
    assert r.compute_cores == P and r.threads == 6
    assert r.loader_cpus == cpus(*E) and r.cpus == tuple(range(20))
    assert r.warnings == ()
    assert "6 big cores compute, 8 little cores load" in r.reasons[-1]
    # OMP_PLACES: the whole rank first (forked DataLoader workers inherit it), then the P-cores only
    assert omp_places(r) == "{" + ",".join(map(str, range(20))) + "}" + ",{0:12}" * 5


def test_two_ranks_get_equal_shares_of_each_kind(raptor: Topology) -> None:
    r0, r1 = plan(raptor, 2).ranks
    assert r0.compute_cores == P[:3] and r0.loader_cpus == cpus(*E[:4]) and r0.cpus == cpus(*P[:3], *E[:4])
    assert r1.compute_cores == P[3:] and r1.loader_cpus == cpus(*E[4:]) and r1.cpus == cpus(*P[3:], *E[4:])
    assert r0.threads == r1.threads == 3
    assert all("3 big cores compute, 4 little cores load" in r.reasons[-1] for r in (r0, r1))


def test_spill_none_leaves_the_slower_kind_idle_and_compute_counts_it(raptor: Topology) -> None:
    (r,) = plan(raptor, 1, spill="none").ranks
    assert r.cpus == cpus(*P) and r.loader_cpus == () and r.threads == 6
    (r,) = plan(raptor, 1, spill="compute").ranks
    assert r.compute_cores == (*P, *E) and r.loader_cpus == () and r.threads == 14


def test_loader_cores_come_from_the_slowest_kind_first(raptor: Topology) -> None:
    (r,) = plan(raptor, 1, spill="compute", loader_cores=2).ranks
    assert r.loader_cpus == (18, 19) and r.compute_cores == (*P, *E[:6])
    (r,) = plan(raptor, 1, spill="none", loader_cores=2).ranks
    assert r.loader_cpus == (18, 19) and r.compute_cores == P and r.cpus == cpus(*P, (18,), (19,))
    # more loader cores than the slower kind has: the rest come from the tail of the fastest kind
    (r,) = plan(raptor, 1, loader_cores=10).ranks
    assert r.compute_cores == P[:4] and r.loader_cpus == cpus(*P[4:], *E)
    with pytest.raises(PlanError, match=r"loader.cores"):
        plan(raptor, 1, loader_cores=14)


def test_ranks_beyond_the_fast_cores_compute_on_e_cores_with_a_warning(raptor: Topology) -> None:
    ranks = plan(raptor, 8).ranks
    for r in ranks[:6]:
        assert r.compute_cores == (P[r.local_rank],) and r.loader_cpus == E[r.local_rank] and r.warnings == ()
    for r in ranks[6:]:
        assert r.compute_cores == (E[r.local_rank],) and r.loader_cpus == ()
        assert len(r.warnings) == 1 and "little core" in r.warnings[0]


def test_shared_modes_and_map_compute_on_the_fastest_kind(raptor: Topology) -> None:
    for mode in ("numa", "socket"):
        for r in plan(raptor, 2, mode=mode).ranks:
            assert r.compute_cores == P and r.loader_cpus == cpus(*E) and r.threads == 3
    the_map = (frozenset({0, 1, 2, 3, 12, 13}), frozenset({4, 5, 14, 15, 16}))
    r0, r1 = plan(raptor, 2, mode="map", cpu_map=the_map).ranks
    assert r0.compute_cores == P[:2] and r0.loader_cpus == (12, 13)
    assert r1.compute_cores == (P[2],) and r1.loader_cpus == (14, 15, 16)
    for r in plan(raptor, 2, mode="l3").ranks:  # one L3 group: cores are split, by kind
        assert len(r.compute_cores) == 3 and len(r.loader_cpus) == 4


def test_allowed_cpus_of_one_kind_plan_as_a_homogeneous_machine(raptor: Topology) -> None:
    flat = replace(raptor, core_kinds=CoreKinds())
    for allowed in (frozenset(range(12)), frozenset(range(12, 20))):
        for n in (1, 2, 3):
            assert plan(raptor.restrict(allowed), n) == plan(flat.restrict(allowed), n)


def test_three_kinds_compute_on_the_fastest_and_load_on_both_slower() -> None:
    base = replace(read_flat(), core_kinds=CoreKinds((
        CoreKind(frozenset({6, 7}), 2, "P-core", "test"),
        CoreKind(frozenset(range(4, 6)), 1, "E-core", "test"),
        CoreKind(frozenset(range(4)), 0, "LP E-core", "test"))))
    (r,) = plan(base, 1).ranks
    assert r.compute_cores == ((6,), (7,)) and r.loader_cpus == tuple(range(6))
    assert "2 P-cores compute, 2 E-cores + 4 LP E-cores load" in r.reasons[-1]
    r0, r1 = plan(base, 2).ranks
    assert r0.compute_cores == ((6,),) and r1.compute_cores == ((7,),)
    assert len(r0.loader_cpus) == len(r1.loader_cpus) == 3


def read_flat() -> Topology:
    """An 8-core machine of single-thread cores 0-7 on one node."""
    from launcher.topology.model import Core, L3Group, NumaNode, Package

    every = frozenset(range(8))
    return Topology((Package(0, every),), (NumaNode(0, every),), (L3Group(every),),
                    tuple(Core(i, (i,), 0, 0, 0) for i in range(8)), every, frozenset(), every)


# ---------------------------------------------------------------------------------------------- the property
@SETTINGS
@given(hybrid_cases())
def test_no_compute_set_spans_two_kinds_unless_spill_compute(case: tuple[Machine, Request]) -> None:
    m, req = case
    try:
        the_plan = make_plan(m.topo, req)
    except PlanError:
        return
    kinds = m.topo.kinds()
    for r in the_plan.ranks:
        assert set(r.compute_cpus) <= set(r.cpus)
        assert r.threads >= 1
        if not kinds.hybrid:
            continue
        used = {kinds.kinds.index(k) for p in r.compute_cpus if (k := kinds.kind_of(p))}
        if req.spill != "compute":
            assert len(used) == 1, (r.compute_cores, kinds)
            home = set(r.cpus) - set(r.spill_cpus)  # cores of nodes hosting no rank stay loaders, whatever their kind
            slower = {kinds.kinds.index(k) for p in home if (k := kinds.kind_of(p))} - used
            assert all(s > min(used) for s in slower)  # the team runs on the fastest kind of the rank's home
        if min(used) > 0 and req.spill != "compute":
            assert any("computes on" in w for w in r.warnings), r
