"""NICs from sysfs: RDMA devices (``sys/class/infiniband``) and network interfaces (``sys/class/net``), each an OS
device under its PCI function; what a NIC's name may be (every source) and what a rank may be handed. Data the
kernel does not write gives a warning and no NIC, within a bound. What is read, and why: docs/nics.md."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from launcher.base.errors import TopologyError
from launcher.base.pci import pci_order, sysfs_pci_path
from launcher.base.untrusted import ascii_int, ascii_uint, short
from launcher.topology._files import machine_path, read_cpus, read_int, read_text
from launcher.topology.fsroot import isdir, lexists, listdir
from launcher.topology.gpus import node_holding
from launcher.topology.model import NIC, NicPort

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from launcher.base.choices import NicKind, PortState

MAX_ENTRIES = 1024  # entries of one class directory read at most (a host of containers has hundreds of veths)
MAX_PORTS = 16
MAX_WARNINGS = 16  # NIC warnings shown one by one; the rest are counted in one more
MAX_RATE_GBPS = 1e6  # a port rate at or above this is none (the fastest links today are below 2,000 Gb/s)
# Interfaces no NIC is named like: skipped by name, before any read (the device-link test would skip them too).
VIRTUAL = ("lo", "docker", "veth", "br-", "virbr", "cali", "flannel", "cni", "tun", "tap", "vxlan", "kube", "dummy")
# ports/N/state: "4: ACTIVE" (include/rdma/ib_verbs.h, enum ib_port_state)
IB_STATES: dict[int, PortState] = {1: "down", 2: "init", 3: "armed", 4: "active", 5: "active"}
# ports/N/link_layer, as drivers/infiniband/core/sysfs.c writes it
LINK_LAYERS = {"infiniband": False, "ethernet": True, "unknown": False}  # -> RoCE
# net/<if>/operstate (RFC 2863 words, Documentation/ABI/testing/sysfs-class-net)
OPER_STATES: dict[str, PortState] = {
    "up": "active", "down": "down", "lowerlayerdown": "down", "notpresent": "down", "dormant": "down",
    "testing": "down", "unknown": "unknown",
}
NET_TYPES: dict[int, NicKind] = {1: "ethernet", 32: "ipoib"}  # net/<if>/type (ARPHRD_ETHER, ARPHRD_INFINIBAND)
UNKNOWN_SPEEDS = frozenset({-1, 0, 0xFFFFFFFF})  # net/<if>/speed: SPEED_UNKNOWN, and -1 printed unsigned


MAX_NAME = 255  # NAME_MAX: the longest name a sysfs entry can have; longer ones come from XML or JSON only
MAX_DEVICE = 31  # UCX keeps a device string (mlx5_0:1) in 32 bytes with its NUL (UCT_DEVICE_NAME_MAX)
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def name_problem(name: str) -> str | None:
    """Why ``name`` is no device name at all (empty, longer than :data:`MAX_NAME`, holding ``/`` or NUL), else
    ``None``: anything else is a name, read as it is (docs/nics.md)."""
    if not name:
        return "an empty name"
    if len(name) > MAX_NAME:
        return f"a name of {len(name)} characters, more than {MAX_NAME}"
    if "/" in name or "\0" in name:
        return "a name with '/' or NUL, which no device name can hold"
    return None


def device_problem(name: str, port: int | None) -> str | None:
    """Why the device string of NIC ``name`` (``name:port`` for an RDMA port, ``name`` for an interface) cannot be
    handed to a rank, else ``None``: a character other than ASCII letters, digits, ``_``, ``.`` and ``-``, more
    than :data:`MAX_DEVICE` characters, or ``all`` (UCX's device-list syntax: docs/nics.md)."""
    device = name if port is None else f"{name}:{port}"
    if not name:
        return "an empty name"
    odd = next((c for c in name if c not in PLAIN), None)
    if odd is not None:
        return f"{odd!r} is not a letter, digit, '_', '.' or '-'"
    if len(device) > MAX_DEVICE:
        return f"{len(device)} characters, more than UCX's {MAX_DEVICE}"
    if name == "all":
        return "UCX reads 'all' as every device"
    return None


def read_nics(root: str, nodes: Mapping[int, frozenset[int]]) -> tuple[list[NIC], list[str]]:
    """The NICs under ``root`` in PCI order (then by name), and warnings. ``nodes`` maps every NUMA node that exists
    to its CPUs: a NIC the kernel places on another node is not read; one it places on none (``numa_node`` -1) is
    on the node whose CPUs hold all of its ``local_cpulist``, if there is exactly one (as hwloc and affrun's GPUs)."""
    warnings: list[str] = []
    found = [*_class_devices(root, "infiniband", nodes, warnings), *_class_devices(root, "net", nodes, warnings)]
    return sorted_nics(found, warnings), capped(warnings)


def sorted_nics(nics: Iterable[NIC], warnings: list[str]) -> list[NIC]:
    """``nics`` in PCI order, then by name, without those whose name another NIC of the same family (RDMA device or
    interface) also has: ``AFFRUN_NIC`` and ``UCX_NET_DEVICES`` name a device, and that name would name two."""
    seen: dict[tuple[bool, str], int] = {}
    for nic in nics:
        seen[(nic.rdma, nic.name)] = seen.get((nic.rdma, nic.name), 0) + 1
    for (_, name), count in seen.items():
        if count > 1:
            warnings.append(f"{count} NICs are named {short(name, 40)}; none of them is read as a NIC")
    kept = [n for n in nics if seen[(n.rdma, n.name)] == 1]
    return sorted(kept, key=lambda n: (pci_order(n.pci), n.name))


def capped(warnings: list[str]) -> list[str]:
    """The first :data:`MAX_WARNINGS` warnings, and one that counts the rest."""
    if len(warnings) <= MAX_WARNINGS:
        return warnings
    return [*warnings[:MAX_WARNINGS], f"{len(warnings) - MAX_WARNINGS} more NIC warnings like these"]


def _names(base: str, net: bool, warnings: list[str]) -> list[str]:
    try:
        entries = listdir(base)
    except (OSError, ValueError):
        return []
    names = sorted(e for e in entries if not (net and (e == "lo" or e.startswith(VIRTUAL[1:]))))
    if len(names) > MAX_ENTRIES:
        warnings.append(f"{short(base, 120)}: {len(names)} entries, more than {MAX_ENTRIES}; no NIC is read from it")
        return []
    return names


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


def _device_path(path: str) -> str | None:
    """The real path of ``path`` as the machine names it (``/sys/devices/...``), links kept inside the fsroot;
    ``None`` when it does not resolve (missing, dangling, looping) or lies outside ``/sys/devices``."""
    real = machine_path(path)
    return real if real is not None and real.startswith("/sys/devices/") else None


def _read_one(root: str, name: str, net: bool, nodes: Mapping[int, frozenset[int]]) -> NIC | str | None:
    """The NIC ``name`` of its class, ``None`` when it is none (a loopback type), or why it cannot be read."""
    problem = name_problem(name)
    if problem:
        return problem
    dev = os.path.join(root, "sys/class", "net" if net else "infiniband", name)
    own = _device_path(dev)
    if own is None or os.path.basename(own) != name:
        return "the class entry is no link to a device of that name under /sys/devices"
    link = os.path.join(dev, "device")
    real = _device_path(link)
    location = sysfs_pci_path(real) if real is not None else None
    if location is None:
        return (f"{short(link, 120)} does not lead to a PCI function under a host bridge in /sys/devices "
                "(missing, dangling, looping or elsewhere)")
    address, path = location
    bus_entry = os.path.join(root, "sys/bus/pci/devices", address)
    function = bus_entry if isdir(bus_entry) else link  # a virtio NIC's link names the virtio device, not the function
    node = read_int(os.path.join(function, "numa_node"))
    if node is not None and node >= 0 and node not in nodes:
        return f"the kernel places it on NUMA node {node}, which does not exist here"
    numa = node if node is not None and node >= 0 else node_holding(
        read_cpus(os.path.join(function, "local_cpulist"), os.path.join(function, "local_cpus")) or frozenset(), nodes)
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


def _port_numbers(ports_dir: str) -> tuple[list[int], str | None]:
    """The port numbers of ``ports/`` (1..255, each written as the kernel writes it: ``1``, never ``01``), or why
    an entry there is no port."""
    try:
        entries = listdir(ports_dir)
    except (OSError, ValueError):
        return [], None
    if len(entries) > MAX_PORTS:
        return [], f"{len(entries)} entries in ports/, more than {MAX_PORTS}"
    numbers: list[int] = []
    for entry in sorted(entries):
        number = ascii_uint(entry)
        if number is None or str(number) != entry or not 1 <= number <= 255:
            return [], f"ports/{short(entry, 40)} is no port number (1..255)"
        numbers.append(number)
    return sorted(numbers), None


def _ib_ports(dev: str) -> tuple[tuple[NicPort, ...], str | None, bool]:
    """(ports, what is wrong, whether the first port's link layer is Ethernet: RoCE)."""
    ports_dir = os.path.join(dev, "ports")
    numbers, problem = _port_numbers(ports_dir)
    if problem:
        return (), problem, False
    ports: list[NicPort] = []
    roce = False
    for number in numbers:
        pdir = os.path.join(ports_dir, str(number))
        text = read_text(os.path.join(pdir, "state")) or ""
        code = ascii_uint(text.partition(":")[0].strip())
        state = IB_STATES.get(code) if code is not None else None
        if state is None:
            return (), f"port {number}'s state is not a port state ({short(text, 40)})", False
        layer = read_text(os.path.join(pdir, "link_layer"))
        ethernet = LINK_LAYERS.get(layer.lower()) if layer else False
        if ethernet is None:
            return (), f"port {number}'s link layer is none ({short(layer, 40)})", False
        if number == numbers[0]:
            roce = ethernet
        rate, problem = ib_rate(read_text(os.path.join(pdir, "rate")))
        if problem:
            return (), f"port {number}'s rate {problem}", False
        ports.append(NicPort(number, state, rate))
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
    rate, problem = net_rate(speed)
    return ((), f"speed {problem}") if problem else ((NicPort(1, state, rate),), None)


def ib_rate(text: str | None) -> tuple[float | None, str | None]:
    """``ports/N/rate`` (``400 Gb/sec (4X NDR)``, ``2.5 Gb/sec (1X SDR)``) in Gb/s, ``None`` when absent or 0; or
    why it is no rate."""
    if not text:
        return None, None
    words = text.split()
    value = _decimal(words[0])
    if value is None or len(words) < 2 or words[1] != "Gb/sec" or value >= MAX_RATE_GBPS:
        return None, f"is not a rate in Gb/sec below {MAX_RATE_GBPS:,.0f} ({short(text, 40)})"
    return (value or None), None


def net_rate(text: str | None) -> tuple[float | None, str | None]:
    """``net/<if>/speed`` (Mb/s) in Gb/s, ``None`` when absent or unknown (-1, 0); or why it is no speed."""
    if not text:
        return None, None
    value = ascii_int(text)
    if value in UNKNOWN_SPEEDS:
        return None, None
    if value is None or value < 0 or value * 1e-3 >= MAX_RATE_GBPS:
        return None, f"is not a speed in Mb/s ({short(text, 40)})"
    return value * 1e-3, None


def _decimal(text: str) -> float | None:
    """``400`` or ``2.5`` (ASCII digits, at most 12 characters) as a number, else ``None`` (no sign, exponent,
    ``nan`` or ``inf``)."""
    whole, dot, frac = text.partition(".")
    if len(text) > 12 or ascii_uint(whole) is None or (dot and ascii_uint(frac) is None):
        return None
    return float(text)
