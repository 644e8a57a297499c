"""Planning on hwloc's two broken or odd NUMA machines, read from their real tarballs and checked against
hwloc's own ``.console`` (``../shared/fixtures/hwloc-linux``), plus fake trees for the other members of each case:

* ``8em64t-2s2ca2c-buggynuma``: 8 nodes that all claim CPUs 0-7 (a broken firmware table). hwloc keeps node 0.
* ``fakememinitiators-1np2c+1npp+gi``: CPUs on memory-less nodes 0-3, memory on CPU-less nodes 5-10, whose
  locality is given by the HMAT initiator links (``access1``, else ``access0``); node 4 is a generic initiator.
"""

from __future__ import annotations

import re
from pathlib import Path

from launcher.base.cpulist import format_cpulist, parse_hexmask
from launcher.options.record import Options
from launcher.plan.planner import make_plan
from launcher.topology import load_topology
from launcher.topology.model import Topology
from launcher.topology.snapshot import from_snapshot, to_snapshot
from launcher.topology.sysfs import read_sysfs
from tests.conftest import FIXTURES
from tests.fakesys import FakeMachine, write_tree
from tests.unit.test_plan_numa_quirks import fakememinitiators

HWLOC_LINUX = FIXTURES / "hwloc-linux"
BUGGY = "8em64t-2s2ca2c-buggynuma"
FAKEMEM = "fakememinitiators-1np2c+1npp+gi"

_TREE_NODE = re.compile(r"^\s*NUMANode(?:\([^)]*\))? L#(\d+) \(P#(\d+)", re.M)
_TREE_PU = re.compile(r"^(\s*)PU L#\d+ \(P#(\d+)\)", re.M)
_LOCALITY = re.compile(r"^\s*NUMANode L#(\d+) = \d+ from cpuset (0x[0-9a-f,x]+)", re.M)


def console(name: str) -> str:
    return (HWLOC_LINUX / f"{name}.console").read_text()


def hwloc_nodes(name: str) -> list[int]:
    """The NUMA nodes (P#) of hwloc's tree, in logical order."""
    return [p for _, p in sorted((int(lg), int(p)) for lg, p in _TREE_NODE.findall(console(name)))]


def hwloc_locality(name: str) -> dict[int, frozenset[int]]:
    """P# of each memory node -> the cpuset hwloc gives its memory (the memory attributes' initiator lines)."""
    text = console(name)
    os_of = {int(lg): int(p) for lg, p in _TREE_NODE.findall(text)}
    return {os_of[int(lg)]: parse_hexmask(mask) for lg, mask in _LOCALITY.findall(text)}


def hwloc_nearest_memory(name: str, cpus: frozenset[int]) -> int:
    """The node hwloc shows nearest to ``cpus``: the one of the smallest locality that holds them all."""
    holding = [(len(c), n) for n, c in hwloc_locality(name).items() if cpus <= c]
    return min(holding)[1]


def fixture_topology(hwloc_root, name: str) -> Topology:  # type: ignore[no-untyped-def]
    return load_topology(fsroot=str(hwloc_root(name)), environ={})


# ------------------------------------------------------------------------------------------ buggynuma
def test_buggy_numa_table_is_read_and_planned_as_one_node_like_hwloc(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = read_sysfs(str(hwloc_root(BUGGY)))  # the reader itself, not only load_topology
    assert [n.os_index for n in topo.numa_nodes] == hwloc_nodes(BUGGY) == [0]
    assert format_cpulist(topo.numa_nodes[0].cpus) == "0-7"
    assert {c.numa_node for c in topo.cores} == {0}
    assert any(w.startswith("the NUMA table is broken: node(s) 1-7 claim CPUs 0-7") for w in topo.warnings)
    topo = fixture_topology(hwloc_root, BUGGY)
    plan = make_plan(topo, Options().request(2))
    # hwloc's packages: PUs 0,2,4,6 and 1,3,5,7; one node for all of them, so both ranks bind to node 0.
    assert [(format_cpulist(r.cpus), r.numa_nodes, r.mem_nodes) for r in plan.ranks] == [
        ("0-3", (0,), (0,)), ("4-7", (0,), (0,)),
    ]
    cpus = [p for r in plan.ranks for p in r.cpus]
    assert len(cpus) == len(set(cpus))
    assert sum("NUMA table is broken" in w for w in topo.warnings) == 1  # once, though two steps check it


# ------------------------------------------------------------------------------------------ fakememinitiators
def test_memory_node_locality_is_hwlocs(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    """Each memory node is local to the CPUs hwloc gives it (access1 initiators: node 5 to 0-1, not to node 4)."""
    topo = read_sysfs(str(hwloc_root(FAKEMEM)))
    expected = hwloc_locality(FAKEMEM)
    assert sorted(expected) == sorted(hwloc_nodes(FAKEMEM)) == [5, 6, 7, 8, 9, 10]
    assert {n.os_index: n.local_cpus for n in topo.numa_nodes if n.local_cpus is not None} == expected
    assert [n.os_index for n in topo.numa_nodes if n.cpus] == [0, 1, 2, 3]  # the CPUs stay on their own nodes


def test_ranks_prefer_the_memory_hwloc_puts_next_to_their_cpus(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    topo = fixture_topology(hwloc_root, FAKEMEM)
    plan = make_plan(topo, Options(spill="none").request(4))
    got = [(format_cpulist(r.cpus), r.mem_nodes) for r in plan.ranks]
    assert got == [(format_cpulist(r.cpus), (hwloc_nearest_memory(FAKEMEM, frozenset(r.cpus)),)) for r in plan.ranks]
    assert got == [("0-1", (5,)), ("2-3", (8,)), ("4-5", (6,)), ("6-7", (9,))]
    assert ("rank 0: node 0 has no memory; the memory policy uses node 5, local to CPUs 0-1 by the firmware's "
            "initiator table") in plan.warnings
    assert not any("nearest node with memory" in w or "cpuset" in w for w in plan.warnings)
    for r in plan.ranks:  # every memory node is one the cpuset allows (hwloc shows only those)
        assert set(r.mem_nodes) <= set(hwloc_nodes(FAKEMEM))


def test_snapshot_keeps_the_locality(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    import json

    topo = fixture_topology(hwloc_root, FAKEMEM)
    again = from_snapshot(json.loads(json.dumps(to_snapshot(topo))), "node.json")
    assert [n.local_cpus for n in again.numa_nodes] == [n.local_cpus for n in topo.numa_nodes]
    plan = make_plan(again, Options(spill="none").request(4))
    assert [r.mem_nodes for r in plan.ranks] == [(5,), (8,), (6,), (9,)]


# ------------------------------------------------------------------------------------------ other members
def two_cpu_nodes(initiators: dict[int, dict[str, list[int]]], *, with_gi: bool = False) -> FakeMachine:
    """CPU nodes 0 (CPUs 0-1) and 1 (2-3) without memory; memory nodes 2 and 3 without CPUs. By distance node
    2 is nearest to node 0 and node 3 to node 1; the initiator table (when given) decides otherwise. Node 4
    (``with_gi``) is a generic initiator: neither CPUs nor memory."""
    ids = [0, 1, 2, 3, 4] if with_gi else [0, 1, 2, 3]
    near = {(0, 2): 11, (1, 3): 11}
    dist = {a: {b: 10 if a == b else near.get((min(a, b), max(a, b)), 20) for b in ids} for a in ids}
    return FakeMachine(
        cores=[(p,) for p in range(4)], node_of_core=[0, 0, 1, 1], package_of_core=[0, 0, 0, 0],
        cpuless_nodes=ids[2:], distances=dist, node_memory_kb={0: 0, 1: 0, 4: 0}, node_initiators=initiators,
    )


def mem_nodes(tmp_path: Path, m: FakeMachine) -> tuple[list[tuple[int, ...]], tuple[str, ...]]:
    topo = load_topology(fsroot=str(write_tree(tmp_path / "root", m)), environ={})
    plan = make_plan(topo, Options(spill="none").request(2))
    return [r.mem_nodes for r in plan.ranks], plan.warnings


def test_initiators_beat_the_distance_table(tmp_path: Path) -> None:
    got, warnings = mem_nodes(tmp_path, two_cpu_nodes({2: {"access1": [1]}, 3: {"access1": [0]}}))
    assert got == [(3,), (2,)]
    assert "rank 0: node 0 has no memory; the memory policy uses node 3, local to CPUs 0-1 by the firmware's " \
        "initiator table" in warnings


def test_access1_is_preferred_to_access0(tmp_path: Path) -> None:
    # access0 is the fastest initiator of any kind, access1 of CPU initiators: hwloc reads access1 when present.
    m = two_cpu_nodes({2: {"access0": [0], "access1": [1]}, 3: {"access0": [1], "access1": [0]}})
    assert mem_nodes(tmp_path, m)[0] == [(3,), (2,)]


def test_access0_alone_is_used(tmp_path: Path) -> None:
    assert mem_nodes(tmp_path, two_cpu_nodes({2: {"access0": [1]}, 3: {"access0": [0]}}))[0] == [(3,), (2,)]


def test_a_generic_initiator_alone_gives_no_locality(tmp_path: Path) -> None:
    # access0 names only node 4 (no CPUs) and there is no access1: hwloc then uses the distances, so does affrun.
    m = two_cpu_nodes({2: {"access0": [4]}, 3: {"access0": [4]}}, with_gi=True)
    topo = load_topology(fsroot=str(write_tree(tmp_path / "gi", m)), environ={})
    assert [n.local_cpus for n in topo.numa_nodes] == [None] * 5
    got, warnings = mem_nodes(tmp_path, m)
    assert got == [(2,), (3,)]
    assert any("the nearest node with memory (distance 11)" in w for w in warnings)


def test_the_tightest_locality_wins(tmp_path: Path) -> None:
    # node 2 is local to both CPU nodes (a package-wide NVM), node 3 to node 0 only: node 0 takes 3, although
    # node 2 is nearer by distance; node 1 has only node 2 local to it.
    assert mem_nodes(tmp_path, two_cpu_nodes({2: {"access1": [0, 1]}, 3: {"access1": [0]}}))[0] == [(3,), (2,)]


def test_nonsense_initiator_links_do_not_break_the_read(tmp_path: Path) -> None:
    # Initiators naming a node that does not exist, the node itself, or an entry that is not a node: ignored.
    m = two_cpu_nodes({2: {"access1": [0, 2, 77]}, 3: {"access1": [3]}})
    root = write_tree(tmp_path / "root", m)
    (root / "sys/devices/system/node/node3/access1/initiators/nodeX").write_text("x\n")
    topo = load_topology(fsroot=str(root), environ={})
    assert {n.os_index: n.local_cpus for n in topo.numa_nodes} == {0: None, 1: None, 2: frozenset({0, 1}), 3: None}
    plan = make_plan(topo, Options(spill="none").request(2))
    assert [r.mem_nodes for r in plan.ranks] == [(2,), (3,)]  # node 1: no initiator info, nearest by distance


def test_no_initiators_keeps_the_distance_rule(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(write_tree(tmp_path / "root", fakememinitiators())), environ={})
    assert all(n.local_cpus is None for n in topo.numa_nodes)
    plan = make_plan(topo, Options(spill="none").request(4))
    assert [r.mem_nodes for r in plan.ranks] == [(5,), (8,), (6,), (9,)]
