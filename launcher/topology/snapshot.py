"""Save a :class:`Topology` as JSON (``affrun topology --save``) and load it back (``--topology FILE.json``): one
record per part, written by :func:`launcher.base.records.to_dict` and read by ``from_dict`` with the snapshot's
key names, then the checks that tie the parts together. A field of the wrong type or parts that disagree refuse
the snapshot in one line naming the field; a NIC on a node the snapshot lacks, or a bad ``core_kinds``,
``priority_cores`` or ``cpu``, is a warning. Lossless, ``source`` included; GPU visibility is not stored."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from launcher.base.cpulist import MAX_NODE_ID, cpu_error, format_cpulist, id_problem, id_text, parse_cpulist
from launcher.base.errors import TopologyError, one_line
from launcher.base.pci import host_bridge, pci_address
from launcher.base.records import BadRecord, from_dict, to_dict
from launcher.base.untrusted import BadJSON, ascii_int, clip, load_json, short
from launcher.topology.kinds import CoreKinds, kinds_from_json, kinds_to_json
from launcher.topology.model import GPU, NIC, Core, L3Group, NumaNode, Package, Topology, checked
from launcher.topology.nics import MAX_ENTRIES, MAX_PORTS, MAX_RATE_GBPS, capped, name_problem, sorted_nics
from launcher.topology.priority import priority_from_json

FORMAT = "affrun-topology/1"
MAX_PATH = 32  # bridges above a device; real trees have fewer than 10


@dataclass(frozen=True)
class _Package:
    os_index: int
    cpus: str  # a cpu list, as every set of CPUs in a snapshot


@dataclass(frozen=True)
class _Node:
    os_index: int
    cpus: str
    distances: dict[str, int] = field(default_factory=dict)  # node id -> distance
    memory_kb: int | None = None
    local_cpus: str | None = None  # written only when known


@dataclass(frozen=True)
class _Core:
    os_index: int
    pus: tuple[int, ...]
    package: int  # logical index into packages
    numa_node: int | None = None
    l3: int | None = None


@dataclass(frozen=True, kw_only=True)
class _Gpu:
    index: int
    pci: str
    vendor: Literal["nvidia", "amd", "intel"]
    numa_node: int | None = None
    cpus: str
    uuid: str | None = None
    memory_node: int | None = None
    vendor_index: int | None = None
    pci_path: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class _Snapshot:
    """The snapshot's keys in their order; ``core_kinds``, ``cpu`` and ``priority_cores`` follow them."""

    format: str
    source: str = "snapshot"
    online: str
    offline: str
    allowed: str
    allowed_mems: str | None = None
    packages: tuple[_Package, ...]
    numa_nodes: tuple[_Node, ...]
    l3_groups: tuple[str, ...]
    cores: tuple[_Core, ...]
    gpus: tuple[_Gpu, ...]
    nics: tuple[NIC, ...] = ()  # read apart: a NIC that does not fit is a warning
    warnings: tuple[str, ...] = ()
    cpu_quota: float | None = None
    cpu_quota_source: str | None = None


_LISTS = ("packages", "numa_nodes", "l3_groups", "cores", "gpus")
_LENIENT = ("nics", "core_kinds", "cpu", "priority_cores")


def to_snapshot(topo: Topology) -> dict[str, Any]:
    cl = format_cpulist
    snap = to_dict(_Snapshot(
        format=FORMAT, source=topo.source, online=cl(topo.online), offline=cl(topo.offline), allowed=cl(topo.allowed),
        allowed_mems=None if topo.allowed_mems is None else cl(topo.allowed_mems),
        packages=tuple(_Package(p.os_index, cl(p.cpus)) for p in topo.packages),
        numa_nodes=tuple(_Node(n.os_index, cl(n.cpus), {str(k): v for k, v in n.distances.items()}, n.memory_kb,
                               None if n.local_cpus is None else cl(n.local_cpus)) for n in topo.numa_nodes),
        l3_groups=tuple(cl(g.cpus) for g in topo.l3_groups),
        cores=tuple(_Core(c.os_index, c.pus, c.package, c.numa_node, c.l3) for c in topo.cores),
        gpus=tuple(_Gpu(index=g.index, pci=g.pci, vendor=g.vendor, numa_node=g.numa_node, cpus=cl(g.cpus),  # type: ignore[arg-type]
                        uuid=g.uuid, memory_node=g.memory_node, vendor_index=g.vendor_index, pci_path=g.pci_path)
                   for g in topo.gpus),
        nics=topo.nics, warnings=topo.warnings, cpu_quota=topo.cpu_quota, cpu_quota_source=topo.cpu_quota_source))
    for node in snap["numa_nodes"]:
        if node["local_cpus"] is None:
            del node["local_cpus"]
    return {**snap, "core_kinds": kinds_to_json(topo.core_kinds), "cpu": None if topo.cpu is None else to_dict(topo.cpu),
            "priority_cores": to_dict(topo.priority)}


def from_snapshot(data: Any, where: str = "snapshot") -> Topology:
    """Build a topology from parsed snapshot JSON; any problem is one ``TopologyError`` line naming ``where``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TopologyError(f"{where}: not an affrun topology snapshot (expected \"format\": \"{FORMAT}\")")
    try:
        topo = _build(data)
    except BadRecord as exc:
        raise TopologyError(f"{where}: bad topology snapshot: {exc}") from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise TopologyError(f"{where}: bad topology snapshot ({type(exc).__name__}: {clip(str(exc))})") from None
    return checked(topo, f"{where}: bad topology snapshot")


def _cpus(text: str, what: str) -> frozenset[int]:
    try:
        return parse_cpulist(text)
    except ValueError as exc:
        raise BadRecord(cpu_error(exc, f"{what} is not a cpu list: {short(text)}", f"{what}: {{}}")) from None


def _build(data: dict[str, Any]) -> Topology:
    for key in _LISTS:
        if not isinstance(data.get(key), list):
            raise BadRecord(f"\"{key}\" must be a list")
    missing = next((k for k in ("online", "offline", "allowed") if k not in data), None)
    if missing:
        raise BadRecord(f"missing key {missing!r}")
    snap = from_dict(_Snapshot, {k: v for k, v in data.items() if k not in _LENIENT}, "")
    packages = [Package(p.os_index, _cpus(p.cpus, f"packages[{i}].cpus")) for i, p in enumerate(snap.packages)]
    nodes = [NumaNode(n.os_index, _cpus(n.cpus, f"numa_nodes[{i}].cpus"),
                      {_node_key(k, f"numa_nodes[{i}].distances"): v for k, v in n.distances.items()}, n.memory_kb,
                      None if n.local_cpus is None else _cpus(n.local_cpus, f"numa_nodes[{i}].local_cpus"))
             for i, n in enumerate(snap.numa_nodes)]
    l3_groups = [L3Group(_cpus(g, f"l3_groups[{i}]")) for i, g in enumerate(snap.l3_groups)]
    cores = []
    for i, c in enumerate(snap.cores):
        if not c.pus:
            raise BadRecord(f"cores[{i}].pus must be a non-empty list of CPU ids")
        problem = next((p for p in map(id_problem, c.pus) if p), None)
        if problem:
            raise BadRecord(f"cores[{i}].pus: {problem}")
        if not 0 <= c.package < len(packages):
            raise BadRecord(f"cores[{i}].package {c.package} is not a package index (0..{len(packages) - 1})")
        if c.l3 is not None and not 0 <= c.l3 < len(l3_groups):
            raise BadRecord(f"cores[{i}].l3 {c.l3} is not an L3 group index")
        cores.append(Core(c.os_index, c.pus, c.package, c.numa_node, c.l3))
    gpus, gpu_at, gpu_notes = _gpus(snap.gpus)
    online, allowed = _cpus(snap.online, "online"), _cpus(snap.allowed, "allowed")
    if not allowed:
        raise BadRecord("\"allowed\" is empty: a topology needs at least one allowed CPU")
    if not allowed <= online:
        raise BadRecord(f"allowed CPUs {format_cpulist(allowed - online)} are not online")
    stray = {p for c in cores for p in c.pus} - online
    if stray:
        raise BadRecord(f"cores list CPUs {format_cpulist(stray)} that are not online")
    _consistent(nodes, cores, gpus, gpu_at, online, len(snap.gpus))
    kinds = kinds_from_json(data.get("core_kinds"), online)
    nics, nic_notes = _nics(data.get("nics", []), frozenset(n.os_index for n in nodes))
    if snap.cpu_quota is not None and not 0 < snap.cpu_quota < 1e9:
        raise BadRecord(f"cpu_quota: expected a positive number of CPUs or null (got {str(snap.cpu_quota)[:40]})")
    return Topology(
        packages=tuple(packages), numa_nodes=tuple(nodes), l3_groups=tuple(l3_groups), cores=tuple(cores),
        online=online, offline=_cpus(snap.offline, "offline"), allowed=allowed,
        allowed_mems=None if snap.allowed_mems is None else _cpus(snap.allowed_mems, "allowed_mems"),
        gpus=tuple(gpus), source=snap.source, warnings=(*snap.warnings, *gpu_notes, *kinds.warnings, *nic_notes),
        core_kinds=CoreKinds(kinds.kinds), nics=nics, priority=priority_from_json(data.get("priority_cores"), online),
        cpu_quota=snap.cpu_quota,
        cpu_quota_source=None if snap.cpu_quota_source is None else one_line(snap.cpu_quota_source),
    )


def _node_key(key: str, what: str) -> int:
    value = ascii_int(key)
    if value is None:
        raise BadRecord(f"{what}: key {short(key, 20)} is not a NUMA node id")
    return value


def _gpus(listed: tuple[_Gpu, ...]) -> tuple[list[GPU], list[int], list[str]]:
    """The GPUs, each PCI address once; each kept GPU's position in the file's list; the duplicates' warnings."""
    gpus: list[GPU] = []
    gpu_at: list[int] = []
    notes: list[str] = []
    seen: dict[str, int] = {}
    for i, g in enumerate(listed):
        pci = pci_address(g.pci)
        if pci is None:
            raise BadRecord(f"gpus[{i}].pci {short(g.pci, 40)} is not a PCI address (dddd:bb:dd.f)")
        if pci in seen:
            notes.append(f"gpus[{i}] has the PCI address of gpus[{seen[pci]}] ({pci}); it is one GPU, kept once")
            continue
        seen[pci] = i
        gpu_at.append(i)
        gpus.append(GPU(g.index, pci, g.vendor, g.numa_node, _cpus(g.cpus, f"gpus[{i}].cpus"), g.uuid, g.memory_node,
                        g.vendor_index, _pci_path(g.pci_path, f"gpus[{i}].pci_path")))
    return gpus, gpu_at, notes


def _consistent(nodes: list[NumaNode], cores: list[Core], gpus: list[GPU], gpu_at: list[int],
                online: frozenset[int], listed: int) -> None:
    """Refuse what affrun's readers never write: two NUMA nodes of one id or sharing a CPU, a node, core or GPU
    naming CPUs that are not online, a core on a node that does not hold it, GPU indexes that are not among the
    ``listed`` entries' 0..n-1, each once."""
    ids = [(f"numa_nodes[{i}].os_index", n.os_index) for i, n in enumerate(nodes)]
    ids += [(f"cores[{i}].numa_node", c.numa_node) for i, c in enumerate(cores) if c.numa_node is not None]
    for name, node_id in ids:  # an id no machine has first: said as such, not as a node missing its CPUs
        if not 0 <= node_id <= MAX_NODE_ID:
            raise BadRecord(f"{name}: NUMA node {id_text(node_id)} is outside 0..{MAX_NODE_ID}")
    node_at: dict[int, int] = {}
    owner: dict[int, int] = {}  # CPU -> the node that holds it
    for i, node in enumerate(nodes):
        if node.os_index in node_at:
            raise BadRecord(f"numa_nodes[{i}].os_index {node.os_index} is also numa_nodes[{node_at[node.os_index]}]'s")
        node_at[node.os_index] = i
        if node.cpus - online:
            raise BadRecord(f"numa_nodes[{i}].cpus lists CPUs {format_cpulist(node.cpus - online)} that are not online")
        common = node.cpus & owner.keys()
        if common:
            raise BadRecord(f"numa_nodes[{i}].cpus lists CPUs {format_cpulist(common)} of NUMA node "
                            f"{owner[min(common)]}; a CPU is in one node")
        owner.update(dict.fromkeys(node.cpus, node.os_index))
    for i, core in enumerate(cores):
        if core.numa_node is not None and not any(owner.get(p) == core.numa_node for p in core.pus):
            raise BadRecord(f"cores[{i}].numa_node {core.numa_node} is not a NUMA node holding its CPUs "
                            f"{format_cpulist(core.pus)}")
    index_at: dict[int, int] = {}
    for at, gpu in zip(gpu_at, gpus):
        if not 0 <= gpu.index < listed:
            raise BadRecord(f"gpus[{at}].index {short(gpu.index, 20)} is not a GPU index (0..{listed - 1})")
        if gpu.index in index_at:
            raise BadRecord(f"gpus[{at}].index {gpu.index} is also gpus[{index_at[gpu.index]}]'s")
        index_at[gpu.index] = at
        if gpu.cpus - online:
            raise BadRecord(f"gpus[{at}].cpus lists CPUs {format_cpulist(gpu.cpus - online)} that are not online")


def _pci_path(value: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A PCI path: empty, or a host bridge (``pci0000:00``) then PCI addresses."""
    if len(value) > MAX_PATH:
        raise BadRecord(f"{what} must be a list of at most {MAX_PATH} strings")
    if not value:
        return ()
    bridge, rest = host_bridge(value[0]), [pci_address(v) for v in value[1:]]
    if bridge is None or None in rest:
        raise BadRecord(f"{what} must be a host bridge (pciDDDD:BB) then PCI addresses, not {short(list(value), 60)}")
    return (bridge, *(a for a in rest if a is not None))


def _nics(value: Any, node_ids: frozenset[int]) -> tuple[tuple[NIC, ...], tuple[str, ...]]:
    """The ``nics`` list: (NICs in PCI order, warnings)."""
    if not isinstance(value, list):
        raise BadRecord("\"nics\" must be a list")
    if len(value) > MAX_ENTRIES:
        return (), (f"\"nics\" lists {len(value)} NICs, more than {MAX_ENTRIES}; no NIC is read",)
    out: list[NIC] = []
    warnings: list[str] = []
    for i, item in enumerate(value):
        nic = _nic(item, f"nics[{i}]")
        if nic.numa_node is not None and nic.numa_node not in node_ids:
            warnings.append(f"NIC {short(nic.name, 40)} is on NUMA node {short(nic.numa_node, 40)}, which the snapshot "
                            "does not have; not read as a NIC")
            continue
        out.append(nic)
    return tuple(sorted_nics(out, warnings)), tuple(capped(warnings))


def _nic(item: Any, what: str) -> NIC:
    name = item.get("name") if isinstance(item, dict) else None
    problem = name_problem(name) if isinstance(name, str) else "not a string"
    if problem and isinstance(item, dict):  # a name is read as it is, as sysfs names are
        raise BadRecord(f"{what}.name must be a device name, not {short(name, 40)} ({problem})")
    nic = from_dict(NIC, item, what)
    address = pci_address(nic.pci)
    if address is None:
        raise BadRecord(f"{what}.pci {short(nic.pci, 40)} is not a PCI address (dddd:bb:dd.f)")
    if nic.numa_node is not None and nic.numa_node < 0:
        raise BadRecord(f"{what}.numa_node must be a node id or null, not {short(nic.numa_node, 20)}")
    if len(nic.ports) > MAX_PORTS:
        raise BadRecord(f"{what}.ports must be a list of at most {MAX_PORTS} ports")
    for j, port in enumerate(nic.ports):
        if not 1 <= port.number <= 255:
            raise BadRecord(f"{what}.ports[{j}].number must be a port number 1..255, not {short(port.number, 20)}")
        if port.rate_gbps is not None and not 0 < port.rate_gbps < MAX_RATE_GBPS:
            raise BadRecord(f"{what}.ports[{j}].rate_gbps must be a positive number of Gb/s or null, "
                            f"not {short(port.rate_gbps, 20)}")
    if len({p.number for p in nic.ports}) < len(nic.ports):
        raise BadRecord(f"{what}.ports lists a port number twice")
    return replace(nic, pci=address, pci_path=_pci_path(nic.pci_path, f"{what}.pci_path"))


def parse_snapshot(data: bytes, path: str) -> Any:
    """Snapshot JSON ``data`` read from ``path``, parsed (a ``TopologyError`` line when it is no JSON)."""
    try:
        return load_json(data)
    except BadJSON as exc:
        if str(exc) == "not UTF-8 text":
            raise TopologyError(f"{path}: not a text file (expected an affrun topology snapshot, JSON)") from None
        raise TopologyError(f"{path}: {exc}") from None
