"""``--gpu-order closest`` against mpibind's own answers (LLNL mpibind ``test-suite/expected``).

Every case with GPU optimisation on (``gpu_optim=1``) and no restriction set (``restr_set`` null) is planned on
the machine's hwloc XML, and each task is compared with mpibind's answer for it:

* GPU: the rank's GPU is one of the GPUs mpibind gives the task (none where mpibind gives none);
* locality: the rank's compute CPUs are on the NUMA nodes of mpibind's CPUs for the task;
* capacity: the rank holds at least as many cores (compute plus loader) as mpibind's CPUs touch.

Cases left out are listed in ``EXCLUDED`` with the reason; a test checks that the list names exactly the
qualifying cases that are not compared, so none is dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from launcher.cpulist import parse_cpulist
from launcher.plan import Request, make_plan
from launcher.topology.hwloc_xml import load_hwloc_xml
from launcher.topology.model import Topology
from tests.conftest import FIXTURES, need

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
