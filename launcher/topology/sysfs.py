"""Read a :class:`Topology` from Linux ``/sys`` and ``/proc``, live or under an fsroot (hwloc's test layout), as
hwloc's Linux backend reads it: each sibling set once, the NUMA nodes' memory, distances and initiators, and a
broken table's overlapping nodes merged (docs/planner.md, docs/how-it-decides.md)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.base.cpulist import format_cpulist
from launcher.base.errors import TopologyError
from launcher.base.siblings import CORE_FILES
from launcher.base.untrusted import ascii_uint, short
from launcher.topology._files import CpusFile, numbered_entries, parse_cpus_file, read_int, read_text
from launcher.topology.cgroup import find_cpuset
from launcher.topology.fsroot import isdir, within
from launcher.topology.gpus import read_pci_gpus, resolve_visible
from launcher.topology.kinds import CoreKinds
from launcher.topology.kinds_sysfs import kinds_from_sysfs, priority_from_sysfs
from launcher.topology.model import Core, L3Group, NumaNode, Package, Topology, checked
from launcher.topology.nics import read_nics

if TYPE_CHECKING:
    from collections.abc import Mapping


def read_sysfs(
    root: str = "/",
    *,
    allowed: frozenset[int] | None = None,
    environ: Mapping[str, str] | None = None,
    gpus: bool = True,
) -> Topology:
    """The topology under ``root``; without the PCI scan for GPUs when ``gpus`` is false. ``allowed``: the
    process's affinity (``None``: the online CPUs within the cpuset found under ``root``); ``environ``: the GPU
    visibility variables (``None``: no restriction)."""
    with within(root):
        return _read_sysfs(root, allowed, environ, gpus)


def _read_sysfs(root: str, allowed: frozenset[int] | None, environ: Mapping[str, str] | None, gpus: bool) -> Topology:
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    cpu_ids = numbered_entries(cpu_dir, "cpu", "cpu")
    if not cpu_ids:
        if not isdir(cpu_dir):
            raise TopologyError(f"{cpu_dir}: no such directory (is {root!r} a sysfs tree with sys/ and proc/?)")
        raise TopologyError(f"{cpu_dir}: no cpuN entries")
    warnings: list[str] = []
    online, offline = _online_cpus(cpu_dir, cpu_ids)
    cpus = _CpuTopology(cpu_dir, online)
    usable = cpus.usable
    if not usable:
        raise TopologyError(f"{cpu_dir}: no online CPU has a topology/ directory (online: {format_cpulist(online)})")
    if cpus.without_topology:
        warnings.append(f"CPUs {format_cpulist(cpus.without_topology)} are online but have no topology/; ignored")
        offline = offline | cpus.without_topology
        online = usable

    # ---------------------------------------------------------------- packages
    package_list = sorted(cpus.package_members.items(), key=lambda kv: min(kv[1]))
    package_index = {key: i for i, (key, _) in enumerate(package_list)}
    packages = tuple(Package(os_index=cpus.package_id[key], cpus=frozenset(members)) for key, members in package_list)

    # ---------------------------------------------------------------- NUMA nodes
    nodes, node_warnings = _numa_nodes(root, online)
    warnings.extend(node_warnings)
    node_of: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            node_of.setdefault(cpu, node.os_index)

    # ---------------------------------------------------------------- L3 groups and cores
    l3_sets = sorted(set(cpus.l3_of.values()), key=min)
    l3_pos = {s: i for i, s in enumerate(l3_sets)}
    cores: list[Core] = []
    for first, pus, core_id in cpus.cores:
        l3 = cpus.l3_of.get(first)
        cores.append(
            Core(
                os_index=core_id if core_id is not None else len(cores),
                pus=pus,
                package=package_index[cpus.package_key_of[first]],
                numa_node=node_of.get(first),
                l3=l3_pos[l3] if l3 is not None else None,
            )
        )

    # ---------------------------------------------------------------- allowed set
    cpuset = find_cpuset(root)
    if allowed is None:
        allowed_set = online if cpuset is None else online & cpuset.cpus
    else:
        allowed_set = online & allowed
    if not allowed_set:
        if allowed is None and cpuset is not None:
            raise TopologyError(
                f"{cpuset.cpus_file}: the cpuset allows CPUs {format_cpulist(cpuset.cpus)}, none of them online "
                f"(online: {format_cpulist(online)})"
            )
        raise TopologyError(
            f"{os.path.join(cpu_dir, 'online')}: none of the online CPUs ({format_cpulist(online)}) is in this "
            f"process's affinity ({format_cpulist(allowed or ())})"
        )

    read: dict[str, dict[int, int]] = {}
    kinds = kinds_from_sysfs(root, online, read=read)
    warnings.extend(kinds.warnings)
    priority = priority_from_sysfs(root, [c.pus for c in cores], kinds, read)
    node_cpus = {n.os_index: n.cpus for n in nodes if n.cpus}
    found, gpu_warnings = read_pci_gpus(root, online, node_cpus) if gpus else ([], [])
    warnings.extend(gpu_warnings)
    nics, nic_warnings = read_nics(root, {n.os_index: n.cpus for n in nodes})
    warnings.extend(nic_warnings)
    visible: tuple[int, ...] | None = None
    if environ is not None and found:
        resolved = resolve_visible(found, environ)
        visible = resolved.visible
        if resolved.warning:
            warnings.append(resolved.warning)
    return _merge_overlapping_nodes(checked(Topology(
        packages=packages,
        numa_nodes=tuple(nodes),
        l3_groups=tuple(L3Group(cpus=s) for s in l3_sets),
        cores=tuple(sorted(cores, key=lambda c: c.pus[0])),
        online=online,
        offline=offline,
        allowed=allowed_set,
        gpus=tuple(found),
        visible=visible,
        source="live" if root == "/" else f"fsroot {root}",
        allowed_mems=None if cpuset is None else cpuset.mems,
        warnings=tuple(warnings),
        core_kinds=CoreKinds(kinds.kinds),
        nics=tuple(nics),
        priority=priority,
    )))


def _online_cpus(cpu_dir: str, cpu_ids: list[int]) -> tuple[frozenset[int], frozenset[int]]:
    """(online, offline) among the ``cpuN`` directories present."""
    present = frozenset(cpu_ids)
    online_text = read_text(os.path.join(cpu_dir, "online"))
    if online_text is not None:
        online = parse_cpus_file(os.path.join(cpu_dir, "online"), online_text, is_list=True) & present
    else:
        # Older kernels: per-CPU online files; cpu0 usually has none and is always online.
        online = frozenset(c for c in cpu_ids if read_int(os.path.join(cpu_dir, f"cpu{c}", "online")) != 0)
    return online, present - online


class _CpuTopology:
    """Packages, cores and L3 caches of the online CPUs, reading each sibling set once (as hwloc does)."""

    def __init__(self, cpu_dir: str, online: frozenset[int]) -> None:
        self.package_key_of: dict[int, object] = {}
        self.package_members: dict[object, set[int]] = {}
        self.package_id: dict[object, int] = {}
        self.cores: list[tuple[int, tuple[int, ...], int | None]] = []  # (first PU, PUs, core_id)
        self.l3_of: dict[int, frozenset[int]] = {}
        without_topology: set[int] = set()
        package_file = CpusFile(
            ("package_cpus_list", True), ("package_cpus", False), ("core_siblings_list", True), ("core_siblings", False)
        )
        core_file = CpusFile(*CORE_FILES)
        l3_file = CpusFile(("shared_cpu_list", True), ("shared_cpu_map", False))
        l3_index: str | None = None
        l3_search = True
        l3_tries = 0
        compute_units: bool | None = None  # AMD Bulldozer: "siblings" with distinct core_id are separate cores
        core_done: set[int] = set()

        for cpu in sorted(online):
            if cpu in core_done:
                continue
            cdir = os.path.join(cpu_dir, f"cpu{cpu}")
            topo = os.path.join(cdir, "topology")
            threads = core_file.read(topo)
            core_id = read_int(os.path.join(topo, "core_id"))
            if threads is None and core_id is None:
                if not isdir(topo):  # only checked on this failure path: one stat, not one per CPU
                    without_topology.add(cpu)
                    continue
                core_file.forget_all()
            threads = (threads & online if threads else frozenset()) | {cpu}
            if len(threads) > 1 and compute_units is None:
                # hwloc's rule: compare this CPU's core_id with one sibling's, once for the whole machine.
                other = min(threads - {cpu})
                compute_units = read_int(os.path.join(cpu_dir, f"cpu{other}", "topology", "core_id")) != core_id
            if compute_units:
                threads = frozenset({cpu})
            core_done.update(threads)

            # The package: package_cpus and physical_package_id are read once per package (at its first CPU).
            key = self.package_key_of.get(cpu)
            if key is None:
                siblings = package_file.read(topo)
                if siblings is None:
                    package_file.forget_all()  # topology/ exists (read above) but has no package sibling file
                siblings = (siblings & online if siblings else frozenset()) | threads
                pkg_id = read_int(os.path.join(topo, "physical_package_id"))
                # physical_package_id is -1 on POWER7/s390: the sibling set names the package then.
                if pkg_id is not None and pkg_id >= 0:
                    key = ("id", pkg_id)
                else:
                    key = ("set", siblings)
                self.package_id.setdefault(key, pkg_id if pkg_id is not None and pkg_id >= 0 else -1)
                for s in siblings:
                    self.package_key_of.setdefault(s, key)
            for s in threads:  # an inconsistent tree can leave a sibling outside every package list read so far
                self.package_key_of.setdefault(s, key)
            self.cores.append((cpu, tuple(sorted(threads)), core_id))

            # The L3 cache shared by this core, once per L3.
            if cpu not in self.l3_of:
                if l3_search and l3_tries < 8:  # a tree without cache/ dirs costs 8 failed lookups, not one per core
                    l3_tries += 1
                    l3_index, l3_search = _find_l3_index(os.path.join(cdir, "cache"))
                if l3_index is not None:
                    shared = l3_file.read(os.path.join(cdir, "cache", l3_index))
                    if shared:
                        shared = (shared & online) | {cpu}
                        for s in shared:
                            self.l3_of.setdefault(s, shared)

        self.without_topology = frozenset(without_topology)
        self.usable = online - self.without_topology
        for cpu in sorted(self.usable):
            self.package_members.setdefault(self.package_key_of[cpu], set()).add(cpu)


def _find_l3_index(cache_dir: str) -> tuple[str | None, bool]:
    """(``indexN`` of the level-3 cache, keep searching?). Searching stops once a ``cache/`` dir was listed."""
    indexes = numbered_entries(cache_dir, "index")
    if not indexes:
        return None, not isdir(cache_dir)
    for idx in indexes:
        if read_int(os.path.join(cache_dir, f"index{idx}", "level")) == 3:
            return f"index{idx}", False
    return None, False


def _numa_nodes(root: str, online: frozenset[int]) -> tuple[list[NumaNode], list[str]]:
    """Every NUMA node with a directory (CPU-less ones included), with online CPUs, distances and memory."""
    node_dir = os.path.join(root, "sys/devices/system/node")
    warnings: list[str] = []
    found: list[tuple[int, frozenset[int], int | None, tuple[int, ...] | None]] = []
    cpulist = CpusFile(("cpulist", True), ("cpumap", False))
    for nid in numbered_entries(node_dir, "node", "node"):
        ndir = os.path.join(node_dir, f"node{nid}")
        cpus = cpulist.read(ndir)
        if cpus is None and not isdir(ndir):
            continue  # dangling link to an offline node
        found.append((nid, (cpus or frozenset()) & online, _node_memory(ndir, warnings), _node_initiators(ndir, nid)))
    if not found:
        return [NumaNode(os_index=0, cpus=online, distances={0: 10})], warnings
    ids = [nid for nid, _, _, _ in found]
    cpus_of = {nid: cpus for nid, cpus, _, _ in found}
    nodes: list[NumaNode] = []
    for nid, cpus, memory_kb, initiators in found:
        row = read_text(os.path.join(node_dir, f"node{nid}", "distance"))
        dist: dict[int, int] = {}
        if row:
            numbers = [ascii_uint(v) for v in row.split()]
            if len(numbers) == len(ids) and None not in numbers:
                dist = {i: v for i, v in zip(ids, numbers) if v is not None}
        nodes.append(NumaNode(nid, cpus, dist, memory_kb, _local_cpus(cpus, initiators, cpus_of)))
    orphan = online - frozenset().union(*(n.cpus for n in nodes))
    if orphan:
        # offline-cpu0-node0: the node of these CPUs is offline. hwloc leaves them outside every NUMA node;
        # so does affrun (their cores have numa_node None, so no memory policy is derived for them).
        warnings.append(f"CPUs {format_cpulist(orphan)} belong to no online NUMA node; no memory policy for them")
    return nodes, warnings


def _node_memory(ndir: str, warnings: list[str]) -> int | None:
    """``MemTotal`` of ``node<N>/meminfo`` in kB (``Node 0 MemTotal:   16318356 kB``, with any spacing or none);
    ``None`` when the file or the line is absent, with a warning when the line is there but holds no number."""
    path = os.path.join(ndir, "meminfo")
    text = read_text(path)
    if not text:
        return None
    for line in text.splitlines():
        _, found, value = line.partition("MemTotal:")
        if not found:
            continue
        number = value.strip()
        if number[-2:].lower() == "kb":
            number = number[:-2].rstrip()
        kb = ascii_uint(number)
        if kb is None:
            warnings.append(f"{short(path, 120)}: MemTotal is not a number of kB ({short(line.strip(), 60)}); "
                            "the node's memory size is taken as unknown")
        return kb
    return None


def _node_initiators(node_dir: str, node: int) -> tuple[int, ...] | None:
    """The initiator node ids of ``node`` (itself left out): ``access1``'s, else ``access0``'s (hwloc's
    ``read_node_initiators``); ``None`` when neither directory exists."""
    for access in ("access1", "access0"):
        path = os.path.join(node_dir, access, "initiators")
        if isdir(path):
            return tuple(n for n in numbered_entries(path, "node") if n != node)
    return None


def _local_cpus(own: frozenset[int], initiators: tuple[int, ...] | None, cpus_of: dict[int, frozenset[int]]
                ) -> frozenset[int] | None:
    """The CPUs a node's memory is local to: its own and its initiators'; ``None`` without initiators or when
    they hold no CPU."""
    found = frozenset().union(*(cpus_of.get(i, frozenset()) for i in initiators or ()))
    return (found | own) if found else None


def _merge_overlapping_nodes(topo: Topology) -> Topology:
    """A broken NUMA table read as hwloc reads it: the nodes in id order, each whose CPUs intersect those of the
    nodes kept before it ignored, with a warning. Their cores and GPUs go to the kept node that holds their CPUs
    (a GPU: the first such node), or to none."""
    kept: list[int] = []
    dropped: list[int] = []
    claimed: dict[int, int] = {}  # CPU -> the kept node that holds it
    overlap: set[int] = set()
    for node in sorted(topo.numa_nodes, key=lambda n: n.os_index):
        common = node.cpus & claimed.keys()
        if common:
            dropped.append(node.os_index)
            overlap |= common
            continue
        kept.append(node.os_index)
        claimed.update(dict.fromkeys(node.cpus, node.os_index))
    if not dropped:
        return topo
    gone = set(dropped)
    dropped_cpus = {n.os_index: n.cpus for n in topo.numa_nodes if n.os_index in gone}

    def moved(node: int | None) -> int | None:
        if node is None or node not in gone:
            return node
        holders = sorted({claimed[p] for p in dropped_cpus[node] if p in claimed})
        return holders[0] if holders else None

    warning = (
        f"the NUMA table is broken: node(s) {format_cpulist(dropped)} claim CPUs {format_cpulist(overlap)} of "
        f"node(s) {format_cpulist({claimed[p] for p in overlap})}; ignoring them, as hwloc does"
        + ("; planning as one NUMA node" if sum(1 for n in topo.numa_nodes if n.os_index in kept and n.cpus) == 1 else "")
    )
    return replace(
        topo,
        numa_nodes=tuple(
            replace(n, distances={k: v for k, v in n.distances.items() if k not in gone})
            for n in topo.numa_nodes if n.os_index not in gone
        ),
        cores=tuple(
            replace(c, numa_node=next((claimed[p] for p in c.pus if p in claimed), None)) if c.numa_node in gone else c
            for c in topo.cores
        ),
        gpus=tuple(
            replace(g, numa_node=moved(g.numa_node), memory_node=None if g.memory_node in gone else g.memory_node)
            for g in topo.gpus
        ),
        allowed_mems=None if topo.allowed_mems is None else topo.allowed_mems - gone,
        warnings=(*topo.warnings, warning),
    )
