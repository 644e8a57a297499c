"""NICs in the model and the nearest NIC per rank (issue 29), in-process: fake sysfs trees with a real PCI hierarchy
(host bridges, switches, GPUs and NICs), hwloc XMLs that carry NICs, snapshots, and hostile NIC data. Every
expected answer is derived by hand from the tree, in the comment beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.base.records import to_dict
from launcher.bind.apply import rank_variables
from launcher.bind.handoff import ParentPlan
from launcher.env.policy import rank_environment
from launcher.errors import TopologyError
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology import load_topology
from launcher.topology.model import Topology
from launcher.topology.snapshot import from_snapshot, to_snapshot
from tests.conftest import FIXTURES, need
from tests.fakesys import (
    HOSTILE_NIC_CASES,
    FakeGPU,
    FakeMachine,
    FakeNIC,
    break_nics,
    dgx_like,
    nic_xml,
    uniform,
    write_tree,
)

ACTIVE_400 = (("4: ACTIVE", "400 Gb/sec (4X NDR)"),)
ACTIVE_200 = (("4: ACTIVE", "200 Gb/sec (4X HDR)"),)
DOWN_400 = (("1: DOWN", "400 Gb/sec (4X NDR)"),)
# Under host bridge pci0000:10: root port 10:01.0, a switch (upstream 11:00.0, downstream ports 12:0N.0).
SWITCH = ("pci0000:10", "0000:10:01.0", "0000:11:00.0")


def behind_switch(port: int) -> tuple[str, ...]:
    return (*SWITCH, f"0000:12:{port:02x}.0")


def machine(gpus: list[tuple[str, int, tuple[str, ...]]], nics: list[tuple[FakeNIC, tuple[str, ...]]]) -> FakeMachine:
    """Two packages of 4 cores, one NUMA node each; GPUs (bdf, node, PCI path) and NICs placed in the PCI tree."""
    m = uniform(packages=2, cores_per_package=4)
    for bdf, node, path in gpus:
        m.gpus.append(FakeGPU(pci=bdf, numa_node=node))
        m.pci_paths[bdf] = path
    for nic, path in nics:
        m.nics.append(nic)
        m.pci_paths[nic.pci] = path
    return m


def plan_on(tmp_path: Path, m: FakeMachine, nproc: int | None = None, **request: Any) -> tuple[Topology, Plan]:
    topo = load_topology(fsroot=str(write_tree(tmp_path / "tree", m)), environ={})
    count = nproc if nproc is not None else len(topo.gpus) or 1
    return topo, make_plan(topo, Request(nproc=count, **request))


def nics_of(plan: Plan) -> list[str | None]:
    return [r.nic_device for r in plan.ranks]


# ------------------------------------------------------------------------------------------------------- the model
def test_sysfs_nics_carry_pci_address_path_node_kind_ports(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(write_tree(tmp_path, dgx_like())), environ={})
    by_name = {n.name: n for n in topo.nics}
    # 8 compute + 4 storage RDMA devices and eno1; lo and docker0 have no device link: no NICs
    assert sorted(by_name) == sorted(["eno1", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6",
                                      "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"])
    mlx5_0 = by_name["mlx5_0"]  # GPU 0 at 1b:00.0 is on the downstream port 1a:00.0 of the same switch
    assert (mlx5_0.pci, mlx5_0.kind, mlx5_0.numa_node) == ("0000:1c:00.0", "infiniband", 0)
    assert mlx5_0.pci_path == ("pci0000:18", "0000:18:01.0", "0000:19:00.0", "0000:1a:01.0")
    assert [(p.number, p.state, p.rate_gbps) for p in mlx5_0.ports] == [(1, "active", 400.0)]
    assert topo.gpus[0].pci_path == ("pci0000:18", "0000:18:01.0", "0000:19:00.0", "0000:1a:00.0")
    assert [p.state for p in by_name["mlx5_2"].ports] == ["down"]
    eno1 = by_name["eno1"]
    assert (eno1.kind, eno1.ports[0].state, eno1.ports[0].rate_gbps, eno1.pci_path) == (
        "ethernet", "active", 25.0, ("pci0000:00",))
    # PCI order, not name order: mlx5_5 (53:00.0) comes before mlx5_4 (62:00.0)
    names = [n.name for n in topo.nics]
    assert names.index("mlx5_5") < names.index("mlx5_4") and names.index("mlx5_1") < names.index("mlx5_3")
    assert not topo.warnings


def test_snapshot_keeps_nics_and_paths(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(write_tree(tmp_path, dgx_like())), environ={})
    again = from_snapshot(to_snapshot(topo))
    assert again.nics == topo.nics and [g.pci_path for g in again.gpus] == [g.pci_path for g in topo.gpus]
    assert again.to_json()["nics"] == topo.to_json()["nics"]


def test_snapshot_nic_on_a_missing_node_warns_and_bad_fields_refuse(tmp_path: Path) -> None:
    data = to_snapshot(load_topology(fsroot=str(write_tree(tmp_path, dgx_like())), environ={}))
    data["nics"][1]["numa_node"] = 7
    loaded = from_snapshot(data)
    assert data["nics"][1]["name"] not in {n.name for n in loaded.nics}
    assert any("NUMA node 7" in w for w in loaded.warnings)
    for field, value in (("ports", [{"number": 1, "state": "banana"}]), ("pci", "GPU0"), ("pci_path", ["x"]),
                         ("kind", "wifi")):
        bad = to_snapshot(loaded)
        bad["nics"][0][field] = value
        with pytest.raises(TopologyError, match=r"bad topology snapshot: nics\[0\]"):
            from_snapshot(bad)


@pytest.mark.parametrize("case", HOSTILE_NIC_CASES)
def test_hostile_nic_data_gives_a_warning_and_no_nic(tmp_path: Path, case: str) -> None:
    root = write_tree(tmp_path, dgx_like())
    broken = break_nics(root, case)
    topo = load_topology(fsroot=str(root), environ={})
    names = {n.name for n in topo.nics}
    assert broken not in names
    assert "mlx5_0" in names  # the other NICs are read
    assert any(broken in w or "more than 1024" in w for w in topo.warnings), topo.warnings
    assert all("\n" not in w for w in topo.warnings)
    make_plan(topo, Request(nproc=8))  # and it plans


# --------------------------------------------------------------------------------------------- the nearest NIC
def test_dgx_like_each_rank_gets_the_nic_behind_its_gpus_switch(tmp_path: Path) -> None:
    """Name order, PCI order and GPU order disagree: the answer is the NIC on each GPU's own switch."""
    _, plan = plan_on(tmp_path, dgx_like())
    expected = ["mlx5_0", "mlx5_3", "mlx5_5", "mlx5_4", "mlx5_9", "mlx5_6", "mlx5_11", "mlx5_10"]
    assert nics_of(plan) == [f"{n}:1" for n in expected]
    assert {r.nic.distance for r in plan.ranks if r.nic} == {"switch"}
    # bind.sh --ib=single takes device local_rank x nIB / nGPU of `ibstat -l | sort -V`: by index, which here
    # gives the storage NICs mlx5_1 and mlx5_7 to ranks 1 and 5, and only ranks 0, 3 and 7 their switch's NIC
    listed = [f"mlx5_{i}" for i in range(12)]
    by_index = [listed[i * 12 // 8] for i in range(8)]
    assert by_index == ["mlx5_0", "mlx5_1", "mlx5_3", "mlx5_4", "mlx5_6", "mlx5_7", "mlx5_9", "mlx5_10"]
    assert [i for i, (a, b) in enumerate(zip(by_index, expected)) if a == b] == [0, 3, 7]


def test_dgx_like_cpu_only_ranks_take_nics_of_their_node_spread(tmp_path: Path) -> None:
    # 4 ranks, 2 per node; node 0's fastest NICs in PCI order: mlx5_0, mlx5_3, mlx5_5, mlx5_4; node 1's: mlx5_9, ...
    _, plan = plan_on(tmp_path, dgx_like(), nproc=4, use_gpus=False)
    assert [r.numa_nodes for r in plan.ranks] == [(0,), (0,), (1,), (1,)]
    assert nics_of(plan) == ["mlx5_0:1", "mlx5_3:1", "mlx5_9:1", "mlx5_6:1"]
    assert {r.nic.distance for r in plan.ranks if r.nic} == {"numa-node"}


def test_nearer_beats_faster(tmp_path: Path) -> None:
    # near: under another root port of the GPU's host bridge (host-bridge), 200 Gb/s; far: another host bridge of
    # the same node (numa-node), 400 Gb/s
    m = machine([("0000:13:00.0", 0, behind_switch(0))],
                [(FakeNIC("mlx5_0", "0000:21:00.0", 0, ports=ACTIVE_400), ("pci0000:20", "0000:20:01.0")),
                 (FakeNIC("mlx5_1", "0000:15:00.0", 0, ports=ACTIVE_200), ("pci0000:10", "0000:10:02.0"))])
    _, plan = plan_on(tmp_path, m)
    nic = plan.ranks[0].nic
    assert nic is not None and (nic.device, nic.distance, nic.rate_gbps) == ("mlx5_1:1", "host-bridge", 200.0)


def test_at_equal_distance_the_faster_wins_and_down_ports_do_not_count(tmp_path: Path) -> None:
    # all three on the GPU's switch; mlx5_0 is down, mlx5_1 200 Gb/s, mlx5_2 400 Gb/s
    m = machine([("0000:13:00.0", 0, behind_switch(0))],
                [(FakeNIC("mlx5_0", "0000:14:00.0", 0, ports=DOWN_400), behind_switch(1)),
                 (FakeNIC("mlx5_1", "0000:15:00.0", 0, ports=ACTIVE_200), behind_switch(2)),
                 (FakeNIC("mlx5_2", "0000:16:00.0", 0, ports=ACTIVE_400), behind_switch(3))])
    _, plan = plan_on(tmp_path, m)
    assert nics_of(plan) == ["mlx5_2:1"]


def test_ranks_spread_over_equally_near_nics_and_share_only_when_fewer(tmp_path: Path) -> None:
    # two GPUs and two NICs on one switch
    m = machine([("0000:13:00.0", 0, behind_switch(0)), ("0000:14:00.0", 0, behind_switch(1))],
                [(FakeNIC("mlx5_0", "0000:15:00.0", 0), behind_switch(2)),
                 (FakeNIC("mlx5_1", "0000:16:00.0", 0), behind_switch(3))])
    _, plan = plan_on(tmp_path, m)
    assert nics_of(plan) == ["mlx5_0:1", "mlx5_1:1"]
    # 4 ranks on the 2 GPUs: each NIC shared by exactly 2 ranks
    _, plan = plan_on(tmp_path / "4", m, nproc=4, gpus=(0, 0, 1, 1))
    assert nics_of(plan) == ["mlx5_0:1", "mlx5_1:1", "mlx5_0:1", "mlx5_1:1"]


def test_ethernet_counts_only_when_it_is_all_there_is(tmp_path: Path) -> None:
    eth = (FakeNIC("eth0", "0000:15:00.0", 0, "ethernet", (("up", "100000"),)), behind_switch(2))
    far_ib = (FakeNIC("mlx5_0", "0000:a1:00.0", 1, "roce"), ("pci0000:a0", "0000:a0:01.0"))
    gpu = [("0000:13:00.0", 0, behind_switch(0))]
    _, plan = plan_on(tmp_path / "a", machine(gpu, [eth, far_ib]))
    nic = plan.ranks[0].nic  # RoCE is RDMA: it wins though on the other package
    assert nic is not None and (nic.device, nic.kind, nic.distance) == ("mlx5_0:1", "roce", "system")
    _, plan = plan_on(tmp_path / "b", machine(gpu, [eth]))
    nic = plan.ranks[0].nic
    assert nic is not None and (nic.device, nic.port, nic.kind, nic.distance) == ("eth0", None, "ethernet", "switch")
    down = (FakeNIC("eth0", "0000:15:00.0", 0, "ethernet", (("down", "-1"),)), behind_switch(2))
    _, plan = plan_on(tmp_path / "c", machine(gpu, [down]))
    assert nics_of(plan) == [None] and to_dict(plan)["ranks"][0]["nic"] is None


def test_hwloc_xml_nics_and_the_nearest_per_rank() -> None:
    need(FIXTURES.is_dir(), "shared fixtures not found")
    xml = FIXTURES / "mpibind/topo-xml"
    # coral-lassen: GPUs 0,1 on node 0 and 2,3 on node 8, each GPU behind its own host bridge; InfiniBand
    # mlx5_0/1 under host bridge 0003 (node 0) and mlx5_2/3 under 0033 (node 8), ports active, rates unknown
    lassen = load_topology(topology_file=str(xml / "coral-lassen.xml"), environ={})
    ib = [(n.name, n.pci, n.numa_node, n.kind) for n in lassen.nics if n.rdma]
    assert ib == [("mlx5_0", "0003:01:00.0", 0, "infiniband"), ("mlx5_1", "0003:01:00.1", 0, "infiniband"),
                  ("mlx5_2", "0033:01:00.0", 8, "infiniband"), ("mlx5_3", "0033:01:00.1", 8, "infiniband")]
    assert {n.name: n.kind for n in lassen.nics}["hsi0"] == "ipoib"
    plan = make_plan(lassen, Request(nproc=4))
    assert nics_of(plan) == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert {r.nic.distance for r in plan.ranks if r.nic} == {"numa-node"}
    # cts1-pascal: both GPUs and mlx5_0 behind the switch 02:00.0: both ranks on the one NIC
    pascal = load_topology(topology_file=str(xml / "cts1-pascal.xml"), environ={})
    plan = make_plan(pascal, Request(nproc=2))
    assert nics_of(plan) == ["mlx5_0:1", "mlx5_0:1"] and plan.ranks[0].nic and plan.ranks[0].nic.distance == "switch"
    # epyc-corona: one NIC, mlx5_0 on node 3 (package 0: nodes 0-3); GPUs on nodes 1, 2 (package 0), 5, 7
    corona = load_topology(topology_file=str(xml / "epyc-corona.xml"), environ={})
    plan = make_plan(corona, Request(nproc=4))
    assert [r.nic.distance if r.nic else None for r in plan.ranks] == ["package", "package", "system", "system"]
    # hwloc 1.x export of the same machine: the same NICs
    lassen1 = load_topology(topology_file=str(xml / "coral-lassen-hwloc1.xml"), environ={})
    assert [(n.name, n.pci, n.numa_node) for n in lassen1.nics] == [(n.name, n.pci, n.numa_node) for n in lassen.nics]


def test_hwloc_3_xml_nics_are_read_from_the_type_bitmask() -> None:
    # hwloc 3.x writes osdev_type as a bitmask (16 Network, 48 Network + OpenFabrics); these exports' NICs, as
    # lstopo of the same files lists them (bus ids and names in the files themselves)
    need(FIXTURES.is_dir(), "shared fixtures not found")
    whole = load_topology(topology_file=str(FIXTURES / "hwloc-xml-gpu/32em64t-2n8c2t-pci-wholeio.xml"), environ={})
    assert [(n.name, n.pci, n.kind, n.numa_node) for n in whole.nics] == [
        ("ib0", "0000:04:00.0", "ipoib", 1), ("mlx5_0", "0000:04:00.0", "infiniband", 1),
        ("eth0", "0000:81:00.0", "ethernet", 1), ("eth1", "0000:81:00.1", "ethernet", 1)]
    assert [p.state for p in whole.nics[1].ports] == ["active"]
    pci = load_topology(topology_file=str(FIXTURES / "hwloc-xml-gpu/24em64t-2n6c2t-pci.xml"), environ={})
    assert [(n.name, n.kind) for n in pci.nics] == [("eth0", "ethernet"), ("eth1", "ethernet"),
                                                    ("eth2", "ethernet"), ("ib0", "ipoib"), ("mlx4_0", "infiniband")]


@pytest.mark.parametrize("version", ["3.0", "3.1"])
def test_hwloc_3_osdev_numbers_mean_other_devices(tmp_path: Path, version: str) -> None:
    # In 3.x, 2 is Memory (a DAX device), 3 Storage + Memory, 4 GPU, 12 GPU + CoProcessor: none is a NIC; 16 is
    # Network, 48 Network + OpenFabrics. The same numbers in a 2.x export or one with no version (1.x) keep 2.x's
    # meaning: 2 Network, 3 OpenFabrics.
    port = '<info name="Port1State" value="4"/>'
    io = "".join(f'<object type="PCIDev" pci_busid="0000:11:00.{i}" pci_type="0207 [15b3:1019] [15b3:0008] 00">'
                 f'<object type="OSDev" name="{name}" osdev_type="{code}">{port}</object></object>'
                 for i, (name, code) in enumerate((("dax0", "2"), ("pmem0", "3"), ("card0", "4"), ("cuda0", "12"),
                                                   ("eth0", "16"), ("mlx5_0", "48"), ("odd0", "-16"))))
    text = nic_xml(io)
    path = tmp_path / "v3.xml"
    path.write_text(text.replace('version="2.0"', f'version="{version}"'))
    topo = load_topology(topology_file=str(path), environ={})
    assert [(n.name, n.kind) for n in topo.nics] == [("eth0", "ethernet"), ("mlx5_0", "infiniband")]
    assert [r.nic_device for r in make_plan(topo, Request(nproc=2)).ranks] == ["mlx5_0:1", "mlx5_0:1"]
    for header in ('version="2.0"', ""):
        path.write_text(text.replace('version="2.0"', header))
        older = load_topology(topology_file=str(path), environ={})
        assert [(n.name, n.kind) for n in older.nics] == [("dax0", "ethernet"), ("pmem0", "infiniband")]


def test_a_nic_without_numa_node_takes_its_local_cpus_node_and_a_virtio_nic_its_pci_function(tmp_path: Path) -> None:
    # numa_node -1 with local_cpulist 4-7 (node 1's CPUs): node 1; a VM's eth0 under 0000:00:03.0/virtio0: that function
    m = machine([], [(FakeNIC("mlx5_0", "0000:a1:00.0", None, local_cpus=range(4, 8)), ("pci0000:a0", "0000:a0:01.0")),
                     (FakeNIC("eth0", "0000:00:03.0", 0, "ethernet", (("up", "-1"),), virtio=True), ("pci0000:00",))])
    topo = load_topology(fsroot=str(write_tree(tmp_path, m)), environ={})
    assert [(n.name, n.pci, n.numa_node, n.pci_path) for n in topo.nics] == [
        ("eth0", "0000:00:03.0", 0, ("pci0000:00",)), ("mlx5_0", "0000:a1:00.0", 1, ("pci0000:a0", "0000:a0:01.0"))]
    assert not topo.warnings


def test_hwloc_xml_bad_port_state_gives_a_warning_and_no_nic(tmp_path: Path) -> None:
    need(FIXTURES.is_dir(), "shared fixtures not found")
    text = (FIXTURES / "mpibind/topo-xml/coral-lassen.xml").read_text()
    first = text.index('name="Port1State" value="4"')
    bad = tmp_path / "bad.xml"
    bad.write_text(text[:first] + 'name="Port1State" value="banana"' + text[first + len('name="Port1State" value="4"'):])
    topo = load_topology(topology_file=str(bad), environ={})
    assert "mlx5_0" not in {n.name for n in topo.nics} and "mlx5_1" in {n.name for n in topo.nics}
    assert any("mlx5_0" in w and "banana" in w for w in topo.warnings)


def test_hwloc_xml_gpu_fixtures_give_gpus_a_pci_path() -> None:
    need(FIXTURES.is_dir(), "shared fixtures not found")
    topo = load_topology(topology_file=str(FIXTURES / "hwloc-xml-gpu/nvidiaDGX2.xml"), environ={})
    assert topo.gpus and all(g.pci_path and g.pci_path[0].startswith("pci") for g in topo.gpus)
    assert not topo.nics


# ------------------------------------------------------------------------------------------------ environment
def test_nic_env_exports_and_keeps_user_values(tmp_path: Path) -> None:
    _, plan = plan_on(tmp_path, dgx_like())
    rank = plan.ranks[2]
    base = rank_environment(rank, local_world_size=8, user_env={})
    assert base.set["AFFRUN_NIC"] == "mlx5_5:1" and "UCX_NET_DEVICES" not in base.set
    ucx = rank_environment(rank, local_world_size=8, user_env={}, nic_env="ucx")
    assert ucx.set["UCX_NET_DEVICES"] == "mlx5_5:1"
    kept = rank_environment(rank, local_world_size=8, user_env={"UCX_NET_DEVICES": "mlx5_1:1"}, nic_env="ucx")
    assert kept.set["UCX_NET_DEVICES"] == "mlx5_1:1" and any("keeping UCX_NET_DEVICES" in n for n in kept.notes)
    forced = rank_environment(rank, local_world_size=8, user_env={"UCX_NET_DEVICES": "mlx5_1:1"}, nic_env="ucx",
                              policy="override")
    assert forced.set["UCX_NET_DEVICES"] == "mlx5_5:1"
    mpich = rank_environment(rank, local_world_size=8, user_env={}, nic_env="mpich")
    assert mpich.set["MPICH_OFI_NIC_POLICY"] == "GPU"
    for env in (base, ucx, kept, forced, mpich):
        assert not {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"} & set(env.set)


def test_the_nic_reaches_the_rank_through_the_plan(tmp_path: Path) -> None:
    _, plan = plan_on(tmp_path, dgx_like())
    parent = ParentPlan(plan, "rank", "safe", "none", "auto", {"UCX_NET_DEVICES": "mine"}, False, "ucx")
    job = parent.job()
    assert [r.nic_device for r in job.ranks] == nics_of(plan)
    variables = rank_variables(job, job.ranks[3])
    assert variables["AFFRUN_NIC"] == "mlx5_4:1" and variables["UCX_NET_DEVICES"] == "mine"
