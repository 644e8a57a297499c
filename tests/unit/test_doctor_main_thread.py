"""The doctor agrees with the thread plan (issue 33 follow-ups), on stated environments: every environment affrun
gives a rank (``--main-thread``, ``--smt``, ``--omp-bind``, ``--loader-cores``, ``--comm-cores``, ``numa`` mode) is
free of warnings; the main core first in ``OMP_PLACES`` is the plan under the rank's hooks and a collapse risk
without them; the pool variables are judged as the env policy judges them; a process that carries affrun's binding
is a rank; ``ensure_affinity()`` in a main-core rank leaves affrun's places alone."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from launcher.doctor.collapse import collapse_findings
from launcher.doctor.diagnose import check_environment
from launcher.doctor.facts import Facts
from launcher.doctor.findings import Finding
from launcher.doctor.gpu import GpuReport
from launcher.doctor.live import JobAudit, ProcessRecord, ThreadRecord, assign_roles
from launcher.doctor.thread_homes import assign_homes
from launcher.env.policy import RankEnvironment, rank_environment
from launcher.plan.planner import Plan, make_plan
from launcher.plan.request import Request
from launcher.topology.model import Topology
from launcher.topology.sysfs import read_sysfs
from tests.fakesys import uniform, write_tree


@pytest.fixture(scope="module")
def smt(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    """2 sockets × 8 cores × 2 threads (CPUs 0-31, siblings c and c+16), one NUMA node per socket."""
    return read_sysfs(str(write_tree(tmp_path_factory.mktemp("smt"), uniform(2, 8, threads=2))))


def planned(topo: Topology, nproc: int = 2, **request: object) -> Plan:
    return make_plan(topo, Request(nproc=nproc, **request))  # type: ignore[arg-type]


def rank_env(topo: Topology, index: int = 0, *, user: dict[str, str] | None = None, policy: str = "safe",
             hooks: str = "auto", bind: str = "rank", nproc: int = 2, **request: object) -> tuple[dict[str, str], Plan]:
    plan = planned(topo, nproc, **request)
    env: RankEnvironment = rank_environment(plan.ranks[index], local_world_size=nproc, user_env=user or {},
                                            bind=bind, smt=bool(request.get("smt")), policy=policy,  # type: ignore[arg-type]
                                            hooks=hooks)  # type: ignore[arg-type]
    return env.apply_to(user or {}), plan


def audit(env: dict[str, str], topo: Topology, cpus: frozenset[int], sharing: int = 1,
          openmp: tuple[str, ...] = ("libgomp",)) -> list[Finding]:
    facts = Facts(rank_cpus=cpus, ranks_sharing=sharing, per_rank_mask=sharing == 1, local_size=2,
                  local_size_source="test", openmp=openmp)
    return check_environment(env, topo, facts, host=False)


def loud(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.id, f.message) for f in findings if f.at_least("warning")]


def one(findings: list[Finding], fid: str) -> Finding:
    (found,) = [f for f in findings if f.id == fid]
    return found


# ----------------------------------------------------------------------------- affrun's own environments
CASES = list(itertools.product(("none", "compute"), (False, True), ("rank", "core"), (0, 1), (0, 1)))


@pytest.mark.parametrize(("main", "smt_", "bind", "loader", "comm"), CASES)
def test_every_environment_affrun_gives_a_rank_is_free_of_warnings(smt: Topology, main: str, smt_: bool, bind: str,
                                                                   loader: int, comm: int) -> None:
    for openmp in (("libgomp",), ("libiomp5",)):
        for index in (0, 1):
            env, plan = rank_env(smt, index, bind=bind, main_thread=main, smt=smt_, loader_cores=loader,
                                 comm_cores=comm)
            found = audit(env, smt, frozenset(plan.ranks[index].cpus), openmp=openmp)
            assert loud(found) == [], (env["OMP_PLACES"], env["OMP_NUM_THREADS"])
            if main != "none":
                assert "collapse-risk" not in [f.id for f in found]  # not even as info: it is the plan


def test_ranks_that_share_a_node_each_with_a_main_core_are_no_collapse(smt: Topology) -> None:
    """``--mode numa``: the ranks share their node's CPUs, each with a main core of its own: under --pid they are
    ranks sharing CPUs, and the first place is no "every rank on one CPU"."""
    for index in (0, 1):
        env, plan = rank_env(smt, index, nproc=4, mode="numa", main_thread="compute")
        cpus = frozenset(plan.ranks[index].cpus)
        assert plan.ranks[0].cpus == plan.ranks[1].cpus and plan.ranks[0].main_cpus != plan.ranks[1].main_cpus
        assert loud(audit(env, smt, cpus, sharing=2)) == []


def test_without_the_hooks_the_main_core_is_a_collapse_risk(smt: Topology) -> None:
    env, plan = rank_env(smt, hooks="none", main_thread="compute")
    risk = one(audit(env, smt, frozenset(plan.ranks[0].cpus)), "collapse-risk")
    assert risk.severity == "warning" and risk.env_fix == {}  # the places are the plan: nothing to unset
    assert "its own core, CPU 0,16 (AFFRUN_MAIN_CPUS" in risk.message and "AFFRUN_RANK_HOOKS=none" in risk.message
    assert "worker_init_fn=launcher.torch.worker_init_fn" in risk.fix and "--rank-hooks auto" in risk.fix
    env["AFFRUN_RANK_HOOKS"] = "\x1b[2Jbogus"  # the startup hook turns the hooks off for any other value
    assert "'\\x1b[2Jbogus'" in one(audit(env, smt, frozenset(plan.ranks[0].cpus)), "collapse-risk").message
    del env["AFFRUN_RANK_HOOKS"]  # unset: the startup hook's default, auto
    assert "collapse-risk" not in [f.id for f in audit(env, smt, frozenset(plan.ranks[0].cpus))]


def test_a_user_s_first_place_on_the_main_core_s_sibling_is_still_judged(smt: Topology) -> None:
    env, plan = rank_env(smt, main_thread="compute")
    env["OMP_PLACES"] = "{1},{2}"  # not the main core (0,16): the usual judgement
    assert one(audit(env, smt, frozenset(plan.ranks[0].cpus)), "collapse-risk").severity == "warning"


# ----------------------------------------------------------------------------- pool variables
def test_a_kept_pool_value_is_the_user_s_above_the_plan(smt: Topology) -> None:
    env, plan = rank_env(smt, user={"OPENCV_FOR_THREADS_NUM": "64"}, policy="keep")
    over = one(audit(env, smt, frozenset(plan.ranks[0].cpus)), "pool-oversubscribed")
    size = plan.ranks[0].threads  # no main core: the pool inherits the rank's whole set, sized to its threads
    assert over.severity == "warning" and over.env_fix == {"OPENCV_FOR_THREADS_NUM": str(size)}
    assert over.message.startswith(f"OPENCV_FOR_THREADS_NUM=64 sizes the opencv pool to 64 threads, above the {size}")
    assert "the rank's CPUs 0-7,16-23" in over.message
    assert "your value (AFFRUN_USER_POOLS), kept under --env-policy keep" in over.message
    assert "drop --env-policy keep" in over.fix
    safe, plan = rank_env(smt, user={"OPENCV_FOR_THREADS_NUM": "64"})  # replaced: nothing to say
    assert "pool-oversubscribed" not in [f.id for f in audit(safe, smt, frozenset(plan.ranks[0].cpus))]
    env["AFFRUN_USER_POOLS"] = ""  # the value is not one affrun kept: set after the launch
    after = one(audit(env, smt, frozenset(plan.ranks[0].cpus)), "pool-oversubscribed")
    assert "your value" not in after.message and "set after the rank started" in after.message


def test_with_a_main_core_the_inheriting_pools_and_openblas_are_judged_against_it(smt: Topology) -> None:
    user = {"RAYON_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4"}
    env, plan = rank_env(smt, user=user, policy="keep", main_thread="compute")
    found = audit(env, smt, frozenset(plan.ranks[0].cpus))
    over = {f.env_fix and next(iter(f.env_fix)): f for f in found if f.id == "pool-oversubscribed"}
    assert set(over) == {"RAYON_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
    assert over["RAYON_NUM_THREADS"].env_fix == {"RAYON_NUM_THREADS": "2"}  # the main core's 2 PUs
    assert "the main thread's core, CPU(s) 0,16 (AFFRUN_MAIN_CPUS)" in over["OPENBLAS_NUM_THREADS"].message
    assert "omp-oversubscribed" not in [f.id for f in found]  # 4 threads fit the team's CPUs


def test_a_pool_value_without_affrun_is_judged_against_the_rank_s_share(smt: Topology) -> None:
    found = audit({"OPENCV_FOR_THREADS_NUM": "64", "NUMEXPR_NUM_THREADS": "8"}, smt, frozenset(range(32)), sharing=2)
    over = one(found, "pool-oversubscribed")
    assert over.env_fix == {"OPENCV_FOR_THREADS_NUM": "8"} and "2 local ranks (test) share CPUs 0-31" in over.message
    assert "affrun exec" in over.fix  # NUMEXPR_NUM_THREADS=8 is the share of each rank: no finding


@pytest.mark.parametrize(("name", "value", "severity"), [
    ("OPENCV_FOR_THREADS_NUM", "lots", "error"), ("OPENCV_FOR_THREADS_NUM", "-1", "error"),
    ("OPENCV_FOR_THREADS_NUM", "8,4", "error"), ("OPENCV_FOR_THREADS_NUM", "0", "warning"),
    ("NUMEXPR_NUM_THREADS", "lots", "error"), ("NUMEXPR_NUM_THREADS", "0", "warning"),
    ("RAYON_NUM_THREADS", "lots", "warning"), ("BLIS_NUM_THREADS", "", "warning"),
    ("OPENCV_FOR_THREADS_NUM", " 1", "error"), ("OPENCV_FOR_THREADS_NUM", "1\n", "error"),
    ("RAYON_NUM_THREADS", " 1", "warning")])
def test_a_pool_value_that_is_no_count_is_invalid(smt: Topology, name: str, value: str, severity: str) -> None:
    invalid = one(audit({name: value}, smt, frozenset({0, 1, 2, 3, 16, 17, 18, 19})), "omp-threads-invalid")
    assert invalid.severity == severity and invalid.env_fix == {name: "4"}  # 8 CPUs, 4 cores


def test_under_affrun_run_a_rank_s_proc_environment_holds_no_counts_of_its_own(smt: Topology) -> None:
    env = {"AFFRUN_RUN": "launcher", "AFFRUN_PLAN": "{}", "OPENCV_FOR_THREADS_NUM": "64"}  # the hook replaced it
    assert "pool-oversubscribed" not in [f.id for f in audit(env, smt, frozenset(range(8)))]


def test_smt_threads_that_affrun_planned_are_info(smt: Topology) -> None:
    env, plan = rank_env(smt, smt=True)
    found = audit(env, smt, frozenset(plan.ranks[0].cpus))
    assert {f.severity for f in found if f.id == "omp-oversubscribed"} == {"info"}  # OMP_ and MKL_NUM_THREADS
    assert all("--smt" in f.message for f in found if f.id == "omp-oversubscribed")
    env["AFFRUN_THREADS"] = str(int(env["OMP_NUM_THREADS"]) // 2)  # a plan of one thread a core: a warning again
    assert [f.severity for f in audit(env, smt, frozenset(plan.ranks[0].cpus))
            if f.id == "omp-oversubscribed" and f.message.startswith("OMP_NUM")] == ["warning"]


# ----------------------------------------------------------------------------- roles
def record(pid: int, ppid: int, environ: dict[str, str], comm: str = "python") -> ProcessRecord:
    p = ProcessRecord(pid, ppid, comm, [comm, "train.py"], environ)
    p.threads = {pid: ThreadRecord(pid, comm, frozenset({0, 1}), 0)}
    return p


def roles(*processes: ProcessRecord) -> dict[int, tuple[str, int | None]]:
    job = JobAudit(processes[0].pid, 1.0, 0.05, 20, list(processes), GpuReport(False, "n/a"), frozenset({0, 1}))
    assign_roles(job)
    return {p.pid: (p.role, p.rank) for p in processes}


BOUND = {"AFFRUN_LOCAL_RANK": "0", "AFFRUN_PLAN_ID": "ae70b7d1", "AFFRUN_CPUS": "0-1"}


def test_affrun_s_binding_makes_a_rank_and_its_workers_its_children() -> None:
    shell = record(5, 1, {})
    rank, worker = record(10, 5, BOUND), record(11, 10, BOUND, "pt_data_worker")
    assert roles(shell, rank, worker) == {5: ("launcher", None), 10: ("rank", 0), 11: ("child", 0)}
    assert rank.label() == "rank 0 (pid 10)"


def test_a_local_rank_marker_without_the_plan_s_identity_is_no_rank() -> None:
    stray = record(10, 1, {"AFFRUN_LOCAL_RANK": "1"})  # proves no binding (launcher.context.run_role.bound_rank)
    other = record(11, 1, {"AFFRUN_LOCAL_RANK": "x", "AFFRUN_PLAN_ID": "1"})
    assert roles(stray, other) == {10: ("rank", None), 11: ("other", None)}  # the audited process, as before


def test_a_launcher_s_variable_wins_and_a_process_that_started_ranks_is_their_launcher() -> None:
    """``affrun exec -- torchrun``: the agent carries the binding its workers inherit, and the workers LOCAL_RANK."""
    agent = record(10, 1, BOUND)
    workers = [record(11 + i, 10, {**BOUND, "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "2"}) for i in range(2)]
    loader = record(20, 12, {**BOUND, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "pt_data_worker")
    assert roles(agent, *workers, loader) == {10: ("launcher", None), 11: ("rank", 0), 12: ("rank", 1),
                                              20: ("child", 1)}


def test_every_worker_on_the_one_cpu_the_plan_gives_them_is_no_collapse() -> None:
    """A rank of 2 CPUs with its main thread on CPU 0: the thread plan gives every worker CPU 1."""
    env = {**BOUND, "AFFRUN_COMPUTE_CPUS": "0-1", "AFFRUN_THREADS": "2", "AFFRUN_MAIN_CPUS": "0"}
    rank = record(10, 1, env)
    rank.threads = {10: ThreadRecord(10, "python", frozenset({0}), 0)}
    workers = [record(11 + i, 10, env, "pt_data_worker") for i in range(2)]
    for w in workers:
        w.threads = {w.pid: ThreadRecord(w.pid, "pt_data_worker", frozenset({1}), 1)}
    job = JobAudit(10, 1.0, 0.05, 20, [rank, *workers], GpuReport(False, "n/a"), frozenset({0, 1}))
    assign_roles(job)
    assign_homes(job)
    assert collapse_findings(job, rank) == []
    for w in workers:  # on the main core instead: collapsed
        w.threads = {w.pid: ThreadRecord(w.pid, "pt_data_worker", frozenset({0}), 0)}
    assert [f.id for f in collapse_findings(job, rank)] == ["collapse"]
    env["AFFRUN_MAIN_CPUS"] = ""
    plain = record(10, 1, env)
    plain.threads = dict(rank.threads)
    job = JobAudit(10, 1.0, 0.05, 20, [plain, *workers], GpuReport(False, "n/a"), frozenset({0, 1}))
    for w in workers:
        w.threads = {w.pid: ThreadRecord(w.pid, "pt_data_worker", frozenset({1}), 1)}
    assign_roles(job)
    assign_homes(job)
    assert [f.id for f in collapse_findings(job, plain)] == ["collapse"]  # without a main core the plan gives 0-1


# ----------------------------------------------------------------------------- ensure_affinity
def test_ensure_affinity_leaves_a_main_core_rank_s_places_alone(tmp_path: Path) -> None:
    import os

    from launcher import ensure_affinity
    from launcher.topology import load_topology

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("a main core needs 2 allowed CPUs")
    plan = make_plan(load_topology(), Request(nproc=1, main_thread="compute"))
    env = dict(rank_environment(plan.ranks[0], local_world_size=1, user_env={}).set)
    report = ensure_affinity(environ=env, warn=False)
    assert report.changes == [] and env["OMP_PLACES"].startswith("{")
    assert "collapse-risk" not in [f.id for f in report.findings]
