"""PCI addresses in one spelling, ``dddd:bb:dd.f`` in lower-case hex, whatever the source wrote (sysfs, NVML, hwloc, a
snapshot), their order, and a device's PCI path from its sysfs directory. Standard library only, no I/O."""

from __future__ import annotations

_HEX = frozenset("0123456789abcdefABCDEF")


def _hex(text: str, max_digits: int, top: int) -> int | None:
    if not text or len(text) > max_digits or not _HEX.issuperset(text):
        return None
    value = int(text, 16)
    return value if value <= top else None


def pci_address(text: str) -> str | None:
    """``text`` as ``dddd:bb:dd.f`` in lower-case hex, or ``None`` when it is not a PCI address (what is accepted:
    docs/design.md §6; ``3b:00.0`` is domain 0)."""
    if len(text) > 20:
        return None
    head, dot, function = text.rpartition(".")
    parts = head.split(":")
    if not dot or len(parts) not in (2, 3):
        return None
    domain = _hex(parts[0], 8, 0xFFFFFFFF) if len(parts) == 3 else 0
    bus = _hex(parts[-2], 2, 0xFF)
    device = _hex(parts[-1], 2, 0x1F)
    fn = _hex(function, 1, 7)
    if domain is None or bus is None or device is None or fn is None:
        return None
    return format_pci(domain, bus, device, fn)


def format_pci(domain: int, bus: int, device: int, function: int) -> str:
    """The canonical spelling of an address given as numbers (what sysfs writes: ``%04x:%02x:%02x.%x``)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def pci_order(address: str) -> tuple[int, ...]:
    """Sort key of a PCI address: domain, bus, device, function. GPUs are numbered in this order (what NVML and
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` do); a text that is not an address sorts last."""
    canonical = pci_address(address)
    if canonical is None:
        return (1 << 40,)
    domain, bus, rest = canonical.split(":")
    device, function = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))


def host_bridge(name: str) -> str | None:
    """``pci0000:3a`` (the directory sysfs names a PCI root bus, whose bridge is the host bridge) in its canonical
    spelling, or ``None`` when ``name`` is not one."""
    if not name.startswith("pci"):
        return None
    domain, colon, bus = name[3:].partition(":")
    number, bus_number = _hex(domain, 8, 0xFFFFFFFF), _hex(bus, 2, 0xFF)
    if not colon or number is None or bus_number is None:
        return None
    return f"pci{number:04x}:{bus_number:02x}"


def sysfs_pci_path(real_path: str) -> tuple[str, tuple[str, ...]] | None:
    """(address, PCI path: the host bridge and the bridges above) of the PCI function whose resolved sysfs directory
    is ``real_path``, or its nearest PCI ancestor's (a virtio NIC); ``None`` when none lies under a host bridge. The
    last host bridge counts (a VMD domain nests one)."""
    parts = real_path.rstrip("/").split("/")
    start = max((i for i, p in enumerate(parts) if host_bridge(p)), default=None)
    if start is None:
        return None
    chain = [pci_address(p) for p in parts[start + 1:]]
    while chain and chain[-1] is None:
        chain.pop()
    addresses = [a for a in chain if a is not None]
    bridge = host_bridge(parts[start])
    if not addresses or len(addresses) != len(chain) or bridge is None:
        return None
    return addresses[-1], (bridge, *addresses[:-1])
