"""``--main-thread none|compute|priority`` (issue 33, part 3): each rank's main core, on machines built in the test
(priority cores cannot exist here: the model is filled by hand, as a reader would fill it), each answer derived by
hand in the comment above it; and properties over random machines, priority sets and requests: main cores are
compute cores of their rank, distinct, priority CPUs of the rank's own node, never loader or comm CPUs, and a
node's priority cores go to as many of its ranks as they can."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given

from launcher.base.cpulist import format_cpulist
from launcher.base.records import to_dict
from launcher.errors import ConfigError, PlanError
from launcher.options.record import Options
from launcher.plan.comm import team_units
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology
from launcher.topology.priority import PriorityCores
from tests.plan_cases import SETTINGS, Machine, main_thread_cases, plan_or_error


def box(nodes: int = 2, cores: int = 8, smt: int = 2, gpu_nodes: tuple[int, ...] = (), priority: tuple[int, ...] = (),
        packages: int | None = None) -> Topology:
    """``nodes`` NUMA nodes of ``cores`` cores (siblings c, c + all cores), one L3 per node, a package per node (or
    all in ``packages`` packages), a GPU on each of ``gpu_nodes`` with its node's CPUs as local CPUs, and the
    priority cores ``priority`` (core numbers, best first; their siblings are priority CPUs too)."""
    total = nodes * cores
    packages = packages or nodes
    per_package = nodes // packages
    core_list = tuple(Core(c % cores, tuple(c + t * total for t in range(smt)), (c // cores) // per_package,
                           c // cores, c // cores) for c in range(total))
    node_cpus = [frozenset(p for c in core_list if c.numa_node == n for p in c.pus) for n in range(nodes)]
    online = frozenset(p for c in core_list for p in c.pus)
    order = tuple(c + t * total for c in priority for t in range(smt))
    return Topology(
        packages=tuple(Package(k, frozenset().union(*node_cpus[k * per_package:(k + 1) * per_package]))
                       for k in range(packages)),
        numa_nodes=tuple(NumaNode(n, node_cpus[n], {m: 10 if m == n else 20 for m in range(nodes)})
                         for n in range(nodes)),
        l3_groups=tuple(L3Group(node_cpus[n]) for n in range(nodes)),
        cores=core_list, online=online, offline=frozenset(), allowed=online,
        gpus=tuple(GPU(i, f"0000:{0x10 + i:02x}:00.0", "nvidia", n, node_cpus[n]) for i, n in enumerate(gpu_nodes)),
        visible=None, source="built in the test",
        priority=PriorityCores(frozenset(order), order, "built in the test") if priority else PriorityCores(
            why_none="no core reports a higher highest_perf than the others"),
    )


def mains(plan: Plan) -> list[str]:
    return [format_cpulist(r.main_cpus) for r in plan.ranks]


# ---------------------------------------------------------------------------------------------- priority
def test_a_node_s_priority_cores_are_shared_out_before_its_chunks_are_cut() -> None:
    # 2 nodes of 8 cores (siblings +16), GPUs 0-1 on node 0, 2-3 on node 1; the priority cores are each node's last
    # two, 7 and 15 best. The plain cut would give node 0's ranks 0-3 and 4-7: both priority cores to rank 1. They
    # are cut first instead: rank 0 gets 6, rank 1 gets 7, then the other six cores 3 + 3 (0-2, 3-5). Each main
    # thread lives on its own priority core, the team on the other three cores.
    topo = box(gpu_nodes=(0, 0, 1, 1), priority=(7, 15, 6, 14))
    plan = make_plan(topo, Request(nproc=4, main_thread="priority"))
    assert [format_cpulist(r.cpus) for r in plan.ranks] == ["0-2,6,16-18,22", "3-5,7,19-21,23", "8-10,14,24-26,30",
                                                          "11-13,15,27-29,31"]
    assert mains(plan) == ["6,22", "7,23", "14,30", "15,31"]
    assert [r.threads for r in plan.ranks] == [4, 4, 4, 4]
    assert "main thread on CPU(s) 6,22, a priority core local to its GPU" in plan.ranks[0].reasons
    assert plan.warnings == ()
    assert to_dict(plan)["ranks"][0]["main_cpus"] == [6, 22]


def test_fewer_priority_cores_than_ranks_on_a_node() -> None:
    # 4 ranks per node, 2 priority cores per node: cut first, ranks 0 and 1 get 6 and 7 (one each); the other
    # six cores go 1, 1, 2, 2 (the ranks with fewest cores so far take the larger parts): rank 0 {0,6}, rank 1
    # {1,7}, rank 2 {2,3}, rank 3 {4,5}. Ranks 2 and 3 keep their main threads on their whole set, with a warning.
    topo = box(gpu_nodes=(0, 0, 0, 0, 1, 1, 1, 1), priority=(7, 15, 6, 14))
    plan = make_plan(topo, Request(nproc=8, main_thread="priority"))
    assert [format_cpulist(r.cpus) for r in plan.ranks[:4]] == ["0,6,16,22", "1,7,17,23", "2-3,18-19", "4-5,20-21"]
    assert mains(plan) == ["6,22", "7,23", "", "", "14,30", "15,31", "", ""]
    assert ("rank 2: --main-thread priority: no priority core of its own (node 0 has 2 for its 4 ranks); its main "
            "thread stays on the rank's whole set") in plan.warnings
    assert sum("no priority core of its own" in w for w in plan.warnings) == 4
    assert any("node 0 has 2 for its 4 ranks" in w for w in plan.ranks[3].warnings)


def test_a_machine_without_priority_cores_plans_as_none_and_says_why() -> None:
    topo = box(gpu_nodes=(0, 1))
    plain = make_plan(topo, Request(nproc=2, loader_cores=1))
    asked = make_plan(topo, Request(nproc=2, loader_cores=1, main_thread="priority"))
    assert asked.ranks == plain.ranks
    (warning,) = asked.warnings
    assert warning == ("--main-thread priority: this machine has no priority core (no core reports a higher "
                       "highest_perf than the others); every rank's main thread stays on its whole set")


def test_priority_cores_that_are_not_allowed_count_as_none() -> None:
    topo = box(nodes=1, gpu_nodes=(0,), priority=(7,))
    topo = replace(topo, allowed=frozenset(range(7)) | frozenset(range(8, 15)))
    plan = make_plan(topo, Request(nproc=1, main_thread="priority"))
    assert mains(plan) == [""] and "none of the priority CPUs is allowed here" in plan.warnings[0]


def test_loader_cores_leave_the_priority_cores_to_compute() -> None:
    # One node, cores 0-7, priority cores 3 (best) and 7: the plain cut (0-3, 4-7) already gives each rank one.
    # --loader-cores 1 takes each chunk's last core that is no priority core: 2 and 6, not 3 and 7.
    topo = box(nodes=1, smt=1, gpu_nodes=(0, 0), priority=(3, 7))
    plan = make_plan(topo, Request(nproc=2, loader_cores=1, main_thread="priority"))
    assert [format_cpulist(r.loader_cpus) for r in plan.ranks] == ["2", "6"]
    assert mains(plan) == ["3", "7"]
    assert [format_cpulist(r.compute_cpus) for r in plan.ranks] == ["0-1,3", "4-5,7"]


def test_a_gpu_local_priority_core_wins_over_a_better_one_far_away() -> None:
    # --mode socket: one package of two nodes (0-3, 4-7), ranks 0 and 1 share all 8 cores; GPU 0 on node 1, GPU 1
    # on node 0. Priority cores 1 (best) and 6. Rank 0 takes 6, local to its GPU; rank 1 takes 1, local to its own.
    topo = box(nodes=2, cores=4, smt=1, gpu_nodes=(1, 0), priority=(1, 6), packages=1)
    plan = make_plan(topo, Request(nproc=2, mode="socket", main_thread="priority"))
    assert mains(plan) == ["6", "1"]
    # a third rank finds both taken: GPU 2 on node 1, whose one priority core is rank 0's
    topo = box(nodes=2, cores=4, smt=1, gpu_nodes=(1, 0, 1), priority=(1, 6), packages=1)
    plan = make_plan(topo, Request(nproc=3, mode="socket", main_thread="priority"))
    assert mains(plan) == ["6", "1", ""]
    assert "rank 2: --main-thread priority: no priority core of its own (node 0,1 has 2 for its 3 ranks)" in (
        plan.warnings[0])


# ---------------------------------------------------------------------------------------------- compute
def test_compute_takes_the_first_compute_core_and_smt_leaves_its_sibling_alone() -> None:
    # One rank of 4 cores (siblings +4): main core 0 (with 4). Without --smt the team is 4 threads, thread 0 on
    # core 0. With --smt the rank's 8 PUs would be 8 threads, but no team thread shares the main thread's core: 7.
    topo = box(nodes=1, cores=4)
    plan = make_plan(topo, Request(nproc=1, main_thread="compute"))
    assert (mains(plan), plan.ranks[0].threads) == (["0,4"], 4)
    plan = make_plan(topo, Request(nproc=1, main_thread="compute", smt=True))
    assert (mains(plan), plan.ranks[0].threads) == (["0,4"], 7)
    assert team_units(plan.ranks[0].compute_cores, plan.ranks[0].main_cpus, True) == 7


def test_comm_cores_never_take_the_main_core() -> None:
    # --map 0-1 (two cores, no SMT), --comm-cores 1: the main core is 0 (the first), the comm core 1 (the last),
    # the team is the main thread alone (1 thread). --comm-cores 2 would leave the team nothing: ignored.
    topo = box(nodes=1, cores=4, smt=1)
    plan = make_plan(topo, Request(nproc=1, mode="map", cpu_map=(frozenset({0, 1}),), comm_cores=1,
                                   main_thread="compute"))
    (r,) = plan.ranks
    assert (format_cpulist(r.main_cpus), format_cpulist(r.comm_cpus), r.threads) == ("0", "1", 1)
    plan = make_plan(topo, Request(nproc=1, mode="map", cpu_map=(frozenset({0, 1}),), comm_cores=2,
                                   main_thread="compute"))
    assert (mains(plan), plan.ranks[0].comm_cpus) == (["0"], ()) and "--comm-cores 2 ignored" in plan.warnings[0]


def test_sharing_ranks_take_distinct_main_cores_while_there_are_some() -> None:
    # --mode numa, 5 ranks on one node of 4 cores (siblings +4): ranks 0-3 take cores 0-3 in turn, rank 4 finds
    # none left.
    topo = box(nodes=1, cores=4, gpu_nodes=(0,) * 5)
    plan = make_plan(topo, Request(nproc=5, mode="numa", main_thread="compute"))
    assert mains(plan) == ["0,4", "1,5", "2,6", "3,7", ""]
    assert plan.warnings == ("rank 4: --main-thread compute: no compute core of its own is left (its 4 compute "
                             "core(s) are the main cores of ranks before it); its main thread stays on the rank's "
                             "whole set",)
    # --map lists that overlap: distinct main cores too
    plan = make_plan(topo, Request(nproc=2, mode="map", cpu_map=(frozenset({0, 1}),) * 2, main_thread="compute"))
    assert mains(plan) == ["0", "1"]  # --map gives PUs: CPUs 0 and 1 are cores of one PU each here


def test_none_is_the_default_and_a_wrong_choice_is_refused() -> None:
    topo = box(nodes=1, cores=4)
    assert mains(make_plan(topo, Request(nproc=2))) == ["", ""]
    with pytest.raises(PlanError, match="main_thread"):
        make_plan(topo, Request(nproc=1, main_thread="fastest"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        Options(main_thread="fastest").request(1)  # type: ignore[arg-type]
    assert "choose one of none, compute, priority" in str(caught.value)


# ---------------------------------------------------------------------------------------------- properties
@SETTINGS
@given(main_thread_cases())
def test_main_cores_are_distinct_compute_cores_off_the_loaders_and_comm(case: tuple[Machine, Request]) -> None:
    m, req = case
    topo = m.topo
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    given_to: dict[int, int] = {}
    node_of = {p: c.numa_node for c in topo.cores for p in c.pus}
    for r in plan.ranks:
        main = set(r.main_cpus)
        if req.main_thread == "none" or (req.main_thread == "priority" and not topo.priority_cores().cpus):
            assert not main
        if not main:
            continue
        assert main in [set(core) for core in r.compute_cores], "a main core is not one of the rank's cores"
        assert main <= set(r.cpus) and main.isdisjoint(r.loader_cpus) and main.isdisjoint(r.comm_cpus)
        for cpu in main:
            assert given_to.setdefault(cpu, r.local_rank) == r.local_rank, "two ranks share a main core"
        if req.main_thread == "priority":
            assert main <= topo.priority_cores().cpus
            assert {node_of[p] for p in main} <= set(r.numa_nodes), "a priority main core off the rank's node"
            assert main.isdisjoint(r.spill_cpus)
        assert r.threads <= team_units(r.compute_cores, r.main_cpus, req.smt)
    if req.mode in ("exclusive", "l3") or (req.mode == "map" and not any("is given to ranks" in w for w in plan.warnings)):
        seen: dict[int, int] = {}
        for r in plan.ranks:
            for p in r.cpus:
                assert seen.setdefault(p, r.local_rank) == r.local_rank, f"CPU {p} in two ranks"


@SETTINGS
@given(main_thread_cases())
def test_compute_gives_every_rank_a_main_core_where_ranks_share_none(case: tuple[Machine, Request]) -> None:
    m, req = case
    if req.main_thread != "compute" or req.mode not in ("exclusive", "l3"):
        return
    plan = plan_or_error(m.topo, req)
    if plan is not None:
        assert all(r.main_cpus for r in plan.ranks)


@SETTINGS
@given(main_thread_cases())
def test_a_node_s_priority_cores_reach_as_many_of_its_ranks_as_they_can(case: tuple[Machine, Request]) -> None:
    """exclusive: on each node, min(priority cores, ranks) of its ranks get a priority main core."""
    m, req = case
    if req.main_thread != "priority" or req.mode != "exclusive":
        return
    topo = m.topo
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    prio = topo.priority_cores().cpus
    reserved = {p for c in topo.cores if not req.reserve.isdisjoint(c.pus) for p in c.pus}
    usable = [c for c in topo.allowed_cores() if reserved.isdisjoint(c.pus)]
    by_node: dict[tuple[int, ...], list[int]] = {}
    for r in plan.ranks:
        by_node.setdefault(r.numa_nodes, []).append(r.local_rank)
    for nodes, ranks in by_node.items():
        if len(nodes) != 1:
            continue
        have = sum(1 for c in usable if c.numa_node == nodes[0] and set(c.pus) <= prio)
        got = sum(1 for i in ranks if plan.ranks[i].main_cpus)
        assert got == min(have, len(ranks)), f"node {nodes[0]}: {got} main cores for {len(ranks)} ranks, {have} priority"


@SETTINGS
@given(main_thread_cases())
def test_the_main_thread_changes_nothing_else_without_priority_cores(case: tuple[Machine, Request]) -> None:
    """none, and priority on a machine without any: the same ranks as a request that does not ask."""
    m, req = case
    if req.main_thread == "compute" or (req.main_thread == "priority" and m.topo.priority_cores().cpus):
        return
    asked = plan_or_error(m.topo, req)
    plain = plan_or_error(m.topo, replace(req, main_thread="none"))
    assert (asked is None) == (plain is None)
    if asked is not None and plain is not None:
        assert asked.ranks == plain.ranks


def test_python_keywords_and_tuned_files_take_the_options() -> None:
    from launcher.options.keywords import check_keywords
    from launcher.submitit import AffinityOptions

    assert check_keywords({"main_thread": "priority", "rank_hooks": "none"}) == {"main_thread": "priority",
                                                                                 "rank_hooks": "none"}
    for keyword, value in (("main_thread", "fast"), ("main_thread", None), ("rank_hooks", True)):
        with pytest.raises(ConfigError) as caught:
            check_keywords({keyword: value})
        assert str(caught.value).startswith(f"{keyword}="), str(caught.value)
    opts = AffinityOptions.from_kwargs(main_thread="compute", rank_hooks="none")
    assert opts.to_argv() == ["--main-thread", "compute", "--rank-hooks", "none"]
    assert opts.request(1).main_thread == "compute"
    from launcher.options.tuned import parse_tuned

    tuned = parse_tuned("affrun-tuned: 1\noptions:\n  main-thread: compute\n", "t.yaml")
    assert tuned.argv() == ["--main-thread", "compute"]
    with pytest.raises(ConfigError, match="main-thread: 'sideways' is not one of none, compute, priority"):
        parse_tuned("affrun-tuned: 1\noptions:\n  main-thread: sideways\n", "t.yaml")
