"""Optional NVML source: GPU UUIDs and a cross-check of the sysfs GPU list (``pip install affrun[nvml]``).

Used only when asked (``load_topology(..., nvml=True)``); never imported on the ``affrun exec`` path. Without
``pynvml`` (nvidia-ml-py), without a driver or without a GPU, it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from launcher.topology.model import Topology
from launcher.topology.pci import pci_address


@dataclass(frozen=True)
class NvmlGpu:
    index: int  # NVML index (PCI bus order); never a CUDA visible index
    pci: str  # dddd:bb:dd.f, lower case, as sysfs names it
    uuid: str


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sysfs_bdf(bus_id: str) -> str:
    """NVML writes ``00000000:17:00.0`` (8-digit domain, upper case); sysfs writes ``0000:17:00.0``: both become
    :func:`launcher.topology.pci.pci_address`'s spelling (a text that is no address is kept, lower-cased)."""
    return pci_address(bus_id.strip()) or bus_id.strip().lower()


def nvml_gpus() -> list[NvmlGpu] | None:
    """Every GPU NVML sees, or ``None`` when NVML is unavailable (no pynvml, no driver, init failure)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no NVML here
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = _sysfs_bdf(_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
            out.append(NvmlGpu(i, pci, _text(pynvml.nvmlDeviceGetUUID(handle))))
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def with_nvml(topo: Topology, found: list[NvmlGpu] | None = None) -> Topology:
    """Fill missing NVIDIA UUIDs from NVML (matched by PCI address) and warn where NVML and sysfs disagree."""
    found = nvml_gpus() if found is None else found
    if not found:
        return topo
    by_pci = {g.pci: g for g in found}
    gpus = []
    warnings = []
    for gpu in topo.gpus:
        match = by_pci.get(gpu.pci)
        if gpu.vendor != "nvidia":
            gpus.append(gpu)
            continue
        if match is None:
            warnings.append(f"GPU {gpu.pci} is in sysfs but NVML does not list it")
            gpus.append(gpu)
            continue
        if gpu.uuid and gpu.uuid != match.uuid:
            warnings.append(f"GPU {gpu.pci}: /proc/driver/nvidia says UUID {gpu.uuid}, NVML says {match.uuid}")
        gpus.append(replace(gpu, uuid=gpu.uuid or match.uuid))
    known = {g.pci for g in topo.gpus}
    warnings.extend(f"NVML GPU {g.index} ({g.pci}) was not found in sysfs" for g in found if g.pci not in known)
    return replace(topo, gpus=tuple(gpus)).with_warnings(*warnings)
