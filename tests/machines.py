"""Fake machines (sysfs trees) that several test files share, and a fake pynvml module."""

from __future__ import annotations

from pathlib import Path

from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree


def two_node_machine() -> FakeMachine:
    return uniform(2, 4, threads=2)  # node 0: cores 0-3 (PUs 0-3,8-11), node 1: cores 4-7 (PUs 4-7,12-15)


def four_gpu_tree(tmp_path: Path) -> Path:
    m = two_node_machine()
    m.gpus = [
        FakeGPU(pci=f"0000:{bus}:00.0", numa_node=i // 2, uuid=f"GPU-{i}0000000-aaaa-bbbb-cccc-dddddddddddd")
        for i, bus in enumerate(["17", "3a", "b1", "c1"])
    ]
    return write_tree(tmp_path / "root", m)


FAKE_PYNVML = '''
"""NVML as nvidia-ml-py exposes it, for GPUs this machine cannot have: {gpus} as (bus id, uuid)."""
GPUS = {gpus!r}
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(GPUS)
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetPciInfo(h): return type("Pci", (), {{"busId": GPUS[h][0].encode()}})()
def nvmlDeviceGetUUID(h): return GPUS[h][1]
'''


def tree(tmp_path: Path) -> Path:
    """A healthy 2-socket, 2-node, SMT2 machine of 16 PUs."""
    return write_tree(tmp_path / "root", uniform(2, 4, threads=2, nodes_per_package=1))


def priority_tree(tmp_path: Path, name: str) -> Path:
    """The tree of one of :data:`tests.fakesys.PRIORITY_MACHINES` (``xeon6-pct``, ``xeon-sst-bf``, ``itmt-desktop``,
    ``homogeneous-server``) under ``tmp_path/name``."""
    from tests.fakesys import priority_machines

    return write_tree(tmp_path / name, priority_machines()[name])
