"""Issue 34, class 6: ``--comm-cores`` at the edges through the real CLI (``affrun plan --json``, ``affrun exec
--dry-run``), on hwloc's hybrid machines (the i7-1370P as a sysfs tree and as hwloc's XML, Lakefield's tree, read
in place) and a DGX-like fake tree with GPUs: as many comm cores as a rank has, one core per rank, with loader
cores, ``--spill compute``, shared and overlapping ranks. Whatever the request: exit 0, comm CPUs inside the
rank's mask, none a loader or compute CPU of any rank, none two ranks'; the variables agree with the plan; a
request that cannot be kept is a warning and the rank keeps its team."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.env.omp_syntax import parse_places
from tests.conftest import FIXTURES, extract_tarball, need
from tests.fakesys import dgx_like, write_tree
from tests.launch import affrun
from tests.run_dry import dry_run

RAPTOR = "20em64t-hybrid-1p6c2t+2ca4co1t"  # hwloc's i7-1370P: P-cores 0-11 (6 cores, HT), E-cores 12-19
P_CORES = set(range(12))
LAKEFIELD = FIXTURES / "hwloc-hybrid" / "5intel64-hybrid-lakefield.tar.bz2"  # 1 Sunny Cove + 4 Tremont


def plan_json(*args: str) -> dict[str, Any]:
    proc = affrun("plan", "--json", *args)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def check_plan(data: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The promises of ``--comm-cores k`` in an ``affrun plan --json`` answer; returns its ranks."""
    ranks: list[dict[str, Any]] = data["ranks"]
    owner: dict[int, int] = {}
    for r in ranks:
        comm, mask, loader = set(r["comm_cpus"]), set(r["cpus"]), set(r["loader_cpus"])
        compute = {p for core in r["compute_cores"] for p in core}
        assert comm <= mask and not comm & loader and not comm & compute, r
        assert compute and r["threads"] >= 1, r
        for o in ranks:
            if o is not r:
                assert not comm & set(o["loader_cpus"]), (r, o)
                assert not comm & {p for core in o["compute_cores"] for p in core}, (r, o)
        for p in comm:
            assert p not in owner, f"CPU {p}: comm CPU of ranks {owner[p]} and {r['local_rank']}"
            owner[p] = r["local_rank"]
        if k and not comm:
            assert any(f"--comm-cores {k} ignored" in w for w in r["warnings"]), r["warnings"]
        env = r["env"]
        assert env["OMP_NUM_THREADS"] == str(r["threads"]) and env["AFFRUN_COMM_CPUS"] == format_cpulist(comm)
        assert (parse_cpulist(env["NCCL_PROXY_CPUSET"]) if "NCCL_PROXY_CPUSET" in env else set()) == comm
        places = parse_places(env["OMP_PLACES"])
        assert places and set(places[0]) <= mask and not set(places[0]) & comm, env["OMP_PLACES"]
        assert all(set(place) <= compute for place in places[1:]), env["OMP_PLACES"]
    if data["mode"] in ("exclusive", "l3"):
        for r in ranks:
            assert all(not set(r["comm_cpus"]) & set(o["cpus"]) for o in ranks if o is not r)
    return ranks


@pytest.fixture(scope="module")
def raptor(hwloc_root) -> str:  # type: ignore[no-untyped-def]
    return str(hwloc_root(RAPTOR))


# (ranks, --comm-cores, other options, what the comm CPUs of the ranks are: "p" P-core PUs, "" none kept)
RAPTOR_CASES = [
    (1, 1, [], ["p"]),
    (1, 5, [], ["p"]),  # all of its 6 P-cores but one: one thread left
    (1, 6, [], [""]),  # as many as the rank computes on: kept none, with a warning
    (1, 30, [], [""]),  # more than the machine has
    (6, 1, [], [""] * 6),  # one P-core per rank
    (2, 1, ["--loader-cores", "2"], ["p", "p"]),
    (3, 1, ["--spill", "compute"], ["p"] * 3),  # the E-cores compute too; the comm core is still a P-core
    (1, 2, ["--smt"], ["p"]),
    (2, 2, ["--mode", "socket"], ["p", "p"]),  # two ranks share the package: 2 comm cores each, apart
    (2, 1, ["--mode", "map", "--map", "0-7;4-11"], ["p", "p"]),  # lists that overlap on 4-7
    (2, 1, ["--mode", "map", "--map", "12-15;14-19", "--loader-cores", "1"], ["e", "e"]),
    (2, 3, ["--mode", "map", "--map", "12-13;12-13"], ["", ""]),  # one list twice: no core to spare
]


@pytest.mark.parametrize(("nproc", "k", "extra", "kinds"), RAPTOR_CASES, ids=[" ".join(map(str, c[:3])) for c in RAPTOR_CASES])
@pytest.mark.parametrize("source", ["tree", "xml"])
def test_comm_cores_on_a_hybrid_cpu(raptor: str, source: str, nproc: int, k: int, extra: list[str],
                                    kinds: list[str]) -> None:
    where = ["--fsroot", raptor] if source == "tree" else [
        "--topology", str(FIXTURES / "hwloc-hybrid" / "Intel-RaptorLake-Corei7-1370P.xml")]
    ranks = check_plan(plan_json(*where, "--no-gpu", "--nproc-per-node", str(nproc), "--comm-cores", str(k),
                                 *extra), k)
    for r, kind in zip(ranks, kinds, strict=True):
        comm = set(r["comm_cpus"])
        assert (comm <= P_CORES if kind == "p" else not comm & P_CORES) and bool(comm) == bool(kind), (kind, r)


@pytest.mark.parametrize(("nproc", "k", "extra"), [(1, 1, []), (1, 1, ["--spill", "compute"]), (1, 4, ["--spill",
                         "compute"]), (1, 5, ["--spill", "compute"]), (2, 1, ["--mode", "numa"]), (5, 1, ["--spill", "compute"])])
def test_comm_cores_on_lakefield(tmp_path_factory: pytest.TempPathFactory, nproc: int, k: int,
                                 extra: list[str]) -> None:
    need(LAKEFIELD.is_file(), f"{LAKEFIELD} not found (set AFFRUN_FIXTURES)")
    top = extract_tarball(LAKEFIELD, tmp_path_factory.mktemp("lakefield"))
    check_plan(plan_json("--fsroot", str(top / "fsroot"), "--no-gpu", "--nproc-per-node", str(nproc),
                         "--comm-cores", str(k), *extra), k)


@pytest.fixture(scope="module")
def dgx(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tree(tmp_path_factory.mktemp("dgx") / "root", dgx_like()))


DGX_CASES = {
    "one each": ["--comm-cores", "1"],
    "with loader cores": ["--comm-cores", "1", "--loader-cores", "1"],
    "as many as the rank has": ["--comm-cores", "2"],
    "numa, shared by 4": ["--comm-cores", "1", "--mode", "numa"],
    "numa, too many to share": ["--comm-cores", "2", "--mode", "numa", "--loader-cores", "1"],
    "core binding": ["--comm-cores", "1", "--omp-bind", "core", "--mode", "socket"],
    "overlapping maps": ["--comm-cores", "1", "--mode", "map", "--map", "0-3;2-5;4-7;6-9;8-11;10-13;12-15;0-15"],
}


@pytest.mark.parametrize("case", list(DGX_CASES))
def test_each_rank_s_variables_are_its_plan_s(dgx: str, case: str) -> None:
    """A DGX-like node (16 cores, 8 GPUs, 2 cores a rank): ``affrun exec --dry-run`` of ranks 0, 3 and 7 sets
    what ``affrun plan --json`` plans for them, and the plan keeps every promise."""
    options = DGX_CASES[case]
    k = int(options[1])
    ranks = check_plan(plan_json("--fsroot", dgx, "--nproc-per-node", "8", *options), k)
    for rank in (0, 3, 7):
        env = dry_run("exec", "--fsroot", dgx, "--local-rank", str(rank), "--nproc-per-node", "8", *options).variables
        planned = ranks[rank]["env"]
        for name in ("OMP_NUM_THREADS", "OMP_PLACES", "AFFRUN_COMM_CPUS", "AFFRUN_CPUS", "AFFRUN_LOADER_CPUS"):
            assert env[name] == planned[name], (name, env[name], planned[name])
        assert env.get("NCCL_PROXY_CPUSET") == planned.get("NCCL_PROXY_CPUSET")
    if case == "as many as the rank has":
        assert all(not r["comm_cpus"] and r["threads"] == 2 for r in ranks)


def test_a_spill_core_kept_for_comm_is_the_rank_s(tmp_path: Path) -> None:
    """One rank on a 2-node machine (cores 0-1 on its node, 2-3 spilled to it as compute cores): 3 comm cores take
    its 2 home cores and a spill core. The rank accepts the plan (it refused it: a spill CPU that is not a compute
    CPU) and computes on the core left."""
    from tests.fakesys import uniform

    root = write_tree(tmp_path / "two", uniform(1, 4, nodes_per_package=2))
    proc = affrun("exec", "--dry-run", "--fsroot", str(root), "--local-rank", "0", "--nproc-per-node", "1",
                  "--spill", "compute", "--comm-cores", "3", "--", "true")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and line[:1].isupper())
    comm = parse_cpulist(env["AFFRUN_COMM_CPUS"])
    assert len(comm) == 3 and {0, 1} <= comm and env["NCCL_PROXY_CPUSET"] == env["AFFRUN_COMM_CPUS"]
    assert env["OMP_NUM_THREADS"] == "1" and not comm & parse_cpulist(env["AFFRUN_COMPUTE_CPUS"])
