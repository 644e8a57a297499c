"""test_run_cmd: the tests that start processes or load real runtimes (tests/system). The in-process ones are tests/unit/test_run_cmd.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakesys import this_machine_with_gpus, write_tree
from tests.launch import affrun, affrun_argv, clean_env, run
from tests.run_dry import dry_run


def test_one_rank_per_visible_gpu(tmp_path: Path) -> None:
    root = write_tree(tmp_path, this_machine_with_gpus(2))
    plan = json.loads(dry_run("run", root=root).variables["AFFRUN_PLAN"])["plan"]
    assert [r["gpu"] for r in plan["ranks"]] == [0, 1]


def test_top_override() -> None:
    assert dry_run("run", "--nproc-per-node", "1", "--top", "launcher").variables["AFFRUN_RUN"] == "launcher"


def test_records_the_task_it_runs_in() -> None:
    """The rank variables already set (a Slurm batch script's, an mpirun task's) travel with what identifies the
    task, as data; an unrelated variable does not, and without a scheduler nothing is written."""
    task = {"SLURM_LOCALID": "0", "SLURM_PROCID": "3", "SLURM_TASK_PID": "4321", "SLURM_STEP_TASKS_PER_NODE": "1",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "job@1"}
    recorded = json.loads(dry_run("run", "--nproc-per-node", "2", env=task).variables["AFFRUN_RUN_TASK"])
    assert recorded == {k: task[k] for k in ("SLURM_LOCALID", "SLURM_PROCID", "SLURM_TASK_PID",
                                             "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_NAMESPACE")}
    assert "AFFRUN_RUN_TASK" not in dry_run("run", "--nproc-per-node", "2").variables


def test_a_stale_launcher_marker_does_not_reach_the_command() -> None:
    code = "import os; print(os.getpid(), os.environ.get('AFFRUN_LAUNCHER_PID'), os.environ.get('AFFRUN_RUN_TASK'))"
    out = run(affrun_argv("run", "--nproc-per-node", "1", "--top", "launcher", "--", sys.executable, "-c", code),
              check=True, env=clean_env(AFFRUN_LAUNCHER_PID="1", AFFRUN_RUN_TASK="{}")).stdout
    pid, marker, task = out.split()
    assert marker == pid and task == str(None)  # the top process's hook wrote its own pid, not the stale one


def test_arguments_pid_and_exit_status_are_the_commands() -> None:
    args = ["a b", "", "--nproc-per-node", "é", "-- x"]
    code = "import os, sys, json; print(json.dumps([os.getpid(), sys.argv[1:]])); sys.exit(7)"
    proc = subprocess.Popen(affrun_argv("run", "--nproc-per-node", "1", "--", sys.executable, "-c", code, *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    pid, argv = json.loads(out)
    assert pid == proc.pid and argv == args  # exec'd in place; every argument byte for byte


@pytest.mark.parametrize(
    ("argv", "extra", "message"),
    [
        (["--nproc-per-node", "0", "--", "true"], {}, "at least 1"),
        (["--nproc-per-node", "1", "--", "true"], {"AFFRUN_RUN": "rank0"}, "already running"),
        (["--nproc-per-node", "99", "--", "true"], {}, ""),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], extra: dict[str, str], message: str) -> None:
    proc = affrun("run", *argv, env=extra)
    assert proc.returncode == 2
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("affrun: error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_warns_about_another_binder() -> None:
    proc = dry_run("run", "--nproc-per-node", "1", program=("--", "deepspeed", "--bind_cores_to_rank", "t.py",
                                                            "--enable_cpu_affinity"))
    warnings = [ln for ln in proc.stderr.splitlines() if "double-binding" in ln]
    assert proc.returncode == 0 and len(warnings) == 1 and "--bind_cores_to_rank" in warnings[0]
