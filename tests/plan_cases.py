"""Hypothesis strategies for random machines and plan requests, shared by the property tests."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from launcher.base.choices import MAIN_THREADS, MODES
from launcher.errors import PlanError
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology.model import GPU, Core, L3Group, NumaNode, Package, Topology
from launcher.topology.priority import PriorityCores

# 200 examples per property run in a few seconds; AFFRUN_HYPOTHESIS_EXAMPLES=5000 searches deeper.
SETTINGS = settings(
    max_examples=int(os.environ.get("AFFRUN_HYPOTHESIS_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ----------------------------------------------------------------------------------------- generators
@dataclass(frozen=True)
class Machine:
    topo: Topology
    cpu_nodes: tuple[int, ...]  # node ids that have CPUs
    cpuless_nodes: tuple[int, ...]


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    npackages = draw(st.integers(1, 3))
    nodes_per_package = draw(st.integers(1, 3))
    cores_per_node = draw(st.integers(1, 6))
    smt = draw(st.sampled_from([1, 1, 2, 4]))
    numbering = draw(st.sampled_from(["interleaved", "sequential", "sparse"]))
    l3_per_node = draw(st.sampled_from([0, 1, 2]))  # 0: no L3 information
    ncpuless = draw(st.integers(0, 3))

    nnodes = npackages * nodes_per_package
    ncores = nnodes * cores_per_node
    # Sparse node ids: CPU nodes and CPU-less nodes get distinct ids out of 0..40, in random order.
    node_ids = rnd.sample(range(41), nnodes + ncpuless) if draw(st.booleans()) else list(range(nnodes + ncpuless))
    cpu_node_ids = node_ids[:nnodes]
    cpuless_ids = node_ids[nnodes:]

    # PU ids of every core.
    if numbering == "interleaved":  # siblings c, c+ncores, ... (x86 Linux)
        pus_of = [tuple(c + t * ncores for t in range(smt)) for c in range(ncores)]
    elif numbering == "sequential":  # siblings adjacent (POWER, some ARM)
        pus_of = [tuple(c * smt + t for t in range(smt)) for c in range(ncores)]
    else:  # sparse, increasing ids with holes
        ids = sorted(rnd.sample(range(ncores * smt * 3), ncores * smt))
        pus_of = [tuple(ids[c * smt : (c + 1) * smt]) for c in range(ncores)]

    cores: list[Core] = []
    l3_sets: list[set[int]] = []
    for c, pus in enumerate(pus_of):
        node_pos = c // cores_per_node
        pkg = node_pos // nodes_per_package
        l3: int | None = None
        if l3_per_node:
            per_l3 = max(1, -(-cores_per_node // l3_per_node))
            l3 = node_pos * l3_per_node + (c % cores_per_node) // per_l3
            while len(l3_sets) <= l3:
                l3_sets.append(set())
            l3_sets[l3].update(pus)
        cores.append(Core(os_index=c % cores_per_node, pus=pus, package=pkg, numa_node=cpu_node_ids[node_pos], l3=l3))
    cores.sort(key=lambda core: core.pus[0])
    # L3 logical indices must follow first-PU order, as the readers produce them.
    order = sorted((i for i, s in enumerate(l3_sets) if s), key=lambda i: min(l3_sets[i]))
    remap = {old: new for new, old in enumerate(order)}
    cores = [
        Core(c.os_index, c.pus, c.package, c.numa_node, None if c.l3 is None else remap[c.l3]) for c in cores
    ]
    l3_groups = tuple(L3Group(frozenset(l3_sets[i])) for i in order)

    all_ids = node_ids
    dist: dict[int, dict[int, int]] = {a: {a: 10} for a in all_ids}
    for i, a in enumerate(all_ids):
        for b in all_ids[i + 1 :]:
            d = rnd.randint(11, 60)
            dist[a][b] = d
            dist[b][a] = d
    nodes = []
    for nid in sorted(all_ids):
        cpus = frozenset(p for c in cores if c.numa_node == nid for p in c.pus)
        nodes.append(NumaNode(os_index=nid, cpus=cpus, distances=dict(dist[nid])))
    packages = tuple(
        Package(os_index=p, cpus=frozenset(q for c in cores if c.package == p for q in c.pus)) for p in range(npackages)
    )
    online = frozenset(p for c in cores for p in c.pus)

    # Allowed subset: everything, a random subset of PUs, or whole random cores.
    allowed_kind = draw(st.sampled_from(["all", "pus", "cores"]))
    if allowed_kind == "all":
        allowed = online
    elif allowed_kind == "pus":
        allowed = frozenset(p for p in online if rnd.random() < 0.7) or frozenset([min(online)])
    else:
        allowed = frozenset(p for c in cores if rnd.random() < 0.7 for p in c.pus) or frozenset(cores[0].pus)

    # GPUs.
    ngpus = draw(st.integers(0, 8))
    gpus: list[GPU] = []
    for g in range(ngpus):
        kind = rnd.choice(["cpu-node", "cpu-node", "cpuless", "unknown", "local-cpus"])
        numa: int | None
        local: frozenset[int]
        if kind == "cpuless" and cpuless_ids:
            numa, local = rnd.choice(cpuless_ids), frozenset()
        elif kind == "unknown":
            numa, local = None, rnd.choice([frozenset(), online])
        elif kind == "local-cpus":
            nid = rnd.choice(cpu_node_ids)
            numa, local = None, next(n.cpus for n in nodes if n.os_index == nid)
        else:
            numa = rnd.choice(cpu_node_ids)
            local = next(n.cpus for n in nodes if n.os_index == numa)
        gpus.append(GPU(index=g, pci=f"0000:{0x10 + g:02x}:00.0", vendor="nvidia", numa_node=numa, cpus=local))
    visible: tuple[int, ...] | None = None
    restrict: bool = draw(st.booleans())
    if gpus and restrict:
        visible = tuple(rnd.sample(range(ngpus), rnd.randint(0, ngpus)))

    topo = Topology(
        packages=packages,
        numa_nodes=tuple(nodes),
        l3_groups=l3_groups,
        cores=tuple(cores),
        online=online,
        offline=frozenset(),
        allowed=allowed,
        gpus=tuple(gpus),
        visible=visible,
        source="generated",
    )
    return Machine(topo, tuple(cpu_node_ids), tuple(cpuless_ids))


@st.composite
def requests(draw: st.DrawFn, m: Machine) -> Request:
    topo = m.topo
    ncores = len(topo.allowed_cores())
    online = sorted(topo.online)
    mode = draw(st.sampled_from(MODES))
    nproc = draw(st.integers(1, max(1, ncores + 2)))
    reserve = frozenset(draw(st.lists(st.sampled_from(online), max_size=3))) if draw(st.booleans()) else frozenset()
    loader = draw(st.sampled_from([0, 0, 1, 2]))
    nvis = len(topo.visible_gpus())
    gpus: tuple[int, ...] | None = None
    if draw(st.integers(0, 4)) == 0:
        gpus = tuple(draw(st.lists(st.integers(-1, nvis), min_size=nproc, max_size=nproc)))
    cpu_map: tuple[frozenset[int], ...] | None = None
    if mode == "map":
        allowed = sorted(topo.allowed)
        if draw(st.booleans()):  # disjoint, allowed
            shuffled = draw(st.permutations(allowed))
            nproc = min(nproc, len(shuffled))
            cpu_map = tuple(frozenset(shuffled[i::nproc]) for i in range(nproc))
        else:  # anything: may overlap, leave the allowed set, or be empty
            cpu_map = tuple(
                frozenset(draw(st.lists(st.sampled_from(online), max_size=4))) for _ in range(nproc)
            )
        if gpus is not None:
            gpus = gpus[:nproc]
    return Request(
        nproc=nproc,
        mode=mode,
        smt=draw(st.booleans()),
        reserve=reserve,
        loader_cores=loader,
        gpu_order=draw(st.sampled_from(["rank", "closest"])),
        cpu_map=cpu_map,
        gpus=gpus,
        use_gpus=draw(st.sampled_from([True, True, False])),
        spill=draw(st.sampled_from(["loader", "loader", "compute", "none"])),
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[Machine, Request]:
    m = draw(machines())
    return m, draw(requests(m))


def plan_or_error(topo: Topology, req: Request) -> Plan | None:
    try:
        return make_plan(topo, req)
    except PlanError as exc:
        assert str(exc), "PlanError without a message"
        assert "\n" not in str(exc), "a PlanError message must be one line"
        return None



@st.composite
def main_thread_cases(draw: st.DrawFn) -> tuple[Machine, Request]:
    """A machine with a random set of priority cores (whole cores or single PUs, in a random order of priority;
    none at all in a quarter of the cases), and a request with a random ``--main-thread`` and ``--comm-cores``."""
    m = draw(machines())
    topo = m.topo
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    if draw(st.integers(0, 3)):
        share = draw(st.sampled_from([0.1, 0.3, 0.7]))
        cores = [c for c in topo.cores if rnd.random() < share]
        cpus = [p for c in cores for p in (c.pus if rnd.random() < 0.9 else c.pus[:1])]
        order = tuple(rnd.sample(cpus, len(cpus)))
        priority = PriorityCores(frozenset(cpus), order, "generated")
    else:
        priority = PriorityCores(why_none="generated without any")
    m = replace(m, topo=replace(topo, priority=priority))
    req = draw(requests(m))
    return m, replace(req, main_thread=draw(st.sampled_from(MAIN_THREADS)),
                      comm_cores=draw(st.sampled_from([0, 0, 1, 2])))


# ----------------------------------------------------------------------------------------- core kinds, comm cores
@st.composite
def hybrid_machines(draw: st.DrawFn) -> Machine:
    """A :func:`machines` machine whose cores are of 2 or 3 kinds (P-, E- and LP E-cores), drawn core by core."""
    from launcher.topology.kinds import CoreKind, CoreKinds

    m = draw(machines())
    nkinds = draw(st.integers(2, 3))
    kind_of = [draw(st.integers(0, nkinds - 1)) for _ in m.topo.cores]
    kinds = [CoreKind(frozenset(p for c, k in zip(m.topo.cores, kind_of) if k == i for p in c.pus), 0,
                      ["P-core", "E-core", "LP E-core"][i], "test") for i in range(nkinds)]
    kept = [k for k in kinds if k.cpus]
    ranked = tuple(replace(k, efficiency=len(kept) - 1 - i) for i, k in enumerate(kept))
    return Machine(replace(m.topo, core_kinds=CoreKinds(ranked)), m.cpu_nodes, m.cpuless_nodes)


@st.composite
def comm_cases(draw: st.DrawFn) -> tuple[Machine, Request]:
    """A machine (with core kinds half the time) and a request of :func:`requests` with any ``--main-thread`` and
    ``--comm-cores`` from 0 to more than a rank can have (the allowed cores, plus 2)."""
    m = draw(st.one_of(machines(), hybrid_machines()))
    req = draw(requests(m))
    ncores = len(m.topo.allowed_cores())
    shape = draw(st.sampled_from(["any", "fits", "overlapping map"]))
    if shape == "fits":  # a few ranks, so that most plans hold cores to spare
        req = replace(req, nproc=draw(st.integers(1, max(1, ncores // 2))), cpu_map=None, gpus=None,
                      mode="exclusive" if req.mode == "map" else req.mode)
    elif shape == "overlapping map":  # windows of the allowed CPUs that overlap: 0-3;2-5;4-7
        allowed = sorted(m.topo.allowed)
        width = draw(st.integers(1, max(1, len(allowed))))
        stride = draw(st.integers(1, width))
        nproc = draw(st.integers(1, 4))
        lists = tuple(frozenset(allowed[i * stride:i * stride + width]) for i in range(nproc))
        req = replace(req, mode="map", nproc=nproc, cpu_map=tuple(c for c in lists if c) or (frozenset(allowed),),
                      gpus=None)
        req = replace(req, nproc=len(req.cpu_map or ()))
    return m, replace(req, comm_cores=draw(st.one_of(st.integers(0, 3), st.integers(0, ncores + 2))),
                      main_thread=draw(st.sampled_from(MAIN_THREADS)))
