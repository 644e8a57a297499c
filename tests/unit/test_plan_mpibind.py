"""``--gpu-order closest`` against mpibind's own answers (LLNL mpibind ``test-suite/expected``).

Every case with GPU optimisation on (``gpu_optim=1``) and no restriction set (``restr_set`` null) is planned on
the machine's hwloc XML, and each task is compared with mpibind's answer for it:

* GPU: the rank's GPU is one of the GPUs mpibind gives the task (none where mpibind gives none);
* locality: the rank's compute CPUs are on the NUMA nodes of mpibind's CPUs for the task;
* capacity: the rank holds at least as many cores (compute plus loader) as mpibind's CPUs touch.

Cases left out are listed in ``EXCLUDED`` with the reason; a test checks that the list names exactly the
qualifying cases that are not compared, so none is dropped silently.

The second half writes out, by hand, closest plans where a node has fewer cores than its GPUs would draw: each
node's rank count is fitted to its cores before GPUs are chosen, so ranks keep CPU order and their GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.env.policy import rank_environment
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology import load_topology
from launcher.topology.hwloc_xml import load_hwloc_xml
from launcher.topology.model import Topology
from tests.conftest import FIXTURES, need
from tests.fakesys import FakeGPU, FakeMachine
from tests.machines import read_machine

MPIBIND = FIXTURES / "mpibind"
# answer file -> the topology XML mpibind's test driver loads for it (test-suite/<machine>.c)
MACHINES = {
    "coral-lassen": "coral-lassen.xml",
    "epyc-corona": "epyc-corona.xml",
    "coral-ea": "coral-ea-hwloc1.xml",
    "cts1-quartz": "cts1-quartz-smt1.xml",
}

EXCLUDED: dict[tuple[str, int], str] = {
    ("epyc-corona", 1): "48 tasks on the 48 PUs of the 24 cores of the GPU nodes, two tasks per core; affrun gives "
    "each rank whole cores of its own, so 48 ranks need all 48 cores, half of them on nodes without GPU",
    ("epyc-corona", 4): "in_nthreads=16 asks for 16 threads per task, an input affrun does not have; mpibind then "
    "spreads 7 tasks over all 8 nodes by worker count and gives tasks 2, 3 and 5 no GPU",
}


@dataclass(frozen=True)
class Case:
    machine: str
    number: int
    params: dict[str, object]
    description: str
    cpus: list[frozenset[int]]
    gpus: list[frozenset[int]]


def _unquote(line: str) -> str:
    return line.strip().strip('"')


def read_cases(machine: str) -> list[Case]:
    lines = [line.rstrip("\n") for line in (MPIBIND / "test-suite" / "expected" / f"expected.{machine}").open()]
    cases: list[Case] = []
    for i, line in enumerate(lines):
        if not (line.startswith("# ") and line.rstrip().endswith(":") and line[2:-1].strip().isdigit()):
            continue
        params = json.loads(lines[i + 1][2:])["params"]
        ntasks = int(params["ntasks"])
        cpus = [parse_cpulist(c) for c in _unquote(lines[i + 4]).split(";")]
        gpu_text = _unquote(lines[i + 5])
        gpus = [frozenset(int(g) for g in t.split(",") if g) for t in gpu_text.split(";")] if ntasks > 1 else [
            frozenset(int(g) for g in gpu_text.split(",") if g)
        ]
        assert len(cpus) == ntasks and len(gpus) == ntasks, (machine, line)
        cases.append(Case(machine, int(line[2:-1]), params, lines[i + 2].strip(), cpus, gpus))
    return cases


def qualifying() -> list[Case]:
    if not MPIBIND.is_dir():
        return []
    return [
        c
        for machine in MACHINES
        for c in read_cases(machine)
        if c.params["gpu_optim"] == 1 and c.params["restr_set"] is None
    ]


CASES = qualifying()
_topologies: dict[str, Topology] = {}


def topology(machine: str) -> Topology:
    if machine not in _topologies:
        _topologies[machine] = load_hwloc_xml(str(MPIBIND / "topo-xml" / MACHINES[machine]))
    return _topologies[machine]


def test_every_qualifying_case_is_compared_or_excluded_with_a_reason() -> None:
    need(MPIBIND.is_dir(), f"mpibind fixtures not found under {FIXTURES}")
    names = {(c.machine, c.number) for c in CASES}
    assert len(CASES) == 32  # 8 per machine: cases 1-4, 6-8 and 11 of mpibind's 12
    assert set(EXCLUDED) <= names, "an excluded case is not a qualifying case"
    assert all(reason for reason in EXCLUDED.values())


def mismatches(case: Case) -> list[str]:
    """How affrun's closest plan differs from mpibind's answer, task by task (empty when it matches)."""
    topo = topology(case.machine)
    # mpibind counts a GPU only where hwloc gave it a compute OS device; on coral-ea's export it sees none.
    sees_gpus = any(case.gpus)
    plan = make_plan(topo, Request(nproc=len(case.cpus), gpu_order="closest", use_gpus=sees_gpus))
    node_of = {p: n.os_index for n in topo.numa_nodes for p in n.cpus}
    core_of = {p: c.pus[0] for c in topo.cores for p in c.pus}
    out: list[str] = []
    for rank, cpus, gpus in zip(plan.ranks, case.cpus, case.gpus, strict=True):
        where = f"{case.machine} #{case.number} ({case.description}), task {rank.local_rank}"
        if not ((rank.gpu in gpus) if gpus else (rank.gpu is None)):
            out.append(f"{where}: GPU {rank.gpu}, mpibind {sorted(gpus) or 'none'}")
        nodes = {node_of[p] for p in cpus}
        mine = {node_of[p] for p in rank.compute_cpus}
        if not mine <= nodes:
            out.append(f"{where}: compute on nodes {sorted(mine)}, mpibind's CPUs on {sorted(nodes)}")
        cores = len({core_of[p] for p in rank.cpus})
        theirs = len({core_of[p] for p in cpus})
        if cores < theirs:
            out.append(f"{where}: {cores} cores, mpibind {theirs}")
    return out


COMPARED = [c for c in CASES if (c.machine, c.number) not in EXCLUDED]


@pytest.mark.parametrize("case", COMPARED, ids=[f"{c.machine}-{c.number}" for c in COMPARED])
def test_closest_order_matches_mpibind(case: Case) -> None:
    assert mismatches(case) == []


@pytest.mark.parametrize("key", sorted(EXCLUDED), ids=[f"{m}-{n}" for m, n in sorted(EXCLUDED)])
def test_excluded_cases_still_differ(key: tuple[str, int]) -> None:
    """An excluded case stays excluded only while its reason holds: if affrun comes to match it, compare it."""
    need(MPIBIND.is_dir(), f"mpibind fixtures not found under {FIXTURES}")
    (case,) = [c for c in CASES if (c.machine, c.number) == key]
    assert mismatches(case), f"{key} now matches mpibind: remove it from EXCLUDED"


# ============================================================================================= nodes that fill up
# closest order, more ranks than GPUs: the GPU nodes take ranks in proportion to their GPUs; a node's share above
# its cores goes to the nearest nodes with room before any GPU is chosen; then each rank uses a GPU of its own
# node (that node's ranks in balanced, contiguous blocks), or, on a node without GPU, one of the nearest GPU
# node's. Rows: (taskset list, GPU, NUMA node, OMP_NUM_THREADS).
Row = tuple[str, int | None, int | None, int]


def table(plan: Plan) -> list[Row]:
    rows: list[Row] = []
    for r in plan.ranks:
        env = rank_environment(r, local_world_size=len(plan.ranks), user_env={})
        (node,) = r.numa_nodes
        rows.append((format_cpulist(r.cpus), r.gpu, node, int(env.set["OMP_NUM_THREADS"])))
    return rows


def gpu_xml(name: str) -> Topology:
    path = FIXTURES / "hwloc-xml-gpu" / f"{name}.xml"
    need(path.is_file(), f"{path} not found")
    return load_hwloc_xml(str(path))


def closest(topo: Topology, nproc: int) -> Plan:
    return make_plan(topo, Request(nproc=nproc, gpu_order="closest"))


def test_hwloc_24em64t_eleven_ranks_keep_cpu_order_and_their_gpu() -> None:
    # hwloc's 24em64t-2n6c2t-pci: 2 nodes of 6 SMT2 cores, node 0 = even CPUs, node 1 = odd CPUs (siblings c and
    # c+12); GPU 0 on node 0, GPUs 1 and 2 on node 1. By GPUs, 11 ranks split 11/3 = 3.67 and 22/3 = 7.33: 4 and
    # 7 (the larger remainder, node 0's, takes the last one). Node 1 has 6 cores, so its 7th rank goes to node 0,
    # the only node with room: 5 + 6. Ranks 0-4 share GPU 0; ranks 5-10 split 3 + 3 over GPUs 1 and 2. Node 0's
    # 6 cores for 5 ranks: 2 + 1 + 1 + 1 + 1 (11 ranks on 12 cores: one rank holds two).
    # (Before: node 1 took 7, and rank 10 was then moved to node 0 with node 1's GPU 2.)
    plan = closest(gpu_xml("24em64t-2n6c2t-pci"), 11)
    assert table(plan) == [
        ("0,2,12,14", 0, 0, 2), ("4,16", 0, 0, 1), ("6,18", 0, 0, 1), ("8,20", 0, 0, 1), ("10,22", 0, 0, 1),
        ("1,13", 1, 1, 1), ("3,15", 1, 1, 1), ("5,17", 1, 1, 1),
        ("7,19", 2, 1, 1), ("9,21", 2, 1, 1), ("11,23", 2, 1, 1),
    ]
    assert plan.warnings == ()


@pytest.mark.parametrize("io", ["normalio", "wholeio"])
def test_hwloc_32em64t_fifteen_ranks_keep_cpu_order_and_their_gpu(io: str) -> None:
    # hwloc's 32em64t-2n8c2t-pci-*: 2 nodes of 8 SMT2 cores (node 0 = 0-7 and siblings 16-23, node 1 = 8-15 and
    # 24-31); GPU 0 on node 0, GPUs 1-3 on node 1 (two NVIDIA, and an AMD function at 84:00.1). By GPUs, 15 ranks
    # split 15/4 = 3.75 and 45/4 = 11.25: 4 and 11. Node 1 holds 8, so 3 go to node 0: 7 + 8. Ranks 0-6 share GPU
    # 0 on node 0's 8 cores (2 + 1 x 6); ranks 7-14, one core each, take GPUs 1, 2, 3 in blocks of 3 + 3 + 2.
    # (Before: ranks 12-14 were moved to node 0 and kept node 1's GPU 3.)
    plan = closest(gpu_xml(f"32em64t-2n8c2t-pci-{io}"), 15)
    assert table(plan) == [
        ("0-1,16-17", 0, 0, 2), *[(f"{c},{c + 16}", 0, 0, 1) for c in range(2, 8)],
        *[(f"{c},{c + 16}", 1, 1, 1) for c in (8, 9, 10)],
        *[(f"{c},{c + 16}", 2, 1, 1) for c in (11, 12, 13)],
        *[(f"{c},{c + 16}", 3, 1, 1) for c in (14, 15)],
    ]
    assert plan.warnings == ()


def test_a_small_node_with_two_gpus_keeps_its_ranks_on_them(tmp_path: Path) -> None:
    # Node 0 = cores 0-2 with GPUs 0 and 1; node 1 = cores 3-15 with GPU 2. By GPUs, 7 ranks split 14/3 = 4.67 and
    # 7/3 = 2.33: 5 and 2. Node 0 holds 3, so 2 go to node 1: 3 + 4. Node 0's ranks 0-2 take GPUs 0 and 1 in
    # blocks of 2 + 1; ranks 3-6 share GPU 2 on node 1's 13 cores: 4 + 3 + 3 + 3.
    # (Before: ranks 0-2 shared GPU 0, and GPU 1 was driven from node 1.)
    m = FakeMachine(cores=[(i,) for i in range(16)], node_of_core=[0] * 3 + [1] * 13, package_of_core=[0] * 3 + [1] * 13)
    m.gpus = [FakeGPU("0000:01:00.0", 0), FakeGPU("0000:02:00.0", 0), FakeGPU("0000:03:00.0", 1)]
    plan = closest(read_machine(tmp_path, m), 7)
    assert table(plan) == [
        ("0", 0, 0, 1), ("1", 0, 0, 1), ("2", 1, 0, 1),
        ("3-6", 2, 1, 4), ("7-9", 2, 1, 3), ("10-12", 2, 1, 3), ("13-15", 2, 1, 3),
    ]
    assert plan.warnings == ()


def test_ranks_of_a_node_without_gpu_even_out_the_domain(tmp_path: Path) -> None:
    # One package: node 0 = cores 0-1 with GPUs 0 and 1, node 1 = cores 2-5 and no GPU (its domain is node 0's).
    # All 5 ranks go to node 0 by GPUs; it holds 2, so 3 go to node 1. Node 0's own ranks 0 and 1 take GPUs 0 and
    # 1; node 1's ranks 2-4 then top the GPUs up to 3 + 2 sharers: ranks 2, 3 on GPU 0, rank 4 on GPU 1. Node 1's
    # 4 cores for 3 ranks: 2 + 1 + 1.
    m = FakeMachine(cores=[(i,) for i in range(6)], node_of_core=[0] * 2 + [1] * 4, package_of_core=[0] * 6)
    m.gpus = [FakeGPU("0000:01:00.0", 0), FakeGPU("0000:02:00.0", 0)]
    plan = closest(read_machine(tmp_path, m), 5)
    assert table(plan) == [("0", 0, 0, 1), ("1", 1, 0, 1), ("2-3", 0, 1, 2), ("4", 0, 1, 1), ("5", 1, 1, 1)]
    assert plan.ranks[2].reasons[0].endswith("shared by 3 rank(s); node 1 is in its domain")
    assert plan.warnings == ()


def test_fewer_ranks_than_gpus_trade_a_pick_for_a_gpu_with_room(tmp_path: Path) -> None:
    # Node 0 = core 0 with GPUs 0-2; node 1 = cores 1-7 with GPU 3. 2 ranks: by GPUs node 0 gets 1.5 and node 1
    # 0.5, the tie to node 0: GPUs 0 and 1. Node 0 holds one rank, so its second pick becomes GPU 3, free on node 1.
    # (Before: rank 1 was moved to node 1 and drove GPU 1 on node 0.)
    m = FakeMachine(cores=[(i,) for i in range(8)], node_of_core=[0] + [1] * 7, package_of_core=[0] * 8)
    m.gpus = [FakeGPU(f"0000:0{i + 1}:00.0", 0 if i < 3 else 1) for i in range(4)]
    topo = read_machine(tmp_path, m)
    plan = closest(topo, 2)
    assert table(plan) == [("0", 0, 0, 1), ("1-7", 3, 1, 7)]
    assert plan.warnings == ()
    # 4 ranks use every GPU: node 0 can hold the rank of GPU 0 only; those of GPUs 1 and 2 live on node 1, in
    # CPU order before GPU 3's own rank, with a warning each. Node 1's 7 cores for 3 ranks: 3 + 2 + 2.
    plan = closest(topo, 4)
    assert table(plan) == [("0", 0, 0, 1), ("1-3", 1, 1, 3), ("4-5", 2, 1, 2), ("6-7", 3, 1, 2)]
    assert plan.warnings == (
        "rank 1: node 0 has 1 core(s) for more ranks; placed on node 1, away from its GPU 1",
        "rank 2: node 0 has 1 core(s) for more ranks; placed on node 1, away from its GPU 2",
    )


def test_no_gpu_idles_while_another_is_shared(tmp_path: Path) -> None:
    # Node 0 = core 0 with GPUs 0 and 1; node 1 = cores 1-4 with GPU 2. By GPUs, 4 ranks split 8/3 = 2.67 and
    # 4/3 = 1.33: 3 and 1. Node 0 holds one rank, so 2 go to node 1: 1 + 3. Node 0's GPU 1 would then have no
    # rank while node 1's 3 share GPU 2, so of the ranks node 0 gave away it keeps one for GPU 1: the first of
    # node 1 (CPU order, GPU by GPU), with a warning. Node 1's 4 cores for 3 ranks: 2 + 1 + 1.
    # (As with fewer ranks than GPUs, where every GPU is used before a rank lives away from its GPU.)
    m = FakeMachine(cores=[(i,) for i in range(5)], node_of_core=[0] + [1] * 4, package_of_core=[0] * 5)
    m.gpus = [FakeGPU("0000:01:00.0", 0), FakeGPU("0000:02:00.0", 0), FakeGPU("0000:03:00.0", 1)]
    plan = closest(read_machine(tmp_path, m), 4)
    assert table(plan) == [("0", 0, 0, 1), ("1-2", 1, 1, 2), ("3", 2, 1, 1), ("4", 2, 1, 1)]
    assert plan.warnings == ("rank 1: node 0 has 1 core(s) for its 2 GPUs; placed on node 1, away from its GPU 1",)


def test_g4dn_metal_cut_to_two_cores_on_node_1_keeps_all_eight_gpus() -> None:
    # mpibind's g4dnmetal: node 0 = cores 0-23 with GPUs 0-3, node 1 = cores 24-47 with GPUs 4-7; --cpus 0-25
    # leaves node 1 two cores. 9 ranks split 4.5 + 4.5 by GPUs: 5 and 4 (ties to the earlier node). Node 1 holds
    # 2, so 2 go to node 0 (7 + 2), and they keep node 1's GPUs 6 and 7, which would otherwise idle while GPU 0
    # is shared. Node 0's ranks in CPU order: its own 5 (GPUs 0, 0, 1, 2, 3: balanced blocks of 2 + 1 + 1 + 1),
    # then the 2 lent to node 1 (GPUs 6 and 7, one warning each); node 1's 2 ranks take GPUs 4 and 5.
    topo = load_topology(topology_file=str(MPIBIND / "topo-xml" / "g4dnmetal.xml"), cpus="0-25", environ={})
    plan = closest(topo, 9)
    assert [(r.gpu, r.numa_nodes) for r in plan.ranks] == [
        (0, (0,)), (0, (0,)), (1, (0,)), (2, (0,)), (3, (0,)), (6, (0,)), (7, (0,)), (4, (1,)), (5, (1,))]
    assert sorted(set(r.gpu for r in plan.ranks)) == list(range(8))
    assert plan.warnings == (
        "rank 5: node 1 has 2 core(s) for its 4 GPUs; placed on node 0, away from its GPU 6",
        "rank 6: node 1 has 2 core(s) for its 4 GPUs; placed on node 0, away from its GPU 7",
    )
