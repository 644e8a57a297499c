"""hwloc's own rules on crafted XML exports: where a NUMA node's CPUs come from, PUs hwloc would drop, the node of a
GPU or NIC under a Group of DDR and MCDRAM nodes, versions and extra root objects (docs/design.md §6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.base.cpulist import format_cpulist
from launcher.cli import cli
from launcher.errors import TopologyError
from launcher.plan.planner import Request, make_plan
from launcher.topology.hwloc_xml import load_hwloc_xml
from launcher.topology.model import Topology
from tests.conftest import FIXTURES, need

# 2 packages, one NUMA node each (CPUs 0-3 and 4-7), 4 cores of 2 PUs, a GPU on each node, a NIC on node 0.
PKG0 = '<object type="Package" os_index="0" cpuset="0x0f" nodeset="0x1">'
NODE0 = '<object type="NUMANode" os_index="0" cpuset="0x0f" nodeset="0x1" local_memory="1000000000"/>'
NODE1 = '<object type="NUMANode" os_index="1" cpuset="0xf0" nodeset="0x2" local_memory="1000000000"/>'
CORE1 = ('<object type="Core" os_index="1" cpuset="0xc"><object type="PU" os_index="2" cpuset="0x4"/>'
         '<object type="PU" os_index="3" cpuset="0x8"/></object>')
CORE2 = ('<object type="Core" os_index="2" cpuset="0x30"><object type="PU" os_index="4" cpuset="0x10"/>'
         '<object type="PU" os_index="5" cpuset="0x20"/></object>')
GPU1 = ('<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[90-90]"><object type="PCIDev" '
        'pci_busid="0000:90:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1 00"/></object>')
GOOD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<topology version="2.0">'
    '<object type="Machine" os_index="0" cpuset="0xff" complete_cpuset="0xff" allowed_cpuset="0xff" nodeset="0x3" '
    f'complete_nodeset="0x3" allowed_nodeset="0x3">{PKG0}{NODE0}'
    '<object type="Core" os_index="0" cpuset="0x3"><object type="PU" os_index="0" cpuset="0x1"/>'
    f'<object type="PU" os_index="1" cpuset="0x2"/></object>{CORE1}'
    '<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[10-10]"><object type="PCIDev" '
    'pci_busid="0000:10:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1 00"/></object>'
    '<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[11-11]"><object type="PCIDev" '
    'pci_busid="0000:11:00.0" pci_type="0207 [15b3:101b] [15b3:0007] 00 00">'
    '<object type="OSDev" name="mlx5_0" osdev_type="3"><info name="Port1State" value="4"/></object></object></object>'
    '</object><object type="Package" os_index="1" cpuset="0xf0" nodeset="0x2">'
    f'{NODE1}{CORE2}<object type="Core" os_index="3" cpuset="0xc0"><object type="PU" os_index="6" cpuset="0x40"/>'
    f'<object type="PU" os_index="7" cpuset="0x80"/></object>{GPU1}</object></object></topology>'
)


def load(tmp_path: Path, text: str) -> Topology:
    path = tmp_path / "topo.xml"
    path.write_text(text)
    return load_hwloc_xml(str(path))


def edited(*pairs: tuple[str, str]) -> str:
    text = GOOD
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


def node_cpus(topo: Topology) -> dict[int, str]:
    return {n.os_index: format_cpulist(n.cpus) for n in topo.numa_nodes}


def rank_cpus(topo: Topology, nproc: int) -> list[frozenset[int]]:
    return [frozenset(r.cpus) for r in make_plan(topo, Request(nproc=nproc)).ranks]


def test_the_base_file_reads_as_two_nodes(tmp_path: Path) -> None:
    topo = load(tmp_path, GOOD)
    assert node_cpus(topo) == {0: "0-3", 1: "4-7"} and topo.warnings == ()
    assert [(g.pci, g.numa_node) for g in topo.gpus] == [("0000:10:00.0", 0), ("0000:90:00.0", 1)]
    assert [(n.name, n.numa_node) for n in topo.nics] == [("mlx5_0", 0)]


# ------------------------------------------------------------------- 1. a Group of DDR and CPU-less MCDRAM nodes
@pytest.mark.parametrize("name", ["knl-snc4-flat-hwloc1.xml", "knl-quad-flat-hwloc1.xml"])
def test_knl_flat_nics_are_on_the_ddr_node_of_their_group(name: str) -> None:
    path = FIXTURES / "mpibind" / "topo-xml" / name
    need(path.is_file(), f"{path} not found")
    topo = load_hwloc_xml(str(path))
    assert {n.name for n in topo.nics} == {"ib0", "mlx5_0", "eno1", "eno2"}
    assert {n.numa_node for n in topo.nics} == {0}  # the Group's nodeset holds DDR node 0 and CPU-less node 4 (1)
    ranks = make_plan(topo, Request(nproc=2)).ranks
    distances = [r.nic.distance if r.nic else None for r in ranks]
    assert distances[0] == "numa-node" and "system" not in distances  # was "system" for every rank


def test_a_gpu_and_a_nic_under_one_group_get_one_node(tmp_path: Path) -> None:
    # A Group of node 0 (DDR, CPUs 0-3) and node 2 (HBM, CPU-less) holds both devices.
    group = '<object type="Group" cpuset="0x0f" nodeset="0x5">'
    hbm = '<object type="NUMANode" os_index="2" cpuset="0x0f" nodeset="0x4" subtype="HBM" local_memory="10"/>'
    text = edited((NODE0, f"{group}{NODE0}{hbm}"), ("</object></object></object></object><object type=\"Package\" os_index=\"1\"",
                                                                        "</object></object></object></object></object><object type=\"Package\" os_index=\"1\""),
                  ('nodeset="0x3" complete_nodeset="0x3" allowed_nodeset="0x3"', 'nodeset="0x7" complete_nodeset="0x7" allowed_nodeset="0x7"'))
    topo = load(tmp_path, text)
    assert node_cpus(topo) == {0: "0-3", 1: "4-7", 2: ""}
    assert topo.gpus[0].numa_node == 0 and topo.nics[0].numa_node == 0


def test_a_gpu_under_a_pu_is_on_that_pus_node(tmp_path: Path) -> None:
    pu5 = '<object type="PU" os_index="5" cpuset="0x20"/>'
    gpu = ('<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[a0-a0]"><object type="PCIDev" '
           'pci_busid="0000:a0:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1 00"/></object>')
    topo = load(tmp_path, edited((pu5, pu5[:-2] + f">{gpu}</object>")))
    gpu_a0 = next(g for g in topo.gpus if g.pci == "0000:a0:00.0")
    assert gpu_a0.numa_node == 1 and format_cpulist(gpu_a0.cpus) == "5"
    assert not any("0000:a0:00.0" in w for w in topo.warnings)


# ------------------------------------------------------------------- 2. a NUMA node's cpuset
@pytest.mark.parametrize("node", [
    '<object type="NUMANode" os_index="0" nodeset="0x1" local_memory="5"/>',
    '<object type="NUMANode" os_index="0"/>',
])
def test_a_numa_node_without_a_cpuset_is_refused_as_hwloc_refuses_it(tmp_path: Path, node: str) -> None:
    with pytest.raises(TopologyError, match=r"NUMANode P#0 has no cpuset"):
        load(tmp_path, edited((NODE0, node)))


def test_the_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "topo.xml"
    path.write_text(edited((NODE0, '<object type="NUMANode" os_index="0" nodeset="0x1"/>')))
    result = CliRunner().invoke(cli, ["plan", "--topology", str(path), "--nproc-per-node", "2"])
    assert result.exit_code == 2
    assert result.stderr.startswith("affrun: error: ") and len(result.stderr.splitlines()) == 1, result.stderr


def test_an_infinite_numa_cpuset_is_its_parents(tmp_path: Path) -> None:
    topo = load(tmp_path, edited((NODE1, NODE1.replace('cpuset="0xf0"', 'cpuset="0xf...f"'))))
    assert node_cpus(topo) == {0: "0-3", 1: "4-7"}
    assert [c.numa_node for c in topo.cores] == [0, 0, 1, 1]
    assert [format_cpulist(c) for c in rank_cpus(topo, 2)] == ["0-3", "4-7"]


# ------------------------------------------------------------------- 3. overlapping NUMA cpusets
def test_a_numa_cpuset_wider_than_its_parent_is_said_and_narrowed(tmp_path: Path) -> None:
    topo = load(tmp_path, edited((NODE1, NODE1.replace('cpuset="0xf0"', 'cpuset="0xfc"'))))
    assert node_cpus(topo) == {0: "0-3", 1: "4-7"}
    assert any("NUMANode P#1" in w and "parent's" in w for w in topo.warnings), topo.warnings


def test_overlapping_nodes_in_a_1x_export_give_the_broken_table_warning(tmp_path: Path) -> None:
    # hwloc 1.x: NUMA nodes are tree parents with their own cpusets; node 1 claims CPUs 2-3 of node 0 too.
    text = (
        '<?xml version="1.0"?>\n<topology><object type="Machine" os_index="0" cpuset="0xff" complete_cpuset="0xff">'
        '<object type="NUMANode" os_index="0" cpuset="0x0f" nodeset="0x1">'
        + "".join(f'<object type="PU" os_index="{i}" cpuset="0x{1 << i:x}"/>' for i in range(4)) + "</object>"
        '<object type="NUMANode" os_index="1" cpuset="0xfc" nodeset="0x2">'
        + "".join(f'<object type="PU" os_index="{i}" cpuset="0x{1 << i:x}"/>' for i in range(4, 8))
        + "</object></object></topology>"
    )
    topo = load(tmp_path, text)
    assert node_cpus(topo) == {0: "0-3", 1: "4-7"}
    assert any(w.startswith("the NUMA table is broken: nodes 0 and 1 both claim CPUs 2-3") for w in topo.warnings)


# ------------------------------------------------------------------- 4. PUs hwloc would drop or place once
def test_a_pu_outside_its_packages_cpuset_is_dropped_so_no_core_spans_two_nodes(tmp_path: Path) -> None:
    # Core 1 of Package 0 (CPUs 0-3) lists PU 4, which is node 1's: hwloc narrows the core to its package and drops PU 4.
    core1 = CORE1.replace('cpuset="0xc"', 'cpuset="0x1c"').replace("</object>", "", 2).replace(
        '<object type="PU" os_index="3" cpuset="0x8"/>',
        '<object type="PU" os_index="3" cpuset="0x8"/><object type="PU" os_index="4" cpuset="0x10"/></object>')
    topo = load(tmp_path, edited((CORE1, core1), (CORE2, CORE2.replace('<object type="PU" os_index="4" cpuset="0x10"/>', ""))))
    assert 4 not in topo.online
    assert any("PU(s) 4 lie outside the cpuset" in w for w in topo.warnings), topo.warnings
    nodes = {c.pus: c.numa_node for c in topo.cores}
    assert nodes[(2, 3)] == 0
    for cpus in rank_cpus(topo, 2):
        assert len({c.numa_node for c in topo.cores if set(c.pus) & cpus}) == 1


def test_a_pu_under_two_packages_is_kept_where_first_listed(tmp_path: Path) -> None:
    core2 = CORE2.replace('cpuset="0x30"', 'cpuset="0x28"').replace('os_index="4" cpuset="0x10"', 'os_index="3" cpuset="0x8"')
    topo = load(tmp_path, edited((CORE2, core2)))
    assert any("PU(s) 3 are listed twice" in w for w in topo.warnings), topo.warnings
    assert {c.pus: c.numa_node for c in topo.cores}[(5,)] == 1
    assert format_cpulist(rank_cpus(topo, 2)[0]) == "0-3"


def test_a_core_over_two_nodes_is_split_per_node(tmp_path: Path) -> None:
    # hwloc 1.x, a Core above two NUMA nodes (each holding one of its PUs): one core per node, with a warning.
    text = (
        '<?xml version="1.0"?>\n<topology><object type="Machine" os_index="0" cpuset="0xf" complete_cpuset="0xf">'
        '<object type="Core" os_index="0" cpuset="0x3">'
        '<object type="NUMANode" os_index="0" cpuset="0x1" nodeset="0x1"><object type="PU" os_index="0" cpuset="0x1"/></object>'
        '<object type="NUMANode" os_index="1" cpuset="0x2" nodeset="0x2"><object type="PU" os_index="1" cpuset="0x2"/></object>'
        '</object><object type="Core" os_index="1" cpuset="0xc"><object type="NUMANode" os_index="2" cpuset="0xc" nodeset="0x4">'
        '<object type="PU" os_index="2" cpuset="0x4"/><object type="PU" os_index="3" cpuset="0x8"/></object></object>'
        "</object></topology>"
    )
    topo = load(tmp_path, text)
    assert [(c.pus, c.numa_node) for c in topo.cores] == [((0,), 0), ((1,), 1), ((2, 3), 2)]
    assert any("Core(s) P#0 have PUs on two NUMA nodes" in w for w in topo.warnings), topo.warnings


# ------------------------------------------------------------------- 5. versions and root objects
def test_a_format_newer_than_3_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"cannot import XML version '99.x'"):
        load(tmp_path, edited(('version="2.0"', 'version="99.x"')))
    assert load(tmp_path, edited(('version="2.0"', 'version="3.0"'))).gpus


def test_objects_after_the_root_are_ignored_with_a_warning(tmp_path: Path) -> None:
    gpu = GPU1.replace("90", "c0")
    topo = load(tmp_path, edited(("</object></topology>", f"</object>{gpu}</topology>")))
    assert [g.pci for g in topo.gpus] == ["0000:10:00.0", "0000:90:00.0"]
    assert any("1 more <object> after the root object" in w for w in topo.warnings), topo.warnings


# ------------------------------------------------------------------- 6. messages
def test_a_cpukind_overlap_names_the_file_once(tmp_path: Path) -> None:
    kinds = '<cpukind cpuset="0x0f"/><cpukind cpuset="0xfc"/>'
    topo = load(tmp_path, edited(("</object></topology>", f"</object>{kinds}</topology>")))
    (warning,) = [w for w in topo.warnings if "core kinds" in w]
    assert warning.count(str(tmp_path / "topo.xml")) == 1, warning
    assert "<cpukind> #1 and <cpukind> #0 both hold CPU 2" in warning


def test_a_distance_matrix_without_a_name_is_named_without_none(tmp_path: Path) -> None:
    matrix = '<distances2 type="NUMANode" nbobjs="2" kind="5" indexing="os"><indexes length="2">0 1</indexes></distances2>'
    with pytest.raises(TopologyError) as info:
        load(tmp_path, edited(("</object></topology>", f"</object>{matrix}</topology>")))
    assert "None" not in str(info.value) and "distances2: expected 2 indexes and 4 values" in str(info.value)


def test_plan_json_of_the_knl_flat_file_names_a_nic(tmp_path: Path) -> None:
    path = FIXTURES / "mpibind" / "topo-xml" / "knl-snc4-flat-hwloc1.xml"
    need(path.is_file(), f"{path} not found")
    result = CliRunner().invoke(cli, ["plan", "--topology", str(path), "--nproc-per-node", "2", "--json"])
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert [r["nic"]["distance"] for r in ranks] == ["numa-node", "package"]
