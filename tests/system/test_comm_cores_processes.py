"""``--comm-cores`` through the real entry points (issue 29, part 3): the mask and the environment a real rank
gets from ``affrun exec`` and ``affrun torchrun`` on this machine's own CPUs (a fake tree of them with a fake GPU
on their node: only the GPU is fake). The rank's mask holds the comm core; ``NCCL_PROXY_CPUSET`` names it;
``OMP_NUM_THREADS`` and ``OMP_PLACES`` leave it out; the rank line shows it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.env.omp_syntax import parse_places
from tests.conftest import need
from tests.fakesys import this_machine_with_gpus, write_tree
from tests.launch import affrun, affrun_argv, clean_env, rank_lines, run

PROBE = """
import json, os, sys
mask = sorted(os.sched_getaffinity(0))
names = ("NCCL_PROXY_CPUSET", "OMP_NUM_THREADS", "OMP_PLACES", "AFFRUN_COMM_CPUS", "AFFRUN_CPUS")
print(json.dumps({"mask": mask, **{n: os.environ.get(n) for n in names}, "argv": sys.argv[1:]}))
"""


def tree(tmp_path: Path) -> dict[str, str]:
    need(len(os.sched_getaffinity(0)) >= 2, "needs 2 CPUs")
    return {"AFFRUN_FSROOT": str(write_tree(tmp_path / "root", this_machine_with_gpus(1)))}


def check(record: dict[str, object], cpus: list[int]) -> None:
    comm = cpus[-1]  # one rank of every core: the comm core is its last (all are on the GPU's node)
    assert record["mask"] == cpus  # the mask still holds the comm core: NCCL pins its threads inside it
    assert record["NCCL_PROXY_CPUSET"] == record["AFFRUN_COMM_CPUS"] == str(comm)
    assert record["OMP_NUM_THREADS"] == str(len(cpus) - 1)
    places = parse_places(str(record["OMP_PLACES"]))
    assert places is not None and comm not in {p for place in places for p in place}


def test_affrun_exec_rank_keeps_a_comm_core(tmp_path: Path) -> None:
    env = tree(tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    proc = affrun("exec", "--verbose", "--comm-cores", "1", "--", sys.executable, "-c", PROBE, "a b", "--x=1",
                  env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    check(record, cpus)
    assert record["argv"] == ["a b", "--x=1"]
    (line,) = rank_lines(proc.stderr)
    assert line["comm"] == str(cpus[-1]) and line["omp"] == str(len(cpus) - 1)


def test_a_users_proxy_cpuset_is_kept_or_replaced_by_the_env_policy(tmp_path: Path) -> None:
    env = tree(tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    inside = str(cpus[0])
    proc = affrun("exec", "--comm-cores", "1", "--", sys.executable, "-c", PROBE,
                  env={**env, "NCCL_PROXY_CPUSET": inside})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["NCCL_PROXY_CPUSET"] == inside  # safe: kept
    outside = str(max(cpus) + 1000)
    proc = affrun("exec", "--verbose", "--comm-cores", "1", "--", sys.executable, "-c", PROBE,
                  env={**env, "NCCL_PROXY_CPUSET": outside})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["NCCL_PROXY_CPUSET"] == str(cpus[-1])  # replaced
    assert "NCCL_PROXY_CPUSET" in proc.stderr  # with a note
    proc = affrun("exec", "--comm-cores", "1", "--env-policy", "keep", "--", sys.executable, "-c", PROBE,
                  env={**env, "NCCL_PROXY_CPUSET": outside})
    assert json.loads(proc.stdout.strip().splitlines()[-1])["NCCL_PROXY_CPUSET"] == outside


@pytest.mark.torch
def test_affrun_torchrun_rank_keeps_a_comm_core(tmp_path: Path) -> None:
    env = tree(tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    proc = run(affrun_argv("torchrun", "--comm-cores", "1", "--nproc-per-node", "1", str(script), "x"),
               env=clean_env(**env), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    check(record, cpus)
    (line,) = rank_lines(proc.stderr)
    assert line["comm"] == str(cpus[-1])


def test_plan_json_and_show_carry_the_comm_cores(tmp_path: Path) -> None:
    env = tree(tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    proc = affrun("plan", "--nproc-per-node", "1", "--comm-cores", "1", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    (rank,) = json.loads(proc.stdout)["ranks"]
    assert rank["comm_cpus"] == [cpus[-1]] and rank["loader_cpus"] == []
    assert parse_cpulist(rank["env"]["NCCL_PROXY_CPUSET"]) == {cpus[-1]}
    table = affrun("plan", "--nproc-per-node", "1", "--comm-cores", "1", env=env).stdout
    assert table.splitlines()[0].split()[:4] == ["rank", "cpus", "loader", "comm"]
    assert table.splitlines()[1].split()[3] == str(cpus[-1])
    shown = affrun("show", "--nproc-per-node", "1", "--comm-cores", "1", "--no-color", env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"[{cpus[-1]} 0C]" in shown.stdout and "0C core of rank 0 for NCCL's threads" in shown.stdout
    assert f"(comm {format_cpulist([cpus[-1]])})" in shown.stdout
    svg = tmp_path / "plan.svg"
    shown = affrun("show", "--nproc-per-node", "1", "--comm-cores", "1", "--svg", str(svg), env=env)
    assert shown.returncode == 0, shown.stderr
    assert f'class="core comm" data-cpu="{cpus[-1]}"' in svg.read_text()
