"""The machine model, in hwloc's vocabulary: Package, NUMA node, L3 group, Core, PU, plus PCI GPUs.

CPU ids are OS indexes (what the kernel, ``taskset`` and ``OMP_PLACES`` use). Logical indexes are positions
in the tuples below. Everything here is immutable and free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from launcher.cpulist import format_cpulist


@dataclass(frozen=True)
class Core:
    """A physical core: its online SMT sibling PUs (OS ids), and where it sits."""

    os_index: int  # core_id; may repeat across packages or even inside one (hwloc keeps it as-is)
    pus: tuple[int, ...]
    package: int  # logical package index
    numa_node: int | None  # OS index of the NUMA node holding the core, None when unknown
    l3: int | None  # logical index of the L3 group, None when unknown


@dataclass(frozen=True)
class Package:
    os_index: int  # physical_package_id; -1 on POWER/s390 (then derived from package_cpus)
    cpus: frozenset[int]


@dataclass(frozen=True)
class NumaNode:
    os_index: int
    cpus: frozenset[int]  # online CPUs of the node; empty for CPU-less (HBM, GPU memory, CXL) nodes
    distances: dict[int, int] = field(default_factory=dict, compare=False)  # node os_index -> distance
    memory_kb: int | None = None


@dataclass(frozen=True)
class L3Group:
    cpus: frozenset[int]


@dataclass(frozen=True)
class GPU:
    """One GPU found on PCI. ``index`` is its position in PCI bus order (what NVML/nvidia-smi show)."""

    index: int
    pci: str  # domain:bus:device.function, lower case
    vendor: str  # "nvidia" | "amd" | "intel"
    numa_node: int | None  # None when the kernel says -1 or does not say
    cpus: frozenset[int]  # local CPUs from sysfs (may be empty or "all" when unknown)
    uuid: str | None = None
    memory_node: int | None = None  # CPU-less NUMA node of the GPU's own memory (Grace Hopper, POWER9)
    # The device's index in its vendor's runtime when every GPU is visible: NVML/nvidia-smi (PCI bus order among
    # NVIDIA GPUs), ROCm (KFD topology order, what rocm-smi and ROCR_VISIBLE_DEVICES count; not always PCI order).
    # None when unknown (Intel, or a source that does not say).
    vendor_index: int | None = None


@dataclass(frozen=True)
class Topology:
    """A whole machine as seen by the process that will launch ranks."""

    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    l3_groups: tuple[L3Group, ...]
    cores: tuple[Core, ...]  # every core with at least one online PU, in order of first PU
    online: frozenset[int]
    offline: frozenset[int]
    allowed: frozenset[int]  # the CPUs this process may use: online ∩ cgroup ∩ affinity ∩ --cpus
    gpus: tuple[GPU, ...] = ()
    visible: tuple[int, ...] | None = None  # visible index -> GPU.index; None means all GPUs in PCI order
    source: str = "live"
    allowed_mems: frozenset[int] | None = None  # cgroup cpuset.mems; None when unrestricted
    warnings: tuple[str, ...] = ()
    # CFS bandwidth limit in CPUs (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us; the tightest
    # along the cgroup's ancestors). None when unlimited or unknown. It does not show in the affinity mask.
    cpu_quota: float | None = None
    cpu_quota_source: str | None = None  # "cgroup2 /sys/fs/cgroup/pod/cpu.max: 800000 100000"
    # The snapshot file this topology was loaded from (``source`` stays what the snapshot recorded, so that
    # ``--json`` is lossless); not part of the machine, so not compared.
    loaded_from: str | None = field(default=None, compare=False)

    @property
    def origin(self) -> str:
        """Where the data was read, for people: ``snapshot node.json (taken from live)``, ``fsroot DIR``..."""
        return f"{self.loaded_from} (taken from {self.source})" if self.loaded_from else self.source

    # ------------------------------------------------------------------ queries
    def node(self, os_index: int) -> NumaNode | None:
        for node in self.numa_nodes:
            if node.os_index == os_index:
                return node
        return None

    def cpu_nodes(self) -> list[NumaNode]:
        """The NUMA nodes that hold allowed CPUs (CPU-less and fully disallowed nodes left out)."""
        return [n for n in self.numa_nodes if n.cpus & self.allowed]

    def allowed_cores(self) -> list[Core]:
        """Cores with at least one allowed PU, each reduced to its allowed PUs."""
        out: list[Core] = []
        allowed = self.allowed
        for core in self.cores:
            pus = tuple(p for p in core.pus if p in allowed)
            if pus:
                out.append(core if len(pus) == len(core.pus) else replace(core, pus=pus))
        return out

    def visible_gpus(self) -> tuple[GPU, ...]:
        """GPUs in visible-index order (what ``torch.cuda.set_device(i)`` means)."""
        if self.visible is None:
            return self.gpus
        by_index = {g.index: g for g in self.gpus}
        return tuple(by_index[i] for i in self.visible if i in by_index)

    def restrict(self, cpus: frozenset[int]) -> Topology:
        """The same machine with the allowed set narrowed to ``cpus``."""
        return replace(self, allowed=self.allowed & cpus)

    def with_warnings(self, *extra: str) -> Topology:
        return replace(self, warnings=self.warnings + tuple(extra))

    # ------------------------------------------------------------------ output
    def to_json(self) -> dict[str, Any]:
        """The documented ``affrun topology --json`` contract (plus extra keys)."""
        allowed = self.allowed
        cores = [list(c.pus) for c in self.allowed_cores()]
        gpus = self.visible_gpus()
        return {
            "packages": len(self.packages),
            "numa_nodes": [
                {
                    "id": n.os_index,
                    "cpus": sorted(n.cpus & allowed),
                    "distances": {str(k): v for k, v in sorted(n.distances.items())},
                }
                for n in self.numa_nodes
            ],
            "cores": cores,
            "cpus": sorted(allowed),
            "gpus": [
                {
                    "index": i,
                    "physical_index": g.index,
                    "pci": g.pci,
                    "vendor": g.vendor,
                    "numa_node": g.numa_node,
                    "cpus": sorted(g.cpus),
                    "uuid": g.uuid,
                }
                for i, g in enumerate(gpus)
            ],
            "l3_groups": [sorted(g.cpus & allowed) for g in self.l3_groups],
            "online": format_cpulist(self.online),
            "offline": format_cpulist(self.offline),
            "source": self.source,
            "warnings": list(self.warnings),
            "cpu_quota": self.cpu_quota,
            "cpu_quota_source": self.cpu_quota_source,
        }
