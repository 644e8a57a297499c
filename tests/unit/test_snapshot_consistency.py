"""A snapshot whose parts disagree (hand-edited: two NUMA nodes of one id or sharing a CPU, a core on a node that does
not hold it, GPU indexes that are not 0..n-1, local CPUs that are not online) is refused in one line naming the
field, never planned: read as it stood, ranks got ``--preferred`` on a node the machine lacks. Every field here is one
that affrun's own readers never write that way, so a saved machine still loads back."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from launcher.errors import TopologyError
from launcher.options.record import Options
from launcher.plan.planner import make_plan
from launcher.topology import load_topology
from launcher.topology.snapshot import from_snapshot, to_snapshot
from tests.fakesys import FakeGPU, FakeNIC, uniform, write_tree


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """2 packages, 2 NUMA nodes, 4 cores of 2 PUs (node 0: CPUs 0-1,4-5; node 1: 2-3,6-7), a GPU and a NIC per node."""
    m = uniform(2, 2, threads=2)
    m.gpus = [FakeGPU(pci="0000:10:00.0", numa_node=0), FakeGPU(pci="0000:90:00.0", numa_node=1)]
    m.nics = [FakeNIC(name="mlx5_0", pci="0000:11:00.0", numa_node=0)]
    root = write_tree(tmp_path_factory.mktemp("machine") / "root", m)
    data: dict[str, Any] = json.loads(json.dumps(to_snapshot(load_topology(fsroot=str(root)))))
    return data


def edited(data: dict[str, Any], path: list[str | int], value: object) -> dict[str, Any]:
    out = copy.deepcopy(data)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def test_the_machine_as_saved_loads_and_plans_on_its_own_nodes(saved: dict[str, Any]) -> None:
    topo = from_snapshot(saved, "node.json")
    assert [n.os_index for n in topo.numa_nodes] == [0, 1] and [g.index for g in topo.gpus] == [0, 1]
    plan = make_plan(topo, Options().request(2))
    assert [r.mem_nodes for r in plan.ranks] == [(0,), (1,)]


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        # One id twice: rank 1 was planned on node "1", which no longer existed.
        (["numa_nodes", 1, "os_index"], 0, "numa_nodes[1].os_index 0 is also numa_nodes[0]'s"),
        # One CPU in two nodes: was read as a broken firmware table, one node, GPU 1 said to be on node 0.
        (["numa_nodes", 1, "cpus"], "1-3,6-7", "numa_nodes[1].cpus lists CPUs 1 of NUMA node 0; a CPU is in one node"),
        (["numa_nodes", 1, "cpus"], "2-3,6-9", "numa_nodes[1].cpus lists CPUs 8-9 that are not online"),
        # A core on a node that does not hold it: its loader cores were placed on node 5.
        (["cores", 0, "numa_node"], 5, "cores[0].numa_node 5 is not a NUMA node holding its CPUs 0,4"),
        (["cores", 0, "numa_node"], 1, "cores[0].numa_node 1 is not a NUMA node holding its CPUs 0,4"),
        # GPU indexes are positions in PCI order: 0..n-1, each once.
        (["gpus", 1, "index"], -5, "gpus[1].index -5 is not a GPU index (0..1)"),
        (["gpus", 1, "index"], 10**30, "gpus[1].index 1000000000000000000"),
        (["gpus", 1, "index"], 2, "gpus[1].index 2 is not a GPU index (0..1)"),
        (["gpus", 1, "index"], 0, "gpus[1].index 0 is also gpus[0]'s"),
        # Readers keep a GPU's local CPUs to the online ones (sysfs local_cpulist & online; hwloc's cpuset & online).
        (["gpus", 0, "cpus"], "0-1,4-5,1000", "gpus[0].cpus lists CPUs 1000 that are not online"),
        # A NUL byte is in no string affrun writes (a cpu list holding one was read as empty).
        (["offline"], "\x00", "offline holds a NUL byte"),
    ],
)
def test_a_snapshot_that_contradicts_itself_is_refused_naming_the_field(
    saved: dict[str, Any], path: list[str | int], value: object, words: str
) -> None:
    with pytest.raises(TopologyError) as exc:
        from_snapshot(edited(saved, path, value), "node.json")
    message = str(exc.value)
    assert message.startswith("node.json: bad topology snapshot: ") and "\n" not in message, message
    assert words in message, message


def test_gpus_may_be_listed_in_any_order_of_their_indexes(saved: dict[str, Any]) -> None:
    swapped = edited(edited(saved, ["gpus", 0, "index"], 1), ["gpus", 1, "index"], 0)
    assert [(g.index, g.pci) for g in from_snapshot(swapped).visible_gpus()] == [(1, "0000:10:00.0"), (0, "0000:90:00.0")]


def test_a_gpu_listed_twice_is_kept_once_and_indexes_count_the_kept_ones(saved: dict[str, Any]) -> None:
    data = edited(saved, ["gpus"], [saved["gpus"][0], saved["gpus"][0], saved["gpus"][1]])
    data["gpus"][2] = {**data["gpus"][2], "index": 1}
    topo = from_snapshot(data)
    assert [g.pci for g in topo.gpus] == ["0000:10:00.0", "0000:90:00.0"]
    assert any("gpus[1] has the PCI address of gpus[0]" in w for w in topo.warnings)


def test_a_nic_on_a_missing_node_is_left_out_with_a_warning_as_in_sysfs(saved: dict[str, Any]) -> None:
    nic = next(i for i, n in enumerate(saved["nics"]) if n["name"] == "mlx5_0")
    topo = from_snapshot(edited(saved, ["nics", nic, "numa_node"], 7))
    assert "mlx5_0" not in [n.name for n in topo.nics]
    assert any("mlx5_0" in w and "NUMA node 7" in w for w in topo.warnings)


def test_refused_through_the_command_in_one_line(saved: dict[str, Any], tmp_path: Path) -> None:
    from tests.launch import affrun

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edited(saved, ["numa_nodes", 1, "os_index"], 0)))
    result = affrun("plan", "--nproc-per-node", "2", "--json", "--topology", str(bad))
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr == f"affrun: error: {bad}: bad topology snapshot: numa_nodes[1].os_index 0 is also numa_nodes[0]'s\n"
