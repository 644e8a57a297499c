"""The nearest NIC of each rank, by the PCI path from the rank's GPU, as NCCL ranks paths. Pure.
The rule: docs/nics.md, "The nearest NIC per rank".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.base.choices import NIC_DISTANCES
from launcher.base.pci import pci_order
from launcher.base.untrusted import short
from launcher.plan.record import NicChoice
from launcher.topology.nics import device_problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from launcher.base.choices import NicDistance
    from launcher.topology.model import GPU, NIC, NicPort, Topology


def usable_nics(topo: Topology) -> list[tuple[NIC, NicPort]]:
    """The NICs that count, each with its best active port (fastest, then lowest number): RDMA NICs when any has
    an active port, else interfaces."""
    found: list[tuple[NIC, NicPort]] = []
    for nic in topo.nics:
        ports = nic.active_ports()
        if ports:
            found.append((nic, min(ports, key=lambda p: (-(p.rate_gbps or 0.0), p.number))))
    rdma = [(n, p) for n, p in found if n.rdma]
    return rdma or found


def node_packages(topo: Topology) -> dict[int, int]:
    """NUMA node -> logical package, from the cores."""
    out: dict[int, int] = {}
    for core in topo.cores:
        if core.numa_node is not None:
            out.setdefault(core.numa_node, core.package)
    return out


def distance(nic: NIC, gpu: GPU | None, nodes: Sequence[int], packages: dict[int, int]) -> NicDistance:
    """How far ``nic`` is from ``gpu`` (its PCI path, then its NUMA node) or, without a GPU, from ``nodes``."""
    if gpu is not None and gpu.pci_path and nic.pci_path and gpu.pci_path[0] == nic.pci_path[0]:
        common = 0
        for a, b in zip(gpu.pci_path, nic.pci_path):
            if a != b:
                break
            common += 1
        return "switch" if common >= 2 else "host-bridge"
    homes = ((gpu.numa_node,) if gpu.numa_node is not None else ()) if gpu is not None else tuple(nodes)
    if nic.numa_node is None or not homes:
        return "system"
    if nic.numa_node in homes:
        return "numa-node"
    nic_package = packages.get(nic.numa_node)
    if nic_package is not None and any(packages.get(n) == nic_package for n in homes):
        return "package"
    return "system"


def choose_nics(topo: Topology, ranks: Sequence[tuple[str | None, Sequence[int]]]
                ) -> tuple[list[NicChoice | None], dict[int, str]]:
    """The NIC of each rank, given as (its GPU's PCI address or None, its NUMA nodes), None when no NIC counts; and,
    by rank index, why a rank got none though a NIC is nearest to it (a name no rank can be given)."""
    usable = usable_nics(topo)
    if not usable:
        return [None] * len(ranks), {}
    gpus = {g.pci: g for g in topo.gpus}
    packages = node_packages(topo)
    problems = {n: device_problem(n.name, p.number if n.rdma else None) for n, p in usable}
    uses: dict[NIC, int] = {}
    out: list[NicChoice | None] = []
    why: dict[int, str] = {}
    for index, (gpu_pci, nodes) in enumerate(ranks):
        gpu = gpus.get(gpu_pci) if gpu_pci is not None else None
        scored = [(NIC_DISTANCES.index(distance(n, gpu, nodes, packages)), -(p.rate_gbps or 0.0), n, p)
                  for n, p in usable]
        best = min((level, rate) for level, rate, _, _ in scored)
        tied = [(n, p) for level, rate, n, p in scored if (level, rate) == best]
        named = [(n, p) for n, p in tied if problems[n] is None]
        if not named:
            nic = tied[0][0]
            why[index] = (f"no NIC: the nearest, {short(nic.name, 40)}, has a name AFFRUN_NIC and UCX_NET_DEVICES "
                          f"cannot carry ({problems[nic]})")
            out.append(None)
            continue
        nic, port = min(named, key=lambda np: (uses.get(np[0], 0), pci_order(np[0].pci), np[0].name))
        uses[nic] = uses.get(nic, 0) + 1
        number = port.number if nic.rdma else None
        out.append(NicChoice(nic.name, number, nic.name if number is None else f"{nic.name}:{number}", nic.pci,
                             nic.kind, NIC_DISTANCES[best[0]], port.rate_gbps))
    return out, why
