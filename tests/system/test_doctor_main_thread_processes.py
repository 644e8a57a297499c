"""``affrun doctor`` agrees with the thread plan of a rank whose main thread has a core of its own (issue 33
follow-ups), through the real entry points: ``affrun exec --main-thread compute -- affrun doctor`` judges the
rank's own environment, ``affrun doctor --pid`` a real DataLoader job that ``affrun exec`` started. Every CPU
asserted is one this test may use; the sizes come from the rank's own variables, never from this machine's shape.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.base.cpulist import format_cpulist, parse_cpulist
from tests.conftest import need
from tests.launch import affrun, affrun_argv, require_torch
from tests.system.test_doctor_live import audit, job_env, processes, running

pytestmark = pytest.mark.slow
CPUS = frozenset(os.sched_getaffinity(0))
BIG = str(4 * len(CPUS) + 4)  # a pool count above any rank of this machine


def doctor_in_rank(*exec_args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """``affrun exec EXEC_ARGS -- affrun doctor --json``: the doctor judges the environment the rank was given."""
    proc = affrun("exec", *exec_args, "--", *affrun_argv("doctor", "--json"), env=env)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def by_id(data: dict[str, Any], fid: str) -> dict[str, Any]:
    (found,) = [f for f in data["findings"] if f["id"] == fid]
    return found


def ids(data: dict[str, Any]) -> list[str]:
    return [f["id"] for f in data["findings"]]


def main_core() -> None:
    need(len(CPUS) >= 2, "a core of its own for the main thread needs 2 allowed CPUs")


# ----------------------------------------------------------------------------- affrun doctor in the rank
def test_the_main_core_first_in_omp_places_is_the_plan_not_a_collapse() -> None:
    main_core()
    code, data = doctor_in_rank("--main-thread", "compute")
    assert "collapse-risk" not in ids(data)
    assert code == 0 and not [f for f in data["findings"] if f["severity"] != "info"], data["findings"]


def test_without_the_rank_hooks_the_main_core_is_a_collapse_risk_for_forked_workers() -> None:
    main_core()
    code, data = doctor_in_rank("--main-thread", "compute", "--rank-hooks", "none")
    risk = by_id(data, "collapse-risk")
    dry = affrun("exec", "--dry-run", "--main-thread", "compute", "--", "true")
    main = next(line.split("=", 1)[1] for line in dry.stdout.splitlines() if line.startswith("AFFRUN_MAIN_CPUS="))
    assert code == 1 and risk["severity"] == "warning"
    assert f"CPU {main}" in risk["message"] and "AFFRUN_RANK_HOOKS=none" in risk["message"]
    assert "worker_init_fn=launcher.torch.worker_init_fn" in risk["fix"] and "--rank-hooks auto" in risk["fix"]
    assert "env_fix" not in risk  # affrun's places are the plan: nothing to unset


def test_a_kept_pool_variable_above_the_rank_is_pool_oversubscribed() -> None:
    code, data = doctor_in_rank("--env-policy", "keep", env={"OPENCV_FOR_THREADS_NUM": BIG})
    over = by_id(data, "pool-oversubscribed")
    assert code == 1 and over["severity"] == "warning"
    assert over["message"].startswith(f"OPENCV_FOR_THREADS_NUM={BIG}")
    assert format_cpulist(CPUS) in over["message"]  # the rank's CPUs: all of this test's, for one rank
    assert "your value (AFFRUN_USER_POOLS), kept under --env-policy keep" in over["message"]
    size = int(over["env_fix"]["OPENCV_FOR_THREADS_NUM"])
    assert 1 <= size <= len(CPUS) and f"export OPENCV_FOR_THREADS_NUM={size}" in over["fix"]
    assert "drop --env-policy keep" in over["fix"]
    safe_code, safe = doctor_in_rank(env={"OPENCV_FOR_THREADS_NUM": BIG})  # safe replaced it: nothing to say
    assert "pool-oversubscribed" not in ids(safe) and safe_code == 0


def test_with_a_main_core_the_inheriting_pools_are_judged_against_it() -> None:
    main_core()
    code, data = doctor_in_rank("--main-thread", "compute", "--env-policy", "keep",
                                env={"RAYON_NUM_THREADS": str(len(CPUS))})
    over = by_id(data, "pool-oversubscribed")
    assert over["message"].startswith(f"RAYON_NUM_THREADS={len(CPUS)}") and "AFFRUN_MAIN_CPUS" in over["message"]
    assert int(over["env_fix"]["RAYON_NUM_THREADS"]) < len(CPUS) and code == 1


def test_a_pool_variable_outside_affrun_is_judged_too() -> None:
    """``affrun doctor`` before a launch, with no plan: the same judgement as the env policy's."""
    proc = affrun("doctor", "--json", env={"OPENCV_FOR_THREADS_NUM": BIG})
    over = by_id(json.loads(proc.stdout), "pool-oversubscribed")
    assert proc.returncode == 1 and over["message"].startswith(f"OPENCV_FOR_THREADS_NUM={BIG}")
    assert format_cpulist(CPUS) in over["message"] and "affrun exec" in over["fix"]
    assert "your value" not in over["message"]


def test_a_garbage_pool_variable_is_reported_as_the_failure_it_causes() -> None:
    """opencv-python-headless fails at its first parallel call with a count that is not a number: checked here
    with the real library, then said by the doctor as an error."""
    need(importlib.util.find_spec("cv2") is not None, "opencv-python-headless is not installed")
    resize = "import cv2, numpy; cv2.resize(numpy.zeros((2000, 2000), numpy.uint8), (1000, 1000))"
    env = {**os.environ, "OPENCV_FOR_THREADS_NUM": "lots"}
    imported = subprocess.run([sys.executable, "-c", resize], env=env, capture_output=True, text=True, timeout=120)
    assert imported.returncode != 0 and "cv2.error" in imported.stderr and "stoull" in imported.stderr
    proc = affrun("doctor", "--json", env={"OPENCV_FOR_THREADS_NUM": "lots"})
    invalid = by_id(json.loads(proc.stdout), "omp-threads-invalid")
    assert proc.returncode == 1 and invalid["severity"] == "error" and "cv2.error (stoull)" in invalid["why"]
    assert invalid["message"].startswith("OPENCV_FOR_THREADS_NUM='lots'") and invalid["env_fix"]


# ----------------------------------------------------------------------------- affrun doctor --pid
LOADER_JOB = r"""
import os, sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Numbers(Dataset):
    def __len__(self):
        return 10**7
    def __getitem__(self, i):
        x = 0
        for k in range(2000):
            x += k
        return torch.tensor([x])

if __name__ == "__main__":
    init = None
    if sys.argv[2] == "worker_init_fn":
        import launcher.torch
        init = launcher.torch.worker_init_fn
    loader = DataLoader(Numbers(), batch_size=4, num_workers=2, worker_init_fn=init)
    batches = iter(loader)
    next(batches)
    a = torch.randn(64, 64)
    os.write(1, f"READY {os.getpid()}\n".encode())
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        a @ a
        next(batches)
"""


def audit_exec_job(tmp_path: Path, exec_args: tuple[str, ...], init: str) -> tuple[int, dict[str, Any], int]:
    require_torch()
    script = tmp_path / "job.py"
    script.write_text(LOADER_JOB)
    argv = affrun_argv("exec", *exec_args, "--", sys.executable, str(script), "600", init)
    with running(argv, job_env()) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        code, data = audit(pid, 1.5)
    return code, data, pid


def check_clean(code: int, data: dict[str, Any], pid: int) -> None:
    assert (code, data["findings"]) == (0, []), data["findings"]
    (rank,) = processes(data, "rank")
    assert (rank["pid"], rank["rank"]) == (pid, 0)  # AFFRUN_LOCAL_RANK makes it a rank, without LOCAL_RANK
    main = next(t for t in rank["threads"] if t["tid"] == pid)
    assert main["home"] == main["allowed"] and main["verdict"] == "home"
    assert parse_cpulist(main["allowed"]) < CPUS  # its core of its own
    workers = [c for c in processes(data, "child") if c["rank_pid"] == pid]
    assert len(workers) == 2 and all(c["worker"] is not None for c in workers)
    assert all(t["verdict"] == "home" and parse_cpulist(t["allowed"]).isdisjoint(parse_cpulist(main["allowed"]))
               for c in workers for t in c["threads"])


def rank_hooks() -> None:
    need(importlib.util.find_spec("launcher.bind.rank_hooks") is not None,
         "needs the rank's thread hooks (launcher.bind.rank_hooks), which keep the workers off the main core")


def test_a_main_core_job_with_worker_init_fn_has_no_finding(tmp_path: Path) -> None:
    main_core()
    rank_hooks()  # launcher.torch.worker_init_fn keeps off the main core from the same change
    check_clean(*audit_exec_job(tmp_path, ("--main-thread", "compute"), "worker_init_fn"))


def test_a_main_core_job_under_the_rank_hooks_has_no_finding(tmp_path: Path) -> None:
    main_core()
    rank_hooks()
    check_clean(*audit_exec_job(tmp_path, ("--main-thread", "compute"), "none"))


def test_a_main_core_job_with_loader_cores_and_worker_init_fn_has_no_finding(tmp_path: Path) -> None:
    main_core()
    code, data, pid = audit_exec_job(tmp_path, ("--main-thread", "compute", "--loader-cores", "1"), "worker_init_fn")
    check_clean(code, data, pid)


@pytest.mark.torch
def test_a_rank_started_by_affrun_exec_is_labelled_a_rank(tmp_path: Path) -> None:
    """No LOCAL_RANK (affrun exec sets it only under srun or mpirun): AFFRUN_LOCAL_RANK and AFFRUN_PLAN_ID say it is
    local rank 0, its findings name it so, and its DataLoader workers are its children."""
    script = tmp_path / "job.py"
    script.write_text(LOADER_JOB)
    argv = affrun_argv("exec", "--env-policy", "keep", "--", sys.executable, str(script), "600", "none")
    with running(argv, job_env(OPENCV_FOR_THREADS_NUM=BIG)) as (_proc, lines):
        pid = int(next(x for x in lines if x.startswith("READY")).split()[1])
        _, data = audit(pid, 0.3)
    (rank,) = processes(data, "rank")
    assert (rank["pid"], rank["rank"]) == (pid, 0)
    assert sorted(c["rank"] for c in processes(data, "child")) == [0, 0]
    assert by_id(data, "pool-oversubscribed")["subject"] == f"rank 0 (pid {pid})"
