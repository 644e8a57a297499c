"""Known machines, each written out as a fake sysfs tree and read back by the real reader, with the plan
derived by hand from the layout.

Every expectation below is a literal: the CPU list of each rank (as ``taskset -c`` would print it), its visible
GPU, its NUMA node and its ``OMP_NUM_THREADS``. The comment above each one says how it follows from the layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher.base.cpulist import format_cpulist
from launcher.env.policy import rank_environment
from launcher.errors import AffrunError, ConfigError, PlanError
from launcher.options.record import Options
from launcher.plan.planner import Plan, Request, make_plan
from launcher.topology import load_topology
from launcher.topology.hwloc_xml import load_hwloc_xml
from launcher.topology.model import Topology
from tests.conftest import FIXTURES, need
from tests.fakesys import FakeGPU, FakeMachine, uniform, write_tree

Row = tuple[str, int | None, int | None, int]  # (cpus, visible GPU, NUMA node, OMP_NUM_THREADS)



@contextmanager
def refused_on_cli(kind: type[Exception], pattern: str) -> Iterator[None]:
    """The error as the command line prints it: the planner names options by key, and the front end spells them
    (launcher.options.table.spell_error)."""
    from launcher.options.table import spell_error

    with pytest.raises(kind) as caught:
        yield
    assert isinstance(caught.value, AffrunError)
    text = str(spell_error(caught.value))
    assert re.search(pattern, text), text

def read(tmp_path: Path, machine: FakeMachine, environ: Mapping[str, str] | None = None) -> Topology:
    root = write_tree(tmp_path / "root", machine)
    return load_topology(fsroot=str(root), environ=environ or {})


_trees: dict[str, Path] = {}
_read: dict[tuple[str, frozenset[tuple[str, str]]], Topology] = {}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Topology]:
    """``tree("dgx_a100", environ)``: the named machine's sysfs tree, written and read once per module and
    environment (a Topology is frozen; reading a 224-CPU tree opens thousands of files)."""

    def get(name: str, environ: Mapping[str, str] | None = None) -> Topology:
        if name not in _trees:
            _trees[name] = write_tree(tmp_path_factory.mktemp(name), MACHINES[name]())
        key = (name, frozenset((environ or {}).items()))
        if key not in _read:
            _read[key] = load_topology(fsroot=str(_trees[name]), environ=environ or {})
        return _read[key]

    return get


def table(plan: Plan) -> list[Row]:
    """What a user checks per rank: taskset list, GPU, NUMA node, and the OMP_NUM_THREADS affrun exports."""
    rows: list[Row] = []
    for r in plan.ranks:
        env = rank_environment(r, local_world_size=len(plan.ranks), user_env={})
        (node,) = r.numa_nodes or (None,)
        rows.append((format_cpulist(r.cpus), r.gpu, node, int(env.set["OMP_NUM_THREADS"])))
    return rows


def plan_of(topo: Topology, nproc: int, **opts: object) -> Plan:
    return make_plan(topo, Options(**opts).request(nproc))  # type: ignore[arg-type]


# ============================================================================================= DGX A100
# 2x AMD EPYC 7742: 64 cores per socket, SMT2, Linux numbers the siblings c and c+128. NPS4 splits each socket
# into 4 NUMA nodes of 16 cores (node n = cores 16n..16n+15 and their siblings), each node holding 2 CCDs = 4
# CCXs of 4 cores sharing an L3. The 8 A100s hang off nodes 3,3,1,1,7,7,5,5 (NVIDIA's DGX A100 user guide and
# `nvidia-smi topo -m`: GPU0 "CPU Affinity 48-63,176-191, NUMA Affinity 3"). NVSwitches (class 0x0680) and the
# BMC's ASPEED VGA are on PCI too and are not GPUs.
def dgx_a100() -> FakeMachine:
    m = uniform(packages=2, cores_per_package=64, threads=2, nodes_per_package=4, l3_per_node=4)
    buses = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]
    nodes = [3, 3, 1, 1, 7, 7, 5, 5]
    m.gpus = [FakeGPU(pci=f"0000:{b}:00.0", numa_node=n) for b, n in zip(buses, nodes)]
    m.extra_pci = [
        ("0000:c4:00.0", 0x10DE, 0x068000),  # NVSwitch
        ("0000:c5:00.0", 0x10DE, 0x068000),  # NVSwitch
        ("0000:22:00.0", 0x1A03, 0x030000),  # ASPEED BMC VGA
    ]
    return m


def test_dgx_a100_topology_is_read_as_built(tree: Callable[..., Topology]) -> None:
    topo = tree("dgx_a100")
    assert len(topo.packages) == 2
    assert [n.os_index for n in topo.numa_nodes] == list(range(8))
    assert format_cpulist(topo.node(3).cpus) == "48-63,176-191"  # type: ignore[union-attr]
    assert len(topo.cores) == 128 and topo.cores[0].pus == (0, 128)
    assert len(topo.l3_groups) == 32
    assert [g.numa_node for g in topo.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]  # NVSwitches and BMC VGA left out


def test_dgx_a100_rank_order(tree: Callable[..., Topology]) -> None:
    # Rank i -> GPU i -> its node. Two ranks share each GPU node; its 16 cores split 8 + 8 in L3 order, both
    # SMT siblings in the mask, OMP_NUM_THREADS = 8 physical cores. With --spill none, nodes 0, 2, 4, 6 (no GPU)
    # stay idle; the default spill is in test_dgx_a100_eight_ranks_spill.
    plan = plan_of(tree("dgx_a100"), 8, spill="none")
    assert table(plan) == [
        ("48-55,176-183", 0, 3, 8),
        ("56-63,184-191", 1, 3, 8),
        ("16-23,144-151", 2, 1, 8),
        ("24-31,152-159", 3, 1, 8),
        ("112-119,240-247", 4, 7, 8),
        ("120-127,248-255", 5, 7, 8),
        ("80-87,208-215", 6, 5, 8),
        ("88-95,216-223", 7, 5, 8),
    ]
    assert plan.warnings == ()
    assert [r.gpu_pci for r in plan.ranks][:2] == ["0000:07:00.0", "0000:0f:00.0"]


def test_dgx_a100_closest_order_follows_cpu_order(tree: Callable[..., Topology]) -> None:
    # Ranks in CPU order: node 1 (GPUs 2, 3), node 3 (GPUs 0, 1), node 5 (6, 7), node 7 (4, 5).
    plan = plan_of(tree("dgx_a100"), 8, gpu_order="closest", spill="none")
    assert table(plan) == [
        ("16-23,144-151", 2, 1, 8),
        ("24-31,152-159", 3, 1, 8),
        ("48-55,176-183", 0, 3, 8),
        ("56-63,184-191", 1, 3, 8),
        ("80-87,208-215", 6, 5, 8),
        ("88-95,216-223", 7, 5, 8),
        ("112-119,240-247", 4, 7, 8),
        ("120-127,248-255", 5, 7, 8),
    ]


def test_dgx_a100_smt_and_loader_cores(tree: Callable[..., Topology]) -> None:
    # --loader-cores 2 keeps the last 2 of each rank's 8 cores for DataLoader workers: rank 0 computes on
    # 48-53 (+176-181) and loads on 54-55 (+182-183). --smt counts both siblings: 6 cores -> 12 threads.
    plan = plan_of(tree("dgx_a100"), 8, loader_cores=2, smt=True, spill="none")
    r0, r7 = plan.ranks[0], plan.ranks[7]
    assert format_cpulist(r0.cpus) == "48-55,176-183"
    assert format_cpulist(r0.compute_cpus) == "48-53,176-181"
    assert format_cpulist(r0.loader_cpus) == "54-55,182-183"
    assert format_cpulist(r7.loader_cpus) == "94-95,222-223"
    assert table(plan)[0] == ("48-55,176-183", 0, 3, 12)
    plan = plan_of(tree("dgx_a100"), 8, loader_cores=2)
    assert [row[3] for row in table(plan)] == [6] * 8
    # With the default spill, rank 0 also holds node 2's first 8 cores as loader cores: 54-55 and 32-39.
    assert format_cpulist(plan.ranks[0].loader_cpus) == "32-39,54-55,160-167,182-183"


def test_dgx_a100_numa_and_socket_modes(tree: Callable[..., Topology]) -> None:
    topo = tree("dgx_a100")
    # numa: each rank gets its GPU's whole node, shared with the other rank there: 16 cores / 2 = 8 threads.
    plan = plan_of(topo, 8, mode="numa", spill="none")
    assert table(plan)[:2] == [("48-63,176-191", 0, 3, 8), ("48-63,176-191", 1, 3, 8)]
    assert all(r.shared for r in plan.ranks)
    # The default spill: node 2 (no GPU; same package, equally far, node 1 already took node 0) joins node 3's
    # two ranks, shared like their node, as loader cores: OMP_NUM_THREADS stays 8.
    plan = plan_of(topo, 8, mode="numa")
    assert table(plan)[:2] == [("32-63,160-191", 0, 3, 8), ("32-63,160-191", 1, 3, 8)]
    assert format_cpulist(plan.ranks[0].loader_cpus) == "32-47,160-175"
    # socket: GPUs 0-3 are on socket 0 (nodes 1 and 3), 4-7 on socket 1: 64 cores shared by 4 ranks = 16 threads.
    plan = plan_of(topo, 8, mode="socket")
    assert [(format_cpulist(r.cpus), r.threads) for r in plan.ranks] == [("0-63,128-191", 16)] * 4 + [
        ("64-127,192-255", 16)
    ] * 4


def test_dgx_a100_l3_mode(tree: Callable[..., Topology]) -> None:
    # l3: the 4 CCXs of 4 cores in node 3 go 2 + 2 to ranks 0 and 1: the same CPUs as exclusive here, because
    # 8 cores per rank is a whole number of CCXs.
    plan = plan_of(tree("dgx_a100"), 8, mode="l3", spill="none")
    assert table(plan)[:2] == [("48-55,176-183", 0, 3, 8), ("56-63,184-191", 1, 3, 8)]
    # 16 ranks: ranks 0-7 by their GPUs, 2 per GPU node; ranks 8-15 have no GPU and are spread by free cores:
    # 14 on each GPU node, 16 on the others, 120 in all, so 8 x 14/120 = 0.93 and 8 x 16/120 = 1.07: one per node
    # (largest remainders). A GPU node then has 3 ranks for its 4 CCXs: 2 + 1 + 1 whole CCXs; a node without GPU
    # gives its one rank all 4.
    plan = plan_of(tree("dgx_a100"), 16, mode="l3")
    assert table(plan) == [
        ("48-55,176-183", 0, 3, 8),
        ("56-59,184-187", 1, 3, 4),
        ("16-23,144-151", 2, 1, 8),
        ("24-27,152-155", 3, 1, 4),
        ("112-119,240-247", 4, 7, 8),
        ("120-123,248-251", 5, 7, 4),
        ("80-87,208-215", 6, 5, 8),
        ("88-91,216-219", 7, 5, 4),
        ("0-15,128-143", None, 0, 16),
        ("28-31,156-159", None, 1, 4),
        ("32-47,160-175", None, 2, 16),
        ("60-63,188-191", None, 3, 4),
        ("64-79,192-207", None, 4, 16),
        ("92-95,220-223", None, 5, 4),
        ("96-111,224-239", None, 6, 16),
        ("124-127,252-255", None, 7, 4),
    ]
    assert all(r.reasons[-1].endswith("whole L3 group(s) of node " + str(r.numa_nodes[0])) for r in plan.ranks)


def test_dgx_a100_eight_ranks_spill(tree: Callable[..., Topology]) -> None:
    # The default --spill loader. Nodes 0, 2, 4, 6 host no rank. The fake tree's distance table puts every other
    # node at 20, so an idle node goes to a rank node of its own package, the one whose ranks hold the fewest spill
    # cores so far: node 0 -> node 1, node 2 -> node 3 (node 1's ranks already have 8 each), 4 -> 5, 6 -> 7. The
    # 16 cores of an idle node are cut 8 + 8, in L3 order, for the two ranks there, as loader cores: 16 cores per
    # rank, the count NVIDIA's gpu_affinity gives, while OMP_NUM_THREADS stays at the 8 cores of the GPU's node.
    topo = tree("dgx_a100")
    plan = plan_of(topo, 8)
    assert table(plan) == [
        ("32-39,48-55,160-167,176-183", 0, 3, 8),
        ("40-47,56-63,168-175,184-191", 1, 3, 8),
        ("0-7,16-23,128-135,144-151", 2, 1, 8),
        ("8-15,24-31,136-143,152-159", 3, 1, 8),
        ("96-103,112-119,224-231,240-247", 4, 7, 8),
        ("104-111,120-127,232-239,248-255", 5, 7, 8),
        ("64-71,80-87,192-199,208-215", 6, 5, 8),
        ("72-79,88-95,200-207,216-223", 7, 5, 8),
    ]
    r0 = plan.ranks[0]
    assert (format_cpulist(r0.compute_cpus), format_cpulist(r0.loader_cpus)) == ("48-55,176-183", "32-39,160-167")
    assert (format_cpulist(r0.spill_cpus), r0.spill_nodes, r0.mem_nodes) == ("32-39,160-167", (2,), (3,))
    assert sorted(p for r in plan.ranks for p in r.cpus) == list(range(256))  # every CPU, once
    assert plan.warnings == () and plan.spill == "loader"
    # --spill compute: the same masks, and OMP_NUM_THREADS counts all 16 cores.
    plan = plan_of(topo, 8, spill="compute")
    assert [row[0] for row in table(plan)][:2] == ["32-39,48-55,160-167,176-183", "40-47,56-63,168-175,184-191"]
    assert [row[3] for row in table(plan)] == [16] * 8


def test_dgx_a100_two_ranks(tree: Callable[..., Topology]) -> None:
    topo = tree("dgx_a100")
    # Rank order: GPUs 0 and 1 are both on node 3, which the two ranks split 8 + 8. The other 7 nodes (112 cores)
    # all spill to node 3, the nearest nodes first (package 0's nodes 0, 1, 2, then 4-7), cut 56 + 56: rank 0 gets
    # nodes 0-2 and the first 8 cores of node 4, rank 1 the rest. Before, 224 of the 256 CPUs were idle.
    plan = plan_of(topo, 2)
    assert table(plan) == [("0-55,64-71,128-183,192-199", 0, 3, 8), ("56-63,72-127,184-191,200-255", 1, 3, 8)]
    assert plan.ranks[1].spill_nodes == (4, 5, 6, 7)
    # closest: 2 ranks for 8 GPUs are spread over the GPU domains, one per package; in package 0 the first GPU
    # node in CPU order is node 1 (GPUs 2, 3), in package 1 node 5 (GPUs 6, 7). Each rank computes on its GPU's
    # whole node (16 cores) and holds the rest of its package as loader cores: NVIDIA's socket split.
    plan = plan_of(topo, 2, gpu_order="closest")
    assert table(plan) == [("0-63,128-191", 2, 1, 16), ("64-127,192-255", 6, 5, 16)]
    assert format_cpulist(plan.ranks[0].compute_cpus) == "16-31,144-159"


# ============================================================================================= DGX H100
# 2x Xeon Platinum 8480C: 56 cores per socket, SMT2 (siblings c and c+112), one NUMA node and one L3 per
# socket. GPUs 0-3 on node 0, 4-7 on node 1 (buses 18, 2a, 3a, 5d | 9a, ab, ba, db).
def dgx_h100() -> FakeMachine:
    m = uniform(packages=2, cores_per_package=56, threads=2)
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    m.gpus = [FakeGPU(pci=f"0000:{b}:00.0", numa_node=i // 4) for i, b in enumerate(buses)]
    return m


def test_dgx_h100_four_ranks_per_socket(tree: Callable[..., Topology]) -> None:
    # 4 ranks per node: 56 cores / 4 = 14 cores each, contiguous, with siblings +112.
    plan = plan_of(tree("dgx_h100"), 8)
    assert table(plan) == [
        ("0-13,112-125", 0, 0, 14),
        ("14-27,126-139", 1, 0, 14),
        ("28-41,140-153", 2, 0, 14),
        ("42-55,154-167", 3, 0, 14),
        ("56-69,168-181", 4, 1, 14),
        ("70-83,182-195", 5, 1, 14),
        ("84-97,196-209", 6, 1, 14),
        ("98-111,210-223", 7, 1, 14),
    ]
    assert plan.warnings == ()


def test_dgx_h100_two_ranks(tree: Callable[..., Topology]) -> None:
    # Rank order: GPUs 0 and 1 are both on node 0 (socket 0): 56 cores split 28 + 28. Socket 1's node hosts no
    # rank, so its 56 cores are cut 28 + 28 as loader cores; before, its 112 CPUs were idle.
    plan = plan_of(tree("dgx_h100"), 2)
    assert table(plan) == [("0-27,56-83,112-139,168-195", 0, 0, 28), ("28-55,84-111,140-167,196-223", 1, 0, 28)]
    assert format_cpulist(plan.ranks[0].loader_cpus) == "56-83,168-195"
    # closest: one rank per socket, with that socket's first GPU (0 and 4), the whole node each.
    plan = plan_of(tree("dgx_h100"), 2, gpu_order="closest")
    assert table(plan) == [("0-55,112-167", 0, 0, 56), ("56-111,168-223", 4, 1, 56)]


def test_dgx_h100_smt_counts_hardware_threads(tree: Callable[..., Topology]) -> None:
    plan = plan_of(tree("dgx_h100"), 8, smt=True)
    assert [row[3] for row in table(plan)] == [28] * 8


def test_dgx_h100_cuda_visible_devices_reorders(tree: Callable[..., Topology]) -> None:
    # CUDA_VISIBLE_DEVICES=4,5,6,7,0,1,2,3: visible GPU 0 is physical GPU 4 (bus 9a, node 1), so rank 0 sits on
    # socket 1. The plan's `gpu` is the visible index, what torch.cuda.set_device takes.
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}
    plan = plan_of(tree("dgx_h100", env), 8)
    assert table(plan)[0] == ("56-69,168-181", 0, 1, 14)
    assert table(plan)[4] == ("0-13,112-125", 4, 0, 14)
    assert plan.ranks[0].gpu_pci == "0000:9a:00.0"


def test_dgx_h100_slurm_half_socket_job(tmp_path: Path) -> None:
    # A Slurm job that got cores 0-27 (+ siblings) through its cgroup and 2 GPUs: CUDA_VISIBLE_DEVICES=0,1.
    m = dgx_h100()
    m.cgroup_cpus = "0-27,112-139"
    plan = plan_of(read(tmp_path, m, {"CUDA_VISIBLE_DEVICES": "0,1"}), 2)
    assert table(plan) == [("0-13,112-125", 0, 0, 14), ("14-27,126-139", 1, 0, 14)]


def test_dgx_h100_explicit_gpus(tree: Callable[..., Topology]) -> None:
    # --gpus 7,6: both ranks' GPUs are on node 1; its 56 cores split 28 + 28.
    plan = plan_of(tree("dgx_h100"), 2, gpus="7,6", spill="none")
    assert table(plan) == [("56-83,168-195", 7, 1, 28), ("84-111,196-223", 6, 1, 28)]
    # By default node 0 (no rank) is cut 28 + 28 as loader cores for them: rank 0 also gets 0-27.
    plan = plan_of(tree("dgx_h100"), 2, gpus="7,6")
    assert table(plan) == [("0-27,56-83,112-139,168-195", 7, 1, 28), ("28-55,84-111,140-167,196-223", 6, 1, 28)]


def test_dgx_h100_more_ranks_than_gpus(tree: Callable[..., Topology]) -> None:
    # 10 ranks, 8 GPUs: ranks 0-7 sit by their GPUs (4 per node); ranks 8 and 9 have no GPU and are spread in
    # proportion to the free cores (52 and 52): one per node. Node 0 then has 5 ranks: 56 = 12 + 11 + 11 + 11 + 11.
    plan = plan_of(tree("dgx_h100"), 10)
    assert table(plan) == [
        ("0-11,112-123", 0, 0, 12),
        ("12-22,124-134", 1, 0, 11),
        ("23-33,135-145", 2, 0, 11),
        ("34-44,146-156", 3, 0, 11),
        ("56-67,168-179", 4, 1, 12),
        ("68-78,180-190", 5, 1, 11),
        ("79-89,191-201", 6, 1, 11),
        ("90-100,202-212", 7, 1, 11),
        ("45-55,157-167", None, 0, 11),
        ("101-111,213-223", None, 1, 11),
    ]
    assert plan.ranks[8].reasons[0] == "no GPU for this rank"


def test_dgx_h100_numa_mode_shares_the_socket(tree: Callable[..., Topology]) -> None:
    plan = plan_of(tree("dgx_h100"), 8, mode="numa")
    assert table(plan) == [("0-55,112-167", i, 0, 14) for i in range(4)] + [
        ("56-111,168-223", i, 1, 14) for i in range(4, 8)
    ]


# ============================================================================================= Frontier
# 1x AMD EPYC 7A53 "Trento": 64 cores, SMT2 (siblings c and c+64), NPS4 = 4 NUMA nodes of 16 cores, 8 CCDs of
# 8 cores each with its own L3. 8 MI250X GCDs (AMD 0x1002, class 0x038000): GCDs 0,1 on node 3, 2,3 on node 1,
# 4,5 on node 0, 6,7 on node 2 (OLCF Frontier user guide). Low-noise mode keeps the first core of each CCD for
# the OS: --reserve 0,8,16,24,32,40,48,56.
FRONTIER_RESERVE = "0,8,16,24,32,40,48,56"


def frontier() -> FakeMachine:
    m = uniform(packages=1, cores_per_package=64, threads=2, nodes_per_package=4, l3_per_node=2)
    buses = ["c1", "c6", "c9", "ce", "d1", "d6", "d9", "de"]
    nodes = [3, 3, 1, 1, 0, 0, 2, 2]
    m.gpus = [FakeGPU(pci=f"0000:{b}:00.0", numa_node=n, vendor=0x1002, klass=0x038000) for b, n in zip(buses, nodes)]
    return m


def test_frontier_closest_matches_olcf(tree: Callable[..., Topology]) -> None:
    # OLCF's documented low-noise layout (srun -c7 --gpu-bind=closest): rank i takes CCD i's 7 free cores,
    # 1-7; 9-15; ...; 57-63, and the GCD next to it: 4,5,2,3,6,7,0,1. affrun adds the SMT siblings (+64).
    plan = plan_of(tree("frontier"), 8, reserve=FRONTIER_RESERVE, gpu_order="closest")
    assert table(plan) == [
        ("1-7,65-71", 4, 0, 7),
        ("9-15,73-79", 5, 0, 7),
        ("17-23,81-87", 2, 1, 7),
        ("25-31,89-95", 3, 1, 7),
        ("33-39,97-103", 6, 2, 7),
        ("41-47,105-111", 7, 2, 7),
        ("49-55,113-119", 0, 3, 7),
        ("57-63,121-127", 1, 3, 7),
    ]
    assert [r.gpu_pci for r in plan.ranks] == [f"0000:{b}:00.0" for b in ["d1", "d6", "c9", "ce", "d9", "de", "c1", "c6"]]


def test_frontier_rank_order_keeps_each_gcd_next_to_its_ccd(tree: Callable[..., Topology]) -> None:
    # Rank i -> GCD i; the two GCDs of a node take its two CCDs in order: GCD 0 -> 49-55, GCD 1 -> 57-63, ...
    # (the same CCD <-> GCD pairs as the closest layout, in GPU order).
    for mode in ("exclusive", "l3"):
        plan = plan_of(tree("frontier"), 8, reserve=FRONTIER_RESERVE, mode=mode)
        assert table(plan) == [
            ("49-55,113-119", 0, 3, 7),
            ("57-63,121-127", 1, 3, 7),
            ("17-23,81-87", 2, 1, 7),
            ("25-31,89-95", 3, 1, 7),
            ("1-7,65-71", 4, 0, 7),
            ("9-15,73-79", 5, 0, 7),
            ("33-39,97-103", 6, 2, 7),
            ("41-47,105-111", 7, 2, 7),
        ], mode


def test_frontier_l3_without_reserve_gives_whole_ccds(tree: Callable[..., Topology]) -> None:
    plan = plan_of(tree("frontier"), 8, mode="l3")
    assert table(plan)[:2] == [("48-55,112-119", 0, 3, 8), ("56-63,120-127", 1, 3, 8)]
    assert "1 whole L3 group(s) of node 3" in plan.ranks[0].reasons


def test_frontier_rocr_visible_devices(tree: Callable[..., Topology]) -> None:
    # ROCR_VISIBLE_DEVICES=4,5: visible GCD 0 is physical GCD 4 on node 0.
    topo = tree("frontier", {"ROCR_VISIBLE_DEVICES": "4,5"})
    plan = plan_of(topo, 2, reserve=FRONTIER_RESERVE, spill="none")
    assert table(plan) == [("1-7,65-71", 0, 0, 7), ("9-15,73-79", 1, 0, 7)]
    # By default nodes 1-3 (42 free cores, all equally far) are cut 21 + 21 as loader cores: rank 0 gets the three
    # CCDs 2, 3, 4 (17-23, 25-31, 33-39), rank 1 the CCDs 5, 6, 7.
    plan = plan_of(topo, 2, reserve=FRONTIER_RESERVE)
    assert [format_cpulist(r.loader_cpus) for r in plan.ranks] == [
        "17-23,25-31,33-39,81-87,89-95,97-103", "41-47,49-55,57-63,105-111,113-119,121-127",
    ]
    assert [r.threads for r in plan.ranks] == [7, 7]


# ============================================================================================= Grace Hopper
# 4x GH200: 4 Grace CPUs of 72 cores (no SMT), NUMA nodes 0-3 = CPUs 72n..72n+71; each Hopper's memory shows up
# as CPU-less NUMA nodes, 8 per GPU: nodes 4-11 for superchip 0, 12-19 for 1, 20-27 for 2, 28-35 for 3.
# Distances: 10 to itself, 40 between Grace CPUs, 80 from a Grace to its own GPU memory, 120 to another's.
def grace_hopper(gpu_node: list[int]) -> FakeMachine:
    m = uniform(packages=4, cores_per_package=72)
    m.cpuless_nodes = list(range(4, 36))

    def chip(n: int) -> int:
        return n if n < 4 else (n - 4) // 8

    ids = list(range(36))
    m.distances = {}
    for a in ids:
        row = {}
        for b in ids:
            if a == b:
                row[b] = 10
            elif a < 4 and b < 4:
                row[b] = 40
            else:
                row[b] = 80 if chip(a) == chip(b) else 120
        m.distances[a] = row
    m.gpus = [
        FakeGPU(pci=f"00{d}9:01:00.0", numa_node=n, local_cpus=[] if n >= 4 else None)
        for d, n in zip("0123", gpu_node)
    ]
    return m


MACHINES: dict[str, Callable[[], FakeMachine]] = {
    "dgx_a100": dgx_a100,
    "dgx_h100": dgx_h100,
    "frontier": frontier,
    "gh200_cpu_node": lambda: grace_hopper([0, 1, 2, 3]),
    "gh200_memory_node": lambda: grace_hopper([4, 12, 20, 28]),
    "gh200_reversed": lambda: grace_hopper([28, 20, 12, 4]),
}


def test_grace_hopper_gpu_on_its_cpu_node(tree: Callable[..., Topology]) -> None:
    # PCI numa_node names the Grace node: rank i gets all 72 cores of node i, no warning.
    plan = plan_of(tree("gh200_cpu_node"), 4)
    assert table(plan) == [("0-71", 0, 0, 72), ("72-143", 1, 1, 72), ("144-215", 2, 2, 72), ("216-287", 3, 3, 72)]
    assert plan.warnings == ()


def test_grace_hopper_gpu_on_cpuless_memory_node(tree: Callable[..., Topology]) -> None:
    # PCI numa_node names the GPU's own memory node (4, 12, 20, 28), which has no CPUs: the nearest node with
    # CPUs by the distance table is that superchip's Grace (80, against 120 for the others), with a warning.
    topo = tree("gh200_memory_node")
    assert not topo.node(4).cpus  # type: ignore[union-attr]
    plan = plan_of(topo, 4)
    assert table(plan) == [("0-71", 0, 0, 72), ("72-143", 1, 1, 72), ("144-215", 2, 2, 72), ("216-287", 3, 3, 72)]
    assert any("NUMA node 4, which has no CPUs; using the nearest node with CPUs, 0" in w for w in plan.warnings)
    assert len([w for w in plan.warnings if "has no CPUs" in w]) == 4


def test_grace_hopper_distances_decide_not_numbering(tree: Callable[..., Topology]) -> None:
    # GPU i's memory node is on superchip 3-i: only the distance table says so. Rank 0 must go to node 3.
    plan = plan_of(tree("gh200_reversed"), 4)
    assert table(plan) == [("216-287", 0, 3, 72), ("144-215", 1, 2, 72), ("72-143", 2, 1, 72), ("0-71", 3, 0, 72)]
    # closest: ranks in CPU order, so rank 0 (node 0) takes GPU 3, whose memory is nearest to node 0.
    plan = plan_of(tree("gh200_reversed"), 4, gpu_order="closest")
    assert table(plan) == [("0-71", 3, 0, 72), ("72-143", 2, 1, 72), ("144-215", 1, 2, 72), ("216-287", 0, 3, 72)]


def test_grace_hopper_warns_only_about_gpus_in_use(tree: Callable[..., Topology]) -> None:
    # One rank uses GPU 0 only: one warning, about GPU 0's memory node 4, none about the other three.
    plan = plan_of(tree("gh200_memory_node"), 1, spill="none")
    assert table(plan) == [("0-71", 0, 0, 72)]
    # By default the one rank also gets the other three Grace CPUs, as loader cores.
    assert table(plan_of(tree("gh200_memory_node"), 1)) == [("0-287", 0, 0, 72)]
    assert [w for w in plan.warnings if "NUMA node" in w] == [
        "GPU 0 (0009:01:00.0) is on NUMA node 4, which has no CPUs; using the nearest node with CPUs, 0"
    ]


def test_grace_hopper_two_ranks_per_gpu(tree: Callable[..., Topology]) -> None:
    # --gpus 0,0,1,1: two ranks per GPU share its Grace: 36 + 36 cores.
    plan = plan_of(tree("gh200_memory_node"), 4, gpus="0,0,1,1", spill="none")
    assert table(plan) == [("0-35", 0, 0, 36), ("36-71", 0, 0, 36), ("72-107", 1, 1, 36), ("108-143", 1, 1, 36)]
    # By default the idle Graces 2 and 3 (all Graces 40 apart) go one to each busy node: node 2 to node 0 (first),
    # node 3 to node 1 (node 0's ranks already have 36 spill cores each), cut 36 + 36 as loader cores.
    plan = plan_of(tree("gh200_memory_node"), 4, gpus="0,0,1,1")
    assert table(plan) == [
        ("0-35,144-179", 0, 0, 36), ("36-71,180-215", 0, 0, 36), ("72-107,216-251", 1, 1, 36), ("108-143,252-287", 1, 1, 36)
    ]


# ============================================================================================= mpibind's machines
# LLNL's hwloc exports (fixtures/mpibind/topo-xml). coral-lassen: 2 POWER9 sockets = NUMA nodes 0 and 8, 20 SMT4
# cores each (the first core of each socket is kept for the system: allowed 8-87, 96-175), V100s 0, 1 on node 0
# and 2, 3 on node 8. epyc-corona: 2 EPYC sockets, 8 NUMA nodes of 6 cores (SMT2, siblings c+48), distance 16
# inside a socket and 32 across; one Radeon on each of nodes 1, 2, 5 and 7.
def mpibind_xml(name: str) -> Topology:
    path = FIXTURES / "mpibind" / "topo-xml" / f"{name}.xml"
    need(path.is_file(), f"{path} not found")
    return load_hwloc_xml(str(path))


def test_coral_lassen_two_ranks_closest() -> None:
    # 2 ranks for 4 GPUs: one per socket, with its first GPU, as mpibind does (task 1 on socket 1 with GPUs 2-3).
    plan = plan_of(mpibind_xml("coral-lassen"), 2, gpu_order="closest")
    assert table(plan) == [("8-87", 0, 0, 20), ("96-175", 2, 8, 20)]


def test_epyc_corona_two_ranks() -> None:
    topo = mpibind_xml("epyc-corona")
    # closest: one rank per socket: GPU 0 (node 1) and GPU 2 (node 5). Each computes on its GPU's 6 cores, and
    # the 3 other nodes of its socket (distance 16, against 32) become its loader cores: 24 cores, as mpibind's.
    plan = plan_of(topo, 2, gpu_order="closest")
    assert table(plan) == [("0-23,48-71", 0, 1, 6), ("24-47,72-95", 2, 5, 6)]
    assert [format_cpulist(r.compute_cpus) for r in plan.ranks] == ["6-11,54-59", "30-35,78-83"]
    assert [r.spill_nodes for r in plan.ranks] == [(0, 2, 3), (4, 6, 7)]
    # Rank order: GPUs 0 and 1, nodes 1 and 2, both in socket 0. Nodes 0 and 3 are 16 away from both: node 0 goes
    # to node 1, node 3 to node 2 (fewer spill cores so far); socket 1's nodes (32 from both) alternate: 4 and 6 to
    # node 1, 5 and 7 to node 2. 24 cores each.
    plan = plan_of(topo, 2)
    assert table(plan) == [
        ("0-11,24-29,36-41,48-59,72-77,84-89", 0, 1, 6),
        ("12-23,30-35,42-47,60-71,78-83,90-95", 1, 2, 6),
    ]


def test_one_rank_per_core_closest() -> None:
    # coral-lassen, 40 ranks on 40 cores: ranks follow CPU order (rank i on the i-th core, its 4 PUs), and the
    # 20 ranks of each socket share its 2 GPUs in blocks of 10: 0 x 10, 1 x 10, 2 x 10, 3 x 10, as mpibind maps it.
    plan = plan_of(mpibind_xml("coral-lassen"), 40, gpu_order="closest")
    firsts = [*range(8, 88, 4), *range(96, 176, 4)]
    assert [format_cpulist(r.cpus) for r in plan.ranks] == [f"{c}-{c + 3}" for c in firsts]
    assert [r.gpu for r in plan.ranks] == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10
    assert {r.threads for r in plan.ranks} == {1} and plan.warnings == ()
    # epyc-corona, 48 ranks: the GPU nodes hold only 24 cores, so every node takes 6 ranks in CPU order; a node
    # without GPU joins the nearest GPU node with the fewest ranks per GPU (node 0 -> 1, 3 -> 2, 4 -> 5, 6 -> 7):
    # 12 ranks per GPU. (mpibind puts two tasks on each core of the GPU nodes instead; affrun never shares a core.)
    plan = plan_of(mpibind_xml("epyc-corona"), 48, gpu_order="closest")
    assert [format_cpulist(r.cpus) for r in plan.ranks] == [f"{c},{c + 48}" for c in range(48)]
    assert [r.gpu for r in plan.ranks] == [0] * 12 + [1] * 12 + [2] * 12 + [3] * 12
    assert "node 0 is in its domain" in plan.ranks[0].reasons[0]


# ============================================================================================= small machines
def two_nodes(gpus: Sequence[FakeGPU] = ()) -> FakeMachine:
    """2 sockets x 8 cores, no SMT, one NUMA node per socket: node 0 = 0-7, node 1 = 8-15."""
    m = uniform(packages=2, cores_per_package=8)
    m.gpus = list(gpus)
    return m


@pytest.mark.parametrize(
    ("nproc", "expected"),
    [
        # 4 ranks over 2 equal nodes: 2 per node, 4 cores each, in blocks (ranks 0, 1 on node 0).
        (4, [("0-3", None, 0, 4), ("4-7", None, 0, 4), ("8-11", None, 1, 4), ("12-15", None, 1, 4)]),
        # 3 ranks: 3 x 8/16 = 1.5 per node; the tie goes to the first node: 2 ranks there, 1 on node 1.
        (3, [("0-3", None, 0, 4), ("4-7", None, 0, 4), ("8-15", None, 1, 8)]),
        # 2 ranks: one whole node each.
        (2, [("0-7", None, 0, 8), ("8-15", None, 1, 8)]),
        # 1 rank lives on one NUMA node (node 0); --mode socket or --cpus choose otherwise. With --spill none
        # node 1 stays idle.
        (1, [("0-7", None, 0, 8)]),
    ],
)
def test_cpu_only_job_spreads_over_nodes(tmp_path: Path, nproc: int, expected: list[Row]) -> None:
    assert table(plan_of(read(tmp_path, two_nodes()), nproc, spill="none")) == expected


def test_one_cpu_only_rank_gets_the_other_node_as_loader_or_compute_cores(tmp_path: Path) -> None:
    # 1 rank: its home is node 0 (8 compute cores); node 1 hosts no rank, so its 8 cores spill to the rank:
    # loader cores by default (OMP_NUM_THREADS 8), compute cores with --spill compute (16).
    topo = read(tmp_path, two_nodes())
    plan = plan_of(topo, 1)
    assert table(plan) == [("0-15", None, 0, 8)]
    assert (format_cpulist(plan.ranks[0].compute_cpus), format_cpulist(plan.ranks[0].loader_cpus)) == ("0-7", "8-15")
    assert (plan.ranks[0].spill_cpus, plan.ranks[0].spill_nodes) == (tuple(range(8, 16)), (1,))
    assert plan.ranks[0].reasons[-1] == "8 loader core(s) of node(s) 1, which host no rank"
    plan = plan_of(topo, 1, spill="compute")
    assert table(plan) == [("0-15", None, 0, 16)]
    assert plan.ranks[0].loader_cpus == () and plan.ranks[0].mem_nodes == (0,)


def test_no_gpu_flag_ignores_gpus(tmp_path: Path) -> None:
    # Both GPUs are on node 1, but --no-gpu plans a CPU-only job: spread over both nodes.
    gpus = [FakeGPU("0000:81:00.0", 1), FakeGPU("0000:82:00.0", 1)]
    topo = read(tmp_path, two_nodes(gpus))
    assert table(plan_of(topo, 2, no_gpu=True)) == [("0-7", None, 0, 8), ("8-15", None, 1, 8)]
    assert table(plan_of(topo, 2, spill="none")) == [("8-11", 0, 1, 4), ("12-15", 1, 1, 4)]
    # Both ranks live on node 1 by their GPUs; node 0's cores spill to them, 4 + 4, as loader cores.
    assert table(plan_of(topo, 2)) == [("0-3,8-11", 0, 1, 4), ("4-7,12-15", 1, 1, 4)]


def test_gpu_without_numa_node_uses_local_cpulist(tmp_path: Path) -> None:
    # numa_node is -1 (common on VMs) but local_cpulist is meaningful: GPU 0 is local to 8-15, GPU 1 to 0-7.
    gpus = [FakeGPU("0000:81:00.0", None, local_cpus=range(8, 16)), FakeGPU("0000:82:00.0", None, local_cpus=range(8))]
    plan = plan_of(read(tmp_path, two_nodes(gpus)), 2)
    assert table(plan) == [("8-15", 0, 1, 8), ("0-7", 1, 0, 8)]


def test_gpu_local_cpulist_across_nodes_takes_the_node_holding_most(tmp_path: Path) -> None:
    # numa_node -1 and local_cpulist 6-15 spans both nodes: 2 CPUs of node 0, 8 of node 1. The reader cannot name
    # one node and warns; the planner takes node 1, which holds most of them, and says why.
    gpus = [FakeGPU("0000:81:00.0", None, local_cpus=range(6, 16))]
    plan = plan_of(read(tmp_path, two_nodes(gpus)), 1, spill="none")
    assert table(plan) == [("8-15", 0, 1, 8)]
    assert table(plan_of(read(tmp_path / "2", two_nodes(gpus)), 1)) == [("0-15", 0, 1, 8)]  # node 0 as loader cores
    assert any(
        "GPU 0000:81:00.0: the kernel gives no NUMA node" in w and "locality taken from local_cpus" in w
        for w in plan.warnings
    )
    assert "GPU 0 (0000:81:00.0) has local CPUs 6-15 (node 1)" in plan.ranks[0].reasons


def test_gpu_without_any_locality_is_spread_with_a_warning(tmp_path: Path) -> None:
    # numa_node -1 and local_cpulist = every CPU: nothing says where the GPUs are; the ranks are spread like
    # CPU-only ranks, and both the reader and the planner say so.
    gpus = [FakeGPU("0000:81:00.0", None), FakeGPU("0000:82:00.0", None)]
    plan = plan_of(read(tmp_path, two_nodes(gpus)), 2)
    assert table(plan) == [("0-7", 0, 0, 8), ("8-15", 1, 1, 8)]
    assert any("local_cpus spans every CPU" in w for w in plan.warnings)
    assert any("GPU 0 (0000:81:00.0) has unknown NUMA locality" in w for w in plan.warnings)


def test_gpu_node_without_allowed_cpus_takes_the_nearest(tmp_path: Path) -> None:
    # 4 nodes of 4 cores; the cgroup allows only nodes 0 and 2; the GPU is on node 3, which is nearer to node 2
    # (distance 12) than to node 0 (30).
    m = uniform(packages=1, cores_per_package=16, nodes_per_package=4)
    m.distances = {
        0: {0: 10, 1: 12, 2: 30, 3: 30},
        1: {0: 12, 1: 10, 2: 30, 3: 30},
        2: {0: 30, 1: 30, 2: 10, 3: 12},
        3: {0: 30, 1: 30, 2: 12, 3: 10},
    }
    m.gpus = [FakeGPU("0000:c1:00.0", 3)]
    m.cgroup_cpus = "0-3,8-11"
    plan = plan_of(read(tmp_path, m), 1, spill="none")
    assert table(plan) == [("8-11", 0, 2, 4)]
    # By default the allowed cores of node 0, which hosts no rank, become the rank's loader cores.
    plan = plan_of(read(tmp_path / "2", m), 1)
    assert table(plan) == [("0-3,8-11", 0, 2, 4)] and format_cpulist(plan.ranks[0].loader_cpus) == "0-3"
    assert any("NUMA node 3, which has no usable CPUs" in w for w in plan.warnings)


def test_weakest_claim_moves_first(tmp_path: Path) -> None:
    # Nodes 0 (CPUs 0-1), 1 (2-3) and a CPU-less node 2 nearest to node 0. GPU 0 sits on node 2, GPUs 1 and 2 on
    # node 0. Ranks 0, 1, 2 all want node 0 (2 cores): rank 0 only by distance, ranks 1 and 2 because their GPU
    # is there. Rank 0 moves to node 1, not rank 2.
    m = uniform(packages=1, cores_per_package=4, nodes_per_package=2)
    m.cpuless_nodes = [2]
    m.distances = {0: {0: 10, 1: 20, 2: 15}, 1: {0: 20, 1: 10, 2: 40}, 2: {0: 15, 1: 40, 2: 10}}
    m.gpus = [FakeGPU("0000:01:00.0", 2, local_cpus=[]), FakeGPU("0000:02:00.0", 0), FakeGPU("0000:03:00.0", 0)]
    plan = plan_of(read(tmp_path, m), 3)
    assert table(plan) == [("2-3", 0, 1, 2), ("0", 1, 0, 1), ("1", 2, 0, 1)]
    assert any("rank 0: node 0 has 2 core(s) for more ranks; placed on node 1" in w for w in plan.warnings)


def test_map_mode(tmp_path: Path) -> None:
    topo = read(tmp_path, two_nodes([FakeGPU("0000:81:00.0", 1), FakeGPU("0000:82:00.0", 0)]))
    # The user's lists, verbatim; rank i still uses GPU i; --mode map is implied by --map.
    plan = plan_of(topo, 2, cpu_map="8-11;0-3")
    assert table(plan) == [("8-11", 0, 1, 4), ("0-3", 1, 0, 4)]
    assert plan.mode == "map"
    # Overlap is allowed but said.
    plan = plan_of(topo, 2, cpu_map="0-3;3-5")
    assert any("CPU 3 is given to ranks 0 and 1" in w for w in plan.warnings)


def test_map_keeps_the_kernel_group_syntax(tmp_path: Path) -> None:
    """Ranks are separated by ';' only: ':' belongs to the cpu list's group syntax (0-7:2/4 is 0,1,4,5)."""
    topo = read(tmp_path, two_nodes())
    plan = plan_of(topo, 2, cpu_map="0-7:2/4;8-15:1/2")
    assert table(plan) == [("0-1,4-5", None, 0, 4), ("8,10,12,14", None, 1, 4)]


def test_reserve_of_a_cpu_that_does_not_exist_is_said(tmp_path: Path) -> None:
    plan = plan_of(read(tmp_path, two_nodes()), 2, reserve="0,99")
    assert table(plan) == [("1-7", None, 0, 7), ("8-15", None, 1, 8)]
    assert "--reserve names CPUs 99, which this machine does not have" in plan.warnings


def test_closest_order_with_more_ranks_than_gpus(tree: Callable[..., Topology]) -> None:
    # Frontier, 10 ranks, closest, as mpibind and --gpu-bind=closest do it: ranks follow CPU order over the GPU
    # nodes in proportion to their GPUs (2 each: 10 x 2/8 = 2.5, the remainders go to the first nodes, 0 and 1:
    # 3, 3, 2, 2 ranks), and the ranks of a node share its GCDs in contiguous blocks (3 ranks on 2 GCDs: 2 + 1).
    # (Before, ranks 8 and 9 got no GPU.)
    plan = plan_of(tree("frontier"), 10, reserve=FRONTIER_RESERVE, gpu_order="closest")
    assert [r.gpu for r in plan.ranks] == [4, 4, 5, 2, 2, 3, 6, 7, 0, 1]
    assert [r.numa_nodes for r in plan.ranks] == [(0,)] * 3 + [(1,)] * 3 + [(2,)] * 2 + [(3,)] * 2
    assert plan.ranks[0].reasons[0] == "closest order: GPU 4 (0000:d1:00.0) is on NUMA node 0, shared by 2 rank(s)"
    # Node 0's 14 free cores: 5 + 5 + 4.
    assert [format_cpulist(plan.ranks[i].cpus) for i in (0, 1, 2)] == ["1-5,65-69", "6-7,9-11,70-71,73-75", "12-15,76-79"]
    assert table(plan)[2] == ("12-15,76-79", 5, 0, 4)
    assert plan.warnings == ()


def test_reserve_takes_whole_cores(tmp_path: Path) -> None:
    # 4 cores with siblings c, c+4; --reserve 4 (the sibling of CPU 0) takes core 0 out entirely.
    m = uniform(packages=1, cores_per_package=4, threads=2)
    plan = plan_of(read(tmp_path, m), 1, reserve="4")
    assert table(plan) == [("1-3,5-7", None, 0, 3)]
    # Even when only CPU 0 of that core is allowed.
    m.cgroup_cpus = "0-3"
    plan = plan_of(read(tmp_path / "2", m), 1, reserve="4")
    assert table(plan) == [("1-3", None, 0, 3)]


# ============================================================================================= errors
def test_more_ranks_than_cores(tmp_path: Path) -> None:
    topo = read(tmp_path, uniform(packages=1, cores_per_package=4, threads=2))
    with pytest.raises(PlanError, match=r"^5 ranks but only 4 whole core\(s\) are available \(allowed CPUs 0-7\)"):
        plan_of(topo, 5)
    with pytest.raises(PlanError, match=r"4 ranks but only 3 whole core\(s\).*reserved 0"):
        plan_of(topo, 4, reserve="0")
    # numa mode shares cores, so it is not an error there.
    assert len(plan_of(topo, 5, mode="numa").ranks) == 5


def test_gpu_index_out_of_range(tree: Callable[..., Topology]) -> None:
    topo = tree("dgx_h100")
    with pytest.raises(PlanError, match=r"^GPU 8 does not exist: 8 GPU\(s\) are visible$"):
        plan_of(topo, 2, gpus="0,8")
    with refused_on_cli(PlanError, r"^--gpus gives 2 GPU\(s\) for 3 ranks$"):
        plan_of(topo, 3, gpus="0,1")
    with pytest.raises(ConfigError, match="expected visible GPU indices"):
        plan_of(topo, 2, gpus="0,x")


def test_empty_map_entry(tmp_path: Path) -> None:
    topo = read(tmp_path, two_nodes())
    with pytest.raises(ConfigError, match="a rank has an empty cpu list"):
        plan_of(topo, 2, cpu_map="0-3;;")
    with refused_on_cli(PlanError, r"^--map gives rank\(s\) 1 an empty CPU list$"):
        make_plan(topo, Request(nproc=2, mode="map", cpu_map=(frozenset({0}), frozenset())))
    with refused_on_cli(PlanError, r"^--map gives 1 CPU list\(s\) for 2 ranks$"):
        plan_of(topo, 2, cpu_map="0-3")
    with refused_on_cli(PlanError, r"^--map rank 1: CPUs 16 are not usable here"):
        plan_of(topo, 2, cpu_map="0-3;16")


def test_map_with_a_reserved_cpu_says_so(tmp_path: Path) -> None:
    topo = read(tmp_path, two_nodes())
    with refused_on_cli(PlanError, r"^--map rank 0: CPUs 0 are not usable here.*reserved 0"):
        plan_of(topo, 1, cpu_map="0-3", reserve="0")


def test_loader_cores_leave_no_compute_core(tmp_path: Path) -> None:
    topo = read(tmp_path, two_nodes())
    with refused_on_cli(PlanError, r"^--loader-cores 4 leaves rank 0 no compute core \(it has 4 core\(s\)\)$"):
        plan_of(topo, 4, loader_cores=4)


def test_everything_reserved(tmp_path: Path) -> None:
    topo = read(tmp_path, uniform(packages=1, cores_per_package=2))
    with pytest.raises(PlanError, match=r"^no usable CPU after reserving 2 core\(s\): allowed CPUs are 0-1$"):
        plan_of(topo, 1, reserve="0-1")


def test_map_with_another_mode_is_refused() -> None:
    with refused_on_cli(ConfigError, "--map"):
        Options(mode="numa", cpu_map="0-3").request(1)


@pytest.mark.parametrize(
    ("opts", "count"),
    [
        (Options(), None),
        (Options(gpus="3,1,2"), 3),
        (Options(cpu_map="0-7:2/4;8-15:1/2"), 2),  # ':' inside a list is the group syntax, not a rank
        (Options(cpu_map="0-3"), 1),
        (Options(gpus="0,1", cpu_map="0;1;2"), 2),  # --gpus first, as the planner pairs rank i with GPU i
    ],
)
def test_rank_count(opts: Options, count: int | None) -> None:
    assert opts.rank_count() == count


def test_gpus_with_no_gpu_is_refused() -> None:
    with refused_on_cli(ConfigError, r"--gpus .* --no-gpu"):
        Options(gpus="0", no_gpu=True).request(1)


# ============================================================================================= real machines
# hwloc's captured sysfs trees (shared/fixtures/hwloc-linux), read in place after extraction.
def test_power9_with_six_v100_and_gpu_memory_nodes(hwloc_root: Callable[[str], Path]) -> None:
    # IBM POWER9 8335-GTW (trimmed capture): nodes 0 (CPUs 0-15) and 8 (88-103), SMT4 with sibling ids adjacent
    # (core = 4 consecutive CPUs), so 4 cores per node. The PCI entries have no numa_node; local_cpus puts GPUs
    # 0-2 on node 0 and 3-5 on node 8. Their memory is in CPU-less nodes 250-255. 3 ranks per node share 4 cores:
    # 2 + 1 + 1, OMP_NUM_THREADS counting cores.
    topo = load_topology(fsroot=str(hwloc_root("nvidiagpunumanodes")), environ={})
    assert sorted(n.os_index for n in topo.numa_nodes if not n.cpus) == [250, 251, 252, 253, 254, 255]
    plan = make_plan(topo, Request(nproc=6))
    assert table(plan) == [
        ("0-7", 0, 0, 2),
        ("8-11", 1, 0, 1),
        ("12-15", 2, 0, 1),
        ("88-95", 3, 8, 2),
        ("96-99", 4, 8, 1),
        ("100-103", 5, 8, 1),
    ]
    # --smt counts the 4 hardware threads of each core.
    plan = make_plan(topo, Request(nproc=6, smt=True))
    assert [row[3] for row in table(plan)] == [8, 4, 4, 8, 4, 4]


HWLOC_TREES = [
    "128arm-2pa2n8cluster4co",
    "16amd64-8n2c-cpusets",
    "16em64t-4s2c2t-offlines",
    "20em64t-hybrid-1p6c2t+2ca4co1t",
    "256ppc-8n8s4t",
    "32amd64-4s2n4c-cgroup2",
    "32intel64-2p8co2t+8ve",
    "48amd64-4pa2n6c-sparse",
    "64amd64-4s2n4ca2co",
    "64intel64-fakeKNL-SNC4-hybrid",
    "8em64t-4c2t",
    "memorysidecaches",
    "nvidia-dgx-gb10",
    "nvidiagpunumanodes",
    "offline-cpu0-node0",
]


@pytest.mark.parametrize("name", HWLOC_TREES)
def test_real_trees_plan_disjoint_whole_cores_inside_the_allowed_set(
    hwloc_root: Callable[[str], Path], name: str
) -> None:
    topo = load_topology(fsroot=str(hwloc_root(name)), environ={})
    cores = topo.allowed_cores()
    nodes = {c.numa_node for c in cores}
    for nproc in sorted({1, 2, len(nodes), len(cores) // 2 or 1, len(cores)}):
        for mode in ("exclusive", "l3"):
            plan = make_plan(topo, Request(nproc=nproc, mode=mode, use_gpus=False))
            owner: dict[int, int] = {}
            for r in plan.ranks:
                assert set(r.cpus) <= topo.allowed
                for p in r.cpus:
                    assert p not in owner, f"{name} {mode} x{nproc}: CPU {p} in ranks {owner[p]} and {r.local_rank}"
                    owner[p] = r.local_rank
                assert r.threads == len(r.compute_cores) >= 1
            for c in cores:
                assert len({owner.get(p) for p in c.pus}) == 1, f"{name}: core {c.pus} split"
        if nproc <= len(cores):
            # exclusive CPU-only plans hand out whole nodes: the CPUs of every node that holds a rank are all used.
            plan = make_plan(topo, Request(nproc=nproc, use_gpus=False))
            used = {p for r in plan.ranks for p in r.cpus}
            for node in {r.numa_nodes for r in plan.ranks}:
                assert {p for c in cores if (c.numa_node,) == node or (c.numa_node is None and node == ()) for p in c.pus} <= used
    with pytest.raises(PlanError, match="whole core"):
        make_plan(topo, Request(nproc=len(cores) + 1))
