"""Optional NVML source: GPU UUIDs and a cross-check of the sysfs GPU list (``pip install affrun[nvml]``).

Used only when asked (``load_topology(..., nvml=True)``); never imported on the ``affrun exec`` path. Without
``pynvml`` (nvidia-ml-py), without a driver or without a GPU, it changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from launcher.base import nvml
from launcher.base.pci import pci_address
from launcher.topology.model import Topology


def nvml_gpus() -> list[nvml.Gpu] | None:
    """Every GPU NVML sees, ``None`` where NVML is unavailable (no pynvml, no driver, an NVML error)."""
    lib, _ = nvml.start()
    if lib is None:
        return None
    try:  # NVML writes 00000000:17:00.0, sysfs 0000:17:00.0: both become pci_address's spelling
        return [replace(g, pci=pci_address(g.pci) or g.pci, handle=None) for g in nvml.gpus(lib)]
    except Exception:
        return None
    finally:
        nvml.stop(lib)


def with_nvml(topo: Topology, found: list[nvml.Gpu] | None = None) -> Topology:
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
