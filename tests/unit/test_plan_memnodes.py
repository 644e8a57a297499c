"""A rank's memory nodes as the planner writes them (sorted, each once, only nodes with memory the cpuset allows),
over generated machines with memory-less nodes (hypothesis).

The machines are test_plan_properties' generated ones, with some nodes made memory-less, memory-only nodes that
the initiator table makes local to CPU nodes (some of them equally near, as CXL and HBM are), and a cpuset that
may forbid some memory. Every plan the planner makes must be read back by the rank, checks included.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from launcher.bind.handoff import ParentPlan
from launcher.errors import PlanError
from launcher.plan.planner import Request, make_plan
from launcher.topology.model import NumaNode, Topology
from tests.plan_cases import SETTINGS, Machine, machines, requests
from tests.plan_check import check_handoff


@st.composite
def memoryless_machines(draw: st.DrawFn) -> Machine:
    m = draw(machines())
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    topo = m.topo
    nodes = list(topo.numa_nodes)
    ids = [n.os_index for n in nodes]
    # Some nodes lose their memory; a memory-only node (CXL, HBM) may be local to the CPUs of one or two CPU nodes,
    # several of them with the same CPUs (equally near).
    memoryless = {i for i in ids if rnd.random() < 0.5}
    extra: list[NumaNode] = []
    next_id = max(ids) + 1
    for _ in range(draw(st.integers(0, 3))):
        near = rnd.sample(nodes, min(len(nodes), rnd.choice([1, 1, 2])))
        local = frozenset().union(*(n.cpus for n in near))
        for _ in range(rnd.choice([1, 2])):  # two memory nodes local to the same CPUs: equally near
            extra.append(NumaNode(next_id, frozenset(), {}, memory_kb=1 << 20, local_cpus=local or None))
            next_id += 1
    all_ids = ids + [n.os_index for n in extra]
    dist = {i: {j: 10 if i == j else rnd.choice([11, 20, 20, 32]) for j in all_ids} for i in all_ids}
    nodes = [replace(n, memory_kb=0 if n.os_index in memoryless else 1 << 20, distances=dist[n.os_index])
             for n in nodes] + [replace(n, distances=dist[n.os_index]) for n in extra]
    with_memory = [n.os_index for n in nodes if n.memory_kb]
    mems = frozenset(i for i in with_memory if rnd.random() < 0.7) if draw(st.booleans()) else None
    topo = replace(topo, numa_nodes=tuple(sorted(nodes, key=lambda n: n.os_index)), allowed_mems=mems)
    return Machine(topo, m.cpu_nodes, m.cpuless_nodes)


@st.composite
def memoryless_cases(draw: st.DrawFn) -> tuple[Topology, Request]:
    m = draw(memoryless_machines())
    return m.topo, draw(requests(m))


@SETTINGS
@given(memoryless_cases())
def test_every_plan_on_memoryless_nodes_is_accepted_by_its_ranks(case: tuple[Topology, Request]) -> None:
    topo, req = case
    try:
        plan = make_plan(topo, req)
    except PlanError:
        return
    for rank in plan.ranks:
        assert list(rank.mem_nodes) == sorted(set(rank.mem_nodes))
        for m in rank.mem_nodes:  # the memory policy names only nodes with memory that the cpuset allows
            node = topo.node(m)
            assert node is not None and node.memory_kb != 0
            assert topo.allowed_mems is None or m in topo.allowed_mems
    check_handoff(ParentPlan(plan, "rank", "safe", "none", "auto", {}, False))
