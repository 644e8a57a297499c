"""Write fake Linux sysfs/procfs trees (the layout ``--fsroot`` reads) for machines we cannot have here.

Only what cannot exist on this 2-core, GPU-less machine is faked: many cores, NUMA nodes and PCI GPUs.
The trees follow the kernel's file formats, including the quirks the reader must survive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.base.cpulist import format_cpulist


@dataclass
class FakeGPU:
    pci: str
    numa_node: int | None  # None writes -1
    vendor: int = 0x10DE
    klass: int = 0x030200
    local_cpus: Sequence[int] | None = None  # None: the node's CPUs (or all CPUs when numa_node is None)
    uuid: str | None = None


@dataclass
class FakeNIC:
    """An RDMA device (kind infiniband or roce: ``sys/class/infiniband/<name>``) or a network interface (ethernet,
    ipoib: ``sys/class/net/<name>``) of PCI function ``pci``. ``ports``: (state, rate) as the kernel writes them,
    ``("4: ACTIVE", "400 Gb/sec (4X NDR)")`` for RDMA ports, ``("up", "100000")`` (operstate, speed in Mb/s) for an
    interface. ``numa_node`` None writes -1."""

    name: str
    pci: str
    numa_node: int | None
    kind: str = "infiniband"
    ports: Sequence[tuple[str, str]] = (("4: ACTIVE", "400 Gb/sec (4X NDR)"),)
    local_cpus: Sequence[int] | None = None  # the function's local_cpulist, written when given
    virtio: bool = False  # an interface of a virtio device (fn/virtio0/net/<name>), as in a VM


@dataclass
class FakeMachine:
    """``cores``: SMT sibling tuples; ``node_of_core``/``package_of_core``/``l3_of_core``: per-core ids."""

    cores: list[tuple[int, ...]]
    node_of_core: list[int]
    package_of_core: list[int]
    l3_of_core: list[int] | None = None
    cpuless_nodes: list[int] = field(default_factory=list)
    distances: dict[int, dict[int, int]] | None = None
    gpus: list[FakeGPU] = field(default_factory=list)
    offline: set[int] = field(default_factory=set)
    cgroup_cpus: str | None = None  # cgroup v2 cpuset.cpus.effective for /proc/self
    cpu_max: str | None = None  # cgroup v2 cpu.max of /proc/self's cgroup ("800000 100000")
    cfs_quota: tuple[str, str] | None = None  # cgroup v1 (cpu.cfs_quota_us, cpu.cfs_period_us) of /proc/self
    extra_pci: list[tuple[str, int, int]] = field(default_factory=list)  # (bdf, vendor, class): NVSwitch, BMC VGA
    node_memory_kb: dict[int, int] = field(default_factory=dict)  # MemTotal per node where not 65536000 (0: none)
    node_cpulist: dict[int, str] = field(default_factory=dict)  # a node's cpulist as written, if not derived
    # HMAT initiators: memory node -> {"access0"/"access1": initiator node ids}, written as the kernel's links
    # node<M>/access<K>/initiators/node<N> -> ../../../node<N>
    node_initiators: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    # NICs and the PCI tree (issue 29): written by write_nics, below
    nics: list[FakeNIC] = field(default_factory=list)
    pci_paths: dict[str, tuple[str, ...]] = field(default_factory=dict)  # bdf -> (pciDDDD:BB, bridge, ...)
    # Anything else, written last: files under the root (proc/cpuinfo, a CPU's cpufreq/...) and symbolic links
    # (path -> target, as ``ln -s target path`` makes them); the priority-core machines below use them
    files: dict[str, str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    @property
    def cpus(self) -> list[int]:
        return sorted(p for c in self.cores for p in c)


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def write_tree(root: Path, m: FakeMachine) -> Path:
    cpu_dir = root / "sys/devices/system/cpu"
    all_cpus = m.cpus
    online = [c for c in all_cpus if c not in m.offline]
    _w(cpu_dir / "online", format_cpulist(online))
    _w(cpu_dir / "possible", format_cpulist(all_cpus))
    _w(cpu_dir / "present", format_cpulist(all_cpus))
    nodes: dict[int, list[int]] = {n: [] for n in sorted(set(m.node_of_core) | set(m.cpuless_nodes))}
    for ci, core in enumerate(m.cores):
        siblings = format_cpulist(core)
        for pu in core:
            d = cpu_dir / f"cpu{pu}"
            d.mkdir(parents=True, exist_ok=True)
            nodes[m.node_of_core[ci]].append(pu)
            if pu in m.offline:
                _w(d / "online", "0")
                continue
            _w(d / "online", "1")
            t = d / "topology"
            _w(t / "physical_package_id", str(m.package_of_core[ci]))
            _w(t / "core_id", str(ci))
            _w(t / "thread_siblings_list", siblings)
            _w(t / "core_cpus_list", siblings)
            pkg_cpus = [p for cj, c in enumerate(m.cores) if m.package_of_core[cj] == m.package_of_core[ci] for p in c]
            _w(t / "package_cpus_list", format_cpulist(pkg_cpus))
            if m.l3_of_core is not None:
                l3 = [p for cj, c in enumerate(m.cores) if m.l3_of_core[cj] == m.l3_of_core[ci] for p in c]
                _w(d / "cache/index3/level", "3")
                _w(d / "cache/index3/shared_cpu_list", format_cpulist(l3))
    node_dir = root / "sys/devices/system/node"
    ids = sorted(nodes)
    _w(node_dir / "online", format_cpulist(ids))
    _w(node_dir / "possible", format_cpulist(ids))
    for n in ids:
        _w(node_dir / f"node{n}/cpulist", m.node_cpulist.get(n, format_cpulist(nodes[n])))
        _w(node_dir / f"node{n}/meminfo", f"Node {n} MemTotal:       {m.node_memory_kb.get(n, 65536000)} kB")
        if m.distances is not None:
            row = " ".join(str(m.distances[n][o]) for o in ids)
        else:
            row = " ".join("10" if o == n else "20" for o in ids)
        _w(node_dir / f"node{n}/distance", row)
        for access, initiators in m.node_initiators.get(n, {}).items():
            links = node_dir / f"node{n}/{access}/initiators"
            links.mkdir(parents=True, exist_ok=True)
            _w(links / "read_latency", "26")
            for i in initiators:
                (links / f"node{i}").symlink_to(f"../../../node{i}")
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True, exist_ok=True)
    for g in m.gpus:
        d = pci_device_dir(root, m, g.pci)
        _w(d / "vendor", f"0x{g.vendor:04x}")
        _w(d / "class", f"0x{g.klass:06x}")
        _w(d / "numa_node", str(-1 if g.numa_node is None else g.numa_node))
        if g.local_cpus is not None:
            local = list(g.local_cpus)
        elif g.numa_node is not None and nodes.get(g.numa_node):
            local = nodes[g.numa_node]
        else:
            local = all_cpus
        _w(d / "local_cpulist", format_cpulist(local))
        if g.uuid:
            _w(root / f"proc/driver/nvidia/gpus/{g.pci}/information", f"Model: Fake\nGPU UUID: \t {g.uuid}\n")
    for bdf, vendor, klass in m.extra_pci:
        d = pci / bdf
        _w(d / "vendor", f"0x{vendor:04x}")
        _w(d / "class", f"0x{klass:06x}")
        _w(d / "numa_node", "0")
    cgroups: list[str] = []
    mounts: list[str] = []
    if m.cgroup_cpus is not None or m.cpu_max is not None:
        cgroups.append("0::/job")
        mounts.append("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0")
    if m.cgroup_cpus is not None:
        _w(root / "sys/fs/cgroup/job/cpuset.cpus.effective", m.cgroup_cpus)
    if m.cpu_max is not None:
        _w(root / "sys/fs/cgroup/cpu.max", "max 100000")  # the root: no limit; the job's own file holds it
        _w(root / "sys/fs/cgroup/job/cpu.max", m.cpu_max)
    if m.cfs_quota is not None:  # cgroup v1, as Docker and Kubernetes on older hosts: a cpu,cpuacct hierarchy
        cgroups.append("4:cpu,cpuacct:/kubepods/pod1")
        mounts.append("cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0")
        _w(root / "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", m.cfs_quota[0])
        _w(root / "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", m.cfs_quota[1])
        _w(root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1")
        _w(root / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000")
    if cgroups:
        _w(root / "proc/self/cgroup", "\n".join(cgroups))
        _w(root / "proc/mounts", "\n".join(mounts))
    write_nics(root, m)
    for path, text in m.files.items():
        _w(root / path, text)
    for path, target in m.links.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).symlink_to(target)
    return root


def uniform(
    packages: int,
    cores_per_package: int,
    threads: int = 1,
    nodes_per_package: int = 1,
    l3_per_node: int = 1,
    interleaved_smt: bool = True,
) -> FakeMachine:
    """A regular x86-like machine. With ``interleaved_smt`` the siblings of core c are c, c+ncores, ..."""
    ncores = packages * cores_per_package
    cores: list[tuple[int, ...]] = []
    for c in range(ncores):
        if interleaved_smt:
            cores.append(tuple(c + t * ncores for t in range(threads)))
        else:
            cores.append(tuple(c * threads + t for t in range(threads)))
    per_node = cores_per_package // nodes_per_package
    per_l3 = per_node // l3_per_node
    return FakeMachine(
        cores=cores,
        node_of_core=[c // per_node for c in range(ncores)],
        package_of_core=[c // cores_per_package for c in range(ncores)],
        l3_of_core=[c // per_l3 for c in range(ncores)],
    )


def this_machine_with_gpus(ngpus: int = 2) -> FakeMachine:
    """This machine's own CPUs (from the live sysfs), one NUMA node, plus ``ngpus`` fake NVIDIA GPUs on node 0."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    m = FakeMachine(
        cores=[(c,) for c in cpus],
        node_of_core=[0] * len(cpus),
        package_of_core=[0] * len(cpus),
        l3_of_core=[0] * len(cpus),
    )
    m.gpus = [FakeGPU(pci=f"0000:{0x17 + 0x20 * i:02x}:00.0", numa_node=0, uuid=f"GPU-fake-{i:04d}") for i in range(ngpus)]
    return m


# ------------------------------------------------------------------------------------------------ live-like trees
# What a real host's sysfs holds beyond write_tree's minimum (cpu_capacity, cpufreq, every cache level, the hybrid
# PMUs' CPU lists, /proc/cpuinfo), in the shapes found on hosts that broke affrun: issue 26's VM reported the same
# cpu_capacity for every CPU (one core kind), arm64 servers have one MIDR, containers on a hybrid laptop see only
# its P-cores, VMs often have no cpufreq and some no cache/ at all. tests/conftest.py points the "live" machine at
# one of them with AFFRUN_TEST_LIVE (docs/development.md).
LIVE_VARIANTS = ("uniform-capacity", "one-kind", "no-cpufreq", "no-cache", "hybrid", "arm64")


def write_live_like(root: Path, variant: str, cpus: Sequence[int] | None = None) -> Path:
    """A live-like tree at ``root`` whose allowed CPUs are ``cpus`` (default: this process's affinity, so that a
    test that binds itself still finds its CPUs in the tree). One core per CPU, one package, one NUMA node.

    * ``uniform-capacity``: cpu_capacity 1024 and one cpufreq maximum on every CPU: one core kind ("core").
    * ``one-kind``: ``cpus`` are P-cores of a hybrid Intel part, with as many E-cores after them that the
      cgroup's cpuset leaves out: two kinds on the machine, one allowed.
    * ``no-cpufreq``: cpu_capacity only (a VM): one kind from the capacity.
    * ``no-cache``: cpufreq without cpu_capacity, and no ``cache/`` directory.
    * ``hybrid``: the first half of ``cpus`` P-cores, the rest E-cores, all allowed (``--cpus`` narrows it).
    * ``arm64``: one MIDR_EL1 value (a Neoverse V2 server) and a uniform cpu_capacity.
    """
    import os

    if variant not in LIVE_VARIANTS:
        raise ValueError(f"unknown live-like variant {variant!r} (one of {', '.join(LIVE_VARIANTS)})")
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    ids = list(allowed)
    fast = set(ids)
    if variant == "one-kind":
        ids += [max(ids) + 1 + i for i in range(len(ids))]
    elif variant == "hybrid":
        fast = set(ids[: max(1, len(ids) // 2)])
    m = FakeMachine(cores=[(c,) for c in ids], node_of_core=[0] * len(ids), package_of_core=[0] * len(ids),
                    l3_of_core=None if variant == "no-cache" else [0] * len(ids))
    if variant == "one-kind":
        m.cgroup_cpus = format_cpulist(allowed)
    write_tree(root, m)
    cpu_dir = root / "sys/devices/system/cpu"
    for cpu in ids:
        d = cpu_dir / f"cpu{cpu}"
        big = cpu in fast
        if variant != "no-cache":
            for index, (level, kind) in enumerate(((1, "Data"), (1, "Instruction"), (2, "Unified"))):
                _w(d / f"cache/index{index}/level", str(level))
                _w(d / f"cache/index{index}/type", kind)
                _w(d / f"cache/index{index}/shared_cpu_list", str(cpu))
            _w(d / "cache/index3/type", "Unified")
        if variant != "no-cache":
            _w(d / "cpu_capacity", "1024" if big else "512")
        if variant in ("uniform-capacity", "one-kind", "no-cache", "hybrid"):
            _w(d / "cpufreq/cpuinfo_max_freq", "4700000" if big else "3400000")
            _w(d / "cpufreq/base_frequency", "2100000" if big else "1600000")
        if variant == "arm64":
            _w(d / "regs/identification/midr_el1", "0x00000000410fd4f1")
    if variant in ("one-kind", "hybrid"):
        _w(root / "sys/devices/cpu_core/cpus", format_cpulist(sorted(fast)))
        _w(root / "sys/devices/cpu_atom/cpus", format_cpulist(sorted(set(ids) - fast)))
    vendor = "vendor_id\t: ARM" if variant == "arm64" else "vendor_id\t: GenuineIntel\ncpu family\t: 6"
    _w(root / "proc/cpuinfo", "\n\n".join(f"processor\t: {cpu}\n{vendor}" for cpu in ids))
    return root


def generated_machines() -> dict[str, FakeMachine]:
    """The shapes the suite generates, one of each, by name: for tests that must hold on every machine
    (tests/system/test_front_ends_every_machine.py). A new shape added here is covered there without a new test."""

    def with_gpus(m: FakeMachine, nodes: Sequence[int | None]) -> FakeMachine:
        m.gpus = [FakeGPU(pci=f"0000:{0x10 + 0x10 * i:02x}:00.0", numa_node=n) for i, n in enumerate(nodes)]
        return m

    crossing = FakeMachine(cores=[(i,) for i in range(8)], node_of_core=[0, 0, 0, 0, 0, 1, 1, 1],
                           package_of_core=[0, 0, 0, 1, 1, 1, 1, 1])
    cpuless = FakeMachine(cores=[(i,) for i in range(8)], node_of_core=[0] * 4 + [1] * 4, package_of_core=[0] * 8,
                          cpuless_nodes=[2, 3], node_memory_kb={2: 98566144, 3: 0},
                          distances={0: {0: 10, 1: 20, 2: 40, 3: 80}, 1: {0: 20, 1: 10, 2: 40, 3: 80},
                                     2: {0: 40, 1: 40, 2: 10, 3: 80}, 3: {0: 80, 1: 80, 2: 80, 3: 10}})
    offline = uniform(1, 4, threads=2)
    offline.offline = {5, 6}
    cgroup = uniform(2, 4, threads=2)
    cgroup.cgroup_cpus, cgroup.cpu_max = "0-3,8-9", "250000 100000"
    v1_quota = uniform(1, 4)
    v1_quota.cfs_quota = ("150000", "100000")
    sparse = FakeMachine(cores=[(0, 64), (2, 66), (8, 72), (9, 73)], node_of_core=[0, 0, 1, 1],
                         package_of_core=[0, 0, 1, 1], l3_of_core=[0, 0, 1, 1])
    loose_gpu = with_gpus(uniform(2, 4), [None, 1])
    loose_gpu.extra_pci = [("0000:c0:00.0", 0x10DE, 0x068000), ("0000:03:00.0", 0x1A03, 0x030000)]
    return {
        "one-cpu": uniform(1, 1),
        "2p8c2t-4gpus": with_gpus(uniform(2, 8, threads=2), [0, 0, 1, 1]),
        "8p32c-8gpus": with_gpus(uniform(8, 32), range(8)),
        "2p64c2t-snc4": uniform(2, 64, threads=2, nodes_per_package=4, l3_per_node=4),
        "packages-cross-nodes": crossing,
        "cpuless-nodes": cpuless,
        "offline-siblings": offline,
        "cgroup2-cpuset-and-quota": cgroup,
        "cgroup1-quota": v1_quota,
        "sparse-cpu-ids": sparse,
        "gpus-without-node": loose_gpu,
        "more-gpus-than-cores": with_gpus(uniform(1, 2), [0, 0, 0, 0]),
        **priority_machines(),
    }


# ------------------------------------------------------------------------------------------------ priority cores
# Four machines with what a real host shows of its core clocks (docs/priority-cores.md): each PU's
# acpi_cppc/{highest_perf,nominal_perf,nominal_freq}, its cpufreq/{cpuinfo_max_freq,base_frequency} (intel_pstate
# in HWP mode), /proc/cpuinfo (model line and flags) and, where ITMT is on, /proc/sys/kernel/sched_itmt_enabled.
# tests/unit/test_priority_cores.py states what each must give; the planner's tests ask for them by name.
PRIORITY_MACHINES = ("xeon6-pct", "xeon-sst-bf", "itmt-desktop", "homogeneous-server")
_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 "
          "ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology "
          "nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx est tm2 ssse3 fma cx16 xtpr pdcm pcid "
          "sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch "
          "cpuid_fault epb fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt xsaveopt "
          "xsavec xgetbv1 xsaves dtherm ida arat pln pts hwp hwp_notify hwp_act_window hwp_epp hwp_pkg_req")
_AVX512 = " avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"


@dataclass(frozen=True)
class CoreClock:
    """What each PU of a core reports: CPPC highest_perf (100 MHz units, as on Intel), max and base in kHz."""

    highest_perf: int
    max_khz: int
    base_khz: int


def with_clocks(m: FakeMachine, clock_of_core: Callable[[int], CoreClock], model: tuple[str, int, int], flags: str,
                *, itmt: bool = False, policy_links: bool = False) -> FakeMachine:
    """``m`` with each core's clock files (``clock_of_core(core index)``), a ``proc/cpuinfo`` of GenuineIntel
    family 6 ``model`` (name, model number, stepping) with ``flags``, and ITMT's switch when ``itmt``. With
    ``policy_links`` cpufreq lives in ``cpu/cpufreq/policyN`` behind a ``cpuN/cpufreq`` link, as the kernel has it."""
    name, number, stepping = model
    cpu = "sys/devices/system/cpu"
    blocks: dict[int, str] = {}
    for ci, core in enumerate(m.cores):
        clock = clock_of_core(ci)
        for pu in core:
            freq = f"{cpu}/cpufreq/policy{pu}" if policy_links else f"{cpu}/cpu{pu}/cpufreq"
            if policy_links:
                m.links[f"{cpu}/cpu{pu}/cpufreq"] = f"../cpufreq/policy{pu}"
            m.files.update({
                f"{freq}/cpuinfo_max_freq": str(clock.max_khz), f"{freq}/cpuinfo_min_freq": "800000",
                f"{freq}/base_frequency": str(clock.base_khz), f"{freq}/scaling_driver": "intel_pstate",
                f"{cpu}/cpu{pu}/acpi_cppc/highest_perf": str(clock.highest_perf),
                f"{cpu}/cpu{pu}/acpi_cppc/nominal_perf": str(clock.base_khz // 100_000),
                f"{cpu}/cpu{pu}/acpi_cppc/nominal_freq": str(clock.base_khz // 1000),
                f"{cpu}/cpu{pu}/acpi_cppc/lowest_perf": "8"})
            blocks[pu] = (f"processor\t: {pu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {number}\n"
                          f"model name\t: {name}\nstepping\t: {stepping}\nphysical id\t: {m.package_of_core[ci]}\n"
                          f"core id\t\t: {ci}\nflags\t\t: {flags}\n")
    m.files["proc/cpuinfo"] = "\n".join(blocks[pu] for pu in sorted(blocks))
    if itmt:
        m.files["proc/sys/kernel/sched_itmt_enabled"] = "1"
    return m


def _gpus(m: FakeMachine, nodes: Sequence[int]) -> FakeMachine:
    m.gpus = [FakeGPU(pci=f"0000:{0x18 + 0x10 * i:02x}:00.0", numa_node=n, uuid=f"GPU-prio-{i}") for i, n in enumerate(nodes)]
    return m


def xeon6_pct() -> FakeMachine:
    """A DGX B300-like host of two Xeon 6776P (Granite Rapids) with Priority Core Turbo: 2 packages of 48 cores with
    SMT (core c is PUs c and c+96), one NUMA node each, 8 GPUs (4 per node). 8 priority cores per package, 4 on
    each of its two compute dies (cores 0-3, 24-27, 48-51, 72-75), report highest_perf 46 and 4.6 GHz; the others
    42 and 4.2 GHz (within 10%: one core kind); base 2.3 GHz everywhere; ITMT on; cpufreq behind policy links.
    Priority CPUs: 0-3,24-27,48-51,72-75 and their siblings 96-99,120-123,144-147,168-171."""
    m = uniform(2, 48, threads=2)

    def clock(ci: int) -> CoreClock:
        return CoreClock(46, 4_600_000, 2_300_000) if ci % 24 < 4 else CoreClock(42, 4_200_000, 2_300_000)

    flags = _FLAGS + _AVX512 + " avx512_fp16 amx_bf16 amx_tile amx_int8"
    return _gpus(with_clocks(m, clock, ("Intel(R) Xeon(R) 6776P", 173, 1), flags, itmt=True, policy_links=True),
                 [0, 0, 0, 0, 1, 1, 1, 1])


def sst_bf_xeon() -> FakeMachine:
    """Two Xeon Gold 6252N with Speed Select Base Frequency on: 2 packages of 24 cores with SMT (core c is PUs c and
    c+48), 4 GPUs (2 per node). The 8 high-priority cores of each package (1, 2, 5, 8, 13, 16, 19, 22, and 24
    more in package 1) have a base frequency of 2.8 GHz, the others 2.1 GHz; max 3.6 GHz and highest_perf 36
    everywhere; no ITMT. hwloc makes two kinds of it (the base frequencies differ); affrun one kind with 16
    priority cores: CPUs 1,2,5,8,13,16,19,22,25,26,29,32,37,40,43,46 and their siblings (+48)."""
    m = uniform(2, 24, threads=2)

    def clock(ci: int) -> CoreClock:
        high = ci % 24 in (1, 2, 5, 8, 13, 16, 19, 22)
        return CoreClock(36, 3_600_000, 2_800_000 if high else 2_100_000)

    return _gpus(with_clocks(m, clock, ("Intel(R) Xeon(R) Gold 6252N CPU @ 2.30GHz", 85, 7), _FLAGS + _AVX512),
                 [0, 0, 1, 1])


def itmt_desktop() -> FakeMachine:
    """A Core i9-10900K desktop with Turbo Boost Max 3.0 and ITMT on: 10 cores with SMT (core c is PUs c and c+10),
    one GPU. Core 3 reports highest_perf 53 (5.3 GHz), core 6 52 (5.2 GHz), the rest 51 (5.1 GHz, within 10%: one
    kind); base 3.7 GHz. Priority CPUs best first: 3, 6, then their siblings 13, 16."""
    m = uniform(1, 10, threads=2)

    def clock(ci: int) -> CoreClock:
        perf = {3: 53, 6: 52}.get(ci, 51)
        return CoreClock(perf, perf * 100_000, 3_700_000)

    return _gpus(with_clocks(m, clock, ("Intel(R) Core(TM) i9-10900K CPU @ 3.70GHz", 165, 5), _FLAGS, itmt=True),
                 [0])


def homogeneous_server() -> FakeMachine:
    """A server of two Xeon Platinum 8480+ whose firmware reports highest_perf 255 (a placeholder) on every CPU:
    2 packages of 16 cores with SMT, 4 GPUs; max 3.8 GHz and base 2.0 GHz everywhere; no ITMT. No priority cores."""
    m = uniform(2, 16, threads=2)
    clock = CoreClock(255, 3_800_000, 2_000_000)
    flags = _FLAGS + _AVX512 + " avx512_fp16 amx_bf16 amx_tile amx_int8"
    return _gpus(with_clocks(m, lambda ci: clock, ("Intel(R) Xeon(R) Platinum 8480+", 143, 8), flags), [0, 0, 1, 1])


def priority_machines() -> dict[str, FakeMachine]:
    """The four machines of :data:`PRIORITY_MACHINES`, by name."""
    return {"xeon6-pct": xeon6_pct(), "xeon-sst-bf": sst_bf_xeon(), "itmt-desktop": itmt_desktop(),
            "homogeneous-server": homogeneous_server()}


# ---------------------------------------------------------------------------------------------- NICs, PCI tree
def pci_device_dir(root: Path, m: FakeMachine, bdf: str) -> Path:
    """The directory of PCI device ``bdf``: under ``sys/devices/<its PCI path>`` with the ``sys/bus/pci/devices``
    link the kernel makes when ``m.pci_paths`` places it, else a plain ``sys/bus/pci/devices/<bdf>`` directory."""
    entry = root / "sys/bus/pci/devices" / bdf
    path = m.pci_paths.get(bdf)
    if path is None:
        entry.mkdir(parents=True, exist_ok=True)
        return entry
    real = root / "sys/devices" / "/".join(path) / bdf
    real.mkdir(parents=True, exist_ok=True)
    if not entry.is_symlink():
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.symlink_to("../../../devices/" + "/".join((*path, bdf)))
    return real


def write_nics(root: Path, m: FakeMachine) -> None:
    """Each NIC's PCI function (class 0x0207 or 0x0200, Mellanox), its class device and the class link; plus the
    virtual ``lo`` and ``docker0`` a real host has, which are no NICs. A NIC's function is under
    ``pci0000:00`` when ``m.pci_paths`` does not place it."""
    if not m.nics:
        return
    for name, kind in (("lo", "772"), ("docker0", "1")):
        d = root / "sys/devices/virtual/net" / name
        _w(d / "type", kind)
        _w(d / "operstate", "unknown")
        (root / "sys/class/net").mkdir(parents=True, exist_ok=True)
        if not (root / "sys/class/net" / name).is_symlink():
            (root / "sys/class/net" / name).symlink_to(f"../../devices/virtual/net/{name}")
    for nic in m.nics:
        m.pci_paths.setdefault(nic.pci, ("pci0000:00",))
        fn = pci_device_dir(root, m, nic.pci)
        rdma = nic.kind in ("infiniband", "roce")
        _w(fn / "vendor", "0x15b3")
        _w(fn / "class", "0x020700" if rdma else "0x020000")
        _w(fn / "numa_node", str(-1 if nic.numa_node is None else nic.numa_node))
        if nic.local_cpus is not None:
            _w(fn / "local_cpulist", format_cpulist(nic.local_cpus))
        klass = "infiniband" if rdma else "net"
        owner = fn / "virtio0" if nic.virtio else fn
        dev = owner / klass / nic.name
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "device").symlink_to(f"../../../{owner.name}")
        if rdma:
            for number, (state, rate) in enumerate(nic.ports, start=1):
                _w(dev / f"ports/{number}/state", state)
                _w(dev / f"ports/{number}/rate", rate)
                _w(dev / f"ports/{number}/link_layer", "Ethernet" if nic.kind == "roce" else "InfiniBand")
        else:
            state, speed = nic.ports[0]
            _w(dev / "type", "32" if nic.kind == "ipoib" else "1")
            _w(dev / "operstate", state)
            _w(dev / "speed", speed)
        link = root / "sys/class" / klass / nic.name
        link.parent.mkdir(parents=True, exist_ok=True)
        inner = f"{nic.pci}/virtio0" if nic.virtio else nic.pci
        link.symlink_to(f"../../devices/{'/'.join(m.pci_paths[nic.pci])}/{inner}/{klass}/{nic.name}")


def dgx_like() -> FakeMachine:
    """A DGX H100-like node: 2 packages of 8 cores, one NUMA node each, 8 GPUs, each behind its own PCIe switch
    (under its own host bridge) with one 400 Gb/s compute NIC; names in neither GPU nor PCI order
    (mlx5_0,3,5,4 on package 0, mlx5_9,6,11,10 on package 1), plus dual-port 200 Gb/s storage cards, one function
    each, directly under a root port: mlx5_1, mlx5_2 (package 0, mlx5_2's port down) and mlx5_7, mlx5_8
    (package 1). And ``eno1``, an Ethernet interface, up."""
    m = uniform(packages=2, cores_per_package=8)
    compute = ["mlx5_0", "mlx5_3", "mlx5_5", "mlx5_4", "mlx5_9", "mlx5_6", "mlx5_11", "mlx5_10"]
    gpu_buses = [0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF]
    for i, bus in enumerate(gpu_buses):
        top = bus - 3  # the host bridge's root bus; the switch's upstream port on top+1, downstream ports on top+2
        path = (f"pci0000:{top:02x}", f"0000:{top:02x}:01.0", f"0000:{top + 1:02x}:00.0")
        gpu, nic = f"0000:{bus:02x}:00.0", f"0000:{bus + 1:02x}:00.0"
        m.pci_paths[gpu] = (*path, f"0000:{top + 2:02x}:00.0")
        m.pci_paths[nic] = (*path, f"0000:{top + 2:02x}:01.0")
        m.gpus.append(FakeGPU(pci=gpu, numa_node=i // 4, uuid=f"GPU-dgx-{i}"))
        m.nics.append(FakeNIC(compute[i], nic, i // 4))
    storage = [("mlx5_1", 0x2A, 0, 0), ("mlx5_2", 0x2A, 1, 0), ("mlx5_7", 0xAA, 0, 1), ("mlx5_8", 0xAA, 1, 1)]
    for name, bus, fn, node in storage:
        bdf = f"0000:{bus:02x}:00.{fn}"
        m.pci_paths[bdf] = (f"pci0000:{bus - 1:02x}", f"0000:{bus - 1:02x}:01.0")
        state = "1: DOWN" if name == "mlx5_2" else "4: ACTIVE"
        m.nics.append(FakeNIC(name, bdf, node, ports=((state, "200 Gb/sec (4X HDR)"),)))
    m.nics.append(FakeNIC("eno1", "0000:0a:00.0", 0, "ethernet", (("up", "25000"),)))
    return m


def break_nics(root: Path, case: str) -> str:
    """Damage the NICs of a tree written from :func:`dgx_like` the way a hostile or broken sysfs can; returns the
    name of the NIC that must give a warning and no NIC. ``loop``: mlx5_9's ``device`` link points at itself;
    ``state``: mlx5_6's port state is garbage; ``node``: mlx5_11 is on NUMA node 7, which does not exist; ``fifo``:
    mlx5_10's port rate is a FIFO; ``many``: 10,000 interfaces in ``sys/class/net`` (then no interface is read)."""
    ib = root / "sys/class/infiniband"
    if case == "loop":
        device = ib / "mlx5_9" / "device"
        device.unlink()
        device.symlink_to("device")
        return "mlx5_9"
    if case == "state":
        (ib / "mlx5_6/ports/1/state").write_text("banana: split\n")
        return "mlx5_6"
    if case == "node":
        (ib / "mlx5_11/device/numa_node").write_text("7\n")
        return "mlx5_11"
    if case == "fifo":
        import os

        rate = ib / "mlx5_10/ports/1/rate"
        rate.unlink()
        os.mkfifo(rate)
        return "mlx5_10"
    if case == "many":
        net = root / "sys/class/net"
        for i in range(10_000):
            (net / f"eth{i}").symlink_to(f"../../devices/virtual/net/eth{i}")
        return "eno1"
    raise ValueError(case)


HOSTILE_NIC_CASES = ("loop", "state", "node", "fifo", "many")


# ------------------------------------------------------------------------------ NIC trees that lie (issue 34)
def rename_nics(m: FakeMachine, names: dict[str, str]) -> FakeMachine:
    """``m`` with NICs renamed (old name -> new). A sysfs name is bytes: a name with surrogate escapes
    (``'mlx5_\\udcff'``) is written as those bytes (0xff), as ``os.fsencode`` writes it."""
    for nic in m.nics:
        nic.name = names.get(nic.name, nic.name)
    return m


def lie_about_nics(root: Path, case: str) -> str:
    """Damage a tree written from :func:`dgx_like` the way a lying sysfs can, beyond :func:`break_nics`; returns the
    name of the NIC that must give a warning and no NIC (every other NIC is read). ``rate-*``: a port rate that is
    no rate (``nan``, ``1e308``, negative, 11 digits, a word, no unit); ``link-layer``: neither InfiniBand nor
    Ethernet; ``port-*``: a port directory that is no port number (huge, a word, ``01`` beside ``1``);
    ``outside``: the ``device`` link leads to a copy of the function outside ``sys/devices``; ``alias``: a second
    class entry, ``mlx5_99``, links to mlx5_9's directory; ``speed*``, ``operstate``, ``net-type``: eno1's."""
    import os
    import shutil

    ib = root / "sys/class/infiniband"
    rates = {"rate-nan": ("mlx5_9", "nan Gb/sec (4X NDR)"), "rate-huge": ("mlx5_6", "1e308 Gb/sec (4X NDR)"),
             "rate-negative": ("mlx5_11", "-400 Gb/sec (4X NDR)"), "rate-digits": ("mlx5_10", "99999999999 Gb/sec"),
             "rate-word": ("mlx5_3", "fast"), "rate-unit": ("mlx5_5", "400")}
    eno1 = {"speed": ("speed", "fast"), "speed-huge": ("speed", "99999999999"),
            "operstate": ("operstate", "\x1b[31mup"), "net-type": ("type", "ether")}
    if case in rates:
        name, text = rates[case]
        (ib / name / "ports/1/rate").write_text(text + "\n")
        return name
    if case in eno1:
        file, text = eno1[case]
        (root / "sys/class/net/eno1" / file).write_text(text + "\n")
        return "eno1"
    if case == "link-layer":
        (ib / "mlx5_4/ports/1/link_layer").write_text("Banana\n")
        return "mlx5_4"
    ports = {"port-huge": ("mlx5_0", "99999999999999999999"), "port-word": ("mlx5_1", "first"),
             "port-twice": ("mlx5_8", "01")}
    if case in ports:
        name, entry = ports[case]
        shutil.copytree(ib / name / "ports/1", ib / name / "ports" / entry)
        if case == "port-huge":
            shutil.rmtree(ib / name / "ports/1")
        return name
    if case == "outside":
        real = (ib / "mlx5_9").resolve()
        copy = root / "home/pci0000:9a" / real.parent.parent.name
        shutil.copytree(real.parent.parent, copy, symlinks=True)
        (ib / "mlx5_9/device").unlink()
        (ib / "mlx5_9/device").symlink_to(os.path.relpath(copy, real))
        (root / "sys/bus/pci/devices" / copy.name).unlink()
        return "mlx5_9"
    if case == "alias":
        (ib / "mlx5_99").symlink_to(os.readlink(ib / "mlx5_9"))
        return "mlx5_99"
    raise ValueError(case)


LYING_NIC_CASES = ("rate-nan", "rate-huge", "rate-negative", "rate-digits", "rate-word", "rate-unit", "link-layer",
                   "port-huge", "port-word", "port-twice", "outside", "alias", "speed", "speed-huge", "operstate",
                   "net-type")


def nic_xml(io: str) -> str:
    """A small hwloc 2 XML export: two packages, each one NUMA node of two cores (CPUs 0-1, 2-3), and under
    package 0 a host bridge ``pci0000:10`` whose root port ``0000:10:01.0`` holds ``io`` (``PCIDev`` and other
    objects, written by the test: how a hostile export nests its ``OSDev``s)."""
    def package(p: int) -> str:
        cpus = f"0x{3 << (2 * p):x}"
        cores = "".join(f'<object type="Core" os_index="{c}" cpuset="0x{1 << c:x}"><object type="PU" os_index="{c}" '
                        f'cpuset="0x{1 << c:x}"/></object>' for c in (2 * p, 2 * p + 1))
        bridge = ('<object type="Bridge" bridge_type="0-1" depth="0" bridge_pci="0000:[10-1f]"><object type="Bridge" '
                  'bridge_type="1-1" depth="1" bridge_pci="0000:[11-1f]" pci_busid="0000:10:01.0">'
                  f'{io}</object></object>' if p == 0 else "")
        return (f'<object type="Package" os_index="{p}" cpuset="{cpus}" nodeset="0x{1 << p:x}"><object type="NUMANode" '
                f'os_index="{p}" cpuset="{cpus}" nodeset="0x{1 << p:x}" local_memory="1073741824"/>{cores}{bridge}'
                '</object>')
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n<topology version="2.0">'
            '<object type="Machine" os_index="0" cpuset="0xf" nodeset="0x3">' + package(0) + package(1)
            + '</object></topology>\n')


def xml_nic(name: str, bdf: str = "0000:11:00.0", osdev_type: str = "3", inner: str = "") -> str:
    """A ``PCIDev`` at ``bdf`` holding one network ``OSDev`` (port 1 active when OpenFabrics), for :func:`nic_xml`;
    ``name`` is XML text (``&#10;`` writes a newline)."""
    port = '<info name="Port1State" value="4"/>' if osdev_type == "3" else ""
    return (f'<object type="PCIDev" pci_busid="{bdf}" pci_type="0207 [15b3:1019] [15b3:0008] 00">'
            f'<object type="OSDev" name="{name}" osdev_type="{osdev_type}">{port}{inner}</object></object>')
