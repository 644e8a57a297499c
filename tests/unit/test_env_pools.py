"""Every thread of a rank has a home (issue 33, parts 2 and 3), in the environment: the pools beyond OpenMP
(OpenBLAS, BLIS, numexpr, OpenCV, Rayon) sized by the rank's thread plan, the user's values of them judged by
``--env-policy`` as ``OMP_NUM_THREADS`` is (garbage included, never a crash), ``OMP_PLACES`` and
``NCCL_PROXY_CPUSET`` with a main core, the ``AFFRUN_*`` variables the rank's hooks read, and what a rank refuses
in ``AFFRUN_PLAN`` (a hostile ``main_cpus``, a pool count above its threads, ``user_pools`` that are no counts)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given

from launcher.bind.apply import rank_variables
from launcher.bind.handoff import ParentPlan
from launcher.bind.wire import read_job
from launcher.env.omp_syntax import omp_places, parse_places
from launcher.env.policy import COUNT_VARIABLES, rank_environment
from launcher.env.rank_line import rank_line
from launcher.env.variables import POOL_VARIABLES, USER_VARIABLES
from launcher.errors import LaunchError
from launcher.plan.planner import Plan, RankPlan
from launcher.plan.threads import thread_plan
from tests.plan_cases import SETTINGS, Machine, main_thread_cases, plan_or_error
from tests.plan_check import check_handoff
from tests.unit.test_plan_main_thread import box

# test_env.py's rank: cores 0-2 compute (siblings +64), core 3 for the loaders; here its main thread on core 0.
RANK = RankPlan(local_rank=1, cpus=(0, 1, 2, 3, 64, 65, 66, 67), compute_cores=((0, 64), (1, 65), (2, 66)),
                loader_cpus=(3, 67), gpu=1, gpu_pci="0000:0f:00.0", numa_nodes=(3,), mem_nodes=(3,), threads=3)
MAIN = replace(RANK, main_cpus=(0, 64))
GARBAGE = ["lots", "-1", "1e9", "0", "", " ", "٣", "0x10", "9" * 40, "\udcff"]


def counts(env: dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in COUNT_VARIABLES}


def test_every_pool_is_sized_by_the_thread_plan() -> None:
    # No main core: every pool inherits the rank's 3 threads. A main core of 2 PUs: OpenMP (and MKL's threads,
    # OpenMP's) stay 3, thread 0 on the main core; the pools the main thread starts live on its core: 2.
    env = rank_environment(RANK, local_world_size=4, user_env={}).set
    assert counts(env) == dict.fromkeys(COUNT_VARIABLES, "3")
    env = rank_environment(MAIN, local_world_size=4, user_env={}).set
    assert counts(env) == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "2",
                           "BLIS_NUM_THREADS": "2", "NUMEXPR_NUM_THREADS": "2", "OPENCV_FOR_THREADS_NUM": "2",
                           "RAYON_NUM_THREADS": "2"}
    pools = thread_plan(MAIN, 0).pools
    assert (pools["openmp"], pools["opencv"], pools["rayon"], pools["numexpr"], pools["blas"]) == (3, 2, 2, 2, 2)


@pytest.mark.parametrize(("bind", "smt", "places"), [
    # the main thread's core first, then the team's places off it
    ("rank", False, "{0,64},{1:2,65:2},{1:2,65:2}"),
    ("core", False, "{0,64},{1,65},{2,66}"),
    ("core", True, "{0,64},{1},{65},{2},{66}"),
])
def test_omp_places_put_the_main_core_first_and_the_team_off_it(bind: str, smt: bool, places: str) -> None:
    assert omp_places(MAIN, bind, smt) == places  # type: ignore[arg-type]
    parsed = parse_places(places)
    assert parsed is not None and parsed[0] == {0, 64}
    assert all(place.isdisjoint({0, 64}) for place in parsed[1:])


def test_the_main_thread_s_variables_and_nccl_s_home() -> None:
    # With a main core and no comm cores NCCL would start its proxies on the main core (its caller's mask): they
    # get the rank's other CPUs, loader ones included. With comm cores, the comm cores.
    env = rank_environment(MAIN, local_world_size=4, user_env={}).set
    assert env["NCCL_PROXY_CPUSET"] == "1-3,65-67"
    assert (env["AFFRUN_MAIN_CPUS"], env["AFFRUN_USER_POOLS"], env["AFFRUN_ENV_POLICY"], env["AFFRUN_RANK_HOOKS"]) == (
        "0,64", "", "safe", "auto")
    comm = replace(MAIN, compute_cores=MAIN.compute_cores[:2], comm_cpus=(2, 66), threads=2)
    assert rank_environment(comm, local_world_size=4, user_env={}).set["NCCL_PROXY_CPUSET"] == "2,66"
    assert "NCCL_PROXY_CPUSET" not in rank_environment(RANK, local_world_size=4, user_env={}).set
    alone = RankPlan(0, (5,), ((5,),), (), None, None, (), (), 1, main_cpus=(5,))
    env = rank_environment(alone, local_world_size=1, user_env={}).set
    assert (env["OMP_PLACES"], env["NCCL_PROXY_CPUSET"], env["OMP_NUM_THREADS"]) == ("{5}", "5", "1")
    hooks = rank_environment(MAIN, local_world_size=4, user_env={}, hooks="none", policy="keep")
    assert (hooks.set["AFFRUN_RANK_HOOKS"], hooks.set["AFFRUN_ENV_POLICY"]) == ("none", "keep")
    assert any("worker_init_fn=launcher.torch.worker_init_fn" in n for n in hooks.notes)


@pytest.mark.parametrize("name", (*POOL_VARIABLES, "OPENBLAS_NUM_THREADS"))
def test_safe_keeps_a_smaller_pool_and_replaces_a_larger_one(name: str) -> None:
    kept = rank_environment(MAIN, local_world_size=4, user_env={name: "1"})
    assert kept.set[name] == "1" and kept.user_pools == (name,) and kept.set["AFFRUN_USER_POOLS"] == name
    assert kept.notes == (f"keeping {name}=1 set by the user (affrun would set 2)",)
    big = rank_environment(MAIN, local_world_size=4, user_env={name: "64"})
    assert big.set[name] == "2" and big.user_pools == ()
    assert big.notes[0].startswith(f"{name}=64 replaced by 2: 64 threads oversubscribe the rank: its thread plan "
                                   "sizes its ")


@pytest.mark.parametrize("policy", ["safe", "keep", "override"])
@pytest.mark.parametrize("value", GARBAGE)
def test_garbage_in_a_pool_variable_is_never_a_crash(policy: str, value: str) -> None:
    """safe: replaced, with a note; keep: kept, with the note; override: ours."""
    user = dict.fromkeys(COUNT_VARIABLES, value)
    e = rank_environment(MAIN, local_world_size=4, user_env=user, policy=policy)  # type: ignore[arg-type]
    ours = counts(rank_environment(MAIN, local_world_size=4, user_env={}).set)
    if policy == "keep":
        assert counts(e.set) == user and e.user_pools == COUNT_VARIABLES
        assert len([n for n in e.notes if n.endswith("; not a positive thread count") or "oversubscribe" in n]) == len(
            COUNT_VARIABLES)
    else:
        assert counts(e.set) == ours and e.user_pools == ()
        assert len([n for n in e.notes if "replaced by" in n]) == len(COUNT_VARIABLES)
    assert all(isinstance(n, str) for n in e.notes)


def test_a_pool_variable_is_one_number() -> None:
    """OpenMP's counts take a list of levels (``3,2``); a pool's variable is one number."""
    e = rank_environment(RANK, local_world_size=4, user_env={"OMP_NUM_THREADS": "3,2", "RAYON_NUM_THREADS": "3,2"})
    assert (e.set["OMP_NUM_THREADS"], e.set["RAYON_NUM_THREADS"]) == ("3,2", "3")
    assert e.notes[-1] == "RAYON_NUM_THREADS=3,2 replaced by 3: not a positive thread count"


@pytest.mark.parametrize("value", [" 1", "1 ", "1\n", "\t1"])
def test_spaces_around_a_count_are_malformed_where_the_pool_reads_digits_alone(value: str) -> None:
    """OpenCV raises at its first parallel call on " 1" and Rayon ignores it (a thread per CPU): replaced under
    safe; the OpenMP and BLAS readers skip spaces (strtol, int()), so there the value is the user's 1."""
    user = dict.fromkeys(COUNT_VARIABLES, value)
    e = rank_environment(MAIN, local_world_size=4, user_env=user)
    ours = counts(rank_environment(MAIN, local_world_size=4, user_env={}).set)
    assert e.set["OPENCV_FOR_THREADS_NUM"] == ours["OPENCV_FOR_THREADS_NUM"]
    assert e.set["RAYON_NUM_THREADS"] == ours["RAYON_NUM_THREADS"]
    assert set(e.user_pools) == set(COUNT_VARIABLES) - {"OPENCV_FOR_THREADS_NUM", "RAYON_NUM_THREADS"}
    assert sum("spaces around the number" in n for n in e.notes) == 2


def test_override_writes_ours_and_keep_keeps_too_many() -> None:
    over = rank_environment(MAIN, local_world_size=4, user_env={"RAYON_NUM_THREADS": "1"}, policy="override")
    assert over.set["RAYON_NUM_THREADS"] == "2" and "(--env-policy override)" in over.notes[0]
    keep = rank_environment(MAIN, local_world_size=4, user_env={"RAYON_NUM_THREADS": "64"}, policy="keep")
    assert keep.set["RAYON_NUM_THREADS"] == "64" and keep.user_pools == ("RAYON_NUM_THREADS",)
    assert "oversubscribe" in keep.notes[0]
    assert set(POOL_VARIABLES) <= set(USER_VARIABLES)


# ---------------------------------------------------------------------------------------------- the hand-off
def _plan() -> Plan:
    from launcher.plan.planner import Request, make_plan

    return make_plan(box(gpu_nodes=(0, 0, 1, 1), priority=(7, 15, 6, 14)),
                     Request(nproc=4, main_thread="priority", loader_cores=1))


def _value(user_env: dict[str, str] | None = None, policy: str = "safe", hooks: str = "auto") -> dict[str, Any]:
    parent = ParentPlan(_plan(), "rank", policy, "none", "auto", user_env or {}, False, "none", hooks)  # type: ignore[arg-type]
    return json.loads(parent.to_json())  # type: ignore[no-any-return]


def test_a_rank_reads_its_main_core_and_the_hooks_variables() -> None:
    value = _value({"OPENCV_FOR_THREADS_NUM": "1", "OMP_NUM_THREADS": "2"}, policy="keep", hooks="none")
    job = read_job(json.dumps(value))
    assert job.plan == _plan()
    rank = job.ranks[1]
    assert rank.main_cpus == (7, 23) and job.handoff.rank_hooks == "none"
    variables = rank_variables(job, rank)
    assert (variables["AFFRUN_MAIN_CPUS"], variables["AFFRUN_USER_POOLS"], variables["AFFRUN_ENV_POLICY"],
            variables["AFFRUN_RANK_HOOKS"]) == ("7,23", "OMP_NUM_THREADS,OPENCV_FOR_THREADS_NUM", "keep", "none")
    assert variables["OMP_PLACES"].startswith("{7,23},") and variables["NCCL_PROXY_CPUSET"] == "3-5,19-21"
    assert rank_line(rank, 4, "none", "h").endswith(" loader 5,21 main 7,23 mem none")
    parent_env = ParentPlan(_plan(), "rank", "keep", "none", "auto", {"OPENCV_FOR_THREADS_NUM": "1", "OMP_NUM_THREADS": "2"},
                            False, "none", "none").environment(_plan().ranks[1]).set
    assert {k: v for k, v in parent_env.items() if k.startswith("AFFRUN_")} == {
        k: v for k, v in variables.items() if k.startswith("AFFRUN_") and k != "AFFRUN_PLAN_ID"}  # as plan --json


@pytest.mark.parametrize(("where", "bad", "message"), [
    ("main_cpus", [100], "ranks[0]: AFFRUN_MAIN_CPUS=100 is not a core of AFFRUN_COMPUTE_CPUS"),
    ("main_cpus", [5, 21], "ranks[0]: AFFRUN_MAIN_CPUS=5,21 is not a core of"),  # a loader core
    ("main_cpus", [0], "ranks[0].main_cpus must be one of its compute_cores"),  # half a core
    ("main_cpus", "0", "ranks[0].main_cpus must be a list"),
    ("rank_hooks", "all", "rank_hooks must be one of auto, none"),
    ("user_pools", ["PATH"], "env[0].user_pools must name thread and pool counts"),
    ("RAYON_NUM_THREADS", "9", "RAYON_NUM_THREADS='9' is neither a count of 1 to the rank's 3 threads"),
    ("RAYON_NUM_THREADS", "0", "RAYON_NUM_THREADS='0' is neither"),
])
def test_a_hostile_plan_is_one_line(where: str, bad: Any, message: str) -> None:
    value = _value()
    if where == "rank_hooks":
        value["rank_hooks"] = bad
    elif where == "user_pools":
        value["env"][0]["user_pools"] = bad
    elif where == "RAYON_NUM_THREADS":
        value["env"][0]["set"][where] = bad
    else:
        value["plan"]["ranks"][0][where] = bad
    with pytest.raises(LaunchError) as caught:
        read_job(json.dumps(value))
    text = str(caught.value)
    assert message in text and "\n" not in text and len(text) < 400, text


# ---------------------------------------------------------------------------------------------- properties
@SETTINGS
@given(main_thread_cases())
def test_no_team_place_nor_nccl_home_is_the_main_core(case: tuple[Machine, Any]) -> None:
    m, req = case
    plan = plan_or_error(m.topo, req)
    if plan is None:
        return
    for rank in plan.ranks:
        for bind in ("rank", "core"):
            env = rank_environment(rank, local_world_size=len(plan.ranks), user_env={}, bind=bind, smt=req.smt).set
            places = parse_places(env["OMP_PLACES"])
            assert places is not None and all(place <= set(rank.cpus) for place in places)
            if rank.main_cpus:
                main = set(rank.main_cpus)
                assert places[0] == main and all(p.isdisjoint(main) for p in places[1:])
                assert len(places) - 1 >= rank.threads - 1 or bind == "rank"
                assert set(map(int, env["NCCL_PROXY_CPUSET"].replace("-", ",").split(","))) <= set(rank.cpus)
                nccl = thread_plan(rank, 0).nccl_proxy.cpus
                assert main.isdisjoint(nccl) or set(nccl) == main
            assert all(1 <= int(env[n]) <= rank.threads for n in COUNT_VARIABLES)
        check_handoff(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False))
