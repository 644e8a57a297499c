"""The per-rank environment: what affrun exports, how it treats values the user already set, numactl arguments,
and a check with the real OpenMP runtimes (libgomp, libiomp5 and LLVM's libomp) that the exported variables bind every thread
inside the rank's CPUs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from launcher.bind.handoff import ParentPlan
from launcher.env.omp_syntax import omp_places, parse_places, parse_proclist
from launcher.env.policy import (
    KMP_DEFAULT,
    effective_mem_policy,
    numactl_args,
    plan_json,
    rank_environment,
    variable_problem,
)
from launcher.plan.planner import Plan, RankPlan, Request, make_plan
from launcher.topology import load_topology
from tests.fakesys import uniform, write_tree
from tests.plan_check import check_handoff

# A rank of a machine whose SMT siblings are c and c+64: cores 0-3, the last one kept for DataLoader workers.
RANK = RankPlan(
    local_rank=1,
    cpus=(0, 1, 2, 3, 64, 65, 66, 67),
    compute_cores=((0, 64), (1, 65), (2, 66)),
    loader_cpus=(3, 67),
    gpu=1,
    gpu_pci="0000:0f:00.0",
    numa_nodes=(3,),
    mem_nodes=(3,),
    threads=3,
)


def env_for(user: dict[str, str], **kwargs: object) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    e = rank_environment(RANK, local_world_size=4, user_env=user, **kwargs)  # type: ignore[arg-type]
    return e.set, e.unset, e.notes


# ---------------------------------------------------------------------------------------------- what affrun sets
def test_defaults_without_user_values() -> None:
    env, unset, notes = env_for({})
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    # The main thread's place is the whole rank (forked DataLoader workers inherit the loader core); the other
    # two threads keep to the compute CPUs, so the loader core stays free of compute.
    assert env["OMP_PLACES"] == "{0,1,2,3,64,65,66,67},{0:3,64:3},{0:3,64:3}"
    assert parse_places(env["OMP_PLACES"]) == [frozenset(RANK.cpus), *[frozenset(RANK.compute_cpus)] * 2]
    assert env["OMP_PROC_BIND"] == "close"
    assert env["KMP_AFFINITY"] == KMP_DEFAULT == "granularity=fine"
    assert unset == ()
    assert notes == ()


def test_affrun_variables() -> None:
    env, _, _ = env_for({})
    assert {k: v for k, v in env.items() if k.startswith("AFFRUN_")} == {
        "AFFRUN_LOCAL_RANK": "1",
        "AFFRUN_LOCAL_WORLD_SIZE": "4",
        "AFFRUN_CPUS": "0-3,64-67",
        "AFFRUN_COMPUTE_CPUS": "0-2,64-66",
        "AFFRUN_LOADER_CPUS": "3,67",
        "AFFRUN_COMM_CPUS": "",
        "AFFRUN_NUMA_NODES": "3",
        "AFFRUN_MEM_NODES": "3",
        "AFFRUN_GPU": "1",
        "AFFRUN_GPU_PCI": "0000:0f:00.0",
        "AFFRUN_NIC": "",
        "AFFRUN_THREADS": "3",
        "AFFRUN_OMP_BIND": "rank",
        "AFFRUN_MAIN_CPUS": "",
        "AFFRUN_USER_POOLS": "",
        "AFFRUN_ENV_POLICY": "safe",
        "AFFRUN_RANK_HOOKS": "auto",
    }
    cpu_only = RankPlan(0, (5,), ((5,),), (), None, None, (), (), 1)
    env = rank_environment(cpu_only, local_world_size=1, user_env={}).set
    assert (env["AFFRUN_GPU"], env["AFFRUN_GPU_PCI"], env["AFFRUN_LOADER_CPUS"], env["AFFRUN_NUMA_NODES"]) == ("", "", "", "")


@pytest.mark.parametrize(
    ("bind", "smt", "places"),
    [
        ("rank", False, "{0,1,2,3,64,65,66,67},{0:3,64:3},{0:3,64:3}"),
        ("core", False, "{0,1,2,3,64,65,66,67},{1,65},{2,66}"),
        ("core", True, "{0,1,2,3,64,65,66,67},{64},{1},{65},{2},{66}"),
    ],
)
def test_omp_places_format(bind: str, smt: bool, places: str) -> None:
    # smt=True with bind="rank" would give the rank's PUs as threads: RANK.threads is the plan's own count
    assert omp_places(RANK, bind, smt) == places
    env, _, _ = env_for({}, bind=bind, smt=smt)
    assert env["OMP_PLACES"] == places
    assert env["AFFRUN_OMP_BIND"] == bind


def test_core_binding_keeps_the_main_thread_on_the_whole_rank() -> None:
    # The layout: the first place is the rank's whole set, the others one core each (4 threads).
    rank = RankPlan(0, (0, 1, 2, 3), ((0,), (1,), (2,), (3,)), (), None, None, (0,), (0,), 4)
    e = rank_environment(rank, local_world_size=1, user_env={}, bind="core")
    assert e.set["OMP_PLACES"] == "{0,1,2,3},{1},{2},{3}" and e.set["OMP_PROC_BIND"] == "close"
    assert e.notes == ()  # nothing to work around: workers inherit the whole rank
    assert omp_places(rank, "rank") == "{0,1,2,3}"  # no loader CPUs: one place


@pytest.mark.parametrize("policy", ["safe", "override", "keep"])
@pytest.mark.parametrize("bind", ["rank", "core"])
def test_every_value_is_a_string(policy: str, bind: str) -> None:
    hostile = {"OMP_NUM_THREADS": "64", "KMP_AFFINITY": "disabled", "OMP_PLACES": "cores", "GOMP_CPU_AFFINITY": "0-127"}
    e = rank_environment(RANK, local_world_size=4, user_env=hostile, bind=bind, policy=policy)
    assert e.set and all(isinstance(k, str) and isinstance(v, str) for k, v in e.set.items())
    assert all(isinstance(n, str) for n in (*e.unset, *e.notes))
    applied = e.apply_to({**hostile, "PATH": "/bin"})
    assert applied["PATH"] == "/bin"
    assert all(isinstance(v, str) for v in applied.values())
    for name in e.unset:
        assert name not in applied


# ---------------------------------------------------------------------------------------------- the user's values
SAFE = [
    ("OMP_NUM_THREADS", "2"),  # fewer threads than compute cores
    ("OMP_NUM_THREADS", "3,2"),  # nested list: the outer level counts
    ("MKL_NUM_THREADS", "1"),
    ("OPENBLAS_NUM_THREADS", "2"),
    ("OMP_PROC_BIND", "spread"),
    ("OMP_PROC_BIND", "spread,close"),
    ("OMP_PLACES", "{0,1,2}"),  # one place inside the rank
    ("OMP_PLACES", "{0:3}"),  # interval notation: 0,1,2
    ("OMP_PLACES", "{0:3,64:3}"),  # one place, two intervals
    ("OMP_PLACES", "{0:4,!3}"),  # exclusion: 0,1,2
    ("KMP_AFFINITY", "granularity=core"),  # no type
    ("KMP_AFFINITY", "noverbose,granularity=fine"),
    ("KMP_AFFINITY", "granularity=fine,compact,1,0"),  # Intel's usual advice: a type, inside the process mask
    ("KMP_AFFINITY", "explicit,proclist=[0,1,2,64]"),
    ("KMP_AFFINITY", "explicit,proclist=[0-2,{64,65}]"),
    ("KMP_AFFINITY", "none"),
]

DANGEROUS = [
    ("OMP_NUM_THREADS", "4", "4 threads oversubscribe the rank: its compute CPUs take 3"),
    ("OMP_NUM_THREADS", "6", "6 threads oversubscribe"),  # one per hardware thread, but affrun plans whole cores
    ("OMP_NUM_THREADS", "8", "8 threads oversubscribe"),  # 8 = all the rank's CPUs, but 2 are loader CPUs
    ("OMP_NUM_THREADS", "0", "not a positive thread count"),
    ("OMP_NUM_THREADS", "", "not a positive thread count"),
    ("OMP_NUM_THREADS", "four", "not a positive thread count"),
    ("MKL_NUM_THREADS", "128", "oversubscribe"),
    ("OPENBLAS_NUM_THREADS", "-1", "not a positive thread count"),
    ("OMP_PROC_BIND", "sideways", "not a valid OMP_PROC_BIND value"),
    ("OMP_PROC_BIND", "", "not a valid OMP_PROC_BIND value"),
    ("OMP_PLACES", "{0,1,99}", "CPUs 99 are outside the rank's CPUs"),
    ("OMP_PLACES", "{4:4}", "CPUs 4-7 are outside the rank's CPUs"),
    ("OMP_PLACES", "cores", "pins the main thread to one place"),
    ("OMP_PLACES", "threads(4)", "pins the main thread to one place"),
    ("OMP_PLACES", "{0},{1},{2}", "pins the main thread to one place"),
    ("OMP_PLACES", "{0,64}:3", "pins the main thread to one place"),  # place interval: 3 places
    ("OMP_PLACES", "{0}:3:100", "CPUs 100,200 are outside the rank's CPUs"),
    ("OMP_PLACES", "{0}:x", "not a valid OMP_PLACES value"),
    ("OMP_PLACES", "{0,{1}}", "not a valid OMP_PLACES value"),
    ("OMP_PLACES", "", "empty OMP_PLACES"),
    ("OMP_PLACES", "{a,b}", "not a valid OMP_PLACES value"),
    ("OMP_PLACES", "{0-2}", "not a valid OMP_PLACES value"),  # libgomp rejects it, then pins one thread per CPU
    ("KMP_AFFINITY", "disabled", "disabled: threads are not bound and migrate"),
    ("KMP_AFFINITY", "granularity=fine,disabled", "disabled"),
    ("KMP_AFFINITY", "", "empty KMP_AFFINITY"),
    ("KMP_AFFINITY", "  ", "empty KMP_AFFINITY"),
    ("KMP_AFFINITY", "compactt", "malformed KMP_AFFINITY token 'compactt'"),
    ("KMP_AFFINITY", "granularity=atom", "malformed KMP_AFFINITY token"),
    ("KMP_AFFINITY", "compact,scatter", "more than one affinity type"),
    ("KMP_AFFINITY", "explicit,proclist=[0,1,100-101]", "proclist CPUs 100-101 are outside the rank's CPUs"),
    ("KMP_AFFINITY", "explicit,proclist=[0,1", "malformed proclist"),
    ("KMP_AFFINITY", "explicit,proclist=[{0-2}]", "malformed proclist"),
    # Sizes that once built hundreds of millions of ids (a hang): refused before anything is expanded.
    ("OMP_PLACES", "{0:100000000}", "not a valid OMP_PLACES value (an interval of 100000000 is longer than"),
    ("OMP_PLACES", "{0}:100000000", "not a valid OMP_PLACES value (an interval of 100000000"),
    ("OMP_PLACES", "{0:65536}:65536", "not a valid OMP_PLACES value (the places name more than"),
    ("OMP_PLACES", "{99999999}", "not a valid OMP_PLACES value (cpu id 99999999 is above 65535"),
    ("KMP_AFFINITY", "explicit,proclist=[0-100000000]", "malformed proclist (cpu id 100000000 is above 65535"),
]


@pytest.mark.parametrize(("name", "value"), SAFE)
def test_safe_user_value_is_kept_with_a_note(name: str, value: str) -> None:
    env, _, notes = env_for({name: value})
    assert env[name] == value
    assert any(n.startswith(f"keeping {name}={value} set by the user") for n in notes)


@pytest.mark.parametrize(("name", "value", "problem"), DANGEROUS)
def test_dangerous_user_value_is_replaced_with_the_reason(name: str, value: str, problem: str) -> None:
    ours, _, _ = env_for({})
    env, _, notes = env_for({name: value})
    assert env[name] == ours[name]
    assert any(n.startswith(f"{name}={value} replaced by {ours[name]}: ") and problem in n for n in notes), notes


@pytest.mark.parametrize(("name", "value", "problem"), DANGEROUS)
def test_keep_policy_keeps_dangerous_values_but_says_why(name: str, value: str, problem: str) -> None:
    env, _, notes = env_for({name: value}, policy="keep")
    assert env[name] == value
    assert any(n.startswith(f"keeping {name}={value}") and problem in n for n in notes), notes


@pytest.mark.parametrize(("name", "value"), SAFE)
def test_override_policy_replaces_even_safe_values(name: str, value: str) -> None:
    ours, _, _ = env_for({})
    env, _, notes = env_for({name: value}, policy="override")
    assert env[name] == ours[name]
    assert f"{name}={value} replaced by {ours[name]} (--env-policy override)" in notes


def test_thread_limit_is_what_affrun_would_set() -> None:
    """The limit is rank.threads: with --smt the hardware threads count, so 6 is fine there."""
    smt_rank = RankPlan(1, RANK.cpus, RANK.compute_cores, RANK.loader_cpus, 1, None, (3,), (3,), threads=6)
    env = rank_environment(smt_rank, local_world_size=4, user_env={"OMP_NUM_THREADS": "6"}, smt=True)
    assert env.set["OMP_NUM_THREADS"] == "6"
    env = rank_environment(smt_rank, local_world_size=4, user_env={"OMP_NUM_THREADS": "7"}, smt=True)
    assert env.set["OMP_NUM_THREADS"] == "6"


def test_shared_mode_thread_limit_is_the_ranks_share(tmp_path: Path) -> None:
    """--mode numa, 2 ranks on one node of 2 cores: each rank takes 1 thread, so a user's 2 (4 threads on
    2 cores in all) is replaced, as affrun doctor also calls it."""
    topo = load_topology(fsroot=str(write_tree(tmp_path / "root", uniform(1, 2))), environ={})
    plan = make_plan(topo, Request(nproc=2, mode="numa"))
    assert [(r.cpus, r.threads) for r in plan.ranks] == [((0, 1), 1), ((0, 1), 1)]
    for rank in plan.ranks:
        env = rank_environment(rank, local_world_size=2, user_env={"OMP_NUM_THREADS": "2"})
        assert env.set["OMP_NUM_THREADS"] == "1"
        assert "OMP_NUM_THREADS=2 replaced by 1: 2 threads oversubscribe the rank: its compute CPUs take 1" in env.notes
        kept = rank_environment(rank, local_world_size=2, user_env={"OMP_NUM_THREADS": "1"})
        assert kept.set["OMP_NUM_THREADS"] == "1" and not any("replaced" in n for n in kept.notes)


def test_a_value_equal_to_affruns_is_silent() -> None:
    ours, _, _ = env_for({})
    _, _, notes = env_for({k: ours[k] for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "KMP_AFFINITY")})
    assert notes == ()


def test_kept_kmp_type_warns_about_182() -> None:
    _, _, notes = env_for({"KMP_AFFINITY": "granularity=fine,compact"})
    assert any("warning #182" in n for n in notes)
    _, _, notes = env_for({"KMP_AFFINITY": "granularity=core"})
    assert not any("warning #182" in n for n in notes)


@pytest.mark.parametrize("bind", ["rank", "core"])
@pytest.mark.parametrize("value", ["{0,1,2,64,65,66},{1,65},{2,66}", "{0:4,64:4},{1},{2}", "{0,1,2,64,65,66}"])
def test_places_whose_first_place_covers_the_compute_cpus_are_kept(value: str, bind: str) -> None:
    env, _, notes = env_for({"OMP_PLACES": value}, bind=bind)
    assert env["OMP_PLACES"] == value
    assert not any("replaced" in n for n in notes)


@pytest.mark.parametrize("bind", ["rank", "core"])
@pytest.mark.parametrize("value", ["cores", "{0},{1},{2}", "{0,64},{1,65}", "{0},{99}"])
def test_places_that_pin_the_main_thread_narrower_are_replaced_in_both_modes(value: str, bind: str) -> None:
    env, _, notes = env_for({"OMP_PLACES": value}, bind=bind)
    assert env["OMP_PLACES"] == omp_places(RANK, bind)
    assert any(f"OMP_PLACES={value} replaced" in n for n in notes)


@pytest.mark.parametrize(
    ("value", "places"),
    [
        ("{0,64},{1,65}", [{0, 64}, {1, 65}]),
        ("{0:4}", [{0, 1, 2, 3}]),
        ("{0:4:2}", [{0, 2, 4, 6}]),
        ("{0,1}:3:2", [{0, 1}, {2, 3}, {4, 5}]),
        ("{0:4,!2}", [{0, 1, 3}]),
        ("{0},{1},!{1}", [{0}]),
        (" {0, 64} , {1} ", [{0, 64}, {1}]),
        ("0,1", [{0}, {1}]),  # a bare CPU id is a place of one CPU
        ("0:2", [{0}, {1}]),  # ... so this is a place interval, not a resource interval
        ("{1}:2:-1", [{1}, {0}]),
        ("{0},!{1}", None),  # excludes a place not (yet) listed
        ("{0-3}", None),  # ranges are not OpenMP: libgomp rejects the whole value
        ("0-3,8", None),
        ("{0}:2:-1", None),  # CPU -1
        ("{!0,1}", None),  # excludes a CPU not (yet) in the place
        ("!{0},{1}", None),  # excludes a place not (yet) listed
        ("{0},,{1}", None),
        ("{}", None),
        ("{0,}", None),
        ("{1 0}", None),
        ("{0}:0", None),
        ("{0:0}", None),
        ("{0", None),
        ("{a}", None),
        ("{0}:2:y", None),
    ],
)
def test_parse_places(value: str, places: list[set[int]] | None) -> None:
    parsed = parse_places(value)
    assert (None if parsed is None else [set(p) for p in parsed]) == places


@pytest.mark.parametrize(
    ("value", "places"),
    [
        ("0,1,2,64", [{0}, {1}, {2}, {64}]),
        ("0-3,8", [{0}, {1}, {2}, {3}, {8}]),  # a range is one place per CPU
        ("7-1:-3", [{7}, {4}, {1}]),
        (" {0, 64} ,1", [{0, 64}, {1}]),
        ("{0-1}", None),  # libiomp5: "KMP_AFFINITY: syntax error, not using affinity"
        ("3-1", None),
        ("0-3:0", None),
        ("", None),
        ("0,", None),
    ],
)
def test_parse_proclist(value: str, places: list[set[int]] | None) -> None:
    parsed = parse_proclist(value)
    assert (None if parsed is None else [set(p) for p in parsed]) == places


def test_gomp_cpu_affinity() -> None:
    # inside the rank, but libiomp5/libomp would pin the main thread to CPU 0 (the matrix of
    # tests/system/test_user_binding_env.py saw it): removed, and the note says why
    _, unset, notes = env_for({"GOMP_CPU_AFFINITY": "0-2 64"})
    assert unset == ("GOMP_CPU_AFFINITY",)
    assert any("pin the main thread to CPU 0" in n for n in notes)
    one_cpu = RankPlan(0, (5,), ((5,),), (), None, None, (), (), 1)
    assert rank_environment(one_cpu, local_world_size=1, user_env={"GOMP_CPU_AFFINITY": "5"}).unset == ()
    _, unset, notes = env_for({"GOMP_CPU_AFFINITY": "0-127"})
    assert unset == ("GOMP_CPU_AFFINITY",)
    assert any("GOMP_CPU_AFFINITY=0-127 removed: CPUs 4-63,68-127 are outside the rank's CPUs" in n for n in notes)
    _, unset, _ = env_for({"GOMP_CPU_AFFINITY": "zero"})
    assert unset == ("GOMP_CPU_AFFINITY",)
    _, unset, notes = env_for({"GOMP_CPU_AFFINITY": "0-100000000"})  # refused, not expanded
    assert unset == ("GOMP_CPU_AFFINITY",) and any("not a valid CPU list" in n for n in notes)
    _, unset, notes = env_for({"GOMP_CPU_AFFINITY": "0-127"}, policy="keep")
    assert unset == ()


def test_doctor_helper_matches_the_policy() -> None:
    cpus = frozenset(RANK.cpus)
    assert variable_problem("KMP_AFFINITY", "disabled", cpus)
    assert variable_problem("OMP_NUM_THREADS", "9", cpus)
    assert variable_problem("OMP_NUM_THREADS", "8", cpus) is None  # without compute CPUs: all the rank's CPUs
    assert variable_problem("OMP_PLACES", "{0,1}", cpus) is None


def test_unknown_bind_or_policy() -> None:
    with pytest.raises(ValueError, match="bind"):
        env_for({}, bind="socket")
    with pytest.raises(ValueError, match="policy"):
        env_for({}, policy="maybe")


# ---------------------------------------------------------------------------------------------- numactl, JSON
@pytest.mark.parametrize(
    ("policy", "args"),
    [
        ("membind", ["numactl", "--physcpubind=0-3,64-67", "--membind=3"]),
        ("preferred", ["numactl", "--physcpubind=0-3,64-67", "--preferred=3"]),
        ("interleave", ["numactl", "--physcpubind=0-3,64-67", "--interleave=3"]),
        ("none", ["numactl", "--physcpubind=0-3,64-67"]),
    ],
)
def test_numactl_args(policy: str, args: list[str]) -> None:
    assert numactl_args(RANK, policy) == args
    assert numactl_args(RANK, policy, bind_cpus=False) == [a for a in args if not a.startswith("--physcpubind")]


def test_numactl_args_two_nodes_and_none() -> None:
    rank = RankPlan(0, (0, 8), ((0,), (8,)), (), None, None, (0, 1), (0, 1), 2, shared=True)
    assert numactl_args(rank, "membind") == ["numactl", "--physcpubind=0,8", "--membind=0,1"]
    assert numactl_args(rank, "preferred") == ["numactl", "--physcpubind=0,8", "--preferred=0"]
    nomem = RankPlan(0, (0,), ((0,),), (), None, None, (), (), 1)
    assert numactl_args(nomem, "membind") == ["numactl", "--physcpubind=0"]


def test_effective_mem_policy() -> None:
    assert effective_mem_policy("auto", 2) == "preferred"
    assert effective_mem_policy("auto", 1) == "none"
    assert effective_mem_policy("membind", 1) == "membind"


def test_plan_json_adds_env_per_rank() -> None:
    plan = Plan("exclusive", False, "rank", "none", (RANK,))
    envs = [rank_environment(RANK, local_world_size=1, user_env={"OMP_PLACES": "cores"})]
    out = plan_json(plan, envs, "preferred")
    ranks: list[dict[str, Any]] = out["ranks"]  # type: ignore[assignment]
    (rank,) = ranks
    assert rank["env"]["OMP_PLACES"] == omp_places(RANK)
    assert rank["unset"] == []
    assert any("OMP_PLACES=cores replaced" in n for n in rank["notes"])
    assert rank["mem_policy"] == "preferred"
    # The hand-off reader checks what it reads: rank i of a plan is local rank i (RANK above is local rank 1).
    whole = Plan("exclusive", False, "rank", "none", (replace(RANK, local_rank=0),))
    check_handoff(ParentPlan(whole, "rank", "safe", "none", "auto", {}, False))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0 3 1-2 4-15:4", [0, 3, 1, 2, 4, 8, 12]), ("0-3,8", [0, 1, 2, 3, 8]), ("x", None), ("5-2", None), ("", None)],
)
def test_gomp_cpu_affinity_syntax(value: str, expected: list[int] | None) -> None:
    """libgomp's own list syntax (strided ranges with ':'), in binding order."""
    from launcher.env.omp_syntax import parse_gomp_cpu_affinity

    assert parse_gomp_cpu_affinity(value) == expected
