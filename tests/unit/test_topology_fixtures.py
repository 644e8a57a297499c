"""The sysfs reader against hwloc's own expectations for 15 real machines (``../shared/fixtures/hwloc-linux``).

Every tarball is found by globbing, and every ``*.test`` file beside it is one comparison: hwloc ran ``lstopo``
on the tarball (with the test's ``options:`` and ``env:``) and saved the ``target:`` (``lstopo -v`` text or
XML). We count Package, NUMANode, Core and PU objects in that target and compare them with affrun's counts:

* packages  = ``len(topo.packages)``         (every package with an online CPU)
* NUMA      = ``len(topo.numa_nodes)``       (every node, CPU-less ones included: the JSON contract)
* cores     = ``len(topo.allowed_cores())``  (cores with an allowed CPU: the JSON contract)
* PUs       = ``len(topo.allowed)``

Where affrun's count legitimately differs from hwloc's, the difference is listed in ``DIFFERENCES`` with the
rule that explains it. The test then checks that (1) the raw counts really differ (a stale entry fails), and
(2) the rule, computed from affrun's topology, gives exactly hwloc's number. Any other difference fails.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.topology.model import Topology
from launcher.topology.sysfs import read_sysfs
from tests.conftest import FIXTURES

HWLOC_LINUX = FIXTURES / "hwloc-linux"
TARBALLS = sorted(HWLOC_LINUX.glob("*.tar.bz2"))
TEST_FILES = sorted(p for p in HWLOC_LINUX.glob("*.test*") if p.is_file())
KINDS = ("Package", "NUMANode", "Core", "PU")


# ------------------------------------------------------------------------------------------ hwloc's side
@dataclass(frozen=True)
class HwlocTest:
    name: str
    source: str
    target: Path
    options: str
    env: tuple[str, ...]

    @property
    def disallowed(self) -> bool:
        return "--disallowed" in self.options.split()

    @property
    def keeps_gpu_numa_nodes(self) -> bool:
        return "HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1" in self.env


def parse_test(path: Path) -> HwlocTest:
    fields: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), []).append(value.strip())
    return HwlocTest(
        name=path.name,
        source=fields["source"][0],
        target=path.parent / fields["target"][0],
        options=" ".join(fields.get("options", [])),
        env=tuple(fields.get("env", [])),
    )


# Tree lines only ("  NUMANode(DRAM) L#0 (P#0 ...)"), not memory-attribute lines ("  NUMANode L#0 = 22500 from ...").
_CONSOLE_OBJECT = re.compile(r"^\s*(Package|NUMANode|Core|PU)(?:\([^)]*\))? L#\d+(?: \(|\s*$)", re.M)
_XML_OBJECT = re.compile(r'<object type="(Package|NUMANode|Core|PU)"')


def hwloc_counts(target: Path) -> dict[str, int]:
    """Count objects in an ``lstopo -v`` text target (``.console``/``.output``) or an XML target."""
    text = target.read_text()
    pattern = _XML_OBJECT if target.suffix == ".xml" else _CONSOLE_OBJECT
    counts = dict.fromkeys(KINDS, 0)
    for match in pattern.finditer(text):
        counts[match.group(1)] += 1
    return counts


# ------------------------------------------------------------------------------------------ affrun's side
def raw_counts(topo: Topology) -> dict[str, int]:
    return {
        "Package": len(topo.packages),
        "NUMANode": len(topo.numa_nodes),
        "Core": len(topo.allowed_cores()),
        "PU": len(topo.allowed),
    }


def gpu_memory_nodes(topo: Topology) -> set[int]:
    return {g.memory_node for g in topo.gpus if g.memory_node is not None}


def nodes_hwloc_shows(topo: Topology, test: HwlocTest) -> list[int]:
    """hwloc hides NVIDIA GPU-memory nodes unless HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES=1 (hwloc's linux backend,
    "GPUMemory" nodes), and without --disallowed it removes nodes outside the cgroup's cpuset.mems."""
    shown = [n.os_index for n in topo.numa_nodes]
    if not test.keeps_gpu_numa_nodes:
        shown = [n for n in shown if n not in gpu_memory_nodes(topo)]
    if not test.disallowed and topo.allowed_mems is not None:
        shown = [n for n in shown if n in topo.allowed_mems]
    return shown


def rule_numa_hidden_by_hwloc(topo: Topology, test: HwlocTest) -> int:
    """affrun lists every NUMA node (the JSON contract: CPU-less nodes too, ``cpus: []``). hwloc drops GPU-memory
    nodes by default and nodes outside cpuset.mems; count only the nodes hwloc keeps."""
    return len(nodes_hwloc_shows(topo, test))


def rule_packages_of_allowed_resources(topo: Topology, test: HwlocTest) -> int:
    """affrun counts every package with an online CPU (the machine); hwloc removes a package when the cgroup
    leaves it neither an allowed CPU nor an allowed NUMA node (32amd64-cgroup2: CPUs 0-5 and mems 0-5 touch
    packages 0, 1, 2 -> 3). Count the packages holding an allowed CPU or the CPUs of a node hwloc keeps."""
    kept_nodes = set(nodes_hwloc_shows(topo, test))
    node_cpus = frozenset().union(*(n.cpus for n in topo.numa_nodes if n.os_index in kept_nodes))
    return sum(1 for p in topo.packages if p.cpus & topo.allowed or p.cpus & node_cpus)


def rule_disallowed_cores(topo: Topology, test: HwlocTest) -> int:
    """With ``--disallowed`` hwloc also shows the cores the cgroup forbids: that is every core affrun found."""
    return len(topo.cores)


def rule_disallowed_pus(topo: Topology, test: HwlocTest) -> int:
    """With ``--disallowed`` hwloc also shows forbidden PUs (not offline ones): affrun's online CPUs."""
    return len(topo.online)


Rule = Callable[[Topology, HwlocTest], int]

# (test file, object type) -> the rule that turns affrun's topology into hwloc's count. Nothing else may differ.
DIFFERENCES: dict[tuple[str, str], Rule] = {
    # Legacy cpuset fs /dev/cpuset/dummy: cpus 0-6,12-15 (cpu4 offline), mems 1-4.
    ("16amd64-8n2c-cpusets.test", "Package"): rule_packages_of_allowed_resources,
    ("16amd64-8n2c-cpusets.test", "NUMANode"): rule_numa_hidden_by_hwloc,
    ("16amd64-8n2c-cpusets-xml.test", "Package"): rule_packages_of_allowed_resources,
    ("16amd64-8n2c-cpusets-xml.test", "NUMANode"): rule_numa_hidden_by_hwloc,
    ("16amd64-8n2c-cpusets-disallowed.test", "Core"): rule_disallowed_cores,
    ("16amd64-8n2c-cpusets-disallowed.test", "PU"): rule_disallowed_pus,
    # cgroup v2 /cgroup/unified/uid_2008/job_15389/step_0: cpus 0-5, mems 0-5.
    ("32amd64-4s2n4c-cgroup2.test", "Package"): rule_packages_of_allowed_resources,
    ("32amd64-4s2n4c-cgroup2.test", "NUMANode"): rule_numa_hidden_by_hwloc,
    # CPU-only nodes 0-3 and the generic initiator node 4 have no memory: the kernel leaves them out of the root
    # cpuset's mems (5-10), and hwloc hides nodes outside it; affrun lists them (their CPUs live there).
    ("fakememinitiators-1np2c+1npp+gi.test", "NUMANode"): rule_numa_hidden_by_hwloc,
    # POWER9 + 6 V100: the GPU-memory nodes 250-255 are CPU-less nodes to affrun, hidden by default in hwloc.
    ("nvidiagpunumanodes.test", "NUMANode"): rule_numa_hidden_by_hwloc,
}


@pytest.fixture(scope="module")
def topo_of(hwloc_root):  # type: ignore[no-untyped-def]
    cache: dict[str, Topology] = {}

    def get(tarball_name: str) -> Topology:
        if tarball_name not in cache:
            cache[tarball_name] = read_sysfs(str(hwloc_root(tarball_name.removesuffix(".tar.bz2"))))
        return cache[tarball_name]

    return get


def test_fixtures_are_there() -> None:
    from tests.conftest import need

    need(HWLOC_LINUX.is_dir(), f"hwloc fixtures not found at {HWLOC_LINUX}")
    assert len(TARBALLS) >= 15, [t.name for t in TARBALLS]


def test_every_tarball_is_compared_with_hwloc() -> None:
    """No tarball is left out: each one is the source of at least one hwloc test."""
    sources = {parse_test(t).source for t in TEST_FILES}
    assert {t.name for t in TARBALLS} <= sources, {t.name for t in TARBALLS} - sources


@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_counts_match_hwloc(test_file: Path, topo_of) -> None:  # type: ignore[no-untyped-def]
    test = parse_test(test_file)
    expected = hwloc_counts(test.target)
    assert all(expected.values()), f"{test.target.name}: could not count objects {expected}"
    topo = topo_of(test.source)
    raw = raw_counts(topo)
    for kind in KINDS:
        rule = DIFFERENCES.get((test.name, kind))
        if rule is None:
            assert raw[kind] == expected[kind], f"{test.name} {kind}: affrun {raw[kind]}, hwloc {expected[kind]}"
        else:
            assert raw[kind] != expected[kind], f"{test.name} {kind}: listed as a difference but both are {raw[kind]}"
            assert rule(topo, test) == expected[kind], f"{test.name} {kind}: {rule.__name__} does not explain it"


def test_difference_table_names_real_tests() -> None:
    names = {t.name for t in TEST_FILES}
    assert {name for name, _ in DIFFERENCES} <= names


# ------------------------------------------------------------------------------------------ distances vs hwloc
_MATRIX = re.compile(r"^Relative latency matrix \(name NUMALatency.*\n index(?P<head>.*)\n(?P<rows>(?:\s+\d+(?:\s+\d+)+\n)+)", re.M)
_NODE_LINE = re.compile(r"^\s*NUMANode(?:\([^)]*\))? L#(\d+) \(P#(\d+)", re.M)


# Targets that print no latency matrix although the machine has several NUMA nodes, and why.
NO_MATRIX = {
    "64intel64-fakeKNL-SNC4-hybrid.test": "the pre-3.0 hwloc that wrote it models KNL from knl_memoryside_cache "
    "and prints no NUMALatency matrix",
    "64intel64-fakeKNL-SNC4-hybrid-msc.test": "same KNL modelling, no NUMALatency matrix printed",
}


@pytest.mark.parametrize("test_file", [t for t in TEST_FILES if parse_test(t).target.suffix != ".xml"], ids=lambda p: p.name)
def test_numa_distances_match_hwloc(test_file: Path, topo_of) -> None:  # type: ignore[no-untyped-def]
    """hwloc prints the latency matrix by logical index; map it to OS ids and compare with node*/distance."""
    test = parse_test(test_file)
    text = test.target.read_text()
    os_of = {int(lg): int(p) for lg, p in _NODE_LINE.findall(text)}
    match = _MATRIX.search(text)
    topo = topo_of(test.source)
    if match is None:
        assert len(os_of) == 1 or test.name in NO_MATRIX, f"{test.name}: no latency matrix to compare with"
        return
    assert test.name not in NO_MATRIX
    columns = [int(c) for c in match.group("head").split()]  # logical indexes, in hwloc's (possibly permuted) order
    by_id = {n.os_index: n for n in topo.numa_nodes}
    compared = 0
    for line in match.group("rows").strip("\n").splitlines():
        row = [int(v) for v in line.split()]
        a = os_of[row[0]]
        for logical_b, value in zip(columns, row[1:]):
            assert by_id[a].distances[os_of[logical_b]] == value, (test.name, a, os_of[logical_b])
            compared += 1
    assert compared == len(os_of) ** 2


# ------------------------------------------------------------------------------------------ quirks
def test_nul_terminated_files_128arm(hwloc_root, topo_of) -> None:  # type: ignore[no-untyped-def]
    root = hwloc_root("128arm-2pa2n8cluster4co")
    raw = (root / "sys/devices/system/cpu/cpu0/topology/core_siblings_list").read_bytes()
    assert raw.endswith(b"\n\0"), raw  # the quirk is really in the data
    topo = topo_of("128arm-2pa2n8cluster4co.tar.bz2")
    assert sorted(p.os_index for p in topo.packages) == [36, 8442]
    assert [format_cpulist(p.cpus) for p in topo.packages] == ["0-63", "64-127"]
    assert [(n.os_index, format_cpulist(n.cpus)) for n in topo.numa_nodes] == [
        (0, "0-31"), (1, "32-63"), (2, "64-95"), (3, "96-127")
    ]
    assert all(len(c.pus) == 1 for c in topo.cores) and len(topo.cores) == 128


def test_self_looping_symlinks_8em64t(hwloc_root, topo_of) -> None:  # type: ignore[no-untyped-def]
    root = hwloc_root("8em64t-4c2t")
    link = root / "sys/devices/system/cpu/cpu1/cpufreq"
    assert link.is_symlink() and os.readlink(link) == "."
    topo = topo_of("8em64t-4c2t.tar.bz2")
    assert [c.pus for c in topo.cores] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [p.os_index for p in topo.packages] == [1]  # a one-socket machine whose package id is 1


def test_no_online_file_16em64t_offlines(hwloc_root, topo_of) -> None:  # type: ignore[no-untyped-def]
    root = hwloc_root("16em64t-4s2c2t-offlines")
    assert not (root / "sys/devices/system/cpu/online").exists()
    topo = topo_of("16em64t-4s2c2t-offlines.tar.bz2")
    offline_by_file = {
        c for c in range(16) if (root / f"sys/devices/system/cpu/cpu{c}/online").is_file()
        and (root / f"sys/devices/system/cpu/cpu{c}/online").read_text().strip() == "0"
    }
    assert offline_by_file == {2, 5, 13, 14}
    assert topo.offline == frozenset(offline_by_file)
    assert topo.allowed == frozenset(range(16)) - offline_by_file
    # node0's cpulist says 0-15: offline CPUs are not planned on
    assert topo.numa_nodes[0].cpus == topo.allowed


def test_offline_cpus_and_node_offline_cpu0_node0(hwloc_root, topo_of) -> None:  # type: ignore[no-untyped-def]
    root = hwloc_root("offline-cpu0-node0")
    topo = topo_of("offline-cpu0-node0.tar.bz2")
    for cpu in (0, 1, 2, 3, 21, 22, 23):
        assert not (root / f"sys/devices/system/cpu/cpu{cpu}/topology").exists()
    assert topo.offline == parse_cpulist("0-3,21-23")
    assert topo.allowed == parse_cpulist("4-20")
    assert [n.os_index for n in topo.numa_nodes] == [1]  # node0 is a dangling link
    assert topo.numa_nodes[0].cpus == frozenset(range(5, 20, 2))  # its cpulist also names offline 21, 23
    # CPUs of the offline node belong to no node: no memory policy is derived for them (hwloc does the same).
    assert {p for c in topo.cores if c.numa_node is None for p in c.pus} == frozenset(range(4, 21, 2))
    assert any("no online NUMA node" in w for w in topo.warnings)


def test_sparse_node_ids_48amd64(topo_of) -> None:  # type: ignore[no-untyped-def]
    topo = topo_of("48amd64-4pa2n6c-sparse.tar.bz2")
    ids = [n.os_index for n in topo.numa_nodes]
    assert ids == [0, 1, 2, 33, 34, 45, 72, 73]
    assert all(len(n.cpus) == 6 for n in topo.numa_nodes)
    assert all(set(n.distances) == set(ids) and n.distances[n.os_index] == 10 for n in topo.numa_nodes)
    assert {c.numa_node for c in topo.cores} == set(ids)


def test_package_id_minus_one_256ppc(topo_of) -> None:  # type: ignore[no-untyped-def]
    """POWER7 reports physical_package_id -1: packages come from core_siblings (hwloc shows 64 as well)."""
    topo = topo_of("256ppc-8n8s4t.tar.bz2")
    assert {p.os_index for p in topo.packages} == {-1}
    assert len(topo.packages) == 64 and all(len(p.cpus) == 4 for p in topo.packages)
    assert all(len(c.pus) == 4 for c in topo.cores)  # SMT4
    assert [n.os_index for n in topo.numa_nodes] == [0, 1, 4, 5, 8, 9, 12, 13]


def test_compute_units_are_cores_64amd64(topo_of) -> None:  # type: ignore[no-untyped-def]
    """Bulldozer pairs share thread_siblings but have distinct core_id: 64 single-PU cores, as hwloc says."""
    topo = topo_of("64amd64-4s2n4ca2co.tar.bz2")
    assert len(topo.cores) == 64 and all(len(c.pus) == 1 for c in topo.cores)


def test_cpuless_nodes_knl_and_json(topo_of) -> None:  # type: ignore[no-untyped-def]
    topo = topo_of("64intel64-fakeKNL-SNC4-hybrid.tar.bz2")
    assert [n.os_index for n in topo.numa_nodes if not n.cpus] == [4, 5, 6, 7]  # MCDRAM
    assert all(len(n.cpus) == 16 for n in topo.numa_nodes if n.os_index < 4)
    data = json.loads(json.dumps(topo.to_json()))
    assert [n["cpus"] for n in data["numa_nodes"] if n["id"] >= 4] == [[], [], [], []]


def test_cgroup2_restriction_32amd64(topo_of) -> None:  # type: ignore[no-untyped-def]
    topo = topo_of("32amd64-4s2n4c-cgroup2.tar.bz2")
    assert format_cpulist(topo.allowed) == "0-5"
    assert topo.allowed_mems == parse_cpulist("0-5")
    assert len(topo.online) == 32
    assert [c.pus for c in topo.allowed_cores()] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    data = topo.to_json()
    assert data["cpus"] == [0, 1, 2, 3, 4, 5]
    assert [n["cpus"] for n in data["numa_nodes"]][:2] == [[0, 1, 2, 3], [4, 5]]


def test_legacy_cpuset_16amd64(topo_of) -> None:  # type: ignore[no-untyped-def]
    topo = topo_of("16amd64-8n2c-cpusets.tar.bz2")
    assert 4 in topo.offline  # cpu4 is offline although it kept topology/
    assert topo.allowed == parse_cpulist("0-3,5-6,12-15")  # /dev/cpuset/dummy/cpus 0-6,12-15 minus offline 4
    assert topo.allowed_mems == parse_cpulist("1-4")


def test_cgroup_v1_root_cpuset_memorysidecaches(topo_of) -> None:  # type: ignore[no-untyped-def]
    topo = topo_of("memorysidecaches.tar.bz2")
    assert topo.allowed == frozenset(range(80))
    assert topo.numa_nodes[0].cpus == frozenset(range(0, 80, 4))  # strided node cpulists


def test_six_v100_of_nvidiagpunumanodes(topo_of) -> None:  # type: ignore[no-untyped-def]
    """The PCI dirs hold only class and local_cpus; the NVIDIA proc entries name the vendor and memory node.
    hwloc's "-kept" output prints which GPU each GPU-memory node belongs to: compare with it."""
    topo = topo_of("nvidiagpunumanodes.tar.bz2")
    kept = (HWLOC_LINUX / "nvidiagpunumanodes-kept.console").read_text()
    hwloc_memory_node = {bdf: int(p) for p, bdf in re.findall(r"NUMANode\(GPUMemory\) L#\d+ \(P#(\d+) .*PCIBusID=([0-9a-f:.]+)\)", kept)}
    assert len(hwloc_memory_node) == 6
    assert [g.pci for g in topo.gpus] == ["0004:05:00.0", "0004:06:00.0", "0006:00:00.0", "0007:00:00.0", "0035:04:00.0", "0035:05:00.0"]
    assert {g.vendor for g in topo.gpus} == {"nvidia"}
    assert {g.pci: g.memory_node for g in topo.gpus} == hwloc_memory_node
    assert [g.numa_node for g in topo.gpus] == [0, 0, 0, 8, 8, 8]  # inferred from local_cpus (no numa_node file)
    assert [format_cpulist(g.cpus) for g in topo.gpus] == ["0-15"] * 3 + ["88-103"] * 3
    assert [n.os_index for n in topo.numa_nodes if not n.cpus] == [250, 251, 252, 253, 254, 255]
    assert not [w for w in topo.warnings if "GPU" in w]


def test_sysfs_reader_agrees_with_hwloc_xml_of_the_same_machine(topo_of) -> None:  # type: ignore[no-untyped-def]
    """Where hwloc's target is XML, our XML reader on it and our sysfs reader on the tarball must agree."""
    from launcher.topology.hwloc_xml import load_hwloc_xml

    compared = 0
    for test_file in TEST_FILES:
        test = parse_test(test_file)
        if test.target.suffix != ".xml" or test.disallowed:
            continue
        from_sysfs = topo_of(test.source)
        from_xml = load_hwloc_xml(str(test.target))
        assert from_xml.allowed == from_sysfs.allowed, test.name
        assert [c.pus for c in from_xml.allowed_cores()] == [c.pus for c in from_sysfs.allowed_cores()], test.name
        xml_nodes = {n.os_index: n.cpus for n in from_xml.numa_nodes}
        for node in from_sysfs.numa_nodes:
            if node.os_index in xml_nodes:
                assert node.cpus & from_sysfs.allowed == xml_nodes[node.os_index], (test.name, node.os_index)
        compared += 1
    assert compared >= 4
