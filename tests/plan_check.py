"""The one test-side check of what a planning parent hands its ranks: every rank reads it back unchanged, and it
holds what the planner guarantees beyond what a rank checks (a rank checks only what protects the user:
launcher.bind.wire.check_handoff). The planner-invariant oracle of the plan and hand-off tests."""

from __future__ import annotations

from launcher.base.cpulist import format_cpulist
from launcher.bind.handoff import ParentPlan
from launcher.bind.wire import read_job
from launcher.env.variables import COMM_VARIABLE, POOL_OF


def check_handoff(parent: ParentPlan) -> None:
    """``parent``'s ``AFFRUN_PLAN`` is read back by every rank as it was planned, and its plan and environments
    are what a planner makes: ``shared`` only in the shared modes and with a sharer, spill CPUs of the plan's
    spill role, no reserved CPU in a rank, memory nodes sorted and each once, distinct main cores, at most one
    thread per compute unit, NCCL's CPUs the comm cores (or the CPUs off the main core), each count the rank's
    threads (a pool's at most them) or the user's value, and ``user_pools`` the counts whose value is the user's."""
    plan, user_env = parent.plan, parent.user_env
    job = read_job(parent.to_env())
    assert job.handoff == parent.handoff() and job.plan == plan
    mains: dict[int, int] = {}
    for rank, env in zip(plan.ranks, job.handoff.env, strict=True):
        what = f"rank {rank.local_rank}"
        sharers = [r for r in plan.ranks if r is not rank and r.shared and r.cpus == rank.cpus]
        assert not rank.shared or (plan.mode in ("numa", "socket") and sharers), what
        compute = set(rank.compute_cpus)
        spill = set(rank.spill_cpus)
        assert spill <= set(rank.cpus) and (plan.spill != "none" or not (spill or rank.spill_nodes)), what
        assert plan.spill != "loader" or spill <= set(rank.loader_cpus), what
        assert plan.spill != "compute" or spill.isdisjoint(rank.loader_cpus), what
        assert set(rank.cpus).isdisjoint(plan.reserved), what
        assert list(rank.mem_nodes) == sorted(set(rank.mem_nodes)), what
        for cpu in rank.main_cpus:
            assert mains.setdefault(cpu, rank.local_rank) == rank.local_rank, f"{what}: a main core twice"
        assert rank.threads <= (len(compute) if plan.smt else len(rank.compute_cores)), what
        comm = env.set.get(COMM_VARIABLE)
        off_main = sorted(set(rank.cpus) - set(rank.main_cpus)) or rank.cpus
        ours = format_cpulist(rank.comm_cpus or (off_main if rank.main_cpus else ()))
        assert comm in (None, ours, user_env.get(COMM_VARIABLE)), (what, comm, ours)
        for name, pool in POOL_OF.items():
            value = env.set.get(name)
            if value is not None and value != user_env.get(name):
                assert value == str(rank.threads) or (pool != "openmp" and 1 <= int(value) <= rank.threads), what
        assert all(env.set[name] == user_env.get(name) for name in env.user_pools), what
