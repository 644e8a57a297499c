"""The machine model, in hwloc's vocabulary: Package, NUMA node, L3 group, Core, PU, plus PCI GPUs and NICs.

CPU ids are OS indexes (what the kernel, ``taskset`` and ``OMP_PLACES`` use). Logical indexes are positions
in the tuples below. Everything here is immutable and free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from launcher.base.choices import RDMA_KINDS, NicKind, PortState
from launcher.base.cpulist import MAX_CPU_ID, MAX_NODE_ID, format_cpulist, id_text
from launcher.base.errors import TopologyError, one_line
from launcher.base.pci import pci_address
from launcher.base.records import to_dict
from launcher.base.untrusted import clip, short
from launcher.topology.kinds import CoreKinds, kinds_to_json
from launcher.topology.priority import PriorityCores

if TYPE_CHECKING:
    from typing import Any

    from launcher.topology.cpu_identity import CpuIdentity

# A device's PCI path: its ancestors from the host bridge down, the device itself left out, e.g.
# ("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0") for a device behind a PCIe switch (root port,
# the switch's upstream and downstream ports). The host bridge is named as sysfs names the root bus, pciDDDD:BB.
PciPath = tuple[str, ...]


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
    # The CPUs this node's memory is local to by the firmware's initiator table (docs/planner.md); None when the
    # source does not say.
    local_cpus: frozenset[int] | None = None


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
    pci_path: PciPath = ()  # empty when the source does not say (docs/nics.md)


@dataclass(frozen=True)
class NicPort:
    """One port of a NIC: its number (1.. for RDMA ports; 1 for an interface), state and rate in Gb/s."""

    number: int
    state: PortState
    rate_gbps: float | None = None  # None when the source does not say (hwloc XML, an interface without speed)


@dataclass(frozen=True)
class NIC:
    """A network device, as hwloc has it: an OS device (an RDMA device such as ``mlx5_0``, or a network interface
    such as ``eth0``) under its PCI function. One function may carry both (``mlx5_0`` and its ``ib0``)."""

    name: str
    pci: str  # the PCI function, dddd:bb:dd.f
    kind: NicKind
    numa_node: int | None = None
    ports: tuple[NicPort, ...] = ()
    pci_path: PciPath = ()

    @property
    def rdma(self) -> bool:
        return self.kind in RDMA_KINDS

    def active_ports(self) -> tuple[NicPort, ...]:
        return tuple(p for p in self.ports if p.state == "active")


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
    # Core kinds of the online CPUs (hybrid CPUs: P/E cores, big.LITTLE), fastest first; empty on a homogeneous
    # machine. :meth:`kinds` narrows them to the allowed CPUs, which is what the planner and the output use.
    core_kinds: CoreKinds = field(default_factory=CoreKinds)
    nics: tuple[NIC, ...] = ()  # in PCI order, then by name
    # The CPU's identity (vendor, model, binding flags): read only where asked (load_topology(cpu_identity=True),
    # affrun topology and doctor), never on a rank's path; not part of the layout, so not compared.
    cpu: CpuIdentity | None = field(default=None, compare=False)
    # Priority cores of the online CPUs (launcher.topology.priority): empty, with the reason, where none are found.
    # :meth:`priority_cores` narrows them to the allowed CPUs, which is what the planner and the output use.
    priority: PriorityCores = field(default_factory=PriorityCores)

    def kinds(self) -> CoreKinds:
        """The core kinds of the allowed CPUs, fastest first (empty or one kind: homogeneous)."""
        return self.core_kinds.restricted(self.allowed) if self.core_kinds.kinds else self.core_kinds

    def priority_cores(self) -> PriorityCores:
        """The priority cores among the allowed CPUs (empty, with the reason, where there are none)."""
        return self.priority.restricted(self.allowed)

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

    def local_memory_of(self, os_index: int) -> tuple[NumaNode, ...]:
        """The nodes with memory, allowed by the cpuset, that the firmware's initiator table makes local to the
        CPUs of node ``os_index``: those of the tightest locality (fewest CPUs, as hwloc's nearest memory), then
        nearest by the distance table. Empty when no initiator information covers the node's CPUs."""
        node = self.node(os_index)
        if node is None or not node.cpus:
            return ()
        allowed = self.allowed_mems
        found = [
            m for m in self.numa_nodes
            if m.os_index != os_index and m.memory_kb != 0 and m.local_cpus and m.local_cpus & node.cpus
            and (allowed is None or m.os_index in allowed)
        ]

        def key(m: NumaNode) -> tuple[int, int]:
            return len(m.local_cpus or ()), node.distances.get(m.os_index, 1 << 30)

        best = min((key(m) for m in found), default=None)
        return tuple(m for m in found if key(m) == best)

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
        """The same machine with ``extra`` warnings, each made one line (:func:`launcher.errors.one_line`)."""
        return replace(self, warnings=self.warnings + tuple(one_line(w) for w in extra))

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
                    "pci_path": list(g.pci_path),
                }
                for i, g in enumerate(gpus)
            ],
            "nics": [to_dict(n) for n in self.nics],
            "l3_groups": [sorted(g.cpus & allowed) for g in self.l3_groups],
            "cpu": None if self.cpu is None else to_dict(self.cpu),
            "online": format_cpulist(self.online),
            "offline": format_cpulist(self.offline),
            "source": self.source,
            "warnings": list(self.warnings),
            "cpu_quota": self.cpu_quota,
            "cpu_quota_source": self.cpu_quota_source,
            "core_kinds": kinds_to_json(self.kinds()),
            "priority_cores": to_dict(self.priority_cores()),
        }


# ---------------------------------------------------------------------------------------------- validation
def checked(topo: Topology, where: str | None = None) -> Topology:
    """``topo`` made consistent, or a :class:`TopologyError` line starting with ``where`` (default: its
    ``source``); every reader returns through here (what it guarantees: docs/design.md §6, "Three topology
    formats")."""
    where = topo.source if where is None else where
    cpu_sets: list[tuple[str, frozenset[int] | tuple[int, ...]]] = [
        ("online", topo.online), ("offline", topo.offline), ("allowed", topo.allowed),
        *((f"package {p.os_index}", p.cpus) for p in topo.packages),
        *((f"NUMA node {n.os_index}", n.cpus) for n in topo.numa_nodes),
        *((f"NUMA node {n.os_index}'s initiators", n.local_cpus or ()) for n in topo.numa_nodes),
        *(("an L3 group", g.cpus) for g in topo.l3_groups),
        *((f"GPU {clip(g.pci, 40)}", g.cpus) for g in topo.gpus),
        *(("a core", c.pus) for c in topo.cores),
    ]
    for what, cpus in cpu_sets:
        bad = next((c for c in cpus if not 0 <= c <= MAX_CPU_ID), None)
        if bad is not None:
            raise TopologyError(f"{where}: {what} has CPU {id_text(bad)}, outside 0..{MAX_CPU_ID}")
    nodes: list[tuple[str, int | None]] = [
        *(("a NUMA node", n.os_index) for n in topo.numa_nodes),
        *((f"NUMA node {n.os_index}'s distances", k) for n in topo.numa_nodes for k in n.distances),
        *(("a core", c.numa_node) for c in topo.cores),
        *((f"GPU {clip(g.pci, 40)}", g.numa_node) for g in topo.gpus),
        *((f"GPU {clip(g.pci, 40)}'s memory", g.memory_node) for g in topo.gpus),
        *(("allowed_mems", m) for m in topo.allowed_mems or ()),
        *((f"NIC {clip(n.name, 40)}", n.numa_node) for n in topo.nics),
    ]
    for what, node in nodes:
        if node is not None and not 0 <= node <= MAX_NODE_ID:
            raise TopologyError(f"{where}: {what} has NUMA node {id_text(node)}, outside 0..{MAX_NODE_ID}")
    for core in topo.cores:
        if not 0 <= core.package < len(topo.packages):
            raise TopologyError(f"{where}: a core of CPUs {format_cpulist(core.pus)} is in package "
                                f"L#{id_text(core.package)}, which does not exist")
        if core.l3 is not None and not 0 <= core.l3 < len(topo.l3_groups):
            raise TopologyError(f"{where}: a core of CPUs {format_cpulist(core.pus)} is in L3 group "
                                f"L#{id_text(core.l3)}, which does not exist")
    listed: set[str] = set()
    for gpu in topo.gpus:
        if pci_address(gpu.pci) != gpu.pci:
            raise TopologyError(f"{where}: GPU {short(gpu.pci, 40)}: not a PCI address in dddd:bb:dd.f form")
        if gpu.pci in listed:
            raise TopologyError(f"{where}: two GPUs have the PCI address {gpu.pci}")
        listed.add(gpu.pci)
    for nic in topo.nics:
        if pci_address(nic.pci) != nic.pci:
            raise TopologyError(f"{where}: NIC {short(nic.name, 40)}: {short(nic.pci, 40)} is not a PCI address")
    cores, twice = _one_core_per_pu(topo.cores)
    warnings = tuple(one_line(w) for w in topo.warnings)
    stray = frozenset().union(*(k.cpus for k in topo.core_kinds.kinds)) - topo.online
    if stray:
        raise TopologyError(f"{where}: core kinds name CPUs {format_cpulist(stray)} that are not online")
    if not twice and cores == topo.cores and warnings == topo.warnings:
        return topo
    if twice:
        warnings += (f"CPUs {format_cpulist(twice)} are listed in more than one core (inconsistent sibling lists); "
                     "each is kept in the first core that lists it",)
    return replace(topo, cores=cores, warnings=warnings)


def _one_core_per_pu(cores: tuple[Core, ...]) -> tuple[tuple[Core, ...], set[int]]:
    """Cores sorted by first PU with each PU kept in its first core only; and the PUs that were in two."""
    seen: set[int] = set()
    twice: set[int] = set()
    out: list[Core] = []
    for core in sorted(cores, key=lambda c: min(c.pus, default=-1)):
        pus = tuple(sorted(set(core.pus) - seen))
        twice.update(p for p in core.pus if p in seen)
        seen.update(pus)
        if pus:
            out.append(core if pus == core.pus else replace(core, pus=pus))
    return tuple(out), twice
