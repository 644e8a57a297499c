"""Read a :class:`Topology` from Linux ``/sys`` and ``/proc``, live or under an fsroot (hwloc's test layout)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from launcher.cpulist import format_cpulist
from launcher.errors import TopologyError
from launcher.topology._files import numbered_entries, read_cpulist, read_cpus, read_int, read_text
from launcher.topology.cgroup import find_cpuset
from launcher.topology.gpus import read_pci_gpus, resolve_visible
from launcher.topology.model import Core, L3Group, NumaNode, Package, Topology


def read_sysfs(
    root: str = "/",
    *,
    allowed: frozenset[int] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """Read the topology under ``root``.

    ``allowed`` is the process's affinity (live reads pass ``os.sched_getaffinity(0)``); with ``None`` the
    allowed set is the online CPUs narrowed by the cpuset found under ``root``. ``environ`` supplies the GPU
    visibility variables (``CUDA_VISIBLE_DEVICES``...); ``None`` means no restriction.
    """
    cpu_dir = os.path.join(root, "sys/devices/system/cpu")
    cpu_ids = numbered_entries(cpu_dir, "cpu")
    if not cpu_ids:
        if not os.path.isdir(cpu_dir):
            raise TopologyError(f"{cpu_dir}: no such directory (is {root!r} a sysfs tree with sys/ and proc/?)")
        raise TopologyError(f"{cpu_dir}: no cpuN entries")
    warnings: list[str] = []
    present = set(cpu_ids)

    online = read_cpulist(os.path.join(cpu_dir, "online"))
    if online is None:
        # Older kernels: per-CPU online files; cpu0 usually has none and is always online.
        online = frozenset(c for c in cpu_ids if read_int(os.path.join(cpu_dir, f"cpu{c}", "online")) != 0)
    online = online & present
    offline = frozenset(present - online)
    # An "online" CPU without topology/ is unusable for planning: treat it as offline (hwloc does the same).
    usable: list[int] = [c for c in sorted(online) if os.path.isdir(os.path.join(cpu_dir, f"cpu{c}", "topology"))]
    if not usable:
        raise TopologyError(f"{cpu_dir}: no online CPU has a topology/ directory")
    if len(usable) != len(online):
        missing = online - set(usable)
        warnings.append(f"CPUs {format_cpulist(missing)} are online but have no topology/; ignored")
        offline = offline | missing
        online = frozenset(usable)

    # ---------------------------------------------------------------- cores and packages
    package_key_of: dict[int, object] = {}
    core_key_of: dict[int, tuple[object, ...]] = {}
    siblings_cache: dict[int, frozenset[int]] = {}
    l3_of: dict[int, frozenset[int]] = {}
    l3_index: str | None = None
    l3_searched = False
    for cpu in usable:
        topo = os.path.join(cpu_dir, f"cpu{cpu}", "topology")
        pkg_id = read_int(os.path.join(topo, "physical_package_id"))
        if pkg_id is None or pkg_id < 0:
            siblings = read_cpus(os.path.join(topo, "package_cpus_list"), os.path.join(topo, "package_cpus"))
            if siblings is None:
                siblings = read_cpus(os.path.join(topo, "core_siblings_list"), os.path.join(topo, "core_siblings"))
            package_key_of[cpu] = ("set", siblings & online) if siblings else ("id", -1)
        else:
            package_key_of[cpu] = ("id", pkg_id)
        threads = siblings_cache.get(cpu)
        if threads is None:
            threads = read_cpus(os.path.join(topo, "core_cpus_list"), os.path.join(topo, "core_cpus"))
            if threads is None:
                threads = read_cpus(os.path.join(topo, "thread_siblings_list"), os.path.join(topo, "thread_siblings"))
            threads = (threads or frozenset({cpu})) & online or frozenset({cpu})
            for t in threads:
                siblings_cache.setdefault(t, threads)
        core_id = read_int(os.path.join(topo, "core_id"))
        # Siblings that report different core_ids are separate cores (AMD Bulldozer compute units), and
        # one core_id can name several cores (different packages, or quirky firmware): key on both.
        core_key_of[cpu] = (package_key_of[cpu], threads, core_id)
        if cpu not in l3_of:
            if not l3_searched:
                l3_index = _find_l3_index(os.path.join(cpu_dir, f"cpu{cpu}", "cache"))
                l3_searched = True
            if l3_index is not None:
                shared = read_cpus(
                    os.path.join(cpu_dir, f"cpu{cpu}", "cache", l3_index, "shared_cpu_list"),
                    os.path.join(cpu_dir, f"cpu{cpu}", "cache", l3_index, "shared_cpu_map"),
                )
                if shared:
                    shared = shared & online
                    for s in shared:
                        l3_of.setdefault(s, shared)

    packages_by_key: dict[object, set[int]] = {}
    for cpu in usable:
        packages_by_key.setdefault(package_key_of[cpu], set()).add(cpu)
    package_list = sorted(packages_by_key.items(), key=lambda kv: min(kv[1]))
    package_index = {key: i for i, (key, _) in enumerate(package_list)}
    packages = tuple(
        Package(os_index=key[1] if isinstance(key, tuple) and key[0] == "id" else -1, cpus=frozenset(cpus))  # type: ignore[index]
        for key, cpus in package_list
    )

    # ---------------------------------------------------------------- NUMA nodes
    node_dir = os.path.join(root, "sys/devices/system/node")
    node_ids = numbered_entries(node_dir, "node")
    nodes: list[NumaNode] = []
    for nid in node_ids:
        ndir = os.path.join(node_dir, f"node{nid}")
        if not os.path.isdir(ndir):
            continue  # dangling link to an offline node
        cpus = read_cpus(os.path.join(ndir, "cpulist"), os.path.join(ndir, "cpumap")) or frozenset()
        nodes.append(NumaNode(os_index=nid, cpus=cpus & online, memory_kb=_node_memory(ndir)))
    if nodes:
        ids = [n.os_index for n in nodes]
        with_distances = []
        for node in nodes:
            row = read_text(os.path.join(node_dir, f"node{node.os_index}", "distance"))
            dist: dict[int, int] = {}
            if row:
                values = row.split()
                if len(values) == len(ids) and all(v.isdigit() for v in values):
                    dist = {i: int(v) for i, v in zip(ids, values)}
            with_distances.append(NumaNode(node.os_index, node.cpus, dist, node.memory_kb))
        nodes = with_distances
        orphan = online - frozenset().union(*(n.cpus for n in nodes))
        if orphan:
            warnings.append(f"CPUs {format_cpulist(orphan)} belong to no NUMA node; planning them as node {nodes[0].os_index}")
            nodes[0] = NumaNode(nodes[0].os_index, nodes[0].cpus | orphan, nodes[0].distances, nodes[0].memory_kb)
    else:
        nodes = [NumaNode(os_index=0, cpus=online, distances={0: 10})]
    node_of: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            node_of.setdefault(cpu, node.os_index)

    # ---------------------------------------------------------------- L3 groups and cores
    l3_sets = sorted({s for s in l3_of.values()}, key=min)
    l3_pos = {s: i for i, s in enumerate(l3_sets)}
    cores_by_key: dict[tuple[object, ...], list[int]] = {}
    for cpu in usable:
        cores_by_key.setdefault(core_key_of[cpu], []).append(cpu)
    cores = []
    for key, pus in sorted(cores_by_key.items(), key=lambda kv: min(kv[1])):
        first = min(pus)
        l3 = l3_of.get(first)
        core_id = key[2]
        cores.append(
            Core(
                os_index=core_id if isinstance(core_id, int) else len(cores),
                pus=tuple(sorted(pus)),
                package=package_index[package_key_of[first]],
                numa_node=node_of.get(first),
                l3=l3_pos[l3] if l3 is not None else None,
            )
        )

    # ---------------------------------------------------------------- allowed set
    cg_cpus, cg_mems, cg_where = find_cpuset(root)
    if allowed is None:
        allowed_set = online if cg_cpus is None else online & cg_cpus
    else:
        allowed_set = online & allowed
    if not allowed_set:
        raise TopologyError(f"{root}: the allowed CPU set is empty (online {format_cpulist(online)}, cpuset {cg_where})")

    gpus, gpu_warnings = read_pci_gpus(root, online)
    warnings.extend(gpu_warnings)
    visible: tuple[int, ...] | None = None
    if environ is not None and gpus:
        visible, _ = resolve_visible(gpus, environ)
    return Topology(
        packages=packages,
        numa_nodes=tuple(nodes),
        l3_groups=tuple(L3Group(cpus=s) for s in l3_sets),
        cores=tuple(cores),
        online=online,
        offline=offline,
        allowed=allowed_set,
        gpus=tuple(gpus),
        visible=visible,
        source="live" if root == "/" else f"fsroot {root}",
        allowed_mems=cg_mems,
        warnings=tuple(warnings),
    )


def _find_l3_index(cache_dir: str) -> str | None:
    for idx in numbered_entries(cache_dir, "index"):
        if read_int(os.path.join(cache_dir, f"index{idx}", "level")) == 3:
            return f"index{idx}"
    return None


def _node_memory(ndir: str) -> int | None:
    text = read_text(os.path.join(ndir, "meminfo"))
    if not text:
        return None
    for line in text.splitlines():
        if "MemTotal:" in line:
            parts = line.split()
            try:
                return int(parts[parts.index("MemTotal:") + 1])
            except (ValueError, IndexError):
                return None
    return None
