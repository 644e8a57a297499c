"""Properties of the planner over generated machines (hypothesis).

Topologies are built directly from the model dataclasses (no files), so one example costs microseconds:
random packages, NUMA nodes with sparse ids, SMT with interleaved or sequential or sparse PU ids, CPU-less
nodes, L3 groups, allowed subsets, GPUs with a NUMA node (with or without CPUs), only ``local_cpus`` or no
locality at all, ``CUDA_VISIBLE_DEVICES``-like reordering, reserved CPUs, loader cores and every spill choice.

Every request either gives a plan that satisfies the invariants below or raises :class:`PlanError`; no
other exception is acceptable.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.errors import PlanError
from launcher.plan.planner import Plan, RankPlan, Request, make_plan
from launcher.topology.model import GPU, Core, NumaNode, Package, Topology
from tests.plan_cases import SETTINGS, Machine, cases, machines, plan_or_error


# ----------------------------------------------------------------------------------------- helpers
def usable_cores(topo: Topology, reserve: frozenset[int]) -> list[Core]:
    """Allowed cores minus every core that holds a reserved CPU (any of its PUs, allowed or not)."""
    reserved_firsts = {c.pus[0] for c in topo.cores if not reserve.isdisjoint(c.pus)}
    out = []
    for core in topo.allowed_cores():
        full = next(c for c in topo.cores if set(core.pus) <= set(c.pus))
        if full.pus[0] not in reserved_firsts:
            out.append(core)
    return out


def wants_node(topo: Topology, gpu: GPU, node: int, cores_on: dict[int, int]) -> bool:
    """Whether the GPU's locality points at ``node``: its NUMA node; for a node without usable cores (CPU-less,
    not allowed or reserved) a nearest node that has some (any of them on a tie); without a node, its local CPUs.
    ``cores_on``: usable cores per node."""
    if gpu.numa_node is not None:
        if cores_on.get(gpu.numa_node, 0):
            return gpu.numa_node == node
        own = next((n for n in topo.numa_nodes if n.os_index == gpu.numa_node), None)
        far = 1 << 30
        reach = {n: own.distances.get(n, far) if own else far for n, k in cores_on.items() if k}
        return node in reach and reach[node] == min(reach.values())
    node_cpus = next(n.cpus for n in topo.numa_nodes if n.os_index == node)
    return bool(gpu.cpus) and gpu.cpus != topo.online and not gpu.cpus.isdisjoint(node_cpus)


def home_cpus(r: RankPlan) -> set[int]:
    """The CPUs of the rank's home chunk: its mask without the cores spilled to it from nodes hosting no rank."""
    return set(r.cpus) - set(r.spill_cpus)


def in_gpu_domain(r: RankPlan) -> bool:
    """closest order, more ranks than the GPU nodes have cores: the rank lives on a node without GPU and shares
    the GPU of the nearest GPU node (its domain)."""
    return "is in its domain" in r.reasons[0]


def moved(plan: Plan, rank: int) -> bool:
    return any(w.startswith(f"rank {rank}: node ") and "placed on node" in w for w in plan.warnings)


# ----------------------------------------------------------------------------------------- properties
@SETTINGS
@given(cases())
def test_every_request_plans_or_raises_plan_error(case: tuple[Machine, Request]) -> None:
    m, req = case
    plan_or_error(m.topo, req)  # any other exception fails the test


@SETTINGS
@given(cases())
def test_masks_are_inside_allowed_disjoint_and_whole_cores(case: tuple[Machine, Request]) -> None:
    m, req = case
    topo = m.topo
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    assert len(plan.ranks) == req.nproc
    assert [r.local_rank for r in plan.ranks] == list(range(req.nproc))
    usable = usable_cores(topo, req.reserve)
    usable_pus = {p for c in usable for p in c.pus}
    for r in plan.ranks:
        assert r.cpus, f"rank {r.local_rank} has no CPU"
        assert set(r.cpus) <= topo.allowed
        assert set(r.cpus) <= usable_pus, "a rank got a reserved core"
        assert list(r.cpus) == sorted(set(r.cpus))
    if req.mode in ("exclusive", "l3") or (req.mode == "map" and not any("is given to ranks" in w for w in plan.warnings)):
        seen: dict[int, int] = {}
        for r in plan.ranks:
            for p in r.cpus:
                assert p not in seen, f"CPU {p} in ranks {seen[p]} and {r.local_rank}"
                seen[p] = r.local_rank
    if req.mode != "map":
        owner = {p: r.local_rank for r in plan.ranks for p in r.cpus}
        for core in usable:
            owners = {owner.get(p) for p in core.pus}
            assert len(owners) == 1, f"core {core.pus} split between ranks {owners}"


@SETTINGS
@given(cases())
def test_loader_threads_and_compute_sets(case: tuple[Machine, Request]) -> None:
    m, req = case
    plan = plan_or_error(m.topo, req)
    if plan is None:
        return
    for r in plan.ranks:
        compute = set(r.compute_cpus)
        loader = set(r.loader_cpus)
        assert loader <= set(r.cpus)
        assert compute.isdisjoint(loader)
        assert compute | loader == set(r.cpus)
        assert r.compute_cores, "no compute core"
        units = sum(len(c) for c in r.compute_cores) if req.smt else len(r.compute_cores)
        spill = set(r.spill_cpus)
        assert spill <= (compute if req.spill == "compute" else loader)
        if r.shared:
            assert req.mode in ("numa", "socket")
            sharers = sum(1 for o in plan.ranks if home_cpus(o) == home_cpus(r))
            assert sharers > 1
            assert r.threads == max(1, units // sharers)
            assert loader == (spill if req.spill == "loader" else set())
        else:
            assert r.threads == units
            pu_core = {p: c.pus[0] for c in m.topo.cores for p in c.pus}
            assert len({pu_core[p] for p in loader - spill}) == req.loader_cores


@SETTINGS
@given(cases())
def test_exclusive_chunks_are_balanced_within_a_node(case: tuple[Machine, Request]) -> None:
    m, req = case
    if req.mode != "exclusive":
        return
    plan = plan_or_error(m.topo, req)
    if plan is None:
        return
    for r in plan.ranks:
        assert len(r.numa_nodes) <= 1, "an exclusive chunk spans NUMA nodes"
    # A chunk's size in cores (compute plus loader), per node.
    core_count: dict[tuple[int, ...], list[int]] = {}
    pu_core = {p: c.pus[0] for c in m.topo.cores for p in c.pus}
    for r in plan.ranks:
        core_count.setdefault(r.numa_nodes, []).append(len({pu_core[p] for p in home_cpus(r)}))
    for node, counts in core_count.items():
        assert max(counts) - min(counts) <= 1, f"node {node}: chunk sizes {counts}"


@SETTINGS
@given(cases())
def test_each_mode_hands_out_its_unit(case: tuple[Machine, Request]) -> None:
    """l3: whole L3 groups; numa: the whole home node; socket: the whole package; map: exactly the user's CPUs."""
    m, req = case
    topo = m.topo
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    usable = usable_cores(topo, req.reserve)
    if req.mode == "map":
        assert req.cpu_map is not None
        for r in plan.ranks:
            assert set(r.cpus) == req.cpu_map[r.local_rank]
    elif req.mode == "numa":
        for r in plan.ranks:
            (node,) = r.numa_nodes
            assert home_cpus(r) == {p for c in usable if c.numa_node == node for p in c.pus}
    elif req.mode == "socket":
        for r in plan.ranks:
            packages = {c.package for c in usable if not set(c.pus).isdisjoint(home_cpus(r))}
            assert len(packages) == 1
            assert home_cpus(r) == {p for c in usable if c.package in packages for p in c.pus}
    elif req.mode == "l3":
        for r in plan.ranks:
            (node,) = r.numa_nodes
            if any(w.startswith(f"node {node}: ") and "L3 group" in w for w in plan.warnings):
                continue  # fewer L3 groups than ranks on this node: split by cores instead, with a warning
            groups = {c.l3 for c in usable if not set(c.pus).isdisjoint(home_cpus(r))}
            whole = {
                p for c in usable if c.numa_node == node and c.l3 in groups and c.l3 is not None for p in c.pus
            }
            if None not in groups:
                assert home_cpus(r) == whole, f"rank {r.local_rank} holds part of an L3 group"


@SETTINGS
@given(cases())
def test_ranks_sit_next_to_their_gpu(case: tuple[Machine, Request]) -> None:
    m, req = case
    topo = m.topo
    if req.mode == "map":
        return
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    visible = topo.visible_gpus() if req.use_gpus else ()
    usable = usable_cores(topo, req.reserve)
    cores_on: dict[int, int] = {}
    for c in usable:
        if c.numa_node is not None:
            cores_on[c.numa_node] = cores_on.get(c.numa_node, 0) + 1
    # GPU assignment: rank order is rank i -> visible GPU i; explicit --gpus wins.
    for r in plan.ranks:
        if req.gpus is not None:
            assert r.gpu == req.gpus[r.local_rank]
        elif req.gpu_order == "rank":
            assert r.gpu == (r.local_rank if r.local_rank < len(visible) else None)
        if r.gpu is not None:
            assert r.gpu_pci == visible[r.gpu].pci
    used = {r.gpu for r in plan.ranks if r.gpu is not None}
    for w in plan.warnings:
        if w.startswith("GPU ") and not w.startswith("GPU 0000"):  # the planner's GPU warnings, by visible index
            assert int(w.split()[1]) in used, f"warning about a GPU no rank uses: {w}"
    if req.gpus is None and req.gpu_order == "closest" and visible:
        given_gpus = [r.gpu for r in plan.ranks if r.gpu is not None]
        if req.nproc <= len(visible):  # one GPU each, never shared
            assert len(given_gpus) == len(set(given_gpus)) == req.nproc
        elif any(r.reasons[0].startswith("closest order") for r in plan.ranks):
            # More ranks than GPUs, and some GPU has a locality: GPUs are shared, so every rank has one.
            assert len(given_gpus) == req.nproc, "a rank without GPU although the GPUs are shared"
    for r in plan.ranks:
        if r.gpu is None or in_gpu_domain(r):
            continue
        node = visible[r.gpu].numa_node
        if node is None or cores_on.get(node, 0) == 0:
            continue
        if req.mode in ("exclusive", "l3") and moved(plan, r.local_rank):
            same = sum(1 for o in plan.ranks if o.gpu is not None and wants_node(topo, visible[o.gpu], node, cores_on))
            assert same > cores_on[node], "a rank was moved off its GPU's node although the node had room"
            continue
        if req.mode == "socket":
            assert node in r.numa_nodes
        else:
            assert r.numa_nodes == (node,), f"rank {r.local_rank} (GPU {r.gpu} on node {node}) got nodes {r.numa_nodes}"


@SETTINGS
@given(cases())
def test_no_allowed_core_is_idle_unless_spill_none(case: tuple[Machine, Request]) -> None:
    """Every usable core (allowed, not reserved) belongs to a rank; with --spill none nothing spills."""
    m, req = case
    if req.mode == "map":
        return
    plan = plan_or_error(m.topo, req)
    if plan is None:
        return
    if req.spill == "none":
        assert all(not r.spill_cpus for r in plan.ranks)
        return
    usable = {p for c in usable_cores(m.topo, req.reserve) for p in c.pus}
    assert {p for r in plan.ranks for p in r.cpus} == usable
    for r in plan.ranks:
        assert set(r.spill_cpus) <= set(r.cpus)
        assert set(r.spill_nodes) == {
            c.numa_node for c in m.topo.cores if c.numa_node is not None and not set(c.pus).isdisjoint(r.spill_cpus)
        }


@SETTINGS
@given(cases())
def test_compute_cpus_are_on_the_home_node(case: tuple[Machine, Request]) -> None:
    """Unless --spill compute, a rank computes only on its home node (package in socket mode), and a rank whose
    GPU's node has usable cores has that node as home (unless moved off a full node, with a warning, or, in
    closest order with more ranks than the GPU nodes have cores, placed on a node of the GPU's domain)."""
    m, req = case
    topo = m.topo
    if req.mode == "map" or req.spill == "compute":
        return
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    usable = usable_cores(topo, req.reserve)
    visible = topo.visible_gpus() if req.use_gpus else ()
    for r in plan.ranks:
        home = set(r.numa_nodes)
        if req.mode == "socket":
            packages = {c.package for c in usable if c.numa_node in home}
            allowed_here = {p for c in usable if c.package in packages for p in c.pus}
        else:
            allowed_here = {p for c in usable if c.numa_node in home or (not home and c.numa_node is None) for p in c.pus}
        assert set(r.compute_cpus) <= allowed_here, f"rank {r.local_rank} computes off its home node {home}"
        if r.gpu is None or req.mode == "socket" or moved(plan, r.local_rank):
            continue
        if in_gpu_domain(r):
            assert req.gpu_order == "closest" and req.mode in ("exclusive", "l3")
            continue
        gnode = visible[r.gpu].numa_node
        if gnode is not None and any(c.numa_node == gnode for c in usable):
            assert r.numa_nodes == (gnode,)


@SETTINGS
@given(cases())
def test_gpu_on_a_node_without_cpus_takes_the_nearest_node(case: tuple[Machine, Request]) -> None:
    m, req = case
    topo = m.topo
    if req.mode not in ("exclusive", "numa", "l3"):
        return
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    visible = topo.visible_gpus() if req.use_gpus else ()
    usable = usable_cores(topo, req.reserve)
    nodes_with_cores = sorted({c.numa_node for c in usable if c.numa_node is not None})
    for r in plan.ranks:
        if r.gpu is None or moved(plan, r.local_rank) or in_gpu_domain(r):
            continue
        gnode = visible[r.gpu].numa_node
        if gnode is None or gnode in nodes_with_cores:
            continue
        dist = next(n.distances for n in topo.numa_nodes if n.os_index == gnode)
        best = min(dist[n] for n in nodes_with_cores)
        (home,) = r.numa_nodes
        assert dist[home] == best, f"GPU node {gnode}: home {home} at {dist[home]}, nearest is at {best}"
        assert any(f"NUMA node {gnode}" in w for w in plan.warnings), "no warning for a CPU-less GPU node"


@SETTINGS
@given(cases())
def test_closest_with_more_ranks_than_gpus_fits_each_node_before_choosing_gpus(case: tuple[Machine, Request]) -> None:
    """closest order, whole cores, more ranks than GPUs: each node's rank count is fitted to its cores before GPUs
    are chosen, so no rank is moved afterwards; ranks follow CPU order (node by node); a rank on a node with GPUs
    uses one of that node's GPUs, a rank on a node without GPU says whose domain it joined; and the GPUs of a node
    are shared evenly (sharers per GPU differ by at most one)."""
    m, req = case
    topo = m.topo
    if req.gpu_order != "closest" or req.gpus is not None or req.mode not in ("exclusive", "l3") or not req.use_gpus:
        return
    visible = topo.visible_gpus()
    if req.nproc <= len(visible):
        return
    plan = plan_or_error(topo, req)
    if plan is None:
        return
    assert not any(moved(plan, r.local_rank) for r in plan.ranks), plan.warnings
    usable = usable_cores(topo, req.reserve)
    cores_on: dict[int, int] = {}
    first_pu: dict[int, int] = {}
    for c in usable:
        if c.numa_node is not None:
            cores_on[c.numa_node] = cores_on.get(c.numa_node, 0) + 1
            first_pu[c.numa_node] = min(first_pu.get(c.numa_node, c.pus[0]), *c.pus)
    ranks = [r for r in plan.ranks if r.reasons[0].startswith("closest order")]
    homes = [r.numa_nodes for r in ranks]
    assert all(len(h) == 1 for h in homes)
    firsts = [first_pu[h[0]] for h in homes]
    assert firsts == sorted(firsts), f"ranks do not follow CPU order: nodes {homes}"
    sharers: dict[int, int] = {}
    for r in ranks:
        assert r.gpu is not None
        sharers[r.gpu] = sharers.get(r.gpu, 0) + 1
        (home,) = r.numa_nodes
        if in_gpu_domain(r):
            assert not any(g.numa_node == home for g in visible), f"rank {r.local_rank} left its node's GPUs"
        elif not wants_node(topo, visible[r.gpu], home, cores_on):
            # only a GPU node with fewer cores than GPUs lends its GPUs to ranks elsewhere, and says so
            assert any(w.startswith(f"rank {r.local_rank}: ") and w.endswith(f"away from its GPU {r.gpu}")
                       for w in plan.warnings), f"rank {r.local_rank}: GPU {r.gpu} is not near, and no warning"
    # no GPU idles while another is shared
    assert {r.gpu for r in plan.ranks} >= set(range(len(visible))), sharers
    for node in cores_on:
        counts = [sharers.get(g, 0) for g, gpu in enumerate(visible) if gpu.numa_node == node]
        if counts:
            assert max(counts) - min(counts) <= 1, f"node {node}: GPUs shared by {counts} ranks"


@SETTINGS
@given(machines(), st.integers(1, 30), st.sampled_from(["exclusive", "l3"]))
def test_exclusive_succeeds_exactly_when_there_are_enough_cores(m: Machine, nproc: int, mode: str) -> None:
    """With no reserve, loader cores or explicit GPUs, whole-core modes fail only for more ranks than cores."""
    topo = m.topo
    plan = plan_or_error(topo, Request(nproc=nproc, mode=mode))
    if nproc <= len(topo.allowed_cores()):
        assert plan is not None
    else:
        assert plan is None


@SETTINGS
@given(machines(), st.integers(1, 12))
def test_cpu_only_ranks_spread_over_nodes_in_proportion(m: Machine, nproc: int) -> None:
    """A CPU-only job in exclusive mode: ranks per node follow each node's share of the cores (within one),
    and a node that holds ranks is used whole."""
    topo = m.topo
    cores = topo.allowed_cores()
    if nproc > len(cores):
        return
    plan = make_plan(topo, Request(nproc=nproc, use_gpus=False))
    per_node: dict[int | None, int] = {}
    for c in cores:
        per_node[c.numa_node] = per_node.get(c.numa_node, 0) + 1
    ranks_on: dict[int | None, list[int]] = {}
    for r in plan.ranks:
        assert r.gpu is None
        (home,) = r.numa_nodes
        ranks_on.setdefault(home, []).append(r.local_rank)
    total = len(cores)
    for node, ncores in per_node.items():
        count = len(ranks_on.get(node, []))
        assert abs(count - nproc * ncores / total) < 1, f"node {node}: {count} ranks for {ncores}/{total} cores"
        if count:
            used = {p for r in plan.ranks if r.local_rank in ranks_on[node] for p in home_cpus(r)}
            assert used == {p for c in cores if c.numa_node == node for p in c.pus}
    # Ranks fill nodes in blocks, in node order: consecutive ranks share a node.
    homes = [r.numa_nodes for r in plan.ranks]
    assert all(homes.index(h) + homes.count(h) - 1 == len(homes) - 1 - homes[::-1].index(h) for h in homes)


@pytest.mark.parametrize("nproc", [0, -1])
def test_rank_count_below_one_is_a_plan_error(nproc: int) -> None:
    topo = Topology(
        packages=(Package(0, frozenset({0})),),
        numa_nodes=(NumaNode(0, frozenset({0}), {0: 10}),),
        l3_groups=(),
        cores=(Core(0, (0,), 0, 0, None),),
        online=frozenset({0}),
        offline=frozenset(),
        allowed=frozenset({0}),
    )
    with pytest.raises(PlanError, match="at least 1"):
        make_plan(topo, Request(nproc=nproc))
