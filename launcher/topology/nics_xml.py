"""NICs and PCI paths from an hwloc XML export: OpenFabrics and Network ``OSDev`` objects under their ``PCIDev``,
whose ``Bridge`` ancestors give the PCI path (host bridges named as sysfs names them). What each attribute says in
each format: docs/nics.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from launcher.base.pci import host_bridge, pci_address
from launcher.base.untrusted import ascii_uint, short
from launcher.topology.model import NIC, NicPort
from launcher.topology.nics import IB_STATES, MAX_ENTRIES, MAX_PORTS, capped, name_problem, sorted_nics

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET
    from collections.abc import Callable

    from launcher.base.choices import NicKind, PortState

_NON_IO = frozenset({"Bridge", "PCIDev", "OSDev", "Misc"})
_V3_NETWORK, _V3_OPENFABRICS = 1 << 4, 1 << 5  # hwloc 3.x HWLOC_OBJ_OSDEV_NETWORK, HWLOC_OBJ_OSDEV_OPENFABRICS
NetworkType = Literal["network", "openfabrics"]


def network_type(osdev_type: str | None, format_major: int) -> NetworkType | None:
    """What an ``OSDev``'s ``osdev_type`` says of it in an export of hwloc's XML format ``format_major``: OpenFabrics,
    Network, or neither (another device, or no decimal number)."""
    code = ascii_uint(osdev_type or "")
    if code is None:
        return None
    if format_major < 3:
        return "openfabrics" if code == 3 else "network" if code == 2 else None
    return "openfabrics" if code & _V3_OPENFABRICS else "network" if code & _V3_NETWORK else None


def format_major(top: ET.Element) -> int:
    """The major number of ``<topology version="M.m">``: 1 when absent (hwloc 1.x writes none) or unreadable."""
    major = ascii_uint((top.get("version") or "").partition(".")[0])
    return 1 if major is None else major


def xml_pci(machine: ET.Element, node_of: Callable[[ET.Element | None], int | None],
            major: int) -> tuple[dict[str, tuple[str, ...]], list[NIC], list[str]]:
    """(PCI address -> PCI path of every ``PCIDev``, the NICs in PCI order, warnings) of an export in XML format
    ``major``. ``node_of``: the NUMA node of an I/O object whose first non-I/O ancestor (with a cpuset) is the
    element given. Only an ``OSDev`` that is a child of its ``PCIDev`` is a NIC (one elsewhere, or nested in another
    ``OSDev``, has no PCI function)."""
    paths: dict[str, tuple[str, ...]] = {}
    nics: list[NIC] = []
    warnings: list[str] = []
    listed = 0  # network OS devices under a PCIDev; past MAX_ENTRIES they are counted, not read
    stack: list[tuple[ET.Element, tuple[str, ...], ET.Element | None]] = [(machine, (), None)]
    while stack:
        element, path, locality = stack.pop()
        kind = element.get("type", "")
        below = path
        if kind == "Bridge":
            if (element.get("bridge_type") or "").startswith("0-"):
                below = (_host_bridge(element.get("bridge_pci") or ""),)
            elif path:
                below = (*path, pci_address(element.get("pci_busid") or "") or "?")
        elif kind == "PCIDev":
            address = pci_address(element.get("pci_busid") or "")
            if address is not None:
                clean = path if path and "?" not in path and path[0] != "?" else ()
                paths.setdefault(address, clean)
                for osdev in element.findall("object"):
                    net = network_type(osdev.get("osdev_type"), major) if osdev.get("type") == "OSDev" else None
                    if net is None:
                        continue
                    listed += 1
                    nic = _nic(osdev, net, address, clean, node_of(locality), warnings) if listed <= MAX_ENTRIES else None
                    if nic is not None:
                        nics.append(nic)
        elif kind not in _NON_IO and element.get("cpuset") is not None:
            locality = element
        for child in reversed(element.findall("object")):
            stack.append((child, below, locality))
    if listed > MAX_ENTRIES:
        return paths, [], [f"the XML lists {listed} NICs, more than {MAX_ENTRIES}; no NIC is read"]
    return paths, sorted_nics(nics, warnings), capped(warnings)


def _host_bridge(bridge_pci: str) -> str:
    """``0000:[10-15]`` -> ``pci0000:10``; ``?`` when it is not that."""
    domain, _, buses = bridge_pci.partition(":")
    return host_bridge(f"pci{domain}:{buses.strip('[]').partition('-')[0]}") or "?"


def _nic(osdev: ET.Element, net: NetworkType, address: str, path: tuple[str, ...], node: int | None,
         warnings: list[str]) -> NIC | None:
    name = osdev.get("name") or ""
    problem = name_problem(name)
    if problem:
        warnings.append(f"a network device of PCI {address} has {problem} ({short(name, 40)}); not read as a NIC")
        return None
    infos = {i.get("name") or "": i.get("value") or "" for i in osdev.findall("info")}
    if net == "network":
        address_len = len(infos.get("Address", "").split(":"))
        net_kind: NicKind = "ipoib" if address_len == 20 else "ethernet"
        return NIC(name, address, net_kind, node, (NicPort(1, "unknown"),), path)
    ports: dict[int, NicPort] = {}
    for key, value in sorted(infos.items()):
        number = ascii_uint(key[4:-5]) if key.startswith("Port") and key.endswith("State") else None
        if number is None:
            continue
        code = ascii_uint(value.strip())
        state: PortState | None = IB_STATES.get(code) if code is not None else None
        problem = ("is not a port state" if state is None else "is no port number (1..255)" if not 1 <= number <= 255
                   else "lists the port twice" if number in ports else None)
        if problem or len(ports) >= MAX_PORTS:
            why = problem or f"is one port more than {MAX_PORTS}"
            warnings.append(f"NIC {short(name, 40)}: {short(key, 24)}={short(value, 20)} {why}; not read as a NIC")
            return None
        if state is not None:
            ports[number] = NicPort(number, state)
    roce = infos.get("LinkLayer", "").lower() == "ethernet"
    return NIC(name, address, "roce" if roce else "infiniband", node, tuple(ports[n] for n in sorted(ports)), path)
