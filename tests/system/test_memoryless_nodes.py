"""Memory-less NUMA nodes through ``affrun exec``: the plan the parent writes is the plan each rank accepts.

Round 4 of the fuzzing (issue 26) found two plans that the rank refused as "not a plan written by affrun": a
memory-less node whose stand-in memory node is also one of the rank's own nodes (``--mode socket``, a ``--map``
across nodes), and a memory-less node that the firmware's initiator table makes local to two memory nodes at once
(CXL, HBM). The machines are fake sysfs trees (tests/fakesys.py); the last test runs a real rank on one of this
machine's own CPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakesys import FakeMachine, write_tree
from tests.launch import affrun_argv, clean_env, run
from tests.run_dry import dry_run

NEAR, FAR = 10, 20


def standin_is_own(cpus: tuple[int, int]) -> FakeMachine:
    """One package, node 0 (CPU ``cpus[0]``) without memory, node 1 (CPU ``cpus[1]``) with memory: node 1 is node
    0's nearest memory, and in ``--mode socket`` one of each rank's own nodes too."""
    return FakeMachine(cores=[(cpus[0],), (cpus[1],)], node_of_core=[0, 1], package_of_core=[0, 0],
                       distances={0: {0: NEAR, 1: FAR}, 1: {0: FAR, 1: NEAR}}, node_memory_kb={0: 0})


def two_equal_initiators(cpu: int) -> FakeMachine:
    """Node 0 holds the CPU and no memory; CPU-less memory nodes 1 and 2 (CXL, HBM) both name node 0 their
    initiator, at the same distance: both are the CPU's local memory."""
    far = {0: FAR, 1: FAR, 2: FAR}
    return FakeMachine(cores=[(cpu,)], node_of_core=[0], package_of_core=[0], cpuless_nodes=[1, 2],
                       distances={0: {**far, 0: NEAR}, 1: {**far, 1: NEAR}, 2: {**far, 2: NEAR}},
                       node_memory_kb={0: 0}, node_initiators={1: {"access0": [0]}, 2: {"access0": [0]}})


@pytest.mark.parametrize("rank", [0, 1])
def test_socket_mode_stand_in_that_is_the_rank_own_node(tmp_path: Path, rank: int) -> None:
    root = write_tree(tmp_path / "root", standin_is_own((0, 1)))
    got = dry_run("exec", "--mode", "socket", "--nproc-per-node", "2", "--local-rank", str(rank), root=root)
    assert "AFFRUN_PLAN" not in got.stderr
    assert (got.variables["AFFRUN_NUMA_NODES"], got.variables["AFFRUN_MEM_NODES"]) == ("0,1", "1")


def test_map_across_a_memoryless_node_and_its_stand_in(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", standin_is_own((0, 1)))
    got = dry_run("exec", "--map", "0,1", "--nproc-per-node", "1", "--local-rank", "0", root=root)
    assert "AFFRUN_PLAN" not in got.stderr
    assert [got.variables[f"AFFRUN_{v}"] for v in ("CPUS", "NUMA_NODES", "MEM_NODES")] == ["0-1", "0,1", "1"]


def test_two_equally_near_memory_nodes_by_the_initiator_table(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", two_equal_initiators(0))
    got = dry_run("exec", "--nproc-per-node", "1", "--local-rank", "0", root=root)
    assert "AFFRUN_PLAN" not in got.stderr
    assert (got.variables["AFFRUN_NUMA_NODES"], got.variables["AFFRUN_MEM_NODES"]) == ("0", "1,2")


def test_a_real_rank_on_a_memoryless_node_with_two_local_memories(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    root = write_tree(tmp_path / "root", two_equal_initiators(cpu))
    probe = "grep Cpus_allowed_list /proc/self/status; echo mem=$AFFRUN_MEM_NODES"
    proc = run(affrun_argv("exec", "--fsroot", str(root), "--nproc-per-node", "1", "--local-rank", "0", "--",
                           "sh", "-c", probe), env=clean_env())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[-1] == "mem=1,2"
    assert lines[1] == str(cpu)
