"""GPUs from sysfs PCI devices, the NUMA node of a device whose kernel gives none, and the mapping from visible
indices (``CUDA_VISIBLE_DEVICES``...) to GPUs (docs/design.md §5)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

from launcher.base.errors import TopologyError
from launcher.base.pci import format_pci, pci_address, pci_order
from launcher.base.slurm_step import slurm_global_visible
from launcher.base.untrusted import ascii_int, ascii_uint, clip, short
from launcher.topology._files import numbered_entries, pci_location, read_cpus, read_int, read_text
from launcher.topology.fsroot import isdir, listdir
from launcher.topology.model import GPU

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel"}
GPU_CLASSES = (0x0300, 0x0302, 0x0380)  # VGA, 3D controller, other display; NVSwitch is 0x0680
EXCLUDED_VENDORS = {0x1A03: "ASPEED BMC VGA", 0x102B: "Matrox BMC VGA", 0x1013: "Cirrus VGA"}
# Server-board VGA chips of GPU vendors: display only, never a compute device.
EXCLUDED_DEVICES = {(0x1002, 0x515E): "AMD Radeon ES1000 BMC VGA", (0x1002, 0x5159): "AMD Radeon 7000/VE (RV100) VGA"}


def read_pci_gpus(
    root: str, all_cpus: frozenset[int], node_cpus: Mapping[int, frozenset[int]] | None = None
) -> tuple[list[GPU], list[str]]:
    """The GPUs of ``sys/bus/pci/devices`` under ``root`` in PCI bus order, and warnings. ``all_cpus``: the
    online CPUs; ``node_cpus``: each NUMA node's (for a GPU without ``numa_node``: :func:`node_holding`). An
    entry that is no PCI address is skipped with a warning; two spellings of one are one device."""
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        entries = listdir(base)
    except (OSError, ValueError):
        return [], []
    warnings: list[str] = []
    devices = _pci_entries(base, entries, warnings)
    nvidia_proc = os.path.join(root, "proc/driver/nvidia/gpus")
    found: list[GPU] = []
    for bdf, name in devices:
        dev = os.path.join(base, name)
        klass = read_int(os.path.join(dev, "class"))
        if klass is None or (klass >> 8) not in GPU_CLASSES:
            continue
        vendor_id = read_int(os.path.join(dev, "vendor"))
        driver_dir = os.path.join(nvidia_proc, bdf)
        if vendor_id is None and isdir(driver_dir):
            vendor_id = 0x10DE  # POWER9 trees keep only class/local_cpus; the driver's proc entry names it
        if vendor_id is None or vendor_id in EXCLUDED_VENDORS or vendor_id not in VENDORS:
            continue
        if vendor_id == 0x1002 and (vendor_id, read_int(os.path.join(dev, "device"))) in EXCLUDED_DEVICES:
            continue
        numa = read_int(os.path.join(dev, "numa_node"))
        if numa is not None and numa < 0:
            numa = None
        cpus = read_cpus(os.path.join(dev, "local_cpulist"), os.path.join(dev, "local_cpus")) or frozenset()
        cpus &= all_cpus
        uuid, memory_node = _nvidia_driver_info(driver_dir) if vendor_id == 0x10DE else (None, None)
        if numa is None:
            numa = node_holding(cpus, node_cpus)
            if numa is None:
                where = "local_cpus spans every CPU" if (not cpus or cpus >= all_cpus) else "locality taken from local_cpus"
                warnings.append(f"GPU {bdf}: the kernel gives no NUMA node (numa_node is -1 or absent); {where}")
        found.append(
            GPU(
                index=len(found),
                pci=bdf,
                vendor=VENDORS[vendor_id],
                numa_node=numa,
                cpus=cpus,
                uuid=uuid,
                memory_node=memory_node,
                pci_path=_path_of(dev, bdf),
            )
        )
    return _with_vendor_indexes(root, found), warnings


def _path_of(dev: str, bdf: str) -> tuple[str, ...]:
    """The PCI path of device ``bdf`` at ``dev`` (empty when its link does not resolve to it)."""
    found = pci_location(dev)
    return found[1] if found is not None and found[0] == bdf else ()


def _pci_entries(base: str, entries: list[str], warnings: list[str]) -> list[tuple[str, str]]:
    """(address, entry name) of each distinct PCI address among ``entries``, in PCI bus order."""
    named: list[tuple[str, str]] = []
    strange: list[str] = []
    for name in entries:
        address = pci_address(name)
        if address is None:
            strange.append(name)
        else:
            named.append((address, name))
    named.sort(key=lambda an: (pci_order(an[0]), an[1] != an[0], an[1]))
    out: list[tuple[str, str]] = []
    twice: list[str] = []
    for address, name in named:
        if out and out[-1][0] == address:
            twice.append(f"{short(name, 24)} is {out[-1][1]}")
        else:
            out.append((address, name))
    if strange:
        listed = ", ".join(short(n, 30) for n in sorted(strange)[:3]) + (", ..." if len(strange) > 3 else "")
        warnings.append(f"{short(base, 120)}: {len(strange)} entr{'y is' if len(strange) == 1 else 'ies are'} not a "
                        f"PCI address (dddd:bb:dd.f) and ignored: {listed}")
    if twice:
        warnings.append(f"{short(base, 120)}: {len(twice)} entr{'y names' if len(twice) == 1 else 'ies name'} a PCI "
                        f"address already listed, in another spelling ({', '.join(twice[:3])}); each device is read "
                        "once")
    return out


def _with_vendor_indexes(root: str, gpus: list[GPU]) -> list[GPU]:
    """Set ``vendor_index``: NVML's order for NVIDIA (PCI bus order), the KFD topology order for AMD."""
    kfd = _kfd_order(root) if any(g.vendor == "amd" for g in gpus) else {}
    out = []
    nvidia = 0
    for gpu in gpus:
        if gpu.vendor == "nvidia":
            gpu = replace(gpu, vendor_index=nvidia)
            nvidia += 1
        elif gpu.vendor == "amd" and gpu.pci in kfd:
            gpu = replace(gpu, vendor_index=kfd[gpu.pci])
        out.append(gpu)
    return out


def _kfd_order(root: str) -> dict[str, int]:
    """PCI address -> position among the GPU nodes of the KFD topology (``gpu_id`` != 0)."""
    base = os.path.join(root, "sys/class/kfd/kfd/topology/nodes")
    order: dict[str, int] = {}
    for node in numbered_entries(base, ""):
        ndir = os.path.join(base, str(node))
        if not read_int(os.path.join(ndir, "gpu_id")):
            continue  # a CPU node
        props: dict[str, str] = {}
        for line in (read_text(os.path.join(ndir, "properties")) or "").splitlines():
            key, _, value = line.partition(" ")
            props[key] = value.strip()
        location, domain = ascii_uint(props.get("location_id", "")), ascii_uint(props.get("domain", "0"))
        if location is None or domain is None:
            continue
        bdf = format_pci(domain, (location >> 8) & 0xFF, (location >> 3) & 0x1F, location & 0x7)
        order[bdf] = len(order)
    return order


def node_holding(cpus: frozenset[int], node_cpus: Mapping[int, frozenset[int]] | None) -> int | None:
    """The one NUMA node whose CPUs include all of ``cpus`` (a device's local CPUs), else ``None``: how hwloc places
    a GPU or NIC whose ``numa_node`` is -1."""
    holders = [n for n, node in (node_cpus or {}).items() if cpus and node and cpus <= node]
    return holders[0] if len(holders) == 1 else None


def _nvidia_driver_info(driver_dir: str) -> tuple[str | None, int | None]:
    """(UUID, GPU-memory NUMA node) from ``/proc/driver/nvidia/gpus/<bdf>/{information,numa_status}``."""
    uuid: str | None = None
    memory_node: int | None = None
    info = read_text(os.path.join(driver_dir, "information"))
    if info:
        for line in info.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "GPU UUID":
                uuid = value.strip() or None
    status = read_text(os.path.join(driver_dir, "numa_status"))
    if status:
        for line in status.splitlines():
            key, _, value = line.partition(":")
            node = ascii_int(value.strip()) if key.strip() == "Node" else None
            if node is not None:
                memory_node = node if node >= 0 else None
    return uuid, memory_node


VISIBLE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
NO_DEVICE_VALUES = ("nodevfiles", "none", "void")  # what batch systems write when a job has no GPU


class VisibleGPUs(NamedTuple):
    visible: tuple[int, ...] | None  # visible index -> GPU.index; None: no variable restricts the GPUs
    variable: str | None  # the variable that gave them
    warning: str | None = None  # entries that were dropped, and why


def resolve_visible(gpus: Sequence[GPU], environ: Mapping[str, str]) -> VisibleGPUs:
    """Visible indices mapped to physical ``GPU.index`` by the first visibility variable that applies (positions
    in PCI bus order; in a Slurm job through :func:`launcher.base.slurm_step.slurm_global_visible`); a bad entry
    ends the list, as CUDA reads it, with a warning (docs/design.md §5)."""
    vendors = {g.vendor for g in gpus}
    order = {
        "CUDA_VISIBLE_DEVICES": "nvidia",
        "ROCR_VISIBLE_DEVICES": "amd",
        "HIP_VISIBLE_DEVICES": "amd",
        "ZE_AFFINITY_MASK": "intel",
    }
    for name in VISIBLE_VARIABLES:
        value = environ.get(name)
        if value is None:
            continue
        vendor = order[name]
        # CUDA_VISIBLE_DEVICES is honoured by HIP too; only use a variable that concerns GPUs we have.
        if gpus and vendor not in vendors and not (name == "CUDA_VISIBLE_DEVICES" and "amd" in vendors):
            continue
        pool = [g for g in gpus if g.vendor == vendor] or list(gpus)
        if all(g.vendor_index is not None for g in pool):
            # ROCm numbers GPUs in its own (KFD) order, which need not be PCI bus order.
            pool.sort(key=lambda g: g.vendor_index or 0)
        items = [v.strip() for v in value.split(",") if v.strip()]
        bad = next((i for i, item in enumerate(items) if not _well_formed(item)), None)
        kept = ",".join(items if bad is None else items[:bad])  # Slurm's renumbering sees the valid prefix only
        if name != "ZE_AFFINITY_MASK":
            kept = slurm_global_visible(kept, environ, len(pool)) or kept
        repeated: list[str] = []
        visible, stop = _parse_visible(name, value, kept, pool, repeated)
        if stop is None and bad is not None:
            stop = f"{items[bad][:40]!r} is not a GPU index or UUID"
        warning = None
        if stop is not None:
            shown = f"GPUs {', '.join(map(str, visible))} stay visible" if visible else "no GPU is visible"
            warning = f"{name}={clip(value)}: {stop}; like CUDA, affrun ignores it and every entry after it ({shown})"
        elif repeated:
            warning = (f"{name}={clip(value)} names a GPU twice ({clip(', '.join(repeated), 60)}): affrun plans "
                       f"each GPU once, {len(visible)} in all")
        return VisibleGPUs(tuple(visible), name, warning)
    if gpus and all(g.vendor == "amd" and g.vendor_index is not None for g in gpus):
        # HIP device i is the i-th GPU in ROCm's (KFD) order, even with no visibility variable set.
        return VisibleGPUs(tuple(g.index for g in sorted(gpus, key=lambda g: g.vendor_index or 0)), None)
    return VisibleGPUs(None, None)


def _well_formed(item: str) -> bool:
    """An index (``3``, ``ZE_AFFINITY_MASK``'s ``0.1``), a UUID or a no-device word; ``-1`` and junk are not."""
    return item.lower() in NO_DEVICE_VALUES or item.startswith(("GPU-", "MIG-")) or ascii_uint(item.split(".")[0]) is not None


def _parse_visible(name: str, value: str, kept: str, pool: Sequence[GPU],
                   repeated: list[str]) -> tuple[list[int], str | None]:
    """The GPUs named by ``kept`` (well-formed entries of ``value``), up to the first that names no GPU here;
    returns them and why the list stopped (``None``: it did not). Entries that name a GPU already listed go to
    ``repeated``: the GPU is planned once."""
    out: list[int] = []
    for raw in kept.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.lower() in NO_DEVICE_VALUES:
            return [], None
        if item.startswith(("GPU-", "MIG-")):
            target = item.split("/")[0]
            match = [g for g in pool if g.uuid and (g.uuid == target or g.uuid.startswith(target))]
            if not match:
                if item.startswith("MIG-"):
                    raise TopologyError(f"{name}={clip(value)}: MIG device {clip(item, 40)} cannot be mapped to a PCI GPU")
                return out, f"no GPU has UUID {clip(item, 60)} (UUIDs come from /proc/driver/nvidia)"
            if match[0].index in out:
                repeated.append(item)
            else:
                out.append(match[0].index)
            continue
        pos = ascii_uint(item.split(".")[0])  # ZE_AFFINITY_MASK=0.1 -> card 0
        if pos is None:  # not reached: _well_formed kept only such items
            return out, f"{short(item)} is not a GPU index"
        if pos >= len(pool):
            return out, f"GPU {pos} does not exist (this machine has {len(pool)})"
        gpu_index = pool[pos].index
        if gpu_index not in out:
            out.append(gpu_index)
        elif "." not in item:  # ZE_AFFINITY_MASK's sub-devices 0.0 and 0.1 are one card, on purpose
            repeated.append(item)
    return out, None
