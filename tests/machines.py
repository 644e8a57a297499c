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
# Utilisation (the feed meter's GPU busy share): FAKE_NVML_UTIL is every device's busy percent; with
# FAKE_NVML_PROCESS_UTIL set, the calling process runs on every GPU and is busy that percent, else NVML cannot tell
# processes apart (NOT_SUPPORTED, as in some VMs and with MIG).
import os as _os, time as _time
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND = 3, 6
class NVMLError(Exception):
    def __init__(self, value): super().__init__(f"NVML error {{value}}"); self.value = value
def _obj(**kw): return type("Obj", (), kw)()
def nvmlDeviceGetUtilizationRates(h): return _obj(gpu=int(_os.environ.get("FAKE_NVML_UTIL", "0")), memory=0)
def nvmlDeviceGetComputeRunningProcesses(h):
    return [_obj(pid=_os.getpid(), usedGpuMemory=1 << 30)] if "FAKE_NVML_PROCESS_UTIL" in _os.environ else []
def nvmlDeviceGetProcessUtilization(h, last_seen):
    if "FAKE_NVML_PROCESS_UTIL" not in _os.environ:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    util = int(_os.environ["FAKE_NVML_PROCESS_UTIL"])
    return [_obj(pid=_os.getpid(), timeStamp=max(int(_time.time() * 1e6), last_seen + 1), smUtil=util, memUtil=0,
                 encUtil=0, decUtil=0)]
'''


def tree(tmp_path: Path) -> Path:
    """A healthy 2-socket, 2-node, SMT2 machine of 16 PUs."""
    return write_tree(tmp_path / "root", uniform(2, 4, threads=2, nodes_per_package=1))


def priority_tree(tmp_path: Path, name: str) -> Path:
    """The tree of one of :data:`tests.fakesys.PRIORITY_MACHINES` (``xeon6-pct``, ``xeon-sst-bf``, ``itmt-desktop``,
    ``homogeneous-server``) under ``tmp_path/name``."""
    from tests.fakesys import priority_machines

    return write_tree(tmp_path / name, priority_machines()[name])
