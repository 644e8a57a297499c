"""Read NICs from sysfs: RDMA devices (``sys/class/infiniband``) and network interfaces (``sys/class/net``).

Each is an OS device under its PCI function (hwloc's vocabulary): the ``device`` link gives the function, its PCI
path and NUMA node. Virtual interfaces (``lo``, ``docker0``, ``veth*``) have no ``device`` link and are no NICs.
Hostile data (a link that loops, a garbage port state, a node that does not exist, thousands of entries) gives
a warning and no NIC, within a bound. Why each field is read: docs/nics.md.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.untrusted import ascii_uint, short
from launcher.errors import TopologyError
from launcher.topology._files import numbered_entries, pci_location, read_cpus, read_int, read_text
from launcher.topology.fsroot import isdir, lexists, listdir
from launcher.topology.model import NIC, NicPort
from launcher.topology.pci import pci_order

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.base.choices import NicKind, PortState

MAX_ENTRIES = 1024  # entries of one class directory read at most (a host of containers has hundreds of veths)
MAX_PORTS = 16
# Interfaces no NIC is named like: skipped by name, before any read (the device-link test would skip them too).
VIRTUAL = ("lo", "docker", "veth", "br-", "virbr", "cali", "flannel", "cni", "tun", "tap", "vxlan", "kube", "dummy")
# ports/N/state: "4: ACTIVE" (include/rdma/ib_verbs.h, enum ib_port_state)
IB_STATES: dict[int, PortState] = {1: "down", 2: "init", 3: "armed", 4: "active", 5: "active"}
# net/<if>/operstate (RFC 2863 words, Documentation/ABI/testing/sysfs-class-net)
OPER_STATES: dict[str, PortState] = {
    "up": "active", "down": "down", "lowerlayerdown": "down", "notpresent": "down", "dormant": "down",
    "testing": "down", "unknown": "unknown",
}
NET_TYPES: dict[int, NicKind] = {1: "ethernet", 32: "ipoib"}  # net/<if>/type (ARPHRD_ETHER, ARPHRD_INFINIBAND)


def read_nics(root: str, nodes: Mapping[int, frozenset[int]]) -> tuple[list[NIC], list[str]]:
    """The NICs under ``root`` in PCI order (then by name), and warnings. ``nodes`` maps every NUMA node that exists
    to its CPUs: a NIC the kernel places on another node is not read; one it places on none (``numa_node`` -1) is
    on the node whose CPUs hold all of its ``local_cpulist``, if there is exactly one (as hwloc and affrun's GPUs)."""
    warnings: list[str] = []
    found = [*_class_devices(root, "infiniband", nodes, warnings), *_class_devices(root, "net", nodes, warnings)]
    found.sort(key=lambda n: (pci_order(n.pci), n.name))
    return found, warnings


def _names(base: str, net: bool, warnings: list[str]) -> list[str]:
    try:
        entries = listdir(base)
    except (OSError, ValueError):
        return []
    names = sorted(e for e in entries if not (net and (e == "lo" or e.startswith(VIRTUAL[1:]))))
    if len(names) > MAX_ENTRIES:
        warnings.append(f"{short(base, 120)}: {len(names)} entries, more than {MAX_ENTRIES}; no NIC is read from it")
        return []
    odd = [n for n in names if not n.isprintable() or not n.isascii() or len(n) > 64]
    if odd:
        warnings.append(f"{short(base, 120)}: {len(odd)} entr{'y has' if len(odd) == 1 else 'ies have'} a name "
                        f"that is no device name ({short(odd[0], 40)}); not read as NICs")
    return [n for n in names if n not in odd]


def _class_devices(root: str, klass: str, nodes: Mapping[int, frozenset[int]], warnings: list[str]) -> list[NIC]:
    net = klass == "net"
    base = os.path.join(root, "sys/class", klass)
    out: list[NIC] = []
    for name in _names(base, net, warnings):
        if net and not lexists(os.path.join(base, name, "device")):
            continue  # a virtual interface
        try:
            nic = _read_one(root, name, net, nodes)
        except TopologyError as exc:  # a file that is not what the kernel writes (read_int, read_bytes)
            nic = f"{exc}"
        if isinstance(nic, str):
            warnings.append(f"NIC {short(name, 40)}: {nic}; not read as a NIC")
        elif nic is not None:
            out.append(nic)
    return out


def _read_one(root: str, name: str, net: bool, nodes: Mapping[int, frozenset[int]]) -> NIC | str | None:
    """The NIC ``name`` of its class, ``None`` when it is none (a loopback type), or why it cannot be read."""
    dev = os.path.join(root, "sys/class", "net" if net else "infiniband", name)
    link = os.path.join(dev, "device")
    location = pci_location(link)
    if location is None:
        return f"{short(link, 120)} does not lead to a PCI function under a host bridge (missing, dangling or looping)"
    address, path = location
    bus_entry = os.path.join(root, "sys/bus/pci/devices", address)
    function = bus_entry if isdir(bus_entry) else link  # a virtio NIC's link names the virtio device, not the function
    node = read_int(os.path.join(function, "numa_node"))
    if node is not None and node >= 0 and node not in nodes:
        return f"the kernel places it on NUMA node {node}, which does not exist here"
    numa = node if node is not None and node >= 0 else _node_of(function, nodes)
    if net:
        kind = NET_TYPES.get(read_int(os.path.join(dev, "type")) or 1)
        if kind is None:
            return None
        ports, problem = _net_port(dev)
    else:
        kind = "infiniband"
        ports, problem, roce = _ib_ports(dev)
        kind = "roce" if roce else kind
    if problem:
        return problem
    return NIC(name=name, pci=address, kind=kind, numa_node=numa, ports=ports, pci_path=path)


def _node_of(function: str, nodes: Mapping[int, frozenset[int]]) -> int | None:
    """The one node whose CPUs hold every CPU of the function's ``local_cpulist``; None when none or several do."""
    cpus = read_cpus(os.path.join(function, "local_cpulist"), os.path.join(function, "local_cpus"))
    holders = [n for n, node_cpus in nodes.items() if cpus and node_cpus and cpus <= node_cpus]
    return holders[0] if len(holders) == 1 else None


def _ib_ports(dev: str) -> tuple[tuple[NicPort, ...], str | None, bool]:
    """(ports, what is wrong, whether the first port's link layer is Ethernet: RoCE)."""
    ports_dir = os.path.join(dev, "ports")
    numbers = numbered_entries(ports_dir, "")
    if len(numbers) > MAX_PORTS or any(not 1 <= n <= 255 for n in numbers):
        return (), f"{short(ports_dir, 120)}: {len(numbers)} ports, numbered {numbers[0]}..{numbers[-1]}", False
    ports: list[NicPort] = []
    roce = False
    for number in numbers:
        pdir = os.path.join(ports_dir, str(number))
        text = read_text(os.path.join(pdir, "state")) or ""
        code = ascii_uint(text.partition(":")[0].strip())
        state = IB_STATES.get(code) if code is not None else None
        if state is None:
            return (), f"port {number}'s state is not a port state ({short(text, 40)})", False
        if number == numbers[0]:
            roce = (read_text(os.path.join(pdir, "link_layer")) or "").lower() == "ethernet"
        ports.append(NicPort(number, state, _gbps(read_text(os.path.join(pdir, "rate")), 1.0)))
    return tuple(ports), None, roce


def _net_port(dev: str) -> tuple[tuple[NicPort, ...], str | None]:
    text = read_text(os.path.join(dev, "operstate")) or "unknown"
    state = OPER_STATES.get(text.lower())
    if state is None:
        return (), f"operstate is not an interface state ({short(text, 40)})"
    try:
        speed = read_text(os.path.join(dev, "speed"))  # EINVAL while the link is down: read as absent
    except TopologyError:
        speed = None
    return (NicPort(1, state, _gbps(speed, 1e-3)),), None


def _gbps(text: str | None, scale: float) -> float | None:
    """``400 Gb/sec (4X NDR)`` (scale 1) or ``100000`` Mb/s (scale 1e-3) in Gb/s; ``None`` when unknown."""
    if not text:
        return None
    head = text.split()[0]
    whole, dot, frac = head.partition(".")
    if ascii_uint(whole) is None or (dot and ascii_uint(frac) is None) or len(head) > 12:
        return None
    value = float(head) * scale
    return value if value > 0 else None
