"""The hwloc XML reader on real exports: hwloc's GPU XMLs (``hwloc-xml-gpu/``) and LLNL's (``mpibind/topo-xml``)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.errors import TopologyError
from launcher.topology import load_topology
from launcher.topology.hwloc_xml import load_hwloc_xml
from launcher.topology.model import Topology
from tests.conftest import FIXTURES, need

GPU_XML = FIXTURES / "hwloc-xml-gpu"
MPIBIND = FIXTURES / "mpibind"
ALL_XML = sorted(GPU_XML.glob("*.xml")) + sorted((MPIBIND / "topo-xml").glob("*.xml"))


@pytest.fixture(autouse=True)
def _fixtures_present() -> None:
    need(GPU_XML.is_dir() and MPIBIND.is_dir(), f"hwloc XML fixtures not found under {FIXTURES}")


def osdev_index(path: Path, prefix: str) -> dict[str, int]:
    """PCI bus id -> N of the ``<prefix>N`` OS device hwloc put under it (nvml3, rsmi5): the vendor's own index."""
    out: dict[str, int] = {}
    for pci in ET.parse(path).iter("object"):
        if pci.get("type") != "PCIDev":
            continue
        for child in pci.findall("object"):
            match = re.fullmatch(rf"{prefix}(\d+)", child.get("name", ""))
            if child.get("type") == "OSDev" and match:
                out[pci.get("pci_busid", "").lower()] = int(match.group(1))
    return out


def xml_counts(path: Path) -> dict[str, int]:
    text = path.read_text()
    return {kind: len(re.findall(rf'<object type="{kind}"', text)) for kind in ("Package", "NUMANode", "Core", "PU")}


# ------------------------------------------------------------------------------------------ DGX-2
def test_dgx2_sixteen_v100_on_two_nodes_without_nvswitches() -> None:
    path = GPU_XML / "nvidiaDGX2.xml"
    text = path.read_text()
    assert len(re.findall(r'pci_type="0680 \[10de:', text)) == 11  # the NVSwitches are in the file...
    topo = load_hwloc_xml(str(path))
    assert len(topo.gpus) == 16  # ...and not among the GPUs
    assert {g.vendor for g in topo.gpus} == {"nvidia"}
    assert [g.numa_node for g in topo.gpus] == [0] * 8 + [1] * 8
    assert [format_cpulist(g.cpus) for g in topo.gpus] == ["0-1"] * 8 + ["24-25"] * 8
    pcis = [g.pci for g in topo.gpus]
    assert pcis == sorted(pcis)  # PCI bus order
    nvml = osdev_index(path, "nvml")
    assert [nvml[g.pci] for g in topo.gpus] == list(range(16))  # PCI bus order is NVML's order
    assert [g.vendor_index for g in topo.gpus] == list(range(16))
    uuids = dict(re.findall(r'pci_busid="([0-9a-f:.]+)" pci_type="0302[^"]*"[^>]*>\s*<object type="OSDev"[^>]*>'
                            r'(?:\s*<info[^>]*/>)*?\s*<info name="NVIDIAUUID" value="([^"]+)"', text))
    assert len(uuids) == 16 and {g.pci: g.uuid for g in topo.gpus} == uuids
    assert [format_cpulist(n.cpus) for n in topo.numa_nodes] == ["0-1", "24-25"]
    assert topo.numa_nodes[0].distances == {0: 10, 1: 21}


def test_dgx2_visible_uuid_maps_through_the_xml() -> None:
    path = GPU_XML / "nvidiaDGX2.xml"
    topo = load_hwloc_xml(str(path))
    last = topo.gpus[15]
    assert last.uuid is not None
    loaded = load_topology(topology_file=str(path), environ={"CUDA_VISIBLE_DEVICES": f"{last.uuid},3"})
    assert [g.pci for g in loaded.visible_gpus()] == [last.pci, topo.gpus[3].pci]


# ------------------------------------------------------------------------------------------ 24em64t
def test_24em64t_interleaved_nodes_and_bmc_vga_excluded() -> None:
    path = GPU_XML / "24em64t-2n6c2t-pci.xml"
    assert 'pci_type="0300 [1002:515e]' in path.read_text()  # AMD ES1000 BMC VGA present in the file
    topo = load_hwloc_xml(str(path))
    evens, odds = frozenset(range(0, 24, 2)), frozenset(range(1, 24, 2))
    assert [n.cpus for n in topo.numa_nodes] == [evens, odds]
    assert all(set(c.pus) <= (evens if c.numa_node == 0 else odds) for c in topo.cores)
    assert [(g.pci, g.vendor, g.numa_node) for g in topo.gpus] == [
        ("0000:06:00.0", "nvidia", 0), ("0000:11:00.0", "nvidia", 1), ("0000:14:00.0", "nvidia", 1)
    ]
    assert [g.cpus for g in topo.gpus] == [evens, odds, odds]


# ------------------------------------------------------------------------------------------ disallowed
def test_irregulargroups_gpus_outside_the_allowed_set() -> None:
    topo = load_hwloc_xml(str(GPU_XML / "irregulargroups-disallowed.xml"))
    assert topo.allowed == parse_cpulist("0-15")
    assert len(topo.online) == 64 and len(topo.cores) == 64
    assert topo.allowed_mems == frozenset({0, 1})
    assert [(g.pci, g.numa_node, format_cpulist(g.cpus)) for g in topo.gpus] == [
        ("0002:01:00.0", 4, "32-39"), ("0004:01:00.0", 7, "56-63")
    ]
    assert all(not (g.cpus & topo.allowed) for g in topo.gpus)
    assert topo.numa_nodes[7].distances[2] == 79 and topo.numa_nodes[2].distances[7] == 79
    data = topo.to_json()
    assert data["cpus"] == list(range(16)) and len(data["numa_nodes"]) == 8
    assert [n["cpus"] for n in data["numa_nodes"][2:]] == [[]] * 6  # nodes whose CPUs are all disallowed


# ------------------------------------------------------------------------------------------ vs hwloc's targets
def _parse_test(path: Path) -> tuple[Path, Path, str]:
    fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line and not line.startswith("#"))
    return path.parent / fields["source"].strip(), path.parent / fields["target"].strip(), fields.get("options", "")


@pytest.mark.parametrize("test_file", sorted(GPU_XML.glob("*.test")), ids=lambda p: p.name)
def test_counts_match_hwloc_targets(test_file: Path) -> None:
    """``lstopo --if xml --input SOURCE`` gave TARGET. Counting rule: without ``--disallowed`` the target holds
    allowed objects only (compare allowed cores/PUs); with it, everything (compare all cores/online PUs)."""
    source, target, options = _parse_test(test_file)
    expected = xml_counts(target)
    topo = load_hwloc_xml(str(source))
    disallowed = "--disallowed" in options.split()
    got = {
        "Package": len(topo.packages),
        "NUMANode": len(topo.numa_nodes),
        "Core": len(topo.cores) if disallowed else len(topo.allowed_cores()),
        "PU": len(topo.online) if disallowed else len(topo.allowed),
    }
    assert got == expected


@pytest.mark.parametrize("path", sorted((MPIBIND / "topo-xml").glob("*.xml")), ids=lambda p: p.name)
def test_mpibind_xml_counts(path: Path) -> None:
    """LLNL's exports (hwloc 1.x and 2.x): affrun sees every Package, NUMANode (CPU-less too), Core and PU."""
    topo = load_hwloc_xml(str(path))
    expected = xml_counts(path)
    assert (len(topo.packages), len(topo.numa_nodes), len(topo.cores), len(topo.online)) == (
        expected["Package"], expected["NUMANode"], expected["Core"], expected["PU"]
    )
    assert all(node.cpus <= topo.online for node in topo.numa_nodes)
    with_cpus = [n for n in topo.numa_nodes if n.cpus]
    assert sum(len(n.cpus) for n in with_cpus) == len(topo.online)  # every PU in exactly one node


def _greedy_record(answer_file: Path) -> tuple[str, str]:
    """mpibind's "Map one task greedily" answer: (cpuset, GPU list) of the single task that gets everything."""
    lines = [line for line in answer_file.read_text().splitlines() if not line.startswith("#")]
    i = lines.index("Map one task greedily")
    return lines[i + 2].strip('"'), lines[i + 3].strip('"')


# mpibind counts a GPU only when hwloc gave it a CUDA/NVML/OpenCL/RSMI OS device. coral-ea's hwloc 1.11 export has
# its 4 P100 PCI devices with DRM devices only (card1, renderD128), so mpibind sees 0 GPUs where affrun sees 4.
MPIBIND_CASES = [
    ("expected.coral-lassen", "coral-lassen.xml", 4),
    ("expected.epyc-corona", "epyc-corona.xml", 4),
    ("expected.coral-ea", "coral-ea-hwloc1.xml", 0),
    ("expected.cts1-quartz", "cts1-quartz-smt1.xml", 0),
]


@pytest.mark.parametrize(("answers", "xml", "mpibind_gpus"), MPIBIND_CASES, ids=[c[1] for c in MPIBIND_CASES])
def test_allowed_cpus_and_gpus_match_mpibind(answers: str, xml: str, mpibind_gpus: int) -> None:
    cpuset, gpus = _greedy_record(MPIBIND / "test-suite" / "expected" / answers)
    path = MPIBIND / "topo-xml" / xml
    topo = load_hwloc_xml(str(path))
    assert topo.allowed == parse_cpulist(cpuset)
    assert len([g for g in gpus.split(",") if g]) == mpibind_gpus
    compute_osdevs = osdev_index(path, "(?:cuda|nvml|opencl\\d+d|rsmi)")
    assert len([g for g in topo.gpus if g.pci in compute_osdevs]) == mpibind_gpus
    assert len(topo.gpus) >= mpibind_gpus


@pytest.mark.parametrize(("xml", "pci_order"), [("eas-tioga.xml", True), ("epyc-corona-p2.xml", False)])
def test_amd_vendor_index_is_rsmi_index(xml: str, pci_order: bool) -> None:
    """ROCm numbers GPUs in KFD topology order. On tioga that is PCI bus order; on corona it is not (bus 63, 43,
    03, 27, ...), so ``GPU.index`` (PCI order) and ``GPU.vendor_index`` (ROCm's) must both be kept."""
    path = MPIBIND / "topo-xml" / xml
    topo = load_hwloc_xml(str(path))
    rsmi = osdev_index(path, "rsmi")
    assert len(topo.gpus) == 8 and {g.vendor for g in topo.gpus} == {"amd"}
    assert [g.vendor_index for g in topo.gpus] == [rsmi[g.pci] for g in topo.gpus]
    assert ([g.vendor_index for g in topo.gpus] == list(range(8))) is pci_order


def test_tioga_gpu_nodes() -> None:
    topo = load_hwloc_xml(str(MPIBIND / "topo-xml" / "eas-tioga.xml"))
    assert [g.numa_node for g in topo.gpus] == [3, 3, 1, 1, 0, 0, 2, 2]
    assert all(g.cpus and g.cpus <= topo.node(g.numa_node).cpus for g in topo.gpus if g.numa_node is not None)  # type: ignore[union-attr]


def test_hwloc1_gpu_memory_and_mcdram_nodes_are_cpuless() -> None:
    lassen = load_hwloc_xml(str(MPIBIND / "topo-xml" / "coral-lassen-hwloc1.xml"))
    assert [n.os_index for n in lassen.numa_nodes if not n.cpus] == [252, 253, 254, 255]
    assert lassen.node(0).distances == {0: 10, 8: 40, 252: 80, 253: 80, 254: 80, 255: 80}  # type: ignore[union-attr]
    assert lassen.offline == frozenset()  # hwloc 1.x says which CPUs are online: 0-7 are disallowed, not offline
    assert lassen.allowed == parse_cpulist("8-87,96-175")
    knl = load_hwloc_xml(str(MPIBIND / "topo-xml" / "knl-snc4-flat-hwloc1.xml"))
    assert [n.os_index for n in knl.numa_nodes] == list(range(8))
    assert [n.os_index for n in knl.numa_nodes if not n.cpus] == [4, 5, 6, 7]
    assert [n.memory_kb for n in knl.numa_nodes[4:]] == [4 * 1024 * 1024] * 4


# ------------------------------------------------------------------------------------------ every file loads
@pytest.mark.parametrize("path", ALL_XML, ids=lambda p: p.name)
def test_every_fixture_gives_a_consistent_topology(path: Path) -> None:
    topo: Topology = load_hwloc_xml(str(path))
    pus = [p for c in topo.cores for p in c.pus]
    assert len(pus) == len(set(pus)) and set(pus) == topo.online
    assert topo.allowed and topo.allowed <= topo.online
    assert frozenset().union(*(p.cpus for p in topo.packages)) == topo.online
    assert [n.os_index for n in topo.numa_nodes] == sorted({n.os_index for n in topo.numa_nodes})
    assert [g.index for g in topo.gpus] == list(range(len(topo.gpus)))
    json.dumps(topo.to_json())


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("<topology><object type='Machine'", "not well-formed XML"),
        ("<machine/>", "not an hwloc topology"),
        ("<topology/>", "holds no <object>"),
        ("<topology><object type='Machine' cpuset='0x1'/></topology>", "no PU objects"),
        ("<topology><object type='Machine' allowed_cpuset='0xzz'><object type='PU' os_index='0'/></object></topology>",
         "is not a bitmap"),
        ("<topology><object type='Machine'><object type='PU' os_index='x'/></object></topology>", "not an integer"),
        ("<topology><object type='Machine' allowed_cpuset='0x2'><object type='PU' os_index='0'/></object></topology>",
         "contains none of the PUs"),
    ],
)
def test_bad_xml_is_one_line_naming_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.xml"
    path.write_text(content)
    with pytest.raises(TopologyError) as info:
        load_hwloc_xml(str(path))
    text = str(info.value)
    assert "\n" not in text and text.startswith(str(path)) and message in text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="No such file"):
        load_hwloc_xml(str(tmp_path / "absent.xml"))


def test_minimal_xml_without_packages_or_nodes(tmp_path: Path) -> None:
    path = tmp_path / "tiny.xml"
    path.write_text("<topology><object type='Machine'><object type='PU' os_index='0'/>"
                    "<object type='PU' os_index='1'/></object></topology>")
    topo = load_hwloc_xml(str(path))
    assert [c.pus for c in topo.cores] == [(0,), (1,)]
    assert [n.os_index for n in topo.numa_nodes] == [0] and topo.numa_nodes[0].cpus == {0, 1}
    assert len(topo.packages) == 1


