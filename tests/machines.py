"""Fake machines (sysfs trees) that several test files share, and a fake pynvml module."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from launcher.topology import Topology, load_topology
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
"""NVML as nvidia-ml-py exposes it, for GPUs this machine cannot have: {gpus} as (bus id, uuid).

What the GPUs do is read, at each call, from the JSON file that FAKE_NVML_STATE names (none: idle, no process):
{{"utilisation": [percent per GPU], "processes": [[pid, ...] per GPU], "process_util": [{{"pid": sm percent}} per
GPU, or "not supported"], "sample_period_s": seconds}}. nvmlDeviceGetProcessUtilization returns one sample for
each process, stamped with the time (us; with a sample period, the start of the current period, as NVML takes a
sample a period), and raises NVMLError(NVML_ERROR_NOT_FOUND) when there is none newer than asked.
"""
import json, os, time
GPUS = {gpus!r}
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML error {{value}}")
        self.value = value
def _state():
    state = {{}}
    path = os.environ.get("FAKE_NVML_STATE")
    if path:
        with open(path) as fh:
            state = json.load(fh)
    # The meter's tests say it in two variables: FAKE_NVML_UTIL, every device's busy percent; with
    # FAKE_NVML_PROCESS_UTIL, the calling process runs on every GPU and is busy that percent, else NVML cannot tell
    # processes apart (NOT_SUPPORTED, as in some VMs and with MIG).
    if "FAKE_NVML_UTIL" in os.environ:
        state["utilisation"] = [int(os.environ["FAKE_NVML_UTIL"])] * len(GPUS)
        state.setdefault("process_util", ["not supported"] * len(GPUS))
    if "FAKE_NVML_PROCESS_UTIL" in os.environ:
        state["processes"] = [[os.getpid()]] * len(GPUS)
        state["process_util"] = [{{str(os.getpid()): int(os.environ["FAKE_NVML_PROCESS_UTIL"])}}] * len(GPUS)
    return state
def _of(key, h, default):
    values = _state().get(key)
    return values[h] if isinstance(values, list) and h < len(values) else default
def _obj(name, **fields): return type(name, (), fields)()
def nvmlInit(): pass
SHUTDOWNS = 0
def nvmlShutdown(): globals()['SHUTDOWNS'] += 1
def nvmlSystemGetDriverVersion(): return "575.57.08"
def nvmlDeviceGetCount(): return len(GPUS)
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetPciInfo(h): return _obj("Pci", busId=GPUS[h][0].encode())
def nvmlDeviceGetUUID(h): return GPUS[h][1]
def nvmlDeviceGetName(h): return b"NVIDIA H200"
def nvmlDeviceGetUtilizationRates(h): return _obj("Utilization", gpu=_of("utilisation", h, 0), memory=0)
def nvmlDeviceGetMemoryInfo(h): return _obj("Memory", used=3 << 30, total=141 << 30)
def nvmlDeviceGetComputeRunningProcesses(h):
    return [_obj("Process", pid=p, usedGpuMemory=1 << 30) for p in _of("processes", h, [])]
def nvmlDeviceGetProcessUtilization(h, lastSeenTimeStamp):
    util = _of("process_util", h, {{}})
    if util == "not supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    period = _state().get("sample_period_s")
    now = int(time.time() // period * period * 1e6) if period else int(time.time() * 1e6)
    if not util or now <= lastSeenTimeStamp:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return [_obj("Sample", pid=int(p), timeStamp=now, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for p, sm in util.items()]
'''


def fake_pynvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gpus: list[tuple[str, str]]) -> ModuleType:
    """:data:`FAKE_PYNVML` as this process's ``pynvml`` until the test ends, idle until :func:`nvml_state`."""
    path = tmp_path / "pynvml.py"
    path.write_text(FAKE_PYNVML.format(gpus=gpus))
    spec = importlib.util.spec_from_file_location("pynvml", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("FAKE_NVML_STATE", str(tmp_path / "nvml.json"))
    nvml_state(tmp_path, {})
    return module


def nvml_state(tmp_path: Path, state: dict[str, Any]) -> None:
    """What the GPUs of :func:`fake_pynvml` do from now on (FAKE_PYNVML's docstring has the keys)."""
    (tmp_path / "nvml.json").write_text(json.dumps(state))


def read_machine(tmp_path: Path, m: FakeMachine) -> Topology:
    """``m`` written as a sysfs tree under ``tmp_path/root`` and read back, with no environment."""
    return load_topology(fsroot=str(write_tree(tmp_path / "root", m)), environ={})


def tree(tmp_path: Path) -> Path:
    """A healthy 2-socket, 2-node, SMT2 machine of 16 PUs."""
    return write_tree(tmp_path / "root", uniform(2, 4, threads=2, nodes_per_package=1))


def fake_cpu_4000_tree(tmp_path: Path) -> Path:
    """A 4-core machine whose CPU is ``Fake CPU 4000``, under ``tmp_path/tree``: the machine a tuned file from
    another one is compared with (affrun's planning never depends on the host's CPU)."""
    root = write_tree(tmp_path / "tree", uniform(1, 4))
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Fake CPU 4000\n\n")
    return root


def priority_tree(tmp_path: Path, name: str) -> Path:
    """The tree of one of :data:`tests.fakesys.PRIORITY_MACHINES` (``xeon6-pct``, ``xeon-sst-bf``, ``itmt-desktop``,
    ``homogeneous-server``) under ``tmp_path/name``."""
    from tests.fakesys import priority_machines

    return write_tree(tmp_path / name, priority_machines()[name])
