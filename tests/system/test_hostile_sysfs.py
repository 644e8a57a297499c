"""Hostile topology sources through the real CLI (issue 18, classes 8, 12, 13 and Slurm's part of 14): a reader of
sysfs, procfs, hwloc XML or a snapshot gives the right machine or one ``affrun: error:`` line; never a traceback,
a file read from outside ``--fsroot``, a warning split over lines, or one GPU counted twice.

Trees are written by ``tests.fakesys`` (only what this 2-CPU machine cannot have is faked: cores, nodes, GPUs)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from launcher.topology import load_topology
from launcher.topology.snapshot import to_snapshot
from tests.errors import ok, refused
from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree
from tests.system.test_hostile_input import affrun, planned

NODE = "sys/devices/system/node"
CGROUP = "sys/fs/cgroup"
PCI = "sys/bus/pci/devices"


def machine(**changes: Any) -> FakeMachine:
    """Two packages of 4 cores, one NUMA node each."""
    m = uniform(2, 4)
    for key, value in changes.items():
        setattr(m, key, value)
    return m


def topology_json(root: Path, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(affrun("topology", "--fsroot", str(root), "--json", *args)))
    return data


def saved_snapshot(root: Path, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "saved.json"
    ok(affrun("topology", "--fsroot", str(root), "--save", str(path)))
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def one_line_warnings(text: str) -> list[str]:
    """The ``warning:`` lines of ``affrun topology``/``plan`` output; none may hold a control character."""
    assert all(line.isprintable() for line in text.splitlines()), [ln for ln in text.splitlines() if not ln.isprintable()]
    return [line for line in text.splitlines() if "warning:" in line]


# ---------------------------------------------------------------------------------------------- 8: meminfo
@pytest.mark.parametrize("line", [
    "Node 0 MemTotal:16318356 kB",
    "Node 0 MemTotal:  16318356kB",
    "Node 0 MemTotal:16318356",
    "Node 0 MemFree: 1 kB\nNode 0 MemTotal:16318356 KB",
])
def test_meminfo_is_read_whatever_its_spacing(tmp_path: Path, line: str) -> None:
    root = write_tree(tmp_path / "t", machine())
    (root / NODE / "node0/meminfo").write_text(line + "\n")
    data = planned(affrun("plan", "--fsroot", str(root), "--json", "--nproc-per-node", "2"))
    assert len(data["ranks"]) == 2
    nodes = {n["os_index"]: n["memory_kb"] for n in saved_snapshot(root, tmp_path)["numa_nodes"]}
    assert nodes == {0: 16318356, 1: 65536000}


@pytest.mark.parametrize("line", ["Node 0 MemTotal:", "Node 0 MemTotal: lots kB", "Node 0 MemTotal: \u0661\u0662 kB",
                                  "Node 0 MemTotal:-5 kB", "Node 0 MemTotal:" + "9" * 5000 + " kB"])
def test_meminfo_garbage_is_a_warning_not_a_traceback(tmp_path: Path, line: str) -> None:
    root = write_tree(tmp_path / "t", machine())
    (root / NODE / "node0/meminfo").write_text(line + "\n")
    data = planned(affrun("plan", "--fsroot", str(root), "--json", "--nproc-per-node", "2"))
    warning = next(w for w in data["warnings"] if "MemTotal" in w)
    assert "node0/meminfo" in warning and len(warning) < 400
    assert {n["os_index"]: n["memory_kb"] for n in saved_snapshot(root, tmp_path)["numa_nodes"]}[0] is None


# ---------------------------------------------------------------------------------------------- 12: links out of the tree
def relink(link: Path, target: str | Path) -> None:
    """Replace ``link`` (a file or directory of the tree) by a symbolic link to ``target``."""
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    elif link.exists() or link.is_symlink():
        link.unlink()
    link.symlink_to(target)


def climbing(link: Path, outside: Path) -> str:
    """A relative target from ``link``'s directory that climbs out of the tree to ``outside``."""
    return os.path.relpath(outside, link.parent)


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_a_cgroup_linked_out_of_the_fsroot_is_not_read(tmp_path: Path, how: str) -> None:
    root = write_tree(tmp_path / "t", machine(cpu_max="800000 100000", cgroup_cpus="0-7"))
    outside = tmp_path / "host-cgroup"
    outside.mkdir()
    (outside / "cpu.max").write_text("100000 100000\n")  # one CPU's worth: must not be applied
    (outside / "cpuset.cpus.effective").write_text("0\n")
    job = root / CGROUP / "job"
    relink(job, outside if how == "absolute" else climbing(job, outside))
    data = topology_json(root)
    assert data["cpu_quota"] is None and data["cpus"] == list(range(8)), data
    plan = planned(affrun("plan", "--fsroot", str(root), "--json", "--nproc-per-node", "2"))
    assert [r["threads"] for r in plan["ranks"]] == [4, 4]


def test_an_absolute_link_is_not_re_rooted_at_the_tree(tmp_path: Path) -> None:
    """A link's target is the kernel's (no chroot): one that leads out of the tree reads as absent, even where the
    tree has a file at the same path; one whose real path is in the tree is read."""
    root = write_tree(tmp_path / "t", machine(cpu_max="800000 100000"))
    (root / CGROUP / "real-job").mkdir()
    (root / CGROUP / "real-job/cpu.max").write_text("200000 100000\n")
    relink(root / CGROUP / "job", "/sys/fs/cgroup/real-job")  # the live machine has no such directory
    data = topology_json(root)
    assert data["cpu_quota"] is None, data["cpu_quota_source"]
    relink(root / CGROUP / "job", root.resolve() / CGROUP / "real-job")  # absolute, into the tree itself
    data = topology_json(root)
    assert data["cpu_quota"] == 2.0 and "/sys/fs/cgroup/job/cpu.max" in data["cpu_quota_source"]


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_sysfs_files_and_directories_linked_out_of_the_tree_are_not_read(tmp_path: Path, how: str) -> None:
    root = write_tree(tmp_path / "t", machine(gpus=[FakeGPU("0000:3b:00.0", 0)], cpu_max="200000 100000"))
    host_machine = uniform(1, 2)
    host_machine.gpus = [FakeGPU("0000:17:00.0", 0), FakeGPU("0000:18:00.0", 0)]
    host = write_tree(tmp_path / "host", host_machine)
    (tmp_path / "host-online").write_text("0\n")
    for rel, outside in [(f"{NODE}", host / NODE), (f"{PCI}", host / PCI),
                         ("sys/devices/system/cpu/online", tmp_path / "host-online")]:
        link = root / rel
        relink(link, outside if how == "absolute" else climbing(link, outside))
    relink(root / CGROUP / "job", "../../../../../../../../sys/fs/cgroup/job")  # a loop, climbing past the root
    data = topology_json(root)
    assert data["cpus"] == list(range(8))  # the tree's online file is gone: every CPU directory counts
    assert [n["id"] for n in data["numa_nodes"]] == [0]  # no node directory inside the tree: one node
    assert data["gpus"] == [] and data["cpu_quota"] is None


def test_an_escaped_mount_point_is_decoded_and_its_warning_is_one_line(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", machine())
    cgroup = root / "sys/fs/c g\\x\nroup"  # a space, a backslash and a newline: the kernel escapes all three
    (cgroup / "job").mkdir(parents=True)
    (cgroup / "job/cpu.max").write_text("200000 100000\n")
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/job\n")
    (root / "proc/mounts").write_text("cgroup2 /sys/fs/c\\040g\\134x\\012roup cgroup2 rw 0 0\n")
    data = topology_json(root)
    assert data["cpu_quota"] == 2.0 and "\n" not in data["cpu_quota_source"]
    text = ok(affrun("plan", "--fsroot", str(root), "--nproc-per-node", "2"))
    quota = [w for w in one_line_warnings(text) if "CPU quota" in w]
    assert len(quota) == 1 and "/sys/fs/c g\\x\\012roup/job/cpu.max" in quota[0] and "threads capped at 1" in quota[0]


# ---------------------------------------------------------------------------------------------- 13: GPU addresses
def gpu_dir(root: Path, name: str) -> None:
    """A PCI entry named ``name`` that looks like an NVIDIA 3D controller."""
    d = root / PCI / name
    d.mkdir(parents=True)
    (d / "vendor").write_text("0x10de\n")
    (d / "class").write_text("0x030200\n")
    (d / "numa_node").write_text("1\n")
    (d / "local_cpulist").write_text("4-7\n")


def test_two_spellings_of_one_pci_address_are_one_gpu(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "t", machine(gpus=[FakeGPU("0000:3b:00.0", 0)]))
    gpu_dir(root, "0000:3B:00.0")
    gpu_dir(root, "0000:AF:00.0")
    data = topology_json(root)
    assert [(g["pci"], g["numa_node"]) for g in data["gpus"]] == [("0000:3b:00.0", 0), ("0000:af:00.0", 1)]
    assert any("0000:3B:00.0" in w and "once" in w for w in data["warnings"]), data["warnings"]
    plan = planned(affrun("plan", "--fsroot", str(root), "--json"))
    assert [r["gpu_pci"] for r in plan["ranks"]] == ["0000:3b:00.0", "0000:af:00.0"]


@pytest.mark.parametrize("name", ["GPU0", "0000:3b:00.0.bak", "0000:3b:00.8", "0000:3g:00.0", "0000:3b:20.0",
                                  "0000:03b:00.0", "0000:3b:00.\u0661", "0000:3b:00.0\n"])
def test_pci_entries_that_are_not_addresses_are_no_gpus(tmp_path: Path, name: str) -> None:
    root = write_tree(tmp_path / "t", machine(gpus=[FakeGPU("0000:3b:00.0", 0)]))
    gpu_dir(root, name)
    text = ok(affrun("topology", "--fsroot", str(root)))
    assert [w for w in one_line_warnings(text) if "not a PCI address" in w], text
    assert [g["pci"] for g in topology_json(root)["gpus"]] == ["0000:3b:00.0"]


HWLOC_GPUS = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" allowed_cpuset="0x0000000f"
          nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001">
    <object type="Package" os_index="0" cpuset="0x0000000f">
      <object type="NUMANode" os_index="0" cpuset="0x0000000f" nodeset="0x00000001" local_memory="1000000"/>
      <object type="Core" os_index="0" cpuset="0x00000003">
        <object type="PU" os_index="0" cpuset="0x00000001"/>
        <object type="PU" os_index="1" cpuset="0x00000002"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x0000000c">
        <object type="PU" os_index="2" cpuset="0x00000004"/>
        <object type="PU" os_index="3" cpuset="0x00000008"/>
      </object>
      {pcidevs}
    </object>
  </object>
</topology>
"""


def pcidev(busid: str) -> str:
    return f'<object type="PCIDev" pci_busid="{busid}" pci_type="0302 [10de:1db8] [10de:1212] a1"/>'


def xml_source(tmp_path: Path, *busids: str) -> list[str]:
    path = tmp_path / "gpus.xml"
    path.write_text(HWLOC_GPUS.format(pcidevs="\n".join(pcidev(b) for b in busids)))
    return ["--topology", str(path)]


def test_hwloc_xml_pci_busids_are_normalised_and_deduped(tmp_path: Path) -> None:
    source = xml_source(tmp_path, "0000:3B:00.0", "0000:3b:00.0", "0000:18:00.0")
    data = json.loads(ok(affrun("topology", *source, "--json")))
    assert [g["pci"] for g in data["gpus"]] == ["0000:18:00.0", "0000:3b:00.0"]
    assert any("listed twice" in w for w in data["warnings"])


@pytest.mark.parametrize("busid", ["GPU0", "0000:3b:00.9", "0000:3b:00.0 ", "0000:3b:00.0\u2028"])
def test_hwloc_xml_gpu_without_a_pci_address_is_refused(tmp_path: Path, busid: str) -> None:
    refused(affrun("plan", *xml_source(tmp_path, "0000:18:00.0", busid), "--json"), "pci_busid", "not a PCI address")


def snapshot_with(tmp_path: Path, gpus: list[dict[str, Any]]) -> list[str]:
    root = write_tree(tmp_path / "t", machine())
    data = to_snapshot(load_topology(fsroot=str(root), environ={}))
    data["gpus"] = gpus
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    return ["--topology", str(path)]


def snap_gpu(index: int, pci: str) -> dict[str, Any]:
    return {"index": index, "pci": pci, "vendor": "nvidia", "numa_node": 0, "cpus": "0-3", "uuid": None}


def test_snapshot_pci_addresses_are_normalised_and_deduped(tmp_path: Path) -> None:
    source = snapshot_with(tmp_path, [snap_gpu(0, "0000:3B:00.0"), snap_gpu(1, "0000:3b:00.0"), snap_gpu(2, "af:00.0")])
    data = json.loads(ok(affrun("topology", *source, "--json")))
    assert [g["pci"] for g in data["gpus"]] == ["0000:3b:00.0", "0000:af:00.0"]
    assert any("gpus[1]" in w and "one GPU" in w for w in data["warnings"])


@pytest.mark.parametrize("pci", ["GPU0", "", "0000:3b:00.0:1", "0x00:3b:00.0"])
def test_snapshot_gpu_without_a_pci_address_is_refused(tmp_path: Path, pci: str) -> None:
    refused(affrun("plan", *snapshot_with(tmp_path, [snap_gpu(0, pci)]), "--json"), "gpus[0].pci", "not a PCI address")


# ---------------------------------------------------------------------------------------------- 14: Slurm's variables
def slurm_exec(**env: str) -> Any:
    return affrun("exec", "--dry-run", "--", "true", env=env)


@pytest.mark.parametrize(("env", "needles"), [
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x"}, ["SLURM_STEP_TASKS_PER_NODE='2(x'", "not a Slurm per-node"]),
    ({"SLURM_STEP_TASKS_PER_NODE": "", "SLURM_TASKS_PER_NODE": "2"}, ["SLURM_STEP_TASKS_PER_NODE=''"]),
    ({"SLURM_STEP_TASKS_PER_NODE": "\u0662"}, ["SLURM_STEP_TASKS_PER_NODE=", "not a Slurm per-node"]),
    ({"SLURM_TASKS_PER_NODE": "2,x"}, ["SLURM_TASKS_PER_NODE='2,x'"]),
    ({"SLURM_NTASKS_PER_NODE": "two"}, ["SLURM_NTASKS_PER_NODE='two'", "not a number"]),
    ({"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "one"}, ["SLURM_NODEID='one'", "not a node index"]),
    ({"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "3"}, ["SLURM_STEP_TASKS_PER_NODE='2'", "SLURM_NODEID=3"]),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x" + "9" * 5000}, ["SLURM_STEP_TASKS_PER_NODE='2(x999", "not a Slurm"]),
])
def test_a_malformed_slurm_variable_is_named_not_called_missing(env: dict[str, str], needles: list[str]) -> None:
    line = refused(slurm_exec(SLURM_LOCALID="0", **env), *needles)
    assert "no SLURM_STEP_TASKS_PER_NODE" not in line and "9" * 100 not in line
