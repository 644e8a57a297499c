"""Issue 34, class 6: ``--comm-cores`` at the edges, as properties over generated machines (core kinds, SMT,
several nodes, GPUs, restricted CPU sets) and requests (every mode, ``--loader-cores``, ``--map`` lists that
overlap or leave the machine, ``--spill``, ``--main-thread``, ``--comm-cores`` from 0 to more than a rank has, one
CPU per rank).

What holds, whatever the request: ``--comm-cores`` never turns a plan into an error and never changes a rank's
mask or loader CPUs; a rank's comm CPUs are inside its mask, none of its loader CPUs, none of its team's; no CPU
is two ranks' comm CPU, nor a comm CPU of one rank and a compute or loader CPU of another; no other rank's mask
holds a comm CPU but those of ranks that share their CPUs (numa, socket; overlapping --map lists do not); a rank
keeps exactly K comm cores or none, with a warning, and always an OpenMP team, never on its main core; and its
``OMP_NUM_THREADS``, ``OMP_PLACES``, ``NCCL_PROXY_CPUSET`` and ``AFFRUN_COMM_CPUS`` agree with the plan."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from launcher.base.cpulist import format_cpulist, parse_cpulist
from launcher.bind.handoff import ParentPlan
from launcher.env.omp_syntax import parse_places
from launcher.env.policy import rank_environment
from launcher.plan.planner import Plan, Request
from launcher.topology.model import Topology
from tests.plan_cases import SETTINGS, Machine, comm_cases, machines, plan_or_error
from tests.plan_check import check_handoff

BINDS = ("rank", "core")


def check_comm(topo: Topology, req: Request, plan: Plan, without: Plan) -> None:
    """Every promise of ``--comm-cores req.comm_cores`` in ``plan``, against ``without`` (the same request with
    none)."""
    k = req.comm_cores
    comm_owner: dict[int, int] = {}
    compute_owner: dict[int, set[int]] = {}
    for r in plan.ranks:
        for p in r.compute_cpus:
            compute_owner.setdefault(p, set()).add(r.local_rank)
    for r, before in zip(plan.ranks, without.ranks, strict=True):
        comm = set(r.comm_cpus)
        assert r.cpus == before.cpus and r.loader_cpus == before.loader_cpus, "--comm-cores changed the mask"
        assert r.gpu == before.gpu and r.numa_nodes == before.numa_nodes
        assert comm <= set(r.cpus), f"rank {r.local_rank}: comm CPUs outside its mask"
        assert comm.isdisjoint(r.loader_cpus), f"rank {r.local_rank}: a comm CPU is a loader CPU"
        assert comm.isdisjoint(r.compute_cpus), f"rank {r.local_rank}: a comm CPU is in its OpenMP team"
        assert comm.isdisjoint(r.main_cpus), f"rank {r.local_rank}: a comm CPU is its main core"
        assert comm <= set(before.compute_cpus), "a comm core that was not one of the rank's compute cores"
        assert set(r.compute_cpus) <= set(before.compute_cpus)
        assert r.compute_cores and r.threads >= 1, f"rank {r.local_rank}: no OpenMP team left"
        units = len(r.compute_cpus) if req.smt else len(r.compute_cores)
        assert r.threads <= units, f"rank {r.local_rank}: {r.threads} threads on {units} compute core(s)"
        if k == 0:
            assert r == before
            continue
        # whole cores, K of them, or none with a warning that says why
        kept = [c for c in before.compute_cores if comm & set(c)]
        assert all(set(c) <= comm for c in kept), f"rank {r.local_rank}: a comm core split from its siblings"
        if comm:
            assert len(kept) == k, (r.local_rank, k, r.comm_cpus)
        else:
            assert any(f"--comm-cores {k} ignored" in w for w in r.warnings), r.warnings
        for p in comm:
            assert p not in comm_owner, f"CPU {p} is a comm CPU of ranks {comm_owner[p]} and {r.local_rank}"
            comm_owner[p] = r.local_rank
            others = compute_owner.get(p, set()) - {r.local_rank}
            assert not others, f"CPU {p}: comm CPU of rank {r.local_rank}, compute CPU of ranks {sorted(others)}"
            loaders = [o.local_rank for o in plan.ranks if p in o.loader_cpus]
            assert not loaders, f"CPU {p}: comm CPU of rank {r.local_rank}, loader CPU of ranks {loaders}"
            holders = [o.local_rank for o in plan.ranks if o is not r and p in o.cpus and not (o.shared and r.shared)]
            assert not holders, f"CPU {p}: comm CPU of rank {r.local_rank}, in the mask of ranks {holders}"
        check_environment(r, len(plan.ranks), req.smt)
    # the plan every rank reads back (AFFRUN_PLAN), and its environments, are what a planner makes
    for bind in BINDS:
        check_handoff(ParentPlan(plan, bind, "safe", "none", "auto", {}, False))
    if req.mode in ("exclusive", "l3"):
        for r in plan.ranks:
            for o in plan.ranks:
                if o is not r:
                    assert set(r.comm_cpus).isdisjoint(o.cpus), f"rank {o.local_rank} holds rank {r.local_rank}'s comm CPU"


def check_environment(r: object, size: int, smt: bool) -> None:
    """The rank's variables say what its plan says, under either OpenMP binding."""
    comm = set(r.comm_cpus)  # type: ignore[attr-defined]
    compute = set(r.compute_cpus)  # type: ignore[attr-defined]
    for bind in BINDS:
        env = rank_environment(r, local_world_size=size, user_env={}, bind=bind, smt=smt)  # type: ignore[arg-type]
        assert env.set["OMP_NUM_THREADS"] == str(r.threads)  # type: ignore[attr-defined]
        places = parse_places(env.set["OMP_PLACES"])
        assert places, env.set["OMP_PLACES"]
        first, rest = set(places[0]), [set(p) for p in places[1:]]
        assert first <= set(r.cpus) and first.isdisjoint(comm), (bind, env.set["OMP_PLACES"])  # type: ignore[attr-defined]
        assert all(place <= compute for place in rest), (bind, env.set["OMP_PLACES"])
        if comm:
            assert parse_cpulist(env.set["NCCL_PROXY_CPUSET"]) == comm
            assert env.set["AFFRUN_COMM_CPUS"] == format_cpulist(comm)
        elif r.main_cpus:  # type: ignore[attr-defined]  # the rank's CPUs off its main core (docs/threads.md)
            proxy = parse_cpulist(env.set["NCCL_PROXY_CPUSET"])
            off_main = set(r.cpus) - set(r.main_cpus)  # type: ignore[attr-defined]
            assert proxy <= set(r.cpus) and (proxy <= off_main or not off_main), (proxy, r)  # type: ignore[attr-defined]
        else:
            assert "NCCL_PROXY_CPUSET" not in env.set


@SETTINGS
@given(comm_cases())
def test_comm_cores_stay_apart_and_inside_every_mask(case: tuple[Machine, Request]) -> None:
    m, req = case
    without = plan_or_error(m.topo, replace(req, comm_cores=0))
    plan = plan_or_error(m.topo, req)
    assert (plan is None) == (without is None), "--comm-cores made a plan an error, or an error a plan"
    if plan is not None and without is not None:
        check_comm(m.topo, req, plan, without)


@st.composite
def one_cpu_per_rank(draw: st.DrawFn) -> tuple[Machine, Request]:
    """As many ranks as allowed cores, one core (one CPU without SMT) each, any --comm-cores."""
    m = draw(machines())
    return m, Request(nproc=len(m.topo.allowed_cores()), comm_cores=draw(st.integers(1, 4)),
                      use_gpus=draw(st.booleans()), smt=draw(st.booleans()), spill="none")


@SETTINGS
@given(one_cpu_per_rank())
def test_one_core_per_rank_keeps_its_core_for_openmp(case: tuple[Machine, Request]) -> None:
    """No rank can spare a core: every rank warns, keeps its one core for its team, and sets no
    NCCL_PROXY_CPUSET."""
    m, req = case
    plan = plan_or_error(m.topo, req)
    assert plan is not None
    without = plan_or_error(m.topo, replace(req, comm_cores=0))
    assert without is not None
    check_comm(m.topo, req, plan, without)
    for r in plan.ranks:
        assert not r.comm_cpus and len(r.compute_cores) == 1 and r.threads >= 1
        assert any(f"--comm-cores {req.comm_cores} ignored" in w for w in r.warnings)


@SETTINGS
@given(comm_cases())
def test_as_many_comm_cores_as_the_rank_has_leaves_it_its_team(case: tuple[Machine, Request]) -> None:
    """--comm-cores equal to a rank's own compute cores (and one fewer): all of them is refused with a warning,
    one fewer keeps them all but one."""
    m, req = case
    without = plan_or_error(m.topo, replace(req, comm_cores=0))
    if without is None:
        return
    smallest = min(len(r.compute_cores) for r in without.ranks)
    for k in {smallest, max(1, smallest - 1)}:
        asked = replace(req, comm_cores=k)
        plan = plan_or_error(m.topo, asked)
        assert plan is not None
        check_comm(m.topo, asked, plan, without)
        rank = min(plan.ranks, key=lambda r: len(r.compute_cores) + len(r.comm_cpus))
        if k == smallest:
            assert not rank.comm_cpus
