"""The thread plan keeps its promises (docs/threads.md) on every machine the suite knows, with any mix of options.

The machines are found, not listed: every hwloc tree (``*.tar.bz2``), hwloc XML and affrun snapshot under the
shared fixtures (read in place), every shape of :func:`tests.fakesys.generated_machines` (the priority-core
machines among them), every live-like tree, and the fake machines of tests/cli_contract.py, tests/machines.py and
:func:`tests.fakesys.dgx_like`. On each, hypothesis draws ``--nproc-per-node``, ``--mode``, ``--smt``,
``--loader-cores``, ``--comm-cores``, ``--main-thread``, ``--spill``, ``--reserve``, ``--cpus`` and a DataLoader
worker count, and plans them twice: through the planner, the env layer and ``thread_plans`` as ``affrun plan``
does (many examples), and through ``affrun plan --json`` itself in click's CliRunner (a few). A refusal is one
``ConfigError``/``PlanError``/``TopologyError`` line, or exit 2 with one ``affrun: error:`` line; every plan that
succeeds is checked rank by rank by :func:`check_plan` (its docstring lists what is asserted).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.base.choices import BIND_MODES, MAIN_THREADS, MODES, SPILLS
from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.bind.handoff import ParentPlan
from launcher.bind.rank_hooks import live_plan
from launcher.cli import cli
from launcher.env.omp_syntax import parse_places
from launcher.env.policy import plan_json
from launcher.errors import AffrunError, ConfigError, PlanError, TopologyError
from launcher.options.record import Options
from launcher.plan.planner import Plan, Request, make_plan
from launcher.plan.threads import thread_plan
from launcher.show.table import thread_plans
from launcher.topology import load_topology
from launcher.topology.model import Topology
from launcher.topology.snapshot import FORMAT
from tests import cli_contract, machines
from tests.conftest import FIXTURES, extract_tarball, need
from tests.fakesys import LIVE_VARIANTS, FakeMachine, dgx_like, generated_machines, write_live_like, write_tree
from tests.plan_cases import Machine as Generated
from tests.plan_cases import comm_cases, main_thread_cases
from tests.unit.test_cli_plan import clean_env

if TYPE_CHECKING:
    from launcher.base.choices import OmpBind

EXAMPLES = int(os.environ.get("AFFRUN_HYPOTHESIS_EXAMPLES", "0"))
PLANS = settings(max_examples=EXAMPLES or 10, deadline=None, suppress_health_check=list(HealthCheck))
GENERATED = settings(max_examples=EXAMPLES or 100, deadline=None, suppress_health_check=list(HealthCheck))
COMMANDS = settings(max_examples=EXAMPLES or 2, deadline=None, suppress_health_check=list(HealthCheck))
REFUSALS = (ConfigError, PlanError, TopologyError)
# A user's value of a pool variable: a count, or one the env policy replaces (malformed: OpenCV and Rayon take
# digits alone; 0 is every CPU to OpenCV and Rayon).
USER_VALUES = st.one_of(st.integers(1, 300).map(str), st.sampled_from(["0", "lots", " 1", "-1", "", "8,4"]))
ROLES = ("main", "omp", "interop", "pin_memory", "nccl_proxy")  # the homes of a rank process (ThreadPlan.homes)
# Each pool variable and the pool of the thread plan it must equal (launcher.env.variables.POOL_OF, restated).
POOL_VARIABLES = {"OMP_NUM_THREADS": "openmp", "MKL_NUM_THREADS": "openmp", "OPENBLAS_NUM_THREADS": "blas",
                  "BLIS_NUM_THREADS": "blas", "NUMEXPR_NUM_THREADS": "numexpr", "OPENCV_FOR_THREADS_NUM": "opencv",
                  "RAYON_NUM_THREADS": "rayon"}


# ---------------------------------------------------------------------------------------------- the machines
@dataclass(frozen=True)
class Machine:
    """One machine: a fixture file (a tree's tarball, or a ``--topology`` file), a fake machine, or a live-like
    variant."""

    name: str
    tarball: Path | None = None
    file: Path | None = None
    fake: Callable[[], FakeMachine] | None = None
    live: str | None = None

    def source(self, tmp: Path) -> dict[str, str]:
        """``load_topology``'s keywords for it: ``fsroot`` or ``topology_file``; a tree is written under ``tmp``."""
        if self.file is not None:
            return {"topology_file": str(self.file)}
        if self.tarball is not None:
            top = extract_tarball(self.tarball, tmp)
            return {"fsroot": str(top / "fsroot" if (top / "fsroot").is_dir() else top)}  # x86+linux: <name>/fsroot
        if self.fake is not None:
            return {"fsroot": str(write_tree(tmp / "tree", self.fake()))}
        assert self.live is not None
        return {"fsroot": str(write_live_like(tmp / "tree", self.live, cpus=range(4)))}


def snapshot(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (ValueError, AttributeError, OSError):
        return False


def every_machine() -> list[Machine]:
    found: list[Machine] = []
    if FIXTURES.is_dir():
        found += [Machine(f"fixture:{p.relative_to(FIXTURES).as_posix()}", tarball=p)
                  for p in sorted(FIXTURES.rglob("*.tar.bz2"))]
        found += [Machine(f"fixture:{p.relative_to(FIXTURES).as_posix()}", file=p)
                  for p in sorted([*FIXTURES.rglob("*.xml"), *filter(snapshot, FIXTURES.rglob("*.json"))])]
    shapes = generated_machines()
    found += [Machine(f"generated:{name}", fake=functools.partial(shapes.__getitem__, name)) for name in shapes]
    found += [Machine(f"live-like:{variant}", live=variant) for variant in LIVE_VARIANTS]
    found += [Machine("cli-contract", fake=cli_contract.machine), Machine("dgx-like", fake=dgx_like),
              Machine("two-node", fake=machines.two_node_machine)]
    return found


MACHINES = every_machine()


def test_the_fixture_machines_are_found() -> None:
    need(FIXTURES.is_dir(), f"shared fixtures not found at {FIXTURES} (set AFFRUN_FIXTURES)")
    names = {m.name for m in MACHINES}
    assert {"fixture:hwloc-linux/256ppc-8n8s4t.tar.bz2", "fixture:mpibind/topo-xml/coral-lassen.xml",
            "generated:xeon6-pct", "cli-contract"} <= names


class Sources:
    """Each machine's source, written or extracted once, and its topology, read once per ``--cpus``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sources: dict[str, dict[str, str]] = {}
        self.topologies: dict[tuple[str, str | None], Topology] = {}

    def source(self, m: Machine) -> dict[str, str]:
        if m.name not in self.sources:
            where = self.tmp / str(len(self.sources))
            where.mkdir()
            self.sources[m.name] = m.source(where)
        return self.sources[m.name]

    def topology(self, m: Machine, cpus: str | None = None) -> Topology:
        """The topology ``affrun plan`` reads (GPU visibility from an empty environment): ``TopologyError``
        when the machine, or ``--cpus``, is refused."""
        key = (m.name, cpus)
        if key not in self.topologies:
            self.topologies[key] = load_topology(**self.source(m), cpus=cpus, environ={})
        return self.topologies[key]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    return Sources(tmp_path_factory.mktemp("machines"))


# ---------------------------------------------------------------------------------------------- the options
@dataclass(frozen=True)
class Mix:
    """One draw of options (``None``: not given) and a DataLoader worker count."""

    nproc: int | None
    mode: str
    smt: bool
    loader_cores: int
    comm_cores: int
    main_thread: str
    spill: str
    reserve: str | None
    cpus: str | None
    cpu_map: str | None
    omp_bind: str
    user: dict[str, str]
    workers: int

    def options(self) -> Options:
        return Options(mode=self.mode, smt=self.smt, reserve=self.reserve, loader_cores=self.loader_cores,
                           spill=self.spill, comm_cores=self.comm_cores, main_thread=self.main_thread,
                           cpu_map=self.cpu_map)

    def argv(self, source: dict[str, str]) -> list[str]:
        args = ["plan", "--json", *(["--fsroot", source["fsroot"]] if "fsroot" in source else
                                    ["--topology", source["topology_file"]])]
        given = {"--nproc-per-node": self.nproc, "--mode": self.mode, "--loader-cores": self.loader_cores,
                 "--comm-cores": self.comm_cores, "--main-thread": self.main_thread, "--spill": self.spill,
                 "--reserve": self.reserve, "--cpus": self.cpus, "--map": self.cpu_map,
                 "--omp-bind": self.omp_bind}
        for flag, value in given.items():
            if value is not None:
                args += [flag, str(value)]
        return args + (["--smt"] if self.smt else [])


def cpu_lists(topo: Topology) -> st.SearchStrategy[str]:
    """A cpulist of this machine: a few of its online CPUs, a slice of the allowed ones, whole cores of it, or a
    CPU it does not have."""
    online, allowed = sorted(topo.online), sorted(topo.allowed)
    cores = [c.pus for c in topo.allowed_cores()]
    picks = st.one_of(
        st.lists(st.sampled_from(online), min_size=1, max_size=3),
        st.tuples(st.integers(0, len(allowed) - 1), st.integers(1, len(allowed))).map(
            lambda t: allowed[t[0]:t[0] + t[1]]),
        st.lists(st.sampled_from(cores), min_size=1, max_size=max(1, len(cores) // 2)).map(
            lambda cs: [p for c in cs for p in c]),
    )
    return st.one_of(picks, picks, picks, st.just([max(online) + 1])).map(format_cpulist)


@st.composite
def cpu_maps(draw: st.DrawFn, topo: Topology) -> str:
    """A ``--map`` for this machine: its allowed cores dealt out to a few ranks (whole, or PU by PU), or
    overlapping windows of its allowed CPUs."""
    allowed = sorted(topo.allowed)
    ranks = draw(st.integers(1, 4))
    shape = draw(st.sampled_from(["cores", "pus", "windows"]))
    if shape == "windows":
        width = draw(st.integers(1, len(allowed)))
        stride = draw(st.integers(1, width))
        lists = [allowed[i * stride:i * stride + width] for i in range(ranks)]
    else:
        units = [c.pus for c in topo.allowed_cores()] if shape == "cores" else [(p,) for p in allowed]
        units = draw(st.permutations(units))
        lists = [[p for unit in units[i::ranks] for p in unit] for i in range(ranks)]
    return ";".join(format_cpulist(cpus) for cpus in lists if cpus) or format_cpulist(allowed)


@st.composite
def mixes(draw: st.DrawFn, topo: Topology) -> Mix:
    ncores = len(topo.allowed_cores())
    mode = draw(st.sampled_from(["exclusive", *MODES]))
    cpu_map = draw(cpu_maps(topo)) if mode == "map" else None
    return Mix(
        nproc=None if cpu_map else draw(st.one_of(st.none(), st.integers(1, 4), st.integers(1, 4),
                                                  st.integers(1, ncores + 1))),
        mode=mode,
        smt=draw(st.booleans()),
        loader_cores=draw(st.sampled_from([0, 0, 1, 2, 3])),
        comm_cores=draw(st.sampled_from([0, 0, 1, 2])),
        main_thread=draw(st.sampled_from(MAIN_THREADS)),
        spill=draw(st.sampled_from(SPILLS)),
        reserve=draw(st.one_of(st.none(), st.none(), cpu_lists(topo))),
        cpus=draw(st.one_of(st.none(), st.none(), st.none(), cpu_lists(topo))),
        cpu_map=cpu_map,
        omp_bind=draw(st.sampled_from(BIND_MODES)),
        user=draw(st.dictionaries(st.sampled_from(sorted(POOL_VARIABLES)), USER_VALUES, max_size=3)),
        workers=draw(st.one_of(st.integers(0, 8), st.integers(0, 2 * len(topo.online) + 2))),
    )


# ---------------------------------------------------------------------------------------------- the promises
def check_plan(data: dict[str, Any], cores: list[tuple[int, ...]], user: dict[str, str] | None = None) -> None:
    """Every rank of ``affrun plan --json``'s ``data`` (``cores``: the machine's cores, all their PUs):

    * every home's CPUs are inside the rank's; the main home is the rank's PUs of one core of the machine when it
      has ``main_cpus``, else its whole set; the OpenMP team is on compute CPUs, off the main core when there is
      one and another compute core;
    * every pool is 1 or more and no larger than the CPUs of the thread that creates it (the team: its CPUs off
      the main core, plus its thread 0 on the main core; the pools the main thread starts: the main home);
    * the env agrees with the thread plan: each pool variable, ``AFFRUN_MAIN_CPUS``, ``NCCL_PROXY_CPUSET``; and
      the thread plan a live rank reads back from its ``AFFRUN_*`` variables is the plan's;
    * the workers shown (one per loader core) keep :func:`check_workers`' promises;
    * in ``exclusive`` and ``l3`` modes, no two ranks share a CPU (main, comm, loader and compute ones included);
    * no rank computes on a comm core, its own or another's (``numa``/``socket`` sharers hold each other's in
      their masks): none is in any of its OpenMP places, the first included, nor its team's, pin-memory thread's
      or DataLoader workers' homes.
    """
    owner: dict[int, int] = {}
    every_comm = frozenset(p for rank in data["ranks"] for p in rank["comm_cpus"])
    for rank in data["ranks"]:
        where = f"rank {rank['local_rank']}"
        cpus = frozenset(rank["cpus"])
        tp = rank["thread_plan"]
        homes = {role: parse_cpulist(tp[role]["cpus"]) for role in ROLES}
        for role, home in homes.items():
            assert home and home <= cpus, f"{where}: {role} home {tp[role]['cpus']} is outside its CPUs"
        main, comm = frozenset(rank["main_cpus"]), frozenset(rank["comm_cpus"])
        compute = frozenset(p for core in rank["compute_cores"] for p in core)
        if main:
            core = next(c for c in cores if min(main) in c)
            assert main == frozenset(core) & cpus, f"{where}: main CPUs {sorted(main)} are not one core's {core}"
            assert homes["main"] == main and tp["main"]["pinned"], where
            assert main <= compute and main.isdisjoint(comm), where
        else:
            assert homes["main"] == cpus and not tp["main"]["pinned"], where
        assert homes["omp"] <= compute, f"{where}: the team is off the compute CPUs"
        if main and compute - main:
            assert homes["omp"] == compute - main, f"{where}: the team is on the main core"
        if comm:
            assert homes["nccl_proxy"] == comm, where
        pools = tp["pools"]
        team = len(homes["omp"] - main) + 1 if main else len(homes["omp"])
        assert 1 <= pools["openmp"] <= team, f"{where}: {pools['openmp']} OpenMP threads on {team} CPUs"
        assert tp["omp"]["threads"] == pools["openmp"] - 1, where
        for pool in ("blas", "opencv", "rayon", "numexpr", "interop"):
            assert 1 <= pools[pool] <= len(homes["main"]), f"{where}: {pool} pool of {pools[pool]} on the main home"
            assert pools[pool] <= pools["openmp"], f"{where}: {pool} pool above the rank's threads"
        assert tp["interop"]["threads"] == pools["interop"], where
        env = rank["env"]
        kept = env["AFFRUN_USER_POOLS"].split(",")
        for name, pool in POOL_VARIABLES.items():
            if name in kept:  # the user's, which --env-policy safe keeps only when no larger than the pool (OpenMP
                # counts may list levels, 8,4: the first is the team's)
                count = int(env[name].split(",")[0])
                assert user and env[name] == user[name] and 1 <= count <= pools[pool], f"{where}: {name}={env[name]}"
            else:
                assert env[name] == str(pools[pool]), f"{where}: {name}={env[name]}, its {pool} pool {pools[pool]}"
        assert env["AFFRUN_MAIN_CPUS"] == format_cpulist(main), where
        places = parse_places(env["OMP_PLACES"])
        assert places, f"{where}: OMP_PLACES={env['OMP_PLACES']}"
        # the main thread's place: its core, else the CPUs the rank computes on (its compute and loader CPUs: no
        # comm core, its own nor a sharer's), inside its home (the rank's whole set: the mask the process has
        # before an OpenMP runtime binds it)
        working = compute | frozenset(rank["loader_cpus"])
        assert places[0] == (main or working) and places[0] <= homes["main"], f"{where}: {env['OMP_PLACES']}"
        assert all(place <= homes["omp"] for place in places[1:]), f"{where}: a team place off the team's home"
        computing = [*places, homes["omp"], homes["pin_memory"], *(parse_cpulist(w["cpus"]) for w in tp["workers"])]
        on_comm = [format_cpulist(c & every_comm) for c in computing if c & every_comm]
        assert not on_comm, f"{where}: computes on comm CPUs {on_comm} ({env['OMP_PLACES']}, {data['mode']})"
        if main or comm:
            assert env["NCCL_PROXY_CPUSET"] == tp["nccl_proxy"]["cpus"], where
        else:
            assert "NCCL_PROXY_CPUSET" not in env, where
        live = live_plan(env).to_dict()
        live.pop("workers")
        assert live == {k: v for k, v in tp.items() if k != "workers"}, (
            f"{where}: the rank reads another thread plan back from its variables")
        check_workers(where, rank, tp["workers"], cores)
        if data["mode"] in ("exclusive", "l3"):
            assert not rank["shared"], where
            for cpu in cpus | main | comm | compute | frozenset(rank["loader_cpus"]):
                assert owner.setdefault(cpu, rank["local_rank"]) == rank["local_rank"], (
                    f"CPU {cpu} in ranks {owner[cpu]} and {rank['local_rank']} ({data['mode']})")


def check_workers(where: str, rank: dict[str, Any], workers: list[dict[str, Any]],
                  cores: list[tuple[int, ...]]) -> None:
    """DataLoader workers (``WorkerHome.to_dict()``\\ s) of a rank: each inside the loader CPUs when it has some,
    else inside its compute CPUs off the main core (all of them when nothing else is left: threads.py
    ``_minus``), never on a comm core (its own, or in its mask a sharer's); its pools its CPU count; disjoint when
    no more than the PUs of that pool; each a union of whole cores (the pool's PUs of each) when no more than its
    cores."""
    cpus, loader = frozenset(rank["cpus"]), frozenset(rank["loader_cpus"])
    working = frozenset(p for core in rank["compute_cores"] for p in core) | loader
    kept = frozenset(rank["main_cpus"]) | (cpus - working)
    pool = loader or (working - kept) or working
    units = {frozenset(c) & pool for c in cores} - {frozenset()}
    units |= {frozenset([p]) for p in pool - frozenset().union(*units)}
    seen: set[int] = set()
    for w in workers:
        mine = parse_cpulist(w["cpus"])
        assert mine and mine <= pool, f"{where}: worker {w['index']} on {w['cpus']}, outside its pool {sorted(pool)}"
        assert loader.isdisjoint(kept) and (mine.isdisjoint(kept) or not working - kept), where
        assert w["pools"] == len(mine), f"{where}: worker {w['index']}'s pools are {w['pools']} on {w['cpus']}"
        if len(workers) <= len(pool):
            assert seen.isdisjoint(mine), f"{where}: worker {w['index']} shares CPUs ({len(workers)} workers)"
        if len(workers) <= len(units):
            split = [u for u in units if u & mine and not u <= mine]
            assert not split, f"{where}: worker {w['index']} ({w['cpus']}) holds part of core(s) {split}"
        seen |= mine
    assert [w["index"] for w in workers] == list(range(len(workers))), where


# ---------------------------------------------------------------------------------------------- the two paths
def refused(exc: AffrunError) -> None:
    assert isinstance(exc, REFUSALS), f"{type(exc).__name__}: {exc}"
    assert str(exc) and "\n" not in str(exc), repr(str(exc))


def check_layers(topo: Topology, plan: Plan, workers: int, bind: OmpBind = "rank",
                 user: dict[str, str] | None = None) -> None:
    """``plan``'s JSON as ``affrun plan --json`` makes it (the env layer, ``thread_plans``) checked by
    :func:`check_plan`, and each rank's thread plan with ``workers`` DataLoader workers by :func:`check_workers`."""
    cores = [c.pus for c in topo.cores]
    parent = ParentPlan(plan, bind, "safe", "none", "auto", dict(user or {}), False)
    data = plan_json(plan, [parent.environment(r) for r in plan.ranks], "none", thread_plans(topo, plan))
    check_plan(data, cores, user)
    for rank, entry in zip(plan.ranks, data["ranks"]):
        drawn = thread_plan(rank, workers, cores).to_dict()["workers"]
        assert len(drawn) == workers
        check_workers(f"rank {rank.local_rank}, {workers} workers", entry, drawn, cores)


@GENERATED
@given(st.one_of(main_thread_cases(), comm_cases()), st.one_of(st.integers(0, 8), st.integers(0, 100)),
       st.sampled_from(BIND_MODES))
def test_generated_machines_keep_them_too(case: tuple[Generated, Request], workers: int, bind: OmpBind) -> None:
    """On machines of tests/plan_cases.py (random packages, nodes, SMT numbering, allowed subsets, GPUs, core
    kinds, priority cores) with any request, ``--map`` lists that overlap among them."""
    m, req = case
    try:
        plan = make_plan(m.topo, req)
    except AffrunError as exc:
        refused(exc)
        return
    check_layers(m.topo, plan, workers, bind)


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_every_plan_keeps_the_thread_plan_s_promises(machine: Machine, sources: Sources) -> None:
    """Through the layers ``affrun plan --json`` runs: the planner, the env layer, ``thread_plans``."""
    try:
        topo = sources.topology(machine)
    except TopologyError as exc:
        refused(exc)
        return

    @PLANS
    @given(mixes(topo))
    def check(mix: Mix) -> None:
        try:
            narrowed = sources.topology(machine, mix.cpus)
            options = mix.options()
            nproc = mix.nproc or options.rank_count() or len(narrowed.visible_gpus()) or 1  # as plan_job counts
            plan = make_plan(narrowed, options.request(nproc))
        except AffrunError as exc:
            refused(exc)
            return
        check_layers(narrowed, plan, mix.workers, mix.omp_bind, mix.user)

    check()


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_affrun_plan_json_keeps_them_or_refuses_in_one_line(machine: Machine, sources: Sources) -> None:
    """Through ``affrun plan --json`` itself, in click's CliRunner, in an environment without the caller's
    thread, pool or GPU variables."""
    try:
        topo = sources.topology(machine)
    except TopologyError as exc:
        refused(exc)
        return

    @COMMANDS
    @given(mixes(topo))
    def check(mix: Mix) -> None:
        result = CliRunner().invoke(cli, mix.argv(sources.source(machine)), prog_name="affrun", env=clean_env(**mix.user),
                                    catch_exceptions=False)
        if result.exit_code == 2:
            lines = result.stderr.splitlines()
            assert result.stdout == "" and len(lines) == 1 and lines[0].startswith("affrun: error: "), result.output
            return
        assert result.exit_code == 0, result.output
        check_plan(json.loads(result.stdout), [c.pus for c in sources.topology(machine, mix.cpus).cores], mix.user)

    check()


def test_a_main_core_is_the_rank_s_pus_of_it_not_always_all_of_them(sources: Sources) -> None:
    # "All PUs of one core" does not hold where --cpus, a cgroup or --map leaves a rank part of a core: siblings
    # are c and c+16 on this machine, and --cpus 0-7 allows no sibling, so the main core of rank 0 is CPU 0 alone
    # (CPU 16 is not the rank's to run on). check_plan asserts the rank's PUs of one core.
    machine = next(m for m in MACHINES if m.name == "cli-contract")
    result = CliRunner().invoke(cli, ["plan", "--json", "--fsroot", sources.source(machine)["fsroot"], "--cpus",
                                      "0-7", "--nproc-per-node", "2", "--main-thread", "compute"],
                                env=clean_env(), catch_exceptions=False)
    data = json.loads(result.stdout)
    assert [r["main_cpus"] for r in data["ranks"]] == [[0], [4]]
    check_plan(data, [c.pus for c in sources.topology(machine).cores])
