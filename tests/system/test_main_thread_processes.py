"""``--main-thread compute`` and the pool variables through the real entry points (issue 33), on this machine's
own CPUs, with assertions that hold on any machine: ``affrun exec --dry-run`` and ``affrun plan --json`` show the
main core, ``OMP_PLACES`` with it first and the team off it, ``NCCL_PROXY_CPUSET`` off it, every pool sized and
the ``AFFRUN_*`` variables the rank's hooks read; and a real rank's main thread is on its main core once
``import torch`` has loaded libgomp."""

from __future__ import annotations

import json
import os
import sys

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.env.omp_syntax import parse_places
from launcher.env.policy import COUNT_VARIABLES
from tests.launch import affrun, rank_lines
from tests.run_dry import dry_run


def exec_env(*args: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``affrun exec --dry-run ARGS``, whose rank line shows the same main core."""
    proc = dry_run("exec", *args, env=env)
    (line,) = rank_lines(proc.stderr + proc.stdout)
    assert (line["main"] or "") == proc.variables["AFFRUN_MAIN_CPUS"]
    return proc.variables


def check_main_core(env: dict[str, str]) -> None:
    main = parse_cpulist(env["AFFRUN_MAIN_CPUS"])
    cpus, compute = parse_cpulist(env["AFFRUN_CPUS"]), parse_cpulist(env["AFFRUN_COMPUTE_CPUS"])
    assert main and main <= compute <= cpus
    places = parse_places(env["OMP_PLACES"])
    assert places is not None and places[0] == main and all(place.isdisjoint(main) for place in places[1:])
    assert env["NCCL_PROXY_CPUSET"] == format_cpulist((cpus - main) or cpus)
    threads = int(env["OMP_NUM_THREADS"])
    assert env["MKL_NUM_THREADS"] == str(threads) == env["AFFRUN_THREADS"]
    for name in COUNT_VARIABLES:  # the pools the main thread starts live on its core: no more than its CPUs
        assert 1 <= int(env[name]) <= (threads if name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") else len(main))


def test_exec_dry_run_shows_the_main_core_and_the_pools() -> None:
    env = exec_env("--main-thread", "compute")
    check_main_core(env)
    assert (env["AFFRUN_ENV_POLICY"], env["AFFRUN_RANK_HOOKS"], env["AFFRUN_USER_POOLS"]) == ("safe", "auto", "")
    plain = exec_env()
    assert plain["AFFRUN_MAIN_CPUS"] == "" and "NCCL_PROXY_CPUSET" not in plain
    assert all(plain[name] == plain["OMP_NUM_THREADS"] for name in COUNT_VARIABLES)


def test_the_user_s_pool_values_are_judged_by_the_env_policy() -> None:
    env = exec_env("--main-thread", "compute", env={"RAYON_NUM_THREADS": "lots", "OPENCV_FOR_THREADS_NUM": "1"})
    assert env["RAYON_NUM_THREADS"] != "lots" and env["OPENCV_FOR_THREADS_NUM"] == "1"
    assert env["AFFRUN_USER_POOLS"] == "OPENCV_FOR_THREADS_NUM"
    env = exec_env("--main-thread", "compute", "--env-policy", "keep", "--rank-hooks", "none",
                  env={"RAYON_NUM_THREADS": "lots"})
    assert env["RAYON_NUM_THREADS"] == "lots" and env["AFFRUN_USER_POOLS"] == "RAYON_NUM_THREADS"
    assert (env["AFFRUN_ENV_POLICY"], env["AFFRUN_RANK_HOOKS"]) == ("keep", "none")


def test_plan_json_carries_the_thread_plan() -> None:
    proc = affrun("plan", "--json", "--main-thread", "compute")
    assert proc.returncode == 0, proc.stderr
    (rank,) = json.loads(proc.stdout)["ranks"]
    check_main_core(rank["env"])
    assert rank["thread_plan"]["main"]["cpus"] == rank["env"]["AFFRUN_MAIN_CPUS"] == format_cpulist(rank["main_cpus"])
    assert rank["thread_plan"]["nccl_proxy"]["cpus"] == rank["env"]["NCCL_PROXY_CPUSET"]
    table = affrun("plan", "--main-thread", "compute")
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:4] == ["rank", "cpus", "loader", "main"]


PROBE = """
import json, os
before = sorted(os.sched_getaffinity(0))
import torch
print(json.dumps({"before": before, "after": sorted(os.sched_getaffinity(0)), "main": os.environ["AFFRUN_MAIN_CPUS"],
                  "cpus": os.environ["AFFRUN_CPUS"]}))
"""


@pytest.mark.torch
def test_a_real_rank_s_main_thread_moves_to_its_main_core_at_import_torch() -> None:
    """libgomp (torch's) binds the initial thread to the first place when it loads: the main core. Until then the
    rank's mask is its whole set, as for --main-thread none."""
    proc = affrun("exec", "--main-thread", "compute", "--", sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["before"] == sorted(parse_cpulist(record["cpus"]))
    assert record["after"] == sorted(parse_cpulist(record["main"]))
    assert set(record["after"]) <= set(os.sched_getaffinity(0))
