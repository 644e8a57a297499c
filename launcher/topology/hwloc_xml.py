"""Read a :class:`Topology` from an hwloc XML export (``lstopo --of xml``; the 1.x, 2.x and 3.x formats) with
``xml.etree``: PUs, Packages, Cores, L3 caches and GPUs here; NUMA nodes: :mod:`launcher.topology.hwloc_xml_numa`;
NICs and PCI paths: :mod:`launcher.topology.nics_xml`. Which attribute means what: docs/design.md §6."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace

from launcher.base.cpulist import MAX_CPU_ID, format_cpulist
from launcher.base.errors import TopologyError
from launcher.base.pci import pci_address, pci_order
from launcher.base.untrusted import ascii_hex, ascii_uint, clip, short
from launcher.topology._files import read_document
from launcher.topology.gpus import EXCLUDED_DEVICES, EXCLUDED_VENDORS, GPU_CLASSES, VENDORS
from launcher.topology.hwloc_xml_numa import (
    BadXML,
    XmlNode,
    int_attr,
    locality_node,
    mask,
    narrowing,
    numa_node,
    xml_nodes,
)
from launcher.topology.kinds import CoreKinds, kinds_from_hwloc_xml
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology, checked
from launcher.topology.nics_xml import format_major, xml_pci
from launcher.topology.priority import priority_from_xml

_IO_TYPES = frozenset({"Bridge", "PCIDev", "OSDev"})  # Misc objects have no cpuset, so they are skipped too
_NEWEST_FORMAT = 3  # hwloc 3.x reads XML versions up to 3 and refuses newer ones


@dataclass
class _Pci:
    busid: str
    vendor: int
    locality: ET.Element | None
    uuid: str | None
    vendor_index: int | None  # N of the nvmlN / rsmiN OS device hwloc attached


@dataclass
class _Walk:
    packages: list[tuple[int, list[int]]] = field(default_factory=list)  # (os_index, PUs)
    cores: list[tuple[int, int | None, list[int]]] = field(default_factory=list)  # (os_index, package, PUs)
    l3s: list[list[int]] = field(default_factory=list)
    nodes: list[XmlNode] = field(default_factory=list)
    pus: dict[int, tuple[int | None, int | None, int | None]] = field(default_factory=dict)  # pu -> (pkg, core, l3)
    gpus: list[_Pci] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    outside: list[int] = field(default_factory=list)  # PUs outside the cpuset of an object above them: dropped
    twice: list[int] = field(default_factory=list)  # PUs listed a second time: that PU object is ignored


def load_hwloc_xml(path: str) -> Topology:
    """Parse ``path``; every problem is one :class:`TopologyError` line naming the file."""
    return hwloc_xml_topology(read_document(path, "an hwloc XML export"), path)


def hwloc_xml_topology(data: bytes, path: str) -> Topology:
    """The topology of an hwloc XML document ``data`` read from ``path``."""
    return xml_topology(parse_hwloc_xml(data, path), path)


def parse_hwloc_xml(data: bytes, path: str) -> ET.Element:
    """The ``<topology>`` element of ``data`` (a ``TopologyError`` line when it is none hwloc would import)."""
    try:
        top = ET.fromstring(data)
    except ET.ParseError as exc:
        raise TopologyError(f"{path}: not well-formed XML ({clip(str(exc))})") from None
    except (LookupError, ValueError) as exc:  # encoding="bogus": LookupError; encoding="UTF-7": ValueError
        raise TopologyError(f"{path}: cannot decode the XML ({clip(str(exc))}); hwloc writes UTF-8") from None
    if top.tag != "topology":
        raise TopologyError(f"{path}: not an hwloc topology (root element <{clip(top.tag, 40)}>, expected <topology>)")
    if format_major(top) > _NEWEST_FORMAT:
        raise TopologyError(f"{path}: cannot import XML version {short(top.get('version'), 20)}: hwloc writes 1.x to "
                            f"{_NEWEST_FORMAT}.x (hwloc refuses a newer one too)")
    return top


def xml_topology(top: ET.Element, path: str) -> Topology:
    """The topology of a parsed ``<topology>`` element read from ``path``."""
    roots = top.findall("object")
    if not roots:
        raise TopologyError(f"{path}: <topology> holds no <object>: not an lstopo --of xml export")
    try:
        return checked(_build(path, top, roots[0], len(roots) - 1), path)
    except BadXML as exc:
        raise TopologyError(f"{path}: {exc}") from None


def _walk(machine: ET.Element, major: int) -> _Walk:
    out = _Walk()
    # (element, package index, core index, L3 index, locality: closest non-I/O ancestor with a cpuset,
    #  inside: the CPUs of every cpuset above it, as hwloc narrows each object's cpuset to its parent's; None: all)
    stack: list[tuple[ET.Element, int | None, int | None, int | None, ET.Element | None, frozenset[int] | None]] = [
        (machine, None, None, None, None, None)
    ]
    while stack:
        element, pkg, core, l3, locality, inside = stack.pop()
        kind = element.get("type", "")
        own = narrowing(element) if kind not in _IO_TYPES else None
        if kind in ("Package", "Socket"):
            os_index = int_attr(element, "os_index")
            out.packages.append((-1 if os_index is None else os_index, []))
            pkg = len(out.packages) - 1
        elif kind == "Core":
            os_index = int_attr(element, "os_index")
            out.cores.append((os_index if os_index is not None else -1, pkg, []))
            core = len(out.cores) - 1
        elif kind == "L3Cache" or (kind == "Cache" and element.get("depth") == "3"):
            out.l3s.append([])
            l3 = len(out.l3s) - 1
        elif kind == "NUMANode":
            out.nodes.append(numa_node(element, inside, major, out.warnings))
        elif kind == "PU":
            os_index = int_attr(element, "os_index")
            if os_index is None:
                raise BadXML("a PU object has no os_index")
            if os_index in out.pus:
                out.twice.append(os_index)
            elif inside is not None and os_index not in inside and 0 <= os_index <= MAX_CPU_ID:
                out.outside.append(os_index)
            else:
                out.pus[os_index] = (pkg, core, l3)
                if pkg is not None:
                    out.packages[pkg][1].append(os_index)
                if core is not None:
                    out.cores[core][2].append(os_index)
                if l3 is not None:
                    out.l3s[l3].append(os_index)
        elif kind == "PCIDev":
            pci = _pci_gpu(element, locality)
            if pci is not None:
                out.gpus.append(pci)
        if kind not in _IO_TYPES and element.get("cpuset") is not None:
            locality = element
            if own is not None:
                inside = own if inside is None else own & inside
        children = element.findall("object")
        for child in reversed(children):  # document order: logical order
            stack.append((child, pkg, core, l3, locality, inside))
    return out


def _pci_gpu(element: ET.Element, locality: ET.Element | None) -> _Pci | None:
    """A ``PCIDev`` that is an NVIDIA/AMD/Intel GPU, else ``None``."""
    pci_type = element.get("pci_type", "")
    given = element.get("pci_busid", "")
    parts = pci_type.split()
    if len(parts) < 2 or not given:
        return None
    busid = pci_address(given) or given
    vendor_text, _, device_text = parts[1].strip("[]").partition(":")
    klass, vendor, device = ascii_hex(parts[0]), ascii_hex(vendor_text), ascii_hex(device_text or "0")
    if klass is None or vendor is None or device is None:
        raise BadXML(f"pci_type={short(pci_type, 40)} of PCI device {clip(busid, 20)} is not 'CLASS [VENDOR:DEVICE] ...'")
    if klass not in GPU_CLASSES or vendor in EXCLUDED_VENDORS or vendor not in VENDORS:
        return None
    if (vendor, device) in EXCLUDED_DEVICES:
        return None
    if pci_address(given) is None:
        raise BadXML(f"pci_busid={short(given, 40)} of a GPU is not a PCI address (dddd:bb:dd.f)")
    uuid: str | None = None
    vendor_index: int | None = None
    for osdev in element.iter("object"):
        name = osdev.get("name", "")
        for prefix in ("nvml", "rsmi"):
            number = ascii_uint(name[len(prefix):]) if name.startswith(prefix) else None
            if number is not None:
                vendor_index = number
        for info in osdev.findall("info"):
            if info.get("name") == "NVIDIAUUID" and info.get("value"):
                uuid = info.get("value")
    return _Pci(busid, vendor, locality, uuid, vendor_index)


def _build(path: str, top: ET.Element, machine: ET.Element, extra_roots: int) -> Topology:
    major = format_major(top)
    walk = _walk(machine, major)
    if not walk.pus and walk.outside:
        raise BadXML(f"every PU ({clip(format_cpulist(walk.outside), 40)}) lies outside the cpuset of an object above it")
    if not walk.pus:
        raise BadXML("no PU objects: not an lstopo --of xml export of a machine")
    online = frozenset(walk.pus)
    complete = mask(machine, "complete_cpuset") or online
    v1_online = mask(machine, "online_cpuset")  # hwloc 1.x only: tells offline from disallowed CPUs
    if v1_online is not None and online & v1_online:
        online &= v1_online
        offline = complete - v1_online
    else:
        offline = complete - online  # offline, or disallowed and left out of the export
    allowed_cpuset = mask(machine, "allowed_cpuset")
    allowed = online if allowed_cpuset is None else online & allowed_cpuset
    if not allowed:
        raise BadXML(f"allowed_cpuset {machine.get('allowed_cpuset')} contains none of the PUs ({format_cpulist(online)})")

    packages, package_of_pu = _packages(walk, online)
    nodes, node_of_pu = xml_nodes(top, machine, walk.nodes, online, walk.warnings)
    l3_groups, l3_of_pu = _l3_groups(walk, online)
    cores = _cores(walk, online, package_of_pu, node_of_pu, l3_of_pu)
    gpus, gpu_warnings = _gpus(walk, online, nodes)
    cpukinds: list[tuple[frozenset[int], dict[str, str]]] = []
    kinds = kinds_from_hwloc_xml(top, online, path, cpukinds)
    node_ids = frozenset(n.os_index for n in nodes)
    pci_paths, nics, nic_warnings = xml_pci(machine, lambda element: locality_node(element, nodes), major)
    gpus = tuple(replace(g, pci_path=pci_paths.get(g.pci, ())) for g in gpus)
    allowed_nodeset = mask(machine, "allowed_nodeset")
    allowed_mems = None if allowed_nodeset is None or allowed_nodeset >= node_ids else allowed_nodeset & node_ids
    return Topology(
        packages=packages,
        numa_nodes=nodes,
        l3_groups=l3_groups,
        cores=cores,
        online=online,
        offline=offline,
        allowed=allowed,
        gpus=gpus,
        source=f"hwloc-xml {path}",
        allowed_mems=allowed_mems,
        warnings=(*_structure_warnings(walk, extra_roots), *gpu_warnings, *kinds.warnings, *nic_warnings),
        core_kinds=CoreKinds(kinds.kinds),
        nics=tuple(nics),
        priority=priority_from_xml(top, cpukinds, [c.pus for c in cores], online),
    )


def _structure_warnings(walk: _Walk, extra_roots: int) -> list[str]:
    """What in the file's tree hwloc would not read as written: each a warning line."""
    out = list(walk.warnings)
    if walk.outside:
        out.append(f"PU(s) {clip(format_cpulist(walk.outside), 40)} lie outside the cpuset of an object above them; "
                   "hwloc drops such PUs, and so does affrun")
    if walk.twice:
        out.append(f"PU(s) {clip(format_cpulist(walk.twice), 40)} are listed twice in the XML; each is kept where it "
                   "is first listed")
    if extra_roots:
        out.append(f"<topology> holds {extra_roots} more <object> after the root object; hwloc reads one root object, "
                   "so they are ignored")
    return out


def _packages(walk: _Walk, online: frozenset[int]) -> tuple[tuple[Package, ...], dict[int, int]]:
    """Packages with online PUs (a package of only disallowed or offline CPUs has none), plus a synthetic one
    for PUs outside every Package object."""
    package_of_pu: dict[int, int] = {}
    packages: list[Package] = []
    for os_index, pus in walk.packages:
        cpus = frozenset(pus) & online
        if cpus:
            for p in cpus:
                package_of_pu.setdefault(p, len(packages))
            packages.append(Package(os_index=os_index, cpus=cpus))
    loose = online - frozenset(package_of_pu)
    if loose:
        for p in loose:
            package_of_pu[p] = len(packages)
        packages.append(Package(os_index=-1 if walk.packages else 0, cpus=loose))
    return tuple(packages), package_of_pu


def _l3_groups(walk: _Walk, online: frozenset[int]) -> tuple[tuple[L3Group, ...], dict[int, int]]:
    sets: list[frozenset[int]] = []
    for pus in walk.l3s:
        cpus = frozenset(pus) & online
        if cpus and cpus not in sets:
            sets.append(cpus)
    sets.sort(key=min)
    l3_of_pu: dict[int, int] = {}
    for i, cpus in enumerate(sets):
        for p in cpus:
            l3_of_pu.setdefault(p, i)
    return tuple(L3Group(cpus) for cpus in sets), l3_of_pu


def _cores(
    walk: _Walk,
    online: frozenset[int],
    package_of_pu: dict[int, int],
    node_of_pu: dict[int, int],
    l3_of_pu: dict[int, int],
) -> tuple[Core, ...]:
    core_sets: list[tuple[int, tuple[int, ...]]] = []
    in_core: set[int] = set()
    for os_index, _pkg, pus in walk.cores:
        members = tuple(sorted(set(pus) & online))
        if members:
            core_sets.append((os_index, members))
            in_core.update(members)
    core_sets.extend((p, (p,)) for p in sorted(online - in_core))  # PUs with no Core above them
    split: list[int] = []
    for i, (os_index, members) in enumerate(list(core_sets)):
        by_node: dict[int | None, list[int]] = {}
        for p in members:
            by_node.setdefault(node_of_pu.get(p), []).append(p)
        if len(by_node) > 1:  # a rank never gets one core whose PUs are on two nodes
            split.append(os_index)
            parts = [tuple(part) for part in by_node.values()]
            core_sets[i] = (os_index, parts[0])
            core_sets.extend((os_index, part) for part in parts[1:])
    if split:
        walk.warnings.append(f"Core(s) P#{clip(', '.join(map(str, sorted(set(split)))), 40)} have PUs on two NUMA nodes; each is read as "
                             "one core per node")
    cores = []
    for os_index, members in sorted(core_sets, key=lambda c: c[1][0]):
        first = members[0]
        cores.append(Core(os_index, members, package_of_pu[first], node_of_pu.get(first), l3_of_pu.get(first)))
    return tuple(cores)


def _gpus(walk: _Walk, online: frozenset[int], nodes: tuple[NumaNode, ...]) -> tuple[tuple[GPU, ...], tuple[str, ...]]:
    """GPUs in PCI bus order; locality from the first non-I/O ancestor's cpuset and nodeset."""
    gpus: list[GPU] = []
    warnings: list[str] = []
    nvidia = 0
    listed: set[str] = set()
    for pci in sorted(walk.gpus, key=lambda g: pci_order(g.busid)):
        if pci.busid in listed:  # one address in two PCIDev objects (or two spellings of it): one GPU
            warnings.append(f"GPU {pci.busid} is listed twice in the XML; it is one GPU")
            continue
        listed.add(pci.busid)
        vendor_index = pci.vendor_index
        if pci.vendor == 0x10DE:  # NVML numbers NVIDIA GPUs in PCI bus order
            vendor_index = nvidia if vendor_index is None else vendor_index
            nvidia += 1
        cpus: frozenset[int] = frozenset()
        if pci.locality is not None:
            cpus = (mask(pci.locality, "complete_cpuset") or mask(pci.locality, "cpuset") or frozenset()) & online
        numa = locality_node(pci.locality, nodes)
        if numa is None:
            warnings.append(f"GPU {pci.busid}: the XML gives no single NUMA node for it; locality taken from its cpuset")
        gpus.append(GPU(len(gpus), pci.busid, VENDORS[pci.vendor], numa, cpus, pci.uuid, vendor_index=vendor_index))
    return tuple(gpus), tuple(warnings)


