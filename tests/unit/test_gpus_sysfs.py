"""GPUs from fake sysfs PCI trees (GPUs cannot exist on this machine): vendors, exclusions, order, locality, UUIDs."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist
from launcher.base.nvml import Gpu
from launcher.topology import load_topology
from launcher.topology.nvml import nvml_gpus, with_nvml
from launcher.topology.sysfs import read_sysfs
from tests.fakesys import FakeGPU, uniform, write_tree
from tests.machines import four_gpu_tree, two_node_machine


def test_nvidia_amd_intel_found_in_pci_bus_order(tmp_path: Path) -> None:
    m = two_node_machine()
    m.gpus = [
        FakeGPU(pci="0000:b1:00.0", numa_node=1, vendor=0x1002, klass=0x038000),  # AMD Instinct (display other)
        FakeGPU(pci="0000:17:00.0", numa_node=0, vendor=0x10DE, klass=0x030200),  # NVIDIA 3D controller
        FakeGPU(pci="0001:03:00.0", numa_node=1, vendor=0x8086, klass=0x038000),  # Intel Data Center GPU
        FakeGPU(pci="0000:3a:00.0", numa_node=0, vendor=0x10DE, klass=0x030000),  # NVIDIA VGA-class board
    ]
    topo = read_sysfs(str(write_tree(tmp_path, m)))
    assert [(g.index, g.pci, g.vendor, g.numa_node) for g in topo.gpus] == [
        (0, "0000:17:00.0", "nvidia", 0),
        (1, "0000:3a:00.0", "nvidia", 0),
        (2, "0000:b1:00.0", "amd", 1),
        (3, "0001:03:00.0", "intel", 1),
    ]
    assert [format_cpulist(g.cpus) for g in topo.gpus] == ["0-3,8-11", "0-3,8-11", "4-7,12-15", "4-7,12-15"]
    assert [g.vendor_index for g in topo.gpus] == [0, 1, None, None]  # NVML order; no KFD topology, no Intel order
    assert not topo.warnings


def test_nvswitch_and_bmc_vgas_are_not_gpus(tmp_path: Path) -> None:
    m = two_node_machine()
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0)]
    m.extra_pci = [
        ("0000:c1:00.0", 0x10DE, 0x068000),  # NVSwitch (bridge class)
        ("0000:02:00.0", 0x1A03, 0x030000),  # ASPEED BMC VGA
        ("0000:03:00.0", 0x102B, 0x030000),  # Matrox G200 BMC VGA
        ("0000:04:00.0", 0x1002, 0x030000),  # AMD ES1000 BMC VGA (device id below)
        ("0000:05:00.0", 0x15B3, 0x020700),  # Mellanox InfiniBand
    ]
    root = write_tree(tmp_path, m)
    (root / "sys/bus/pci/devices/0000:04:00.0/device").write_text("0x515e\n")
    topo = read_sysfs(str(root))
    assert [g.pci for g in topo.gpus] == ["0000:17:00.0"]


def test_numa_node_minus_one(tmp_path: Path) -> None:
    """-1 with a precise local_cpulist: the node holding those CPUs. -1 with every CPU local: unknown, warned."""
    m = two_node_machine()
    m.gpus = [
        FakeGPU(pci="0000:17:00.0", numa_node=None, local_cpus=[4, 5, 6, 7, 12, 13, 14, 15]),
        FakeGPU(pci="0000:3a:00.0", numa_node=None),  # local_cpulist = all CPUs (typical VM)
    ]
    topo = read_sysfs(str(write_tree(tmp_path, m)))
    assert [g.numa_node for g in topo.gpus] == [1, None]
    assert [w for w in topo.warnings if "0000:3a:00.0" in w and "no NUMA node" in w]
    assert not [w for w in topo.warnings if "0000:17:00.0" in w]
    assert topo.to_json()["gpus"][1]["numa_node"] is None


def test_numa_node_minus_one_on_a_one_node_machine(tmp_path: Path) -> None:
    m = uniform(1, 4)
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=None)]
    topo = read_sysfs(str(write_tree(tmp_path, m)))
    assert topo.gpus[0].numa_node == 0 and not topo.warnings  # one node: nothing to guess


def test_uuid_from_proc_driver_nvidia(tmp_path: Path) -> None:
    m = two_node_machine()
    m.gpus = [
        FakeGPU(pci="0000:17:00.0", numa_node=0, uuid="GPU-2f1e8f0a-57f0-4b8e-9c3a-1d2e3f4a5b6c"),
        FakeGPU(pci="0000:3a:00.0", numa_node=1),  # no proc entry
    ]
    root = write_tree(tmp_path, m)
    info = root / "proc/driver/nvidia/gpus/0000:17:00.0/information"
    assert "GPU UUID:" in info.read_text()
    topo = read_sysfs(str(root))
    assert [g.uuid for g in topo.gpus] == ["GPU-2f1e8f0a-57f0-4b8e-9c3a-1d2e3f4a5b6c", None]
    visible = load_topology(fsroot=str(root), environ={"CUDA_VISIBLE_DEVICES": "GPU-2f1e8f0a"})
    assert [g.pci for g in visible.visible_gpus()] == ["0000:17:00.0"]


@pytest.mark.parametrize(
    ("value", "visible", "stop"),
    [
        ("-1", [], "'-1' is not a GPU index or UUID"),  # the usual way to hide every GPU
        ("0,2,-1,1", [0, 2], "'-1' is not a GPU index or UUID"),  # NVIDIA's own example: GPUs 0 and 2
        ("1,7,0", [1], "GPU 7 does not exist (this machine has 4)"),
        ("3, x ,0", [3], "'x' is not a GPU index or UUID"),
        ("GPU-ffffffff", [], "no GPU has UUID GPU-ffffffff"),
        ("GPU-30000000,GPU-ffffffff,1", [3], "no GPU has UUID GPU-ffffffff"),
    ],
)
def test_visible_list_stops_at_the_first_bad_entry_like_cuda(
    tmp_path: Path, value: str, visible: list[int], stop: str
) -> None:
    topo = load_topology(fsroot=str(four_gpu_tree(tmp_path)), environ={"CUDA_VISIBLE_DEVICES": value})
    assert [g.index for g in topo.visible_gpus()] == visible
    (warning,) = [w for w in topo.warnings if w.startswith(f"CUDA_VISIBLE_DEVICES={value}: ")]
    assert stop in warning and "like CUDA, affrun ignores it and every entry after it" in warning
    assert ("no GPU is visible" in warning) == (not visible)


def test_a_valid_visible_list_gives_no_warning(tmp_path: Path) -> None:
    topo = load_topology(fsroot=str(four_gpu_tree(tmp_path)), environ={"CUDA_VISIBLE_DEVICES": "2,GPU-00000000"})
    assert [g.index for g in topo.visible_gpus()] == [2, 0] and not topo.warnings


@pytest.mark.parametrize(("value", "visible"), [("1,1", [1]), ("0,GPU-00000000,3", [0, 3]), ("2,3,2", [2, 3])])
def test_a_gpu_named_twice_is_planned_once_with_a_warning(tmp_path: Path, value: str, visible: list[int]) -> None:
    topo = load_topology(fsroot=str(four_gpu_tree(tmp_path)), environ={"CUDA_VISIBLE_DEVICES": value})
    assert [g.index for g in topo.visible_gpus()] == visible
    (warning,) = topo.warnings
    assert warning.startswith(f"CUDA_VISIBLE_DEVICES={value} names a GPU twice") and f"{len(visible)} in all" in warning


def test_invalid_entries_before_slurms_renumbering(tmp_path: Path) -> None:
    """In a constrained Slurm step holding global GPUs 2,3, CUDA_VISIBLE_DEVICES=1,-1 is the job's GPU 1."""
    env = {"CUDA_VISIBLE_DEVICES": "1,-1", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "2,3"}
    topo = load_topology(fsroot=str(four_gpu_tree(tmp_path)), environ=env)
    assert [g.index for g in topo.visible_gpus()] == [3]
    assert any("'-1' is not a GPU index" in w for w in topo.warnings)


def test_amd_order_follows_the_kfd_topology(tmp_path: Path) -> None:
    """ROCm counts GPUs in KFD node order, which need not be PCI order: GPU.vendor_index records it."""
    m = two_node_machine()
    buses = (0x03, 0x27, 0x43, 0x63)
    m.gpus = [FakeGPU(pci=f"0000:{b:02x}:00.0", numa_node=0, vendor=0x1002, klass=0x038000) for b in buses]
    root = write_tree(tmp_path, m)
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    kfd_order = [0x63, 0x43, 0x03, 0x27]  # LLNL corona's order
    (nodes / "0").mkdir(parents=True)
    (nodes / "0/gpu_id").write_text("0\n")  # a CPU node
    (nodes / "0/properties").write_text("cpu_cores_count 16\nlocation_id 0\ndomain 0\n")
    for n, bus in enumerate(kfd_order, start=1):
        (nodes / str(n)).mkdir()
        (nodes / f"{n}/gpu_id").write_text(f"{1000 + n}\n")
        (nodes / f"{n}/properties").write_text(f"cpu_cores_count 0\nsimd_count 240\nlocation_id {bus << 8}\ndomain 0\n")
    topo = read_sysfs(str(root))
    assert [g.pci[5:7] for g in topo.gpus] == ["03", "27", "43", "63"]  # index: PCI bus order
    assert [g.vendor_index for g in topo.gpus] == [2, 3, 1, 0]  # ROCm's numbering
    # HIP's device numbers follow that order, with and without ROCR_VISIBLE_DEVICES
    default = load_topology(fsroot=str(root), environ={})
    assert [g.pci[5:7] for g in default.visible_gpus()] == ["63", "43", "03", "27"]
    narrowed = load_topology(fsroot=str(root), environ={"ROCR_VISIBLE_DEVICES": "0,2"})
    assert [g.pci[5:7] for g in narrowed.visible_gpus()] == ["63", "03"]


def test_power9_pci_entries_without_vendor(hwloc_root) -> None:  # type: ignore[no-untyped-def]
    """nvidiagpunumanodes keeps only class and local_cpus; /proc/driver/nvidia names them NVIDIA."""
    root = hwloc_root("nvidiagpunumanodes")
    first = root / "sys/bus/pci/devices/0004:05:00.0"
    assert not (first / "vendor").exists() and not (first / "numa_node").exists()
    topo = read_sysfs(str(root))
    assert len(topo.gpus) == 6 and [g.vendor_index for g in topo.gpus] == list(range(6))


# ------------------------------------------------------------------------------------------ NVML (optional)
def test_nvml_fills_uuids_by_pci_and_reports_mismatches(tmp_path: Path) -> None:
    m = two_node_machine()
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0), FakeGPU(pci="0000:3a:00.0", numa_node=1, uuid="GPU-proc")]
    topo = read_sysfs(str(write_tree(tmp_path, m)))
    found = [
        Gpu(0, "0000:17:00.0", "GPU-from-nvml-0"),
        Gpu(1, "0000:3a:00.0", "GPU-from-nvml-1"),
        Gpu(2, "0000:ff:00.0", "GPU-elsewhere"),
    ]
    checked = with_nvml(topo, found)
    assert [g.uuid for g in checked.gpus] == ["GPU-from-nvml-0", "GPU-proc"]
    assert any("0000:3a:00.0" in w and "GPU-from-nvml-1" in w for w in checked.warnings)
    assert any("0000:ff:00.0" in w and "not found in sysfs" in w for w in checked.warnings)


def test_nvml_without_a_driver_changes_nothing(tmp_path: Path) -> None:
    """This machine has no NVIDIA driver: NVML is unavailable whether or not pynvml is installed."""
    assert nvml_gpus() is None
    m = two_node_machine()
    m.gpus = [FakeGPU(pci="0000:17:00.0", numa_node=0)]
    root = write_tree(tmp_path, m)
    assert load_topology(fsroot=str(root), environ={}, nvml=True) == load_topology(fsroot=str(root), environ={})




def test_a_gpu_name_nvml_cannot_give_keeps_the_cross_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvmlDeviceGetName only labels a GPU: where it fails, the GPU is still NVML's, with no name (the whole
    cross-check of `topology --nvml` disappeared, silently)."""
    from tests.machines import fake_pynvml

    fake = fake_pynvml(monkeypatch, tmp_path, [("00000000:17:00.0", "GPU-a"), ("00000000:3a:00.0", "GPU-b")])

    def no_name(handle: object) -> str:
        raise fake.NVMLError(3)

    monkeypatch.setattr(fake, "nvmlDeviceGetName", no_name)
    assert [(g.pci, g.uuid, g.name) for g in nvml_gpus() or []] == [("0000:17:00.0", "GPU-a", ""),
                                                                   ("0000:3a:00.0", "GPU-b", "")]
