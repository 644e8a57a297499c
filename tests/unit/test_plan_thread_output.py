"""``affrun plan`` shows every thread's home (issue 33, part 1): a ``main`` column where some rank has a main core,
each rank's thread plan below the ranks, and ``thread_plan`` per rank in ``--json``; on the two-node, four-GPU
fake machine of tests/cli_contract.py (8 cores per node, siblings +16), through click's CliRunner."""

from __future__ import annotations

import json

from tests import cli_contract
from tests.cli_contract import check_plan_contract
from tests.unit.test_cli_plan import invoke

root = cli_contract.root


def test_the_table_shows_main_cores_and_every_rank_s_threads(root: str) -> None:
    # 4 ranks, 4 cores each; --loader-cores 1 takes each chunk's last core, --comm-cores 1 the last compute core,
    # --main-thread compute the first: rank 0 computes on 0 (main) and 1, NCCL on 2, its loader on 3.
    result = invoke(["plan", "--fsroot", root, "--main-thread", "compute", "--loader-cores", "1", "--comm-cores", "1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:5] == ["rank", "cpus", "loader", "comm", "main"]
    assert lines[1].split()[:5] == ["0", "0-3,16-19", "3,19", "2,18", "0,16"]
    start = lines.index("rank  main   omp       interop   pin-memory  nccl   workers")
    # the main thread on core 0; the team's other thread on core 1; torch's inter-op pool on the main core (2
    # PUs); the pin-memory thread on the loader core; NCCL on the comm core; one worker on the loader core, its
    # pools sized to its 2 PUs
    assert lines[start + 1].split() == ["0", "0,16", "1,17", "x1", "0,16", "x2", "3,19", "2,18", "3,19/2"]
    assert lines[start - 1].startswith("threads (docs/threads.md)")


def test_the_main_column_only_where_a_rank_has_a_main_core(root: str) -> None:
    lines = invoke(["plan", "--fsroot", root]).stdout.splitlines()
    assert "main" not in lines[0].split()
    start = lines.index(next(line for line in lines if line.startswith("rank  main")))
    assert lines[start + 1].split() == ["0", "whole", "whole", "x3", "whole", "x4", "whole", "whole", "-"]
    # --main-thread priority on a machine without priority cores: as none, and the warning says why
    lines = invoke(["plan", "--fsroot", root, "--main-thread", "priority"]).stdout.splitlines()
    assert "main" not in lines[0].split()
    assert lines[-1].startswith("warning: --main-thread priority: this machine has no priority core (")


def test_json_carries_each_rank_s_thread_plan_and_the_variables(root: str) -> None:
    result = invoke(["plan", "--fsroot", root, "--json", "--main-thread", "compute", "--loader-cores", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check_plan_contract(data)
    r0 = data["ranks"][0]
    assert r0["main_cpus"] == [0, 16]
    threads = r0["thread_plan"]
    assert threads["main"] == {"role": "main", "cpus": "0,16", "threads": 1, "pinned": True, "why": "a core of its own"}
    assert (threads["omp"]["cpus"], threads["omp"]["threads"]) == ("1-2,17-18", 2)
    assert threads["workers"] == [{"index": 0, "cpus": "3,19", "pools": 2}]
    assert threads["pools"] == {"openmp": 3, "blas": 2, "opencv": 2, "rayon": 2, "numexpr": 2, "interop": 2}
    env = r0["env"]
    assert (env["AFFRUN_MAIN_CPUS"], env["OMP_PLACES"], env["NCCL_PROXY_CPUSET"]) == ("0,16", "{0,16},{1:2,17:2},{1:2,17:2}",
                                                                                     "1-3,17-19")
    assert (env["OMP_NUM_THREADS"], env["RAYON_NUM_THREADS"], env["OPENCV_FOR_THREADS_NUM"]) == ("3", "2", "2")
    assert (env["AFFRUN_ENV_POLICY"], env["AFFRUN_RANK_HOOKS"], env["AFFRUN_USER_POOLS"]) == ("safe", "auto", "")
    kept = json.loads(invoke(["plan", "--fsroot", root, "--json", "--env-policy", "keep"],
                             RAYON_NUM_THREADS="64").stdout)["ranks"][0]
    assert kept["env"]["RAYON_NUM_THREADS"] == "64" and kept["env"]["AFFRUN_USER_POOLS"] == "RAYON_NUM_THREADS"


def test_workers_are_cut_by_whole_cores_where_siblings_are_numbered_apart(root: str) -> None:
    # Siblings +16: the loader cores 2 and 3 of rank 0 are CPUs 2,3,18,19. Cut in CPU order, worker 0 had 2-3
    # and worker 1 18-19, both workers on both cores; by core, each worker has a core of its own.
    data = json.loads(invoke(["plan", "--fsroot", root, "--json", "--loader-cores", "2"]).stdout)
    r0 = data["ranks"][0]
    assert r0["loader_cpus"] == [2, 3, 18, 19]
    assert r0["thread_plan"]["workers"] == [{"index": 0, "cpus": "2,18", "pools": 2},
                                            {"index": 1, "cpus": "3,19", "pools": 2}]
