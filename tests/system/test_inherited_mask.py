"""A parent that collapsed its own mask (a launcher that imported torch with OMP_PROC_BIND exported) is named:
``affrun exec`` warns and ``affrun doctor`` reports ``inherited-mask-collapsed``. Real parents, real libgomp."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from launcher.context.inherited_mask import judge
from tests.launch import affrun_argv, clean_env, run

NCPU = len(os.sched_getaffinity(0))
# A launcher that imports torch, then starts its command: what torchrun's agent does.
PARENT = "import subprocess, sys, torch; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
ONE, TWO = frozenset({0}), frozenset({0, 1})


def test_judge_needs_one_cpu_a_wider_cpuset_several_ranks_and_a_cause() -> None:
    env = {"OMP_PROC_BIND": "close"}
    found = judge(ONE, TWO, 2, env, None)
    assert found is not None and found.variables == ("OMP_PROC_BIND=close",)
    assert "CPU 0 only" in found.message() and "cpuset of CPUs 0-1" in found.message()
    assert "unset OMP_PROC_BIND" in found.fix()
    assert judge(TWO, TWO, 2, env, None) is None  # a mask of several CPUs
    assert judge(ONE, ONE, 2, env, None) is None  # the cpuset itself is one CPU
    assert judge(ONE, TWO, 1, env, None) is None  # one rank may well own one CPU
    assert judge(ONE, None, 2, env, None) is None  # no cpuset known
    assert judge(ONE, TWO, 2, {}, None) is None  # no cause shows: taskset or mpirun --bind-to core on purpose
    assert judge(ONE, TWO, 2, {**env, "SLURM_CPU_BIND_TYPE": "cores"}, None) is None  # srun bound the task
    parent = judge(ONE, TWO, 2, {}, "PID 7 (python3) has libgomp loaded and is bound to CPU 0")
    assert parent is not None and "its parent, PID 7" in parent.message()


def collapsed_parent_run(*argv: str) -> tuple[int, str, str]:
    if NCPU < 2:
        pytest.skip("needs 2 CPUs: a collapse onto one cannot show on one")
    env = clean_env(OMP_PROC_BIND="close", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    proc = run([sys.executable, "-c", PARENT, *affrun_argv(*argv)], env=env, timeout=240)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.torch
def test_exec_under_a_collapsed_parent_warns_naming_the_cause() -> None:
    code, _, err = collapsed_parent_run("exec", "--", "true")
    (warning,) = [line for line in err.splitlines() if line.startswith("affrun: warning:")]
    assert "the mask it inherited was collapsed" in warning
    assert "has libgomp loaded and is bound to CPU" in warning and "OMP_PROC_BIND=close" in warning
    assert code == 2 and "affrun: error: 2 ranks but only 1" in err and "Traceback" not in err


@pytest.mark.torch
def test_doctor_under_a_collapsed_parent_reports_it() -> None:
    _, out, _ = collapsed_parent_run("doctor", "--json")
    findings = {f["id"]: f for f in json.loads(out)["findings"]}
    found = findings["inherited-mask-collapsed"]
    assert found["severity"] == "error" and "libgomp" in found["message"] and "OMP_PROC_BIND" in found["fix"]


def test_exec_from_a_clean_parent_says_nothing(tmp_path: Path) -> None:
    proc = run(affrun_argv("exec", "--", "true"), env=clean_env(OMP_PROC_BIND="close", LOCAL_RANK="0",
                                                                LOCAL_WORLD_SIZE="1"), check=True)
    assert "warning" not in proc.stderr
