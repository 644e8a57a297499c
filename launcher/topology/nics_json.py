"""NICs and PCI paths of a topology snapshot (the ``nics`` list of ``affrun topology --save``), read back.

A field of the wrong type refuses the snapshot (:class:`BadNic`, one line), as every other field does; a NIC on a
NUMA node the snapshot does not have, a name two NICs share, or more NICs than a machine has, gives a warning and
no NIC, as in sysfs. A name is read as it is, as sysfs names are (:mod:`launcher.topology.nics_names`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.choices import NIC_KINDS, PORT_STATES
from launcher.base.pci import host_bridge, pci_address
from launcher.base.untrusted import short
from launcher.topology.model import NIC, NicPort
from launcher.topology.nics import MAX_ENTRIES, MAX_PORTS, MAX_RATE_GBPS, capped, sorted_nics
from launcher.topology.nics_names import name_problem

if TYPE_CHECKING:
    from typing import Any

MAX_PATH = 32  # bridges above a device; real trees have fewer than 10


class BadNic(Exception):
    """A NIC field of the snapshot has the wrong type or value (message says which)."""


def pci_path_from_json(value: Any, what: str) -> tuple[str, ...]:
    """A PCI path: empty, or a host bridge (``pci0000:00``) then PCI addresses."""
    if not isinstance(value, list) or len(value) > MAX_PATH or not all(isinstance(v, str) for v in value):
        raise BadNic(f"{what} must be a list of at most {MAX_PATH} strings")
    if not value:
        return ()
    bridge = host_bridge(value[0])
    rest = [pci_address(v) for v in value[1:]]
    if bridge is None or None in rest:
        raise BadNic(f"{what} must be a host bridge (pciDDDD:BB) then PCI addresses, not {short(value, 60)}")
    return (bridge, *(a for a in rest if a is not None))


def nics_from_json(value: Any, node_ids: frozenset[int]) -> tuple[tuple[NIC, ...], tuple[str, ...]]:
    """The ``nics`` list: (NICs in PCI order, warnings)."""
    if not isinstance(value, list):
        raise BadNic("\"nics\" must be a list")
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
    if not isinstance(item, dict):
        raise BadNic(f"{what} must be an object")
    name, pci, kind, node = item.get("name"), item.get("pci"), item.get("kind"), item.get("numa_node")
    problem = name_problem(name) if isinstance(name, str) else "not a string"
    if problem or not isinstance(name, str):
        raise BadNic(f"{what}.name must be a device name, not {short(name, 40)} ({problem})")
    address = pci_address(pci) if isinstance(pci, str) else None
    if address is None:
        raise BadNic(f"{what}.pci {short(pci, 40)} is not a PCI address (dddd:bb:dd.f)")
    if kind not in NIC_KINDS:
        raise BadNic(f"{what}.kind must be one of {', '.join(NIC_KINDS)}, not {short(kind, 20)}")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
        raise BadNic(f"{what}.numa_node must be a node id or null, not {short(node, 20)}")
    ports = item.get("ports", [])
    if not isinstance(ports, list) or len(ports) > MAX_PORTS:
        raise BadNic(f"{what}.ports must be a list of at most {MAX_PORTS} ports")
    read = tuple(_port(p, f"{what}.ports[{j}]") for j, p in enumerate(ports))
    numbers = [p.number for p in read]
    if len(set(numbers)) < len(numbers):
        raise BadNic(f"{what}.ports lists a port number twice")
    return NIC(name, address, kind, node, read, pci_path_from_json(item.get("pci_path", []), f"{what}.pci_path"))


def _port(item: Any, what: str) -> NicPort:
    if not isinstance(item, dict):
        raise BadNic(f"{what} must be an object")
    number, state, rate = item.get("number"), item.get("state"), item.get("rate_gbps")
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 255:
        raise BadNic(f"{what}.number must be a port number 1..255, not {short(number, 20)}")
    if state not in PORT_STATES:
        raise BadNic(f"{what}.state must be one of {', '.join(PORT_STATES)}, not {short(state, 20)}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < MAX_RATE_GBPS):
        raise BadNic(f"{what}.rate_gbps must be a positive number of Gb/s or null, not {short(rate, 20)}")
    return NicPort(number, state, None if rate is None else float(rate))
