"""The network side of a rank, from its environment and the machine: ``nccl-ib-hca-prefix``, ``nic-far``,
``rank-off-gpu-node`` (docs/doctor.md, docs/nics.md). Pure functions of (environ, topology, facts)."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.base.choices import NIC_DISTANCES, RDMA_KINDS
from launcher.base.cpulist import format_cpulist
from launcher.base.untrusted import ascii_uint, short
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.plan.nics import distance, node_packages, usable_nics
from launcher.topology.model import GPU, Topology
from launcher.topology.nics import device_problem

HCA_VARIABLES = ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME")
MAX_ENTRIES = 256  # more entries than any machine has NICs: the rest are not read
LISTED = 8  # nearest NICs named in a finding; the rest are counted


def parse_nccl_list(value: str) -> tuple[bool, bool, list[str]]:
    """(exclude ``^``, exact ``=``, the device names) of an ``NCCL_IB_HCA``-style list as NCCL reads it, ports
    (``:1``) dropped (docs/doctor.md)."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    names = [item.split(":", 1)[0].strip() for item in text.split(",")[:MAX_ENTRIES]]
    return exclude, exact, [n for n in names if n]


def check_nccl_hca_prefix(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    for variable in HCA_VARIABLES:
        value = environ.get(variable)
        if not value:
            continue
        exclude, exact, names = parse_nccl_list(value)
        rdma = variable == "NCCL_IB_HCA"
        devices = sorted({n.name for n in topology.nics if (n.kind in RDMA_KINDS) == rdma})
        if exact or not devices:
            continue
        traps = {name: [d for d in devices if d.startswith(name) and d != name] for name in names if name in devices}
        traps = {name: extra for name, extra in traps.items() if extra}
        if not traps:
            continue
        listed = "; ".join(f"{name} also selects {', '.join(extra[:8])}{', ...' if len(extra) > 8 else ''}"
                           for name, extra in list(traps.items())[:4]) + ("; ..." if len(traps) > 4 else "")
        fixed = f"{variable}={'^' if exclude else ''}={value.strip().lstrip('^').lstrip('=')}"
        out.append(Finding(
            "nccl-ib-hca-prefix", "warning",
            f"{variable}={short(value, 80)} is a prefix match: {listed}",
            f"NCCL matches each name of {variable} as a prefix unless the list starts with '=': the value "
            f"{'excludes' if exclude else 'selects'} more devices than it names",
            f"write the exact form: {fixed} (or leave {variable} unset: NCCL picks the GPU-local NICs itself)",
            env_fix={variable: fixed.split("=", 1)[1]},
        ))
    return out


def _rank_gpu(environ: Mapping[str, str], topology: Topology) -> GPU | None:
    """The rank's GPU: ``AFFRUN_GPU_PCI``, else the visible GPU its ``LOCAL_RANK`` numbers; ``None`` when unknown."""
    pci = environ.get("AFFRUN_GPU_PCI", "").strip().lower()
    if pci:
        return next((g for g in topology.gpus if g.pci == pci), None)
    local = ascii_uint(environ.get("LOCAL_RANK", "").strip())
    visible = topology.visible_gpus()
    return visible[local] if local is not None and local < len(visible) else None


def _told_nics(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, device name) of every NIC the rank was told to use."""
    out: list[tuple[str, str]] = []
    for variable in ("UCX_NET_DEVICES", "AFFRUN_NIC"):
        value = environ.get(variable, "").strip()
        if value and value != "all":
            out += [(variable, item.split(":", 1)[0].strip()) for item in value.split(",")[:MAX_ENTRIES] if item]
    return list(dict.fromkeys(out))


def check_nic_far(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    told = _told_nics(environ)
    usable = usable_nics(topology)
    if not told or not usable:
        return []
    gpu = _rank_gpu(environ, topology)
    nodes = sorted({c.numa_node for c in topology.cores if c.numa_node is not None and set(c.pus) & facts.rank_cpus})
    packages = node_packages(topology)
    far = {n.name: distance(n, gpu, nodes, packages) for n, _ in usable}
    problems = {n.name: device_problem(n.name, p.number if n.rdma else None) for n, p in usable}
    best = min(far.values(), key=NIC_DISTANCES.index)
    nearest = sorted(name for name, d in far.items() if d == best)
    listed = ", ".join(nearest[:LISTED]) + (f" and {len(nearest) - LISTED} more" if len(nearest) > LISTED else "")
    givable = [name for name in nearest if problems[name] is None]
    by_name = {n.name: n for n in topology.nics}
    out: list[Finding] = []
    for variable, name in told:
        nic = by_name.get(name)
        if nic is None:
            continue
        level = far.get(name) or distance(nic, gpu, nodes, packages)
        if NIC_DISTANCES.index(level) <= NIC_DISTANCES.index(best):
            continue
        origin = f"GPU {gpu.pci}" if gpu is not None else f"NUMA node(s) {','.join(map(str, nodes)) or '?'}"
        fix = (f"give the rank {givable[0]}: launch with `affrun torchrun` / `affrun exec` (AFFRUN_NIC; --nic-env ucx "
               "sets UCX_NET_DEVICES), or unset it and let the library choose" if givable else
               f"the nearest NIC's name cannot be written in {variable} ({problems[nearest[0]]}): rename the device "
               f"(`rdma dev set NAME name NEW`, a udev rule for an interface), or unset {variable} and let the "
               "library choose")
        out.append(Finding(
            "nic-far", "warning",
            f"{variable} names {name} ({level}), but {listed} {'is' if len(nearest) == 1 else 'are'} "
            f"nearer to the rank's {origin} ({best})",
            "traffic to a far NIC crosses the host bridge or the socket link: less bandwidth, more latency, and "
            "the NIC's traffic competes with other ranks'",
            fix,
        ))
    return out


def check_rank_off_gpu_node(environ: Mapping[str, str], topology: Topology, facts: Facts) -> list[Finding]:
    gpu = _rank_gpu(environ, topology)
    if gpu is None or not facts.per_rank_mask or not facts.rank_cpus:
        return []
    node = topology.node(gpu.numa_node) if gpu.numa_node is not None else None
    local = node.cpus if node is not None and node.cpus else (gpu.cpus if gpu.cpus != topology.online else frozenset())
    if not local or local & facts.rank_cpus:
        return []
    where = f"node {gpu.numa_node} (CPUs {format_cpulist(local)})" if node is not None and node.cpus else (
        f"local CPUs {format_cpulist(local)}")
    return [Finding(
        "rank-off-gpu-node", "warning",
        f"the rank's CPUs {format_cpulist(facts.rank_cpus)} hold no CPU of its GPU {gpu.pci}'s {where}",
        "host-device copies cross the socket link, and NCCL pins its threads to the rank's mask ∩ the GPU's local "
        "CPUs: an empty intersection",
        "launch with `affrun torchrun` / `affrun exec`, which put each rank on its GPU's node",
    )]
