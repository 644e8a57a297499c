"""NUMA tables that real machines get wrong or make odd: memory-less CPU nodes, and node cpusets that overlap.

Both machines are hwloc test trees (from hwloc's own Linux test folder), written out here with ``tests/fakesys.py``
from their files: the node cpumaps, ``meminfo`` totals and distance rows are the tarballs' own values.
"""

from __future__ import annotations

from pathlib import Path

from launcher.base.cpulist import format_cpulist
from launcher.options.record import Options
from launcher.plan.planner import make_plan
from tests.fakesys import FakeMachine
from tests.machines import read_machine

# fakememinitiators-1np2c+1npp+gi: 2 Xeon Gold 6230 packages (PUs 0, 1, 4, 5 and 2, 3, 6, 7), one PU per core.
# The CPUs sit on nodes 0-3 (0-1, 2-3, 4-5, 6-7), which have no memory; node 4 is a generic initiator with neither;
# the memory is on nodes 5, 6, 8, 9 (DRAM) and 7, 10 (NVM), which have no CPUs. Distance rows of nodes 0-10:
FAKEMEM_DISTANCES = [
    [10, 21, 13, 21, 12, 11, 14, 17, 21, 21, 28],
    [21, 10, 21, 13, 31, 21, 21, 28, 11, 14, 17],
    [13, 21, 10, 21, 12, 14, 11, 17, 21, 21, 28],
    [21, 13, 21, 10, 31, 21, 21, 28, 14, 11, 17],
    [12, 31, 12, 31, 10, 15, 15, 13, 31, 31, 13],
    [11, 21, 14, 21, 15, 10, 13, 17, 21, 21, 28],
    [14, 21, 11, 21, 15, 13, 10, 17, 21, 21, 28],
    [17, 28, 17, 28, 13, 17, 17, 10, 28, 28, 28],
    [21, 11, 21, 14, 31, 21, 21, 28, 10, 13, 17],
    [21, 14, 21, 11, 31, 21, 21, 28, 13, 10, 17],
    [28, 17, 28, 17, 13, 28, 28, 28, 17, 17, 10],
]
FAKEMEM_MEMORY_KB = {5: 97447340, 6: 99090348, 7: 778043392, 8: 97542052, 9: 99051020, 10: 780140544}


def fakememinitiators() -> FakeMachine:
    return FakeMachine(
        cores=[(p,) for p in range(8)],
        node_of_core=[0, 0, 1, 1, 2, 2, 3, 3],
        package_of_core=[0, 0, 1, 1, 0, 0, 1, 1],
        cpuless_nodes=[4, 5, 6, 7, 8, 9, 10],
        distances={a: dict(enumerate(row)) for a, row in enumerate(FAKEMEM_DISTANCES)},
        node_memory_kb={n: FAKEMEM_MEMORY_KB.get(n, 0) for n in range(11)},
    )


# 8em64t-2s2ca2c-buggynuma: 2 Xeon E5472 packages of 4 cores (PUs 0, 2, 4, 6 and 1, 3, 5, 7), no SMT. All 8
# nodes claim CPUs 0-7, all distances are 10, node 0 has all the memory (2 GiB), as hwloc's expected output says.
def buggynuma() -> FakeMachine:
    return FakeMachine(
        cores=[(p,) for p in range(8)],
        node_of_core=list(range(8)),
        package_of_core=[p % 2 for p in range(8)],
        distances={a: dict.fromkeys(range(8), 10) for a in range(8)},
        node_memory_kb={n: 2097152 if n == 0 else 0 for n in range(8)},
        node_cpulist=dict.fromkeys(range(8), "0-7"),
    )


def test_memoryless_cpu_nodes_take_the_nearest_node_with_memory(tmp_path: Path) -> None:
    # 4 CPU-only ranks, one per CPU node. By the distance rows the nearest memory of node 0 is node 5 (11), of
    # node 1 node 8 (11), of node 2 node 6 (11), of node 3 node 9 (11). The warnings say that, and blame no cpuset.
    topo = read_machine(tmp_path, fakememinitiators())
    plan = make_plan(topo, Options(spill="none").request(4))
    assert [(format_cpulist(r.cpus), r.numa_nodes, r.mem_nodes) for r in plan.ranks] == [
        ("0-1", (0,), (5,)), ("2-3", (1,), (8,)), ("4-5", (2,), (6,)), ("6-7", (3,), (9,)),
    ]
    assert "rank 0: node 0 has no memory; the memory policy uses node 5, the nearest node with memory (distance 11)" \
        in plan.warnings
    assert not any("cpuset" in w for w in plan.warnings)
    # The environment's numactl line follows: --preferred on the memory node, not the CPU node.
    assert [r.mem_nodes for r in make_plan(topo, Options().request(4)).ranks] == [(5,), (8,), (6,), (9,)]


def test_one_rank_on_a_memoryless_machine(tmp_path: Path) -> None:
    # 1 rank: home node 0 (memory on 5); nodes 1-3 host no rank and spill to it as loader cores.
    plan = make_plan(read_machine(tmp_path, fakememinitiators()), Options().request(1))
    (r,) = plan.ranks
    assert (format_cpulist(r.compute_cpus), format_cpulist(r.loader_cpus), r.mem_nodes) == ("0-1", "2-7", (5,))


def test_overlapping_numa_cpusets_are_planned_as_one_node(tmp_path: Path) -> None:
    topo = read_machine(tmp_path, buggynuma())
    assert [(n.os_index, format_cpulist(n.cpus), n.memory_kb) for n in topo.numa_nodes] == [(0, "0-7", 2097152)]
    assert {c.numa_node for c in topo.cores} == {0}
    # hwloc keeps node 0 and ignores nodes 1-7, whose CPUs node 0 already holds: one node, node 0's memory.
    warning = ("the NUMA table is broken: node(s) 1-7 claim CPUs 0-7 of node(s) 0; ignoring them, as hwloc does; "
               "planning as one NUMA node")
    assert warning in topo.warnings
    plan = make_plan(topo, Options().request(2))
    assert [(format_cpulist(r.cpus), r.numa_nodes, r.mem_nodes) for r in plan.ranks] == [
        ("0-3", (0,), (0,)), ("4-7", (0,), (0,)),
    ]
    assert warning in plan.warnings


def test_a_partly_overlapping_table_keeps_the_sound_nodes(tmp_path: Path) -> None:
    # 4 nodes of 2 cores; node 2 also claims CPU 1 of node 0: node 2 is ignored (as hwloc does) and its own
    # CPUs 4-5 are left in no node; nodes 0, 1 and 3 stay, so the machine still has NUMA.
    m = FakeMachine(cores=[(p,) for p in range(8)], node_of_core=[0, 0, 1, 1, 2, 2, 3, 3], package_of_core=[0] * 8,
                    node_cpulist={2: "1,4-5"})
    topo = read_machine(tmp_path, m)
    assert [n.os_index for n in topo.numa_nodes] == [0, 1, 3]
    assert "the NUMA table is broken: node(s) 2 claim CPUs 1 of node(s) 0; ignoring them, as hwloc does" in topo.warnings
    assert [c.numa_node for c in topo.cores] == [0, 0, 1, 1, None, None, 3, 3]


def test_a_sound_table_is_left_alone(tmp_path: Path) -> None:
    topo = read_machine(tmp_path, fakememinitiators())
    assert [n.os_index for n in topo.numa_nodes] == list(range(11))
    assert not any("NUMA table" in w for w in topo.warnings)
