"""Save a :class:`Topology` as JSON (``affrun topology --save``) and load it back (``--topology FILE.json``).

A snapshot is lossless: loading it gives the same ``affrun topology --json`` as the machine it was taken on,
``source`` included (the snapshot records where its data came from). GPU visibility is not stored; it is
resolved again from the environment of the process that loads the snapshot.

A snapshot whose parts disagree (a hand-edited one: two NUMA nodes sharing an id or a CPU...) is refused in
one line naming the field, as a field of the wrong type is; affrun never writes one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.base.cpulist import MAX_NODE_ID, cpu_error, format_cpulist, id_problem, id_text, parse_cpulist
from launcher.base.pci import pci_address
from launcher.base.untrusted import BadJSON, ascii_int, clip, load_json, short
from launcher.errors import TopologyError, one_line
from launcher.topology._files import read_document
from launcher.topology.kinds import CoreKinds, kinds_from_json, kinds_to_json
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology, checked
from launcher.topology.nics_json import BadNic, nics_from_json, pci_path_from_json
from launcher.topology.priority import priority_from_json

FORMAT = "affrun-topology/1"


def to_snapshot(topo: Topology) -> dict[str, Any]:
    cl = format_cpulist
    return {
        "format": FORMAT,
        "source": topo.source,
        "online": cl(topo.online),
        "offline": cl(topo.offline),
        "allowed": cl(topo.allowed),
        "allowed_mems": None if topo.allowed_mems is None else cl(topo.allowed_mems),
        "packages": [{"os_index": p.os_index, "cpus": cl(p.cpus)} for p in topo.packages],
        "numa_nodes": [
            {"os_index": n.os_index, "cpus": cl(n.cpus), "distances": {str(k): v for k, v in n.distances.items()},
             "memory_kb": n.memory_kb, **({} if n.local_cpus is None else {"local_cpus": cl(n.local_cpus)})}
            for n in topo.numa_nodes
        ],
        "l3_groups": [cl(g.cpus) for g in topo.l3_groups],
        "cores": [
            {"os_index": c.os_index, "pus": list(c.pus), "package": c.package, "numa_node": c.numa_node, "l3": c.l3}
            for c in topo.cores
        ],
        "gpus": [
            {"index": g.index, "pci": g.pci, "vendor": g.vendor, "numa_node": g.numa_node, "cpus": cl(g.cpus),
             "uuid": g.uuid, "memory_node": g.memory_node, "vendor_index": g.vendor_index,
             "pci_path": list(g.pci_path)}
            for g in topo.gpus
        ],
        "nics": [n.to_json() for n in topo.nics],
        "warnings": list(topo.warnings),
        "cpu_quota": topo.cpu_quota,
        "cpu_quota_source": topo.cpu_quota_source,
        "core_kinds": kinds_to_json(topo.core_kinds),
        "cpu": None if topo.cpu is None else topo.cpu.to_json(),
        "priority_cores": topo.priority.to_json(),
    }


class _Bad(Exception):
    """A field of the snapshot has the wrong type or value (message says which)."""


def _int(value: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{what} must be an integer{' or null' if optional else ''}, not {short(value, 40)}")
    return value


def _cpu(value: Any, what: str) -> int:
    problem = id_problem(_int(value, what), "cpu")
    if problem:
        raise _Bad(f"{what}: {problem}")
    return int(value)


def _str(value: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _Bad(f"{what} must be a string, not {short(value, 40)}")
    return value


def _cpus(value: Any, what: str) -> frozenset[int]:
    try:
        return parse_cpulist(_str(value, what))
    except ValueError as exc:
        raise _Bad(cpu_error(exc, f"{what} is not a cpu list: {short(value)}", f"{what}: {{}}")) from None


def _node_key(key: str, what: str) -> int:
    value = ascii_int(key)
    if value is None:
        raise _Bad(f"{what}: key {short(key, 20)} is not a NUMA node id")
    return value


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise _Bad(f"\"{key}\" must be a list")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{what} must be an object")
    return value


def from_snapshot(data: Any, where: str = "snapshot") -> Topology:
    """Build a topology from parsed snapshot JSON; any problem is one ``TopologyError`` line naming ``where``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TopologyError(f"{where}: not an affrun topology snapshot (expected \"format\": \"{FORMAT}\")")
    try:
        topo = _build(data)
    except (_Bad, BadNic) as exc:
        raise TopologyError(f"{where}: bad topology snapshot: {exc}") from None
    except KeyError as exc:
        raise TopologyError(f"{where}: bad topology snapshot: missing key {clip(str(exc), 40)}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise TopologyError(f"{where}: bad topology snapshot ({type(exc).__name__}: {clip(str(exc))})") from None
    return checked(topo, f"{where}: bad topology snapshot")


def _build(data: dict[str, Any]) -> Topology:
    packages = []
    for i, p in enumerate(_list(data, "packages")):
        p = _obj(p, f"packages[{i}]")
        packages.append(Package(_int(p["os_index"], f"packages[{i}].os_index"), _cpus(p["cpus"], f"packages[{i}].cpus")))
    nodes = []
    for i, n in enumerate(_list(data, "numa_nodes")):
        n = _obj(n, f"numa_nodes[{i}]")
        dist = _obj(n.get("distances", {}), f"numa_nodes[{i}].distances")
        nodes.append(
            NumaNode(
                _int(n["os_index"], f"numa_nodes[{i}].os_index"),
                _cpus(n["cpus"], f"numa_nodes[{i}].cpus"),
                {_node_key(k, f"numa_nodes[{i}].distances"): _int(v, f"numa_nodes[{i}].distances[{clip(k, 20)}]")
                 for k, v in dist.items()},
                _int(n.get("memory_kb"), f"numa_nodes[{i}].memory_kb", optional=True),
                None if n.get("local_cpus") is None else _cpus(n["local_cpus"], f"numa_nodes[{i}].local_cpus"),
            )
        )
    l3_groups = [L3Group(_cpus(g, f"l3_groups[{i}]")) for i, g in enumerate(_list(data, "l3_groups"))]
    cores = []
    for i, c in enumerate(_list(data, "cores")):
        c = _obj(c, f"cores[{i}]")
        pus = c["pus"]
        if not isinstance(pus, list) or not pus:
            raise _Bad(f"cores[{i}].pus must be a non-empty list of CPU ids")
        package = _int(c["package"], f"cores[{i}].package")
        if not 0 <= package < len(packages):
            raise _Bad(f"cores[{i}].package {package} is not a package index (0..{len(packages) - 1})")
        l3 = _int(c.get("l3"), f"cores[{i}].l3", optional=True)
        if l3 is not None and not 0 <= l3 < len(l3_groups):
            raise _Bad(f"cores[{i}].l3 {l3} is not an L3 group index")
        cores.append(
            Core(
                _int(c["os_index"], f"cores[{i}].os_index"),
                tuple(_cpu(p, f"cores[{i}].pus") for p in pus),
                package,
                _int(c.get("numa_node"), f"cores[{i}].numa_node", optional=True),
                l3,
            )
        )
    gpus = []
    gpu_at: list[int] = []  # each kept GPU's position in the file's "gpus"
    gpu_notes: list[str] = []
    seen_pci: dict[str, int] = {}
    for i, g in enumerate(_list(data, "gpus")):
        g = _obj(g, f"gpus[{i}]")
        vendor = _str(g["vendor"], f"gpus[{i}].vendor")
        if vendor not in ("nvidia", "amd", "intel"):
            raise _Bad(f"gpus[{i}].vendor must be nvidia, amd or intel, not {short(vendor, 20)}")
        given = _str(g["pci"], f"gpus[{i}].pci")
        pci = pci_address(given)
        if pci is None:
            raise _Bad(f"gpus[{i}].pci {short(given, 40)} is not a PCI address (dddd:bb:dd.f)")
        if pci in seen_pci:
            gpu_notes.append(f"gpus[{i}] has the PCI address of gpus[{seen_pci[pci]}] ({pci}); it is one GPU, kept once")
            continue
        seen_pci[pci] = i
        gpu_at.append(i)
        gpus.append(
            GPU(
                _int(g["index"], f"gpus[{i}].index"),
                pci,
                vendor,
                _int(g.get("numa_node"), f"gpus[{i}].numa_node", optional=True),
                _cpus(g["cpus"], f"gpus[{i}].cpus"),
                _str(g.get("uuid"), f"gpus[{i}].uuid", optional=True),
                _int(g.get("memory_node"), f"gpus[{i}].memory_node", optional=True),
                _int(g.get("vendor_index"), f"gpus[{i}].vendor_index", optional=True),
                pci_path_from_json(g.get("pci_path", []), f"gpus[{i}].pci_path"),
            )
        )
    online = _cpus(data["online"], "online")
    allowed = _cpus(data["allowed"], "allowed")
    if not allowed:
        raise _Bad("\"allowed\" is empty: a topology needs at least one allowed CPU")
    if not allowed <= online:
        raise _Bad(f"allowed CPUs {format_cpulist(allowed - online)} are not online")
    stray = {p for c in cores for p in c.pus} - online
    if stray:
        raise _Bad(f"cores list CPUs {format_cpulist(stray)} that are not online")
    _consistent(nodes, cores, gpus, gpu_at, online, len(_list(data, "gpus")))
    mems = data.get("allowed_mems")
    warnings = _list(data, "warnings") if "warnings" in data else []
    kinds = kinds_from_json(data.get("core_kinds"), online)
    nics, nic_notes = nics_from_json(data.get("nics", []), frozenset(n.os_index for n in nodes))
    return Topology(
        packages=tuple(packages),
        numa_nodes=tuple(nodes),
        l3_groups=tuple(l3_groups),
        cores=tuple(cores),
        online=online,
        offline=_cpus(data["offline"], "offline"),
        allowed=allowed,
        allowed_mems=None if mems is None else _cpus(mems, "allowed_mems"),
        gpus=tuple(gpus),
        source=_str(data.get("source", "snapshot"), "source"),
        warnings=(*(_str(w, "warnings[]") for w in warnings), *gpu_notes, *kinds.warnings, *nic_notes),
        core_kinds=CoreKinds(kinds.kinds),
        nics=nics,
        priority=priority_from_json(data.get("priority_cores"), online),
        cpu_quota=_quota(data.get("cpu_quota")),
        cpu_quota_source=None if data.get("cpu_quota_source") is None else one_line(_str(data["cpu_quota_source"],
                                                                                          "cpu_quota_source")),
    )


def _consistent(nodes: list[NumaNode], cores: list[Core], gpus: list[GPU], gpu_at: list[int],
                online: frozenset[int], listed: int) -> None:
    """Refuse what affrun's readers never write (a hand-edited snapshot): two NUMA nodes of one id or sharing a CPU,
    a node, core or GPU naming CPUs that are not online, a core on a node that does not hold it, GPU indexes that
    are not among the ``listed`` entries' 0..n-1, each once (a duplicate GPU dropped leaves a gap). Read from such a file, the plan would bind to a node the machine lacks."""
    ids = [(f"numa_nodes[{i}].os_index", n.os_index) for i, n in enumerate(nodes)]
    ids += [(f"cores[{i}].numa_node", c.numa_node) for i, c in enumerate(cores) if c.numa_node is not None]
    for field, node_id in ids:  # an id no machine has first: said as such, not as a node missing its CPUs
        if not 0 <= node_id <= MAX_NODE_ID:
            raise _Bad(f"{field}: NUMA node {id_text(node_id)} is outside 0..{MAX_NODE_ID}")
    node_at: dict[int, int] = {}
    owner: dict[int, int] = {}  # CPU -> the node that holds it
    for i, node in enumerate(nodes):
        if node.os_index in node_at:
            raise _Bad(f"numa_nodes[{i}].os_index {node.os_index} is also numa_nodes[{node_at[node.os_index]}]'s")
        node_at[node.os_index] = i
        if node.cpus - online:
            raise _Bad(f"numa_nodes[{i}].cpus lists CPUs {format_cpulist(node.cpus - online)} that are not online")
        common = node.cpus & owner.keys()
        if common:
            raise _Bad(f"numa_nodes[{i}].cpus lists CPUs {format_cpulist(common)} of NUMA node "
                       f"{owner[min(common)]}; a CPU is in one node")
        owner.update(dict.fromkeys(node.cpus, node.os_index))
    for i, core in enumerate(cores):
        if core.numa_node is not None and not any(owner.get(p) == core.numa_node for p in core.pus):
            raise _Bad(f"cores[{i}].numa_node {core.numa_node} is not a NUMA node holding its CPUs "
                       f"{format_cpulist(core.pus)}")
    index_at: dict[int, int] = {}
    for at, gpu in zip(gpu_at, gpus):
        if not 0 <= gpu.index < listed:
            raise _Bad(f"gpus[{at}].index {short(gpu.index, 20)} is not a GPU index (0..{listed - 1})")
        if gpu.index in index_at:
            raise _Bad(f"gpus[{at}].index {gpu.index} is also gpus[{index_at[gpu.index]}]'s")
        index_at[gpu.index] = at
        if gpu.cpus - online:
            raise _Bad(f"gpus[{at}].cpus lists CPUs {format_cpulist(gpu.cpus - online)} that are not online")


def _quota(value: object) -> float | None:
    """``cpu_quota``: a positive, finite number of CPUs, or null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise _Bad(f"cpu_quota: expected a positive number of CPUs or null (got {str(value)[:40]})")
    return float(value)


def load_snapshot(path: str) -> Topology:
    return snapshot_topology(read_document(path, "an affrun topology snapshot"), path)


def snapshot_topology(data: bytes, path: str) -> Topology:
    """The topology of snapshot JSON ``data`` read from ``path``."""
    try:
        parsed = load_json(data)
    except BadJSON as exc:
        if str(exc) == "not UTF-8 text":
            raise TopologyError(f"{path}: not a text file (expected an affrun topology snapshot, JSON)") from None
        raise TopologyError(f"{path}: {exc}") from None
    return replace(from_snapshot(parsed, path), loaded_from=f"snapshot {path}")
