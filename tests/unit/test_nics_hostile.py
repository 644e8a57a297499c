"""NIC data that lies (issue 34, class 5), in-process: sysfs trees whose ports, rates, link layers and links are no
kernel's, NICs named with spaces, list separators, shell and escape sequences or bytes that are not UTF-8, hwloc
XML whose OS devices nest wrongly, and snapshots whose ``nics`` are hostile. The promise: a warning and no NIC for
data no kernel writes, a NIC read under its exact name, and a rank given only a NIC whose name its variables can
carry, never a farther one instead (tests/system/test_nics_hostile_processes.py runs the same through the commands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.env.policy import rank_environment
from launcher.errors import TopologyError
from launcher.plan.planner import Request, make_plan
from launcher.topology import load_topology
from launcher.topology.model import Topology
from launcher.topology.nics import MAX_WARNINGS, device_problem, ib_rate, net_rate
from launcher.topology.snapshot import from_snapshot, to_snapshot
from tests.fakesys import (
    LYING_NIC_CASES,
    FakeGPU,
    FakeNIC,
    dgx_like,
    lie_about_nics,
    nic_xml,
    rename_nics,
    uniform,
    write_tree,
    xml_nic,
)

# dgx_like's answer (tests/system/test_nics_processes.py): the NIC on each GPU's switch, by rank
DGX_NICS = ["mlx5_0:1", "mlx5_3:1", "mlx5_5:1", "mlx5_4:1", "mlx5_9:1", "mlx5_6:1", "mlx5_11:1", "mlx5_10:1"]
# Names a kernel lets an administrator give (rdma dev set ... name, ip link set ... name), each odd in its own way
ODD_NAMES = [
    "mlx5 0", "mlx5,0", "mlx5:0", "mlx5=0", "$(touch x);`id`|&>'\"", "mlx5\n0", "mlx5\r0", "mlx5\t0",
    "mlx5\x1b[31m0", "mlx5\x850", "mlx5_\u202e0", "mlx5_é", "mlx5_\udcff", "mlx5_[0-3]", "^mlx5_0", "mlx5*", "all",
    "m" * 30,  # mlx5's device string m...m:1 is 32 characters: UCX keeps 31
]


def dgx(tmp_path: Path, renames: dict[str, str] | None = None) -> Topology:
    return load_topology(fsroot=str(write_tree(tmp_path, rename_nics(dgx_like(), renames or {}))), environ={})


def xml_topology(tmp_path: Path, io: str) -> Topology:
    path = tmp_path / "nics.xml"
    path.write_text(nic_xml(io))
    return load_topology(topology_file=str(path), environ={})


# ---------------------------------------------------------------------------------------------------- sysfs lies
@pytest.mark.parametrize("case", LYING_NIC_CASES)
def test_a_lying_sysfs_nic_gives_a_warning_and_no_nic(tmp_path: Path, case: str) -> None:
    root = write_tree(tmp_path, dgx_like())
    broken = lie_about_nics(root, case)
    topo = load_topology(fsroot=str(root), environ={})
    names = {n.name for n in topo.nics}
    assert broken not in names
    # every other NIC of dgx_like (8 compute, 4 storage, eno1) is read
    assert names == ({f"mlx5_{i}" for i in range(12)} | {"eno1"}) - {broken}
    (warning,) = topo.warnings
    assert repr(broken) in warning and "not read as a NIC" in warning and warning.isprintable()
    plan = make_plan(topo, Request(nproc=8))
    assert broken not in {r.nic.name for r in plan.ranks if r.nic}


def test_port_rates_and_speeds_as_the_kernel_writes_them() -> None:
    # ports/N/rate: "%d%s Gb/sec (%dX%s)" (drivers/infiniband/core/sysfs.c); absent or 0: unknown
    assert ib_rate("400 Gb/sec (4X NDR)") == (400.0, None)
    assert ib_rate("2.5 Gb/sec (1X SDR)") == (2.5, None)
    assert ib_rate("0 Gb/sec (4X)") == (None, None) and ib_rate(None) == (None, None) and ib_rate("") == (None, None)
    for text in ("nan Gb/sec", "inf Gb/sec", "1e308 Gb/sec", "-5 Gb/sec", "+5 Gb/sec", "1_000 Gb/sec", "١٠ Gb/sec",
                 "5", "5 Mb/sec", "999999999999 Gb/sec", "1000000 Gb/sec", "0x10 Gb/sec", "1.2.3 Gb/sec", "Gb/sec"):
        value, problem = ib_rate(text)
        assert value is None and problem is not None, text
    # net/<if>/speed: Mb/s; -1 (SPEED_UNKNOWN), its unsigned spelling and 0 are unknown
    assert net_rate("100000") == (100.0, None) and net_rate("25000") == (25.0, None)
    for unknown in ("-1", "4294967295", "0", "", None):
        assert net_rate(unknown) == (None, None), unknown
    for text in ("fast", "-2", "1e308", "nan", "99999999999", "1000000000", " 100"):
        value, problem = net_rate(text)
        assert value is None and problem is not None, text


def test_two_nics_on_one_pci_function_are_both_read_and_shared_out(tmp_path: Path) -> None:
    # mlx5_0 and mlx5_99, two RDMA devices of the one function behind GPU 0's switch (0000:1c:00.0); 16 ranks on the
    # 8 GPUs: GPU 0's two ranks take one each (equally near and fast), as two ports of one card would be shared
    m = dgx_like()
    m.nics.append(FakeNIC("mlx5_99", "0000:1c:00.0", 0))
    topo = load_topology(fsroot=str(write_tree(tmp_path, m)), environ={})
    assert [n.pci for n in topo.nics if n.name in ("mlx5_0", "mlx5_99")] == ["0000:1c:00.0", "0000:1c:00.0"]
    plan = make_plan(topo, Request(nproc=16, gpus=tuple(i // 2 for i in range(16))))
    assert [r.nic_device for r in plan.ranks[:2]] == ["mlx5_0:1", "mlx5_99:1"] and not topo.warnings


def test_nic_warnings_are_bounded(tmp_path: Path) -> None:
    # 300 interfaces whose operstate is an escape sequence: 300 problems, MAX_WARNINGS lines and one that counts
    m = uniform(packages=1, cores_per_package=2)
    m.nics = [FakeNIC(f"eth{i}", f"0000:{1 + i // 32:02x}:{i % 32:02x}.0", 0, "ethernet", (("\x1b[2Jup", "1000"),))
              for i in range(300)]
    topo = load_topology(fsroot=str(write_tree(tmp_path, m)), environ={})
    assert not topo.nics
    assert len(topo.warnings) == MAX_WARNINGS + 1 and topo.warnings[-1] == "284 more NIC warnings like these"


# ---------------------------------------------------------------------------------------------------- odd names
@pytest.mark.parametrize("name", ODD_NAMES, ids=ascii)
def test_an_odd_name_is_read_exactly_and_given_to_no_rank(tmp_path: Path, name: str) -> None:
    topo = dgx(tmp_path, {"mlx5_0": name})  # GPU 0's switch NIC
    assert name in {n.name for n in topo.nics} and not topo.warnings
    plan = make_plan(topo, Request(nproc=8))
    # rank 0 gets no NIC, not mlx5_3 (GPU 1's, farther): the data does not support a farther choice
    assert [r.nic_device for r in plan.ranks] == [None, *DGX_NICS[1:]]
    (why,) = plan.ranks[0].warnings
    assert why.startswith(f"no NIC: the nearest, {name!r}, has a name AFFRUN_NIC and UCX_NET_DEVICES cannot carry")
    assert f"rank 0: {why}" in plan.warnings
    env = rank_environment(plan.ranks[0], local_world_size=8, user_env={}, nic_env="ucx")
    assert env.set["AFFRUN_NIC"] == "" and "UCX_NET_DEVICES" not in env.set
    assert json.loads(json.dumps(topo.to_json()))["nics"] == topo.to_json()["nics"]  # exact in JSON


def test_a_plain_name_wins_a_tie_with_an_odd_one(tmp_path: Path) -> None:
    # GPU 0 and 1 behind one switch with two equally fast NICs, one named "mlx5,1": both ranks share mlx5_0
    m = uniform(packages=2, cores_per_package=4)
    switch = ("pci0000:10", "0000:10:01.0", "0000:11:00.0")
    for i, bdf in enumerate(("0000:13:00.0", "0000:14:00.0")):
        m.gpus.append(FakeGPU(pci=bdf, numa_node=0))
        m.pci_paths[bdf] = (*switch, f"0000:12:{i:02x}.0")
    for i, name in enumerate(("mlx5,1", "mlx5_0")):
        m.nics.append(FakeNIC(name, f"0000:{0x15 + i:02x}:00.0", 0))
        m.pci_paths[m.nics[-1].pci] = (*switch, f"0000:12:{2 + i:02x}.0")
    plan = make_plan(load_topology(fsroot=str(write_tree(tmp_path, m)), environ={}), Request(nproc=2))
    assert [r.nic_device for r in plan.ranks] == ["mlx5_0:1", "mlx5_0:1"] and not plan.warnings


def test_which_device_strings_a_rank_can_be_given() -> None:
    for name, port in (("mlx5_0", 1), ("mlx5_bond_0", 1), ("eth0.100", None), ("enp65s0f0np0", None),
                       ("br-ex", None), ("ALL", None), ("m" * 29, 1), ("e" * 31, None)):
        assert device_problem(name, port) is None, name
    for name, port in (("mlx5 0", 1), ("a,b", None), ("a:b", 1), ("^a", None), ("a[0-1]", 1), ("all", None),
                       ("m" * 30, 1), ("e" * 32, None), ("mlx5_é", 1), ("\udcff", 1), ("", None)):
        assert device_problem(name, port) is not None, name


# ----------------------------------------------------------------------------------------------------- hwloc XML
def test_hwloc_xml_with_broken_osdev_nesting(tmp_path: Path) -> None:
    # Only a network OSDev that is a child of its PCIDev is a NIC: one under a Bridge or a Package has no PCI
    # function, one nested in another OSDev neither; an OSDev of another type, or of a type that is no number, no NIC
    stray = '<object type="OSDev" name="stray0" osdev_type="3"><info name="Port1State" value="4"/></object>'
    nested = xml_nic("mlx5_0", inner=stray.replace("stray0", "inner0"))
    io = (stray + nested + xml_nic("nvme0", "0000:11:00.1", "0") + xml_nic("odd0", "0000:11:00.2", "banana")
          + xml_nic("ib0", "0000:11:00.3", "2"))
    topo = xml_topology(tmp_path, io)
    assert [(n.name, n.pci, n.kind) for n in topo.nics] == [("mlx5_0", "0000:11:00.0", "infiniband"),
                                                            ("ib0", "0000:11:00.3", "ethernet")]
    assert not topo.warnings
    assert [r.nic_device for r in make_plan(topo, Request(nproc=2)).ranks] == ["mlx5_0:1", "mlx5_0:1"]


def test_hwloc_xml_names_ports_and_duplicates(tmp_path: Path) -> None:
    io = (xml_nic("", "0000:11:00.0")  # no name: a warning
          + xml_nic("mlx5&#10;1", "0000:11:00.1")  # a newline, read exactly, given to no rank
          + xml_nic("mlx5_2", "0000:11:00.2").replace("Port1State", "Port0State")  # port 0: no port
          + xml_nic("mlx5_3", "0000:11:00.3", inner='<info name="Port01State" value="4"/>')  # port 1 twice
          + xml_nic("mlx5_4", "0000:11:00.4", inner="".join(f'<info name="Port{i}State" value="1"/>'
                                                             for i in range(2, 18)))  # 17 ports
          + xml_nic("mlx5_5", "0000:11:00.5") + xml_nic("mlx5_5", "0000:11:00.6")  # one name, two NICs
          + xml_nic("mlx5_7&#x85;&#x202e;", "0000:11:00.7"))
    topo = xml_topology(tmp_path, io)
    assert [n.name for n in topo.nics] == ["mlx5\n1", "mlx5_7\x85\u202e"]
    assert len(topo.warnings) == 5 and all(w.isprintable() for w in topo.warnings)
    assert any("an empty name" in w for w in topo.warnings) and any("2 NICs are named 'mlx5_5'" in w
                                                                      for w in topo.warnings)
    for name, why in (("mlx5_2", "is no port number"), ("mlx5_3", "lists the port twice"),
                      ("mlx5_4", "one port more than 16")):
        assert any(f"NIC {name!r}" in w and why in w for w in topo.warnings), (name, topo.warnings)
    plan = make_plan(topo, Request(nproc=1))
    assert plan.ranks[0].nic is None
    assert any(w.startswith("rank 0: no NIC: the nearest, 'mlx5\\n1'") for w in plan.warnings)


def test_hwloc_xml_with_10000_osdevs_reads_none_and_says_so_once(tmp_path: Path) -> None:
    osdevs = "".join(f'<object type="OSDev" name="{"" if i % 2 else f"mlx5_{i}"}" osdev_type="3"/>'
                     for i in range(10_000))
    topo = xml_topology(tmp_path, xml_nic("mlx5_x").replace("</object></object>", f"</object>{osdevs}</object>"))
    assert not topo.nics and topo.warnings == ("the XML lists 10001 NICs, more than 1024; no NIC is read",)


# ------------------------------------------------------------------------------------------------------ snapshots
def test_odd_names_survive_a_snapshot_exactly(tmp_path: Path) -> None:
    renames = {"mlx5_0": "mlx5\n0", "mlx5_3": "mlx5_\udcff", "mlx5_5": "mlx5\x1b[31m5", "mlx5_4": "mlx5,4"}
    topo = dgx(tmp_path, renames)
    text = json.dumps(to_snapshot(topo))  # as affrun topology --save writes it: ASCII, \udcff escaped
    again = from_snapshot(json.loads(text))
    assert again.nics == topo.nics and set(renames.values()) <= {n.name for n in again.nics}
    assert [r.nic_device for r in make_plan(again, Request(nproc=8)).ranks] == [None] * 4 + DGX_NICS[4:]


@pytest.mark.parametrize(("field", "value", "why"), [
    ("name", "mlx5\x000", "'/' or NUL"), ("name", "m" * 100_000, "more than 255"), ("name", ["mlx5_0"], "not a string"),
    ("name", "", "an empty name"), ("ports", [{"number": 1, "state": "active"}] * 2, "a port number twice"),
    ("ports", [{"number": 1, "state": "active", "rate_gbps": 1e308}], "rate_gbps"),
    ("ports", [[[[[]]]]], "must be an object"), ("pci_path", [["x"]], "pci_path"), ("kind", "wifi\n", "kind"),
])
def test_a_hostile_snapshot_nic_field_refuses_the_snapshot(tmp_path: Path, field: str, value: object, why: str) -> None:
    data = to_snapshot(dgx(tmp_path))
    data["nics"][1][field] = value
    with pytest.raises(TopologyError, match=r"bad topology snapshot: nics\[1\]") as exc:
        from_snapshot(data)
    assert why in str(exc.value) and len(str(exc.value)) < 400


def test_snapshot_nics_that_lie_give_warnings(tmp_path: Path) -> None:
    data = to_snapshot(dgx(tmp_path))
    data["nics"][1]["numa_node"] = 10**4000  # bounded in the warning
    data["nics"][2]["name"] = data["nics"][3]["name"]  # two NICs of one name
    topo = from_snapshot(data)
    assert len(topo.nics) == 13 - 3 and all(len(w) < 200 for w in topo.warnings)
    assert any("a huge integer" in w for w in topo.warnings)
    assert any(f"2 NICs are named {data['nics'][3]['name']!r}" in w for w in topo.warnings)
    data["nics"] = data["nics"][:1] * 100_000
    topo = from_snapshot(data)
    assert not topo.nics and topo.warnings == ('"nics" lists 100000 NICs, more than 1024; no NIC is read',)
