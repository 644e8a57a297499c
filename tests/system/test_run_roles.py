"""``affrun run`` with real launchers, where the role of a process is not told by a rank variable of its own:
accelerate's single-process launcher (its training process has no rank variable), the helpers of torchrun and
DeepSpeed in a one-rank plan, and launchers that run inside a scheduler's task (``SLURM_LOCALID`` already set).

Every process records what it really runs with, and what its ancestors (the launchers) run with, from /proc;
the expected values come from the plan ``affrun run --dry-run`` prints for the same options and environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import parse_cpulist
from tests.conftest import need
from tests.system.test_run_launchers import BIN, PROGRAMS, assert_matches_plan, by_rank, have, plan_of, run_job

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ALLOWED = frozenset(os.sched_getaffinity(0))  # affrun run does not bind itself: an unbound launcher keeps this
# One rank on all CPUs but the first (kept for the OS), so that a bound process and an unbound one differ.
ONE_RANK = ["--nproc-per-node", "1", "--reserve", str(min(ALLOWED))]
ACCELERATE_FLAGS = ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def slurm_task() -> dict[str, str]:
    """The rank variables of the task that runs ``affrun run``, as a Slurm batch script has them (this test
    process stands in for the task: SLURM_TASK_PID is its pid, as slurmstepd sets it)."""
    return {"SLURM_JOB_ID": "4242", "SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_NODEID": "0",
            "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
            "SLURM_TASK_PID": str(os.getpid())}


def launchers_above(record: dict[str, Any], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ancestors of a recorded process that run one of the launchers ``names`` (console script or module)."""
    return [a for a in record["ancestors"]
            if any(os.path.basename(w) in names or w.split(".")[0] in names for w in a["argv"][1:4])]


def assert_unbound(launchers: list[dict[str, Any]], count: int) -> None:
    assert len(launchers) == count, launchers
    for launcher in launchers:
        assert parse_cpulist(launcher["mask"]) == ALLOWED, launcher  # never confined to a rank's CPUs


def assert_rank(record: dict[str, Any], planned: dict[str, Any]) -> None:
    assert parse_cpulist(record["mask"]) == frozenset(planned["cpus"]), (record, planned)
    assert record["OMP_NUM_THREADS"] == str(planned["threads"]), (record, planned)
    assert record["AFFRUN_LOCAL_RANK"] == str(planned["local_rank"]), record


# ------------------------------------------------------------------------- accelerate's simple launcher
@pytest.mark.parametrize(("options", "flags"), [(ONE_RANK, ["--num_processes", "1"]),
                                                (["--nproc-per-node", "2"], ["--cpu", "--num_processes", "1"])])
def test_accelerate_single_process_is_rank_0(tmp_path: Path, options: list[str], flags: list[str]) -> None:
    """accelerate's simple launcher (1 process, or --cpu) starts `python script.py` with no rank variable: the
    process is the plan's rank 0 (one-rank plan, or accelerate's ACCELERATE_USE_CPU); `accelerate launch` stays
    unbound. No LOCAL_RANK is set for it."""
    need(have("accelerate"), "accelerate is not installed (tests/run_all.sh installs the test extra)")
    plan = plan_of(*options)
    need(frozenset(plan["ranks"][0]["cpus"]) != ALLOWED, "rank 0 has every CPU here: bound and unbound look alike")
    proc, records = run_job(tmp_path, options, [str(BIN / "accelerate"), "launch", *flags, *ACCELERATE_FLAGS,
                                                str(PROGRAMS / "accelerate_probe.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rank,) = records
    assert rank["distributed"] == "DistributedType.NO" and rank["LOCAL_RANK"] is None, rank
    assert_rank(rank, plan["ranks"][0])
    assert_unbound(launchers_above(rank, ("accelerate",)), 1)


# ------------------------------------------------------------------------- one-rank plans: helpers unbound
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_one_rank_plan_leaves_the_launchers_unbound(tmp_path: Path, launcher: str) -> None:
    """In a one-rank plan, torchrun's agent, DeepSpeed's runner and the launch.py it starts (Python processes
    with no rank variable below a launcher) stay unbound; only the rank they start (LOCAL_RANK=0) is bound."""
    options = ONE_RANK
    plan = plan_of(*options)
    need(frozenset(plan["ranks"][0]["cpus"]) != ALLOWED, "rank 0 has every CPU here: bound and unbound look alike")
    if launcher == "torchrun":
        command, names, count = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "1"], ("torchrun",), 1
    else:
        need(have("deepspeed") and (BIN / "deepspeed").exists(), "deepspeed is not installed")
        command, names, count = [str(BIN / "deepspeed"), "--num_gpus", "1"], ("deepspeed",), 2  # runner + launch.py
    proc, records = run_job(tmp_path, options, [*command, str(PROGRAMS / "rank_probe_plain.py")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = by_rank(records, key="LOCAL_RANK")
    assert_matches_plan(ranks, plan)
    assert_unbound(launchers_above(ranks[0], names), count)


# ------------------------------------------------------------------------- inside a scheduler's task
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_launcher_in_a_slurm_task_is_not_rank_0(tmp_path: Path, launcher: str) -> None:
    """SLURM_LOCALID=0 of the batch script that runs `affrun run -- LAUNCHER` is not a rank: the launcher (and
    torchrun's agent) stays unbound, and the ranks it starts get the plan's CPUs, rank 0 not shared."""
    options = ["--nproc-per-node", "2"]
    env = slurm_task()
    plan = plan_of(*options, env=env)
    if launcher == "torchrun":
        command = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(PROGRAMS / "rank_probe_plain.py")]
        key = "LOCAL_RANK"
    else:
        need(have("accelerate"), "accelerate is not installed (tests/run_all.sh installs the test extra)")
        command = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", *ACCELERATE_FLAGS,
                   str(PROGRAMS / "accelerate_probe.py")]
        key = "local_rank"
    proc, records = run_job(tmp_path, options, command, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = by_rank(records, key=key)
    assert_matches_plan(ranks, plan)
    for rank in ranks.values():
        assert rank["SLURM_LOCALID"] == "0", rank  # the batch script's variables reached the ranks untouched
        assert_unbound(launchers_above(rank, (launcher,)), 1)


def test_top_launcher_in_a_slurm_task_stays_unbound(tmp_path: Path) -> None:
    """The reviewer's case: --top launcher with the batch script's SLURM_LOCALID: the top process is unbound."""
    env = slurm_task()
    proc, records = run_job(tmp_path, ["--nproc-per-node", "2", "--top", "launcher"],
                            [sys.executable, str(PROGRAMS / "rank_probe_plain.py")], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (top,) = records
    assert parse_cpulist(top["mask"]) == ALLOWED and top["AFFRUN_LOCAL_RANK"] is None, top


@pytest.mark.parametrize("local", ["0", "1"])
def test_one_affrun_run_per_slurm_task_still_binds_that_task(tmp_path: Path, local: str) -> None:
    """`srun -n 2 affrun run --nproc-per-node 2 -- python train.py` (--top rank0): each task's SLURM_LOCALID is
    its rank, as before."""
    options = ["--nproc-per-node", "2"]
    env = {**slurm_task(), "SLURM_LOCALID": local, "SLURM_PROCID": local, "SLURM_NTASKS": "2",
           "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}
    plan = plan_of(*options, env=env)
    proc, records = run_job(tmp_path, options, [sys.executable, str(PROGRAMS / "rank_probe_plain.py")], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rank,) = records
    assert_rank(rank, plan["ranks"][int(local)])
