"""``--comm-cores K`` (issue 29, part 3): cores of each rank kept for NCCL's proxy threads, on known machines
written as fake sysfs trees (and hwloc's hybrid tree, read in place), with each answer derived by hand in the
comment above it; and properties over random machines and requests: comm CPUs are inside the rank's mask, apart
from its loader CPUs and from every OpenMP place, never another rank's, and the OpenMP team keeps a core."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.base.records import to_dict
from launcher.env.omp_syntax import omp_places, parse_places
from launcher.env.policy import rank_environment
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology.model import Topology
from launcher.topology.sysfs import read_sysfs
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.plan_cases import SETTINGS, cases, plan_or_error
from tests.unit.test_plan_layouts import dgx_a100, plan_of, read, two_nodes

RAPTOR = "20em64t-hybrid-1p6c2t+2ca4co1t"  # hwloc's i7-1370P: 6 P-cores (PUs 0-11, HT), 8 E-cores (12-19)


def comm(plan: Plan) -> list[str]:
    return [format_cpulist(r.comm_cpus) for r in plan.ranks]


def test_dgx_a100_comm_core_is_the_last_compute_core_next_to_the_loaders(tmp_path: Path) -> None:
    # Rank 0: GPU 0 on node 3, cores 48-55 (+ siblings 176-183). --loader-cores 2 takes 54-55; --comm-cores 1 takes
    # the last compute core, 53 with its sibling 181 (GPU-local: node 3's CPUs are GPU 0's local CPUs). The team
    # computes on 48-52: OMP_NUM_THREADS 5, OMP_PLACES without 53 and 181, NCCL_PROXY_CPUSET=53,181; the mask
    # still holds all of 48-55,176-183.
    plan = plan_of(read(tmp_path, dgx_a100()), 8, loader_cores=2, comm_cores=1, spill="none")
    r0 = plan.ranks[0]
    assert format_cpulist(r0.cpus) == "48-55,176-183"
    assert format_cpulist(r0.comm_cpus) == "53,181"
    assert format_cpulist(r0.loader_cpus) == "54-55,182-183"
    assert format_cpulist(r0.compute_cpus) == "48-52,176-180"
    assert r0.threads == 5
    env = rank_environment(r0, local_world_size=8, user_env={})
    assert env.set["NCCL_PROXY_CPUSET"] == "53,181"
    assert env.set["OMP_NUM_THREADS"] == "5"
    assert env.set["AFFRUN_COMM_CPUS"] == "53,181"
    places = parse_places(env.set["OMP_PLACES"])
    assert places is not None and not {53, 181} & {p for place in places for p in place}
    # rank 7: GPU 7 on node 5, cores 88-95: loaders 94-95, comm 93 (+221)
    assert comm(plan)[7] == "93,221"
    assert to_dict(plan)["ranks"][0]["comm_cpus"] == [53, 181]


def test_numa_mode_sharers_keep_one_comm_core_each(tmp_path: Path) -> None:
    # --mode numa: ranks 0 and 1 share node 3 (48-63 + 176-191). Each keeps its own comm core, the last GPU-local
    # cores first: rank 0 takes 63 (+191), rank 1 takes 62 (+190). Neither computes on either: 14 cores left,
    # shared by 2 ranks, 7 threads each.
    plan = plan_of(read(tmp_path, dgx_a100()), 8, mode="numa", comm_cores=1, spill="none")
    r0, r1 = plan.ranks[:2]
    assert (format_cpulist(r0.comm_cpus), format_cpulist(r1.comm_cpus)) == ("63,191", "62,190")
    assert format_cpulist(r0.compute_cpus) == format_cpulist(r1.compute_cpus) == "48-61,176-189"
    assert r0.threads == r1.threads == 7
    assert r0.cpus == r1.cpus and {63, 62} <= set(r0.cpus)


def test_overlapping_map_lists_keep_their_comm_cores_apart(tmp_path: Path) -> None:
    # --map '4-7;6-9' (no GPU): ranks 0 and 1 overlap on 6-7. A comm core is in no other rank's mask (the other
    # rank's main thread and workers may run anywhere in it): rank 0 keeps its last core outside 6-9, 5; rank 1 its
    # last outside 4-7, 9. Both compute on the overlap they were given: 4,6-7 for rank 0, 6-8 for rank 1.
    topo = read(tmp_path, two_nodes([]))
    plan = plan_of(topo, 2, cpu_map="4-7;6-9", comm_cores=1)
    assert comm(plan) == ["5", "9"]
    assert [format_cpulist(r.compute_cpus) for r in plan.ranks] == ["4,6-7", "6-8"]
    # the same list twice: no core of either is outside the other's mask, so neither keeps any
    plan = plan_of(topo, 2, cpu_map="4-5;4-5", comm_cores=1)
    assert comm(plan) == ["", ""] and all("ignored" in " ".join(r.warnings) for r in plan.ranks)


def test_comm_core_is_gpu_local_not_merely_last(tmp_path: Path) -> None:
    # --map 4-11: the rank spans node 0 (4-7) and node 1 (8-11). Its GPU is on node 1 with local CPUs 8-9 only:
    # the last core local to it is 9, not 11.
    topo = read(tmp_path, two_nodes([FakeGPU(pci="0000:81:00.0", numa_node=1, local_cpus=[8, 9])]))
    plan = plan_of(topo, 1, cpu_map="4-11", comm_cores=1)
    assert comm(plan) == ["9"] and plan.ranks[0].threads == 7
    # two comm cores: 8 and 9, both local
    assert comm(plan_of(topo, 1, cpu_map="4-11", comm_cores=2)) == ["8-9"]
    # --map 0-3: no core local to the GPU; the rank keeps its own last core, with a warning
    plan = plan_of(topo, 1, cpu_map="0-3", comm_cores=1)
    assert comm(plan) == ["3"]
    assert any("no core of the rank is local to its GPU 0" in w for w in plan.warnings)


def test_a_rank_too_small_keeps_no_comm_core_and_a_thread(tmp_path: Path) -> None:
    # 16 ranks on 16 cores: one core each. A comm core would leave no OpenMP thread: a warning, no comm core,
    # OMP_NUM_THREADS 1, and no NCCL_PROXY_CPUSET.
    plan = plan_of(read(tmp_path, two_nodes()), 16, comm_cores=1)
    assert comm(plan) == [""] * 16
    assert all(r.threads == 1 and len(r.compute_cores) == 1 for r in plan.ranks)
    assert sum("--comm-cores 1 ignored" in w for w in plan.warnings) == 16
    env = rank_environment(plan.ranks[0], local_world_size=16, user_env={})
    assert "NCCL_PROXY_CPUSET" not in env.set


def test_comm_cores_under_a_cpu_quota(tmp_path: Path) -> None:
    # 2 ranks, one node each (0-7, 8-15); comm cores 7 and 15, 7 compute cores each. A quota of 4 CPUs caps the
    # threads at 4 // 2 = 2 per rank; the comm cores stay.
    m = two_nodes()
    m.cpu_max = "400000 100000"
    plan = plan_of(read(tmp_path, m), 2, comm_cores=1, spill="none")
    assert comm(plan) == ["7", "15"]
    assert [r.threads for r in plan.ranks] == [2, 2]
    assert any("threads capped at 2" in w for w in plan.warnings)


def test_hybrid_comm_core_is_a_fast_core(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    # i7-1370P, 1 rank: it computes on the 6 P-cores and loads on the E-cores. The comm core is the last P-core
    # (PUs 10, 11), 5 threads. With --spill compute the E-cores compute too, and the comm core is still the last
    # P-core, not the last core (an E-core): a polling thread needs a fast core.
    topo: Topology = read_sysfs(str(hwloc_root(RAPTOR)), gpus=False)
    for spill, threads in (("loader", 5), ("compute", 13)):
        (r,) = make_plan(topo, Request(nproc=1, use_gpus=False, comm_cores=1, spill=spill)).ranks  # type: ignore[arg-type]
        assert format_cpulist(r.comm_cpus) == "10-11" and r.threads == threads
        assert not set(r.comm_cpus) & set(r.loader_cpus)


def test_negative_comm_cores_is_refused(tmp_path: Path) -> None:
    import pytest

    from launcher.errors import PlanError

    with pytest.raises(PlanError, match="comm"):
        make_plan(read(tmp_path, uniform(1, 4)), Request(nproc=1, comm_cores=-1))


# ----------------------------------------------------------------------------------------------- properties
@SETTINGS
@given(cases(), st.integers(1, 3))
def test_comm_cpus_are_apart_inside_and_out_of_the_openmp_team(case: tuple[object, Request], k: int) -> None:
    m, req = case
    topo: Topology = m.topo  # type: ignore[attr-defined]
    plan = plan_or_error(topo, replace(req, comm_cores=k))
    if plan is None:
        return
    without = make_plan(topo, req)
    pu_core = {p: c.pus[0] for c in topo.cores for p in c.pus}
    owner: dict[int, int] = {}
    for r, before in zip(plan.ranks, without.ranks):
        comm_set = set(r.comm_cpus)
        assert r.cpus == before.cpus, "--comm-cores changed the rank's mask"
        assert comm_set <= set(r.cpus)
        assert comm_set.isdisjoint(r.loader_cpus)
        assert comm_set.isdisjoint(r.compute_cpus)
        assert r.compute_cores and r.threads >= 1
        assert len({pu_core[p] for p in comm_set}) in (0, k)
        env = rank_environment(r, local_world_size=len(plan.ranks), user_env={}, bind="core", smt=req.smt)
        places = parse_places(env.set["OMP_PLACES"])
        assert places is not None and comm_set.isdisjoint({p for place in places for p in place})
        assert comm_set.isdisjoint({p for place in parse_places(omp_places(r)) or [] for p in place})
        if comm_set:
            assert parse_cpulist(env.set["NCCL_PROXY_CPUSET"]) == comm_set
        for p in comm_set:  # a comm CPU is one rank's, even where ranks share CPUs (numa, socket)
            assert p not in owner, f"CPU {p} is a comm CPU of ranks {owner[p]} and {r.local_rank}"
            owner[p] = r.local_rank
        if r.shared:
            sharers_comm = {p for o in plan.ranks if o.cpus == r.cpus for p in o.comm_cpus}
            assert sharers_comm.isdisjoint(r.compute_cpus)
    if req.mode in ("exclusive", "l3"):
        seen: set[int] = set()
        for r in plan.ranks:
            assert seen.isdisjoint(r.cpus), "two ranks on one CPU"
            seen |= set(r.cpus)


# ----------------------------------------------------------------------------------------------- the rank's record
def test_the_rank_reads_its_comm_cpus_and_refuses_comm_cpus_that_do_not_split_its_cpus(tmp_path: Path) -> None:
    # What a rank reads from AFFRUN_PLAN: its comm CPUs, NCCL_PROXY_CPUSET among the variables affrun sets; a
    # plan whose comm CPUs are also compute CPUs, or outside the rank, is refused.
    import json

    import pytest

    from launcher.bind.apply import rank_variables
    from launcher.bind.handoff import ParentPlan
    from launcher.bind.wire import read_job
    from launcher.errors import LaunchError

    plan = plan_of(read(tmp_path, dgx_a100()), 8, loader_cores=2, comm_cores=1, spill="none")
    value = json.loads(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False).to_json())
    job = read_job(json.dumps(value))
    assert job.ranks[0].comm_cpus == (53, 181)
    assert rank_variables(job, job.ranks[0])["NCCL_PROXY_CPUSET"] == "53,181"
    from launcher.env.rank_line import rank_line

    assert " comm 53,181 mem none" in rank_line(job.ranks[0], 8, "none", "h")
    for bad, message in (([52, 180], "must split"), ([100], "AFFRUN_COMM_CPUS=100 names CPUs that are not the rank's")):
        broken = json.loads(json.dumps(value))
        broken["plan"]["ranks"][0]["comm_cpus"] = bad
        with pytest.raises(LaunchError, match=message):
            read_job(json.dumps(broken))


def test_no_rank_computes_on_a_sharer_s_comm_core_its_first_place_included(tmp_path: Path) -> None:
    # Issue 40, item 4: one node of 8 cores (0-7) and two GPUs, `affrun plan --mode numa|socket --nproc-per-node 2
    # --comm-cores 1`: rank 0 keeps core 7, rank 1 core 6, and both share cores 0-5 (3 threads each). Each mask
    # is the node's (0-7), so it holds the other's comm core, but no OpenMP place does: the first place (where the
    # main thread is bound and which forked workers inherit) is 0-5, not 0-6 (rank 0) nor 0-5,7 (rank 1). With
    # --main-thread compute, rank 0's main core is 0 and rank 1's 1; --omp-bind core gives one place per core.
    # `affrun doctor` in rank 0's environment finds no collapse risk in that first place.
    import json

    from tests.launch import affrun

    m = uniform(1, 8)
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0), FakeGPU(pci="0000:3a:00.0", numa_node=0)]
    root = str(write_tree(tmp_path / "root", m))
    expected = {(): ["{0,1,2,3,4,5}"] * 2, ("--main-thread", "compute"): ["{0},{1:5},{1:5}", "{1},{0,2:4},{0,2:4}"],
                ("--omp-bind", "core"): ["{0,1,2,3,4,5},{1},{2},{3},{4},{5}"] * 2}
    for mode in ("numa", "socket"):
        for extra, places in expected.items():
            result = affrun("plan", "--fsroot", root, "--mode", mode, "--nproc-per-node", "2", "--comm-cores", "1",
                            "--json", *extra)
            assert result.returncode == 0, result.stderr
            ranks = json.loads(result.stdout)["ranks"]
            assert [r["comm_cpus"] for r in ranks] == [[7], [6]] and [r["cpus"] for r in ranks] == [list(range(8))] * 2
            assert [r["env"]["OMP_PLACES"] for r in ranks] == places, (mode, extra)
            assert [r["env"]["OMP_NUM_THREADS"] for r in ranks] == ["3", "3"]
    doctor = affrun("doctor", "--fsroot", root, "--nproc-per-node", "2", "--json", env=ranks[0]["env"])
    assert "collapse-risk" not in {f["id"] for f in json.loads(doctor.stdout)["findings"]}, doctor.stdout
